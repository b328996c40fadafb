"""A site file read once: its facts, its providers and its Parsl configuration from one reading.

``run`` plans with a site and then builds its Parsl configuration, again after a failed start:
all from the one :class:`SiteFile` the plan carries, so a run sees one version of the file and
opens it once. Building the configuration imports Parsl; the rest does not. Options given with
the site (``nodes``, ``walltime``, ``queue``, ``account``: see :mod:`resilient_flows.sites._options`)
are applied as the file is read, so that its facts and its providers see the same values.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites._facts import SiteFacts, parse_clock, parse_facts
from resilient_flows.sites._options import SiteOptions
from resilient_flows.sites._sitefile import read_site, site_path
from resilient_flows.sites._spares import spare_nodes, with_spares

if TYPE_CHECKING:
    from parsl.config import Config


@dataclass(frozen=True)
class SiteFile:
    """The site ``name`` (a name in ``site-configs/`` or a YAML path), read from ``path``, with
    ``options`` applied to its ``document``."""

    name: str
    path: Path
    document: dict[str, Any]
    options: SiteOptions = field(default_factory=SiteOptions)

    @classmethod
    def open(cls, name_or_path: str | os.PathLike, options: SiteOptions | None = None) -> SiteFile:
        path = site_path(name_or_path)
        options = SiteOptions() if options is None else SiteOptions.model_validate(options.given())
        return cls(os.fspath(name_or_path), path, options.apply(read_site(path), str(path)), options)

    def facts(self) -> SiteFacts:
        """The site's facts, checked against its providers: a block's ``walltime`` is the
        providers' where the facts name none, and facts that promise a longer one than a provider
        asks for are refused (the runner would drain its blocks after the batch system killed them)."""
        facts = parse_facts(self.document.get("facts"), name=self.path.stem, where=str(self.path))
        asked = self._provider_walltimes()
        if not asked:
            return facts
        if facts.walltime_s is None:
            return replace(facts, walltime_s=min(asked.values()))
        longer = {label: s for label, s in asked.items() if s < facts.walltime_s}
        if longer:
            label, seconds = min(longer.items(), key=lambda item: item[1])
            raise SiteConfigError(
                f"{self.path}: facts.walltime is {facts.walltime_s:.0f} s, but the provider of executor {label!r} "
                f"asks for blocks of {seconds:.0f} s: the runner drains a block by the facts' walltime; "
                "make them agree (a YAML anchor can share one value)"
            )
        return facts

    def _provider_walltimes(self) -> dict[str, float]:
        """Each executor's provider walltime in seconds, by label, where it names one."""
        found = {}
        for index, executor in enumerate(self.document.get("executors") or []):
            provider = executor.get("provider") if isinstance(executor, dict) else None
            walltime = provider.get("walltime") if isinstance(provider, dict) else None
            if walltime is None:
                continue
            label = str(executor.get("label", f"executors[{index}]"))
            try:
                found[label] = parse_clock(walltime)
            except ValueError as exc:
                problem = f"executor {label!r}: provider walltime {walltime!r}: {exc}"
                raise SiteConfigError(f"{self.path}: {problem}") from None
        return found

    def provider_types(self) -> set[str]:
        """The ``type`` of each executor's provider (no Parsl object is built)."""
        executors = self.document.get("executors") or []
        return {
            str(e["provider"].get("type"))
            for e in executors
            if isinstance(e, dict) and isinstance(e.get("provider"), dict)
        }

    def config(self, *, survive_node_loss: bool = False, standby_blocks: bool = False, **overrides: Any) -> Config:
        """A new ``parsl.Config``; ``overrides`` replace top-level ``parsl.Config`` arguments.

        ``survive_node_loss``: its blocks outlive a lost node even without spare nodes, for members
        that may shrink onto the nodes left (``min_nodes``). ``standby_blocks``: the executors that
        ask for a ``standby_pool`` keep one, for a runner that tells it when to go (without one, a
        waiting block would never start)."""
        from resilient_flows.sites._build import build_config

        spares = spare_nodes(self.document, str(self.path))
        document = with_spares(copy.deepcopy(self.document), spares, survive=survive_node_loss)
        return build_config(document, str(self.path), standby_blocks=standby_blocks, **overrides)


def site_facts(name_or_path: str | os.PathLike = "local") -> SiteFacts:
    """The facts of a named site (``local``, ``polaris``, ...) or of a site YAML file."""
    return SiteFile.open(name_or_path).facts()


def load_site(name_or_path: str | os.PathLike = "local", **overrides: Any) -> Config:
    """The ``parsl.Config`` of a named site (``local``, ``polaris``, ...) or of a YAML file.

    ``overrides`` replace top-level ``parsl.Config`` arguments (``run_dir``, ``retries``, ...).
    The file's ``facts`` are not part of it: see :func:`site_facts`.
    """
    return SiteFile.open(name_or_path).config(**overrides)
