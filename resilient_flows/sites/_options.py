"""A site's block size, walltime, queue and account, changed without copying its file.

A workflow names its site with them, ``site: {name: polaris, nodes: 4, walltime: 2h, queue:
debug, account: MYPROJ}``, and ``validate``, ``run`` and ``resume`` take them as ``--set
nodes=4 --set walltime=2h`` on top. Each goes to the provider of every executor of the site, by
the provider's own name for it, and ``nodes`` and ``walltime`` to the facts as well, so that the
runner plans and drains blocks by the size and time the batch system gives them:

==========  ==================  ==============  ==============  ==============
option      facts               SlurmProvider   PBSProProvider  CobaltProvider
==========  ==================  ==============  ==============  ==============
nodes       nodes               nodes_per_block nodes_per_block nodes_per_block
walltime    walltime            walltime        walltime        walltime
queue                           partition       queue           queue
account                         account         account         account
==========  ==================  ==============  ==============  ==============

Other providers (a ``LocalProvider`` has no queue or walltime) take none of them: a site
whose executors have one is refused with the options named.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Sequence
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites._facts import parse_clock

#: The options, in the order they are shown.
SITE_OPTIONS = ("nodes", "walltime", "queue", "account")

_BATCH = {"nodes": "nodes_per_block", "walltime": "walltime", "queue": "queue", "account": "account"}
#: Each provider that takes the options, and its argument for each.
PROVIDER_FIELDS: dict[str, dict[str, str]] = {
    "SlurmProvider": {**_BATCH, "queue": "partition"},
    "PBSProProvider": _BATCH,
    "CobaltProvider": _BATCH,
}
#: The facts the options set beside the providers' arguments.
FACT_FIELDS = ("nodes", "walltime")


class SiteOptions(BaseModel):
    """The options given, None for those that are not (the site file's values stay)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    nodes: Annotated[int, Field(ge=1)] | None = None
    walltime: str | None = None
    queue: Annotated[str, Field(min_length=1)] | None = None
    account: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"nodes must be a number of nodes, got {value!r}")
        return value

    @field_validator("walltime")
    @classmethod
    def _walltime(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            seconds = parse_clock(value)
        except ValueError:
            seconds = 0
        if seconds <= 0:
            raise ValueError(f"walltime must be a duration like 2h, 90m or HH:MM:SS, got {value!r}")
        return value

    def given(self) -> dict[str, Any]:
        """The options that are set, by name."""
        return {key: getattr(self, key) for key in SITE_OPTIONS if getattr(self, key) is not None}

    def merged(self, other: SiteOptions) -> Self:
        """These options with those ``other`` sets replacing theirs."""
        return self.model_copy(update=other.given())

    def describe(self) -> str:
        """``nodes 4, walltime 2h`` (empty when none is set)."""
        return ", ".join(f"{key} {value}" for key, value in self.given().items())

    def apply(self, document: dict[str, Any], where: str) -> dict[str, Any]:
        """A copy of the site ``document`` (read from ``where``) with these options in its
        providers and facts; the document itself when none is set."""
        given = self.given()
        if not given:
            return document
        document = copy.deepcopy(document)
        for index, executor in enumerate(document.get("executors") or []):
            provider = executor.get("provider") if isinstance(executor, dict) else None
            kind = provider.get("type") if isinstance(provider, dict) else None
            fields = PROVIDER_FIELDS.get(str(kind))
            if fields is None or not isinstance(provider, dict):  # no provider: no fields either
                raise SiteConfigError(
                    f"{where}: executors[{index}]: its provider, {kind or 'none'}, takes no site options "
                    f"({', '.join(given)}); they apply to {', '.join(PROVIDER_FIELDS)}"
                )
            for key, value in given.items():
                provider[fields[key]] = _clock(value) if key == "walltime" else value
        facts = document.get("facts")
        if isinstance(facts, dict):
            for key in FACT_FIELDS:
                if key in given:
                    facts[key] = _clock(given[key]) if key == "walltime" else given[key]
        return document


def _clock(walltime: str) -> str:
    """``HH:MM:SS``, as every provider takes a walltime."""
    seconds = round(parse_clock(walltime))
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def parse_site_options(assignments: Sequence[str]) -> SiteOptions:
    """Options from ``KEY=VALUE`` words (``--set nodes=4``)."""
    values: dict[str, str] = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SiteConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set nodes=4")
        if key not in SITE_OPTIONS:
            close = difflib.get_close_matches(key, SITE_OPTIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            allowed = ", ".join(SITE_OPTIONS)
            raise SiteConfigError(f"--set {item!r}: unknown site option {key!r}{hint}; allowed: {allowed}")
        values[key] = text.strip()
    try:
        return SiteOptions.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0])
        message = error["msg"].removeprefix("Value error, ")
        raise SiteConfigError(f"--set {key}={values[key]}: {message}") from None
