"""One package adapts Parsl: no other module names one of Parsl's internals, and the installed Parsl
is one whose internals it knows (fast: nothing here starts Parsl)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from parsl.version import VERSION

from resilient_flows.errors import UnsupportedParslError
from resilient_flows.sites._parsl import PARSL_INTERNALS, PARSL_RANGE, POOL_MODULE, TESTED_PARSL, check_parsl

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "resilient_flows"
ADAPTER = PACKAGE / "sites" / "_parsl"


def internals_named(source: str) -> list[str]:
    """Where ``source`` names one of :data:`PARSL_INTERNALS`, each as ``line: name``.

    What it finds: an attribute of that name read or written on anything but ``self`` or ``cls``
    (a class of ours may have a ``_status`` of its own), a string equal to one (``getattr(e,
    "_hold_block")``, ``record["exec_fu"]``, ``import_module(...)``, a logger's name) and an
    import of an internal module. What it cannot find: an internal reached under another name
    (a ``getattr`` with a computed string), or an internal this package does not list."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in PARSL_INTERNALS:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PARSL_INTERNALS:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Import):
            found.extend(f"{node.lineno}: import {a.name}" for a in node.names if a.name in PARSL_INTERNALS)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found.extend(f"{node.lineno}: from {n}" for n in names if n in PARSL_INTERNALS)
    return sorted(found, key=lambda where: int(where.split(":")[0]))


def test_no_module_outside_the_adapter_names_a_parsl_internal() -> None:
    offences = {
        str(path.relative_to(REPO)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if ADAPTER not in path.parents and (found := internals_named(path.read_text()))
    }
    assert offences == {}


def test_the_scan_finds_each_kind_of_use_it_claims_to() -> None:
    source = """
from parsl.executors.high_throughput import process_worker_pool
import parsl.executors.high_throughput.interchange
executor._simulated_status["1"] = status
hold = getattr(executor, "_hold_block", None)
launched = future.task_record["exec_fu"]
executor.connected_managers = list
self._status = {}
"""
    assert internals_named(source) == [
        "2: from parsl.executors.high_throughput.process_worker_pool",
        "3: import parsl.executors.high_throughput.interchange",
        "4: ._simulated_status",
        "5: '_hold_block'",
        "6: 'exec_fu'",
        "7: .connected_managers",
    ]


def test_the_installed_parsl_is_in_the_range_that_pyproject_and_the_adapter_declare() -> None:
    # the first requirement line naming parsl is the dependency's (the extras' come after it)
    line = re.search(r'^\s*"(parsl[^"]*)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert line is not None and Requirement(line.group(1)).specifier == SpecifierSet(PARSL_RANGE)
    assert check_parsl() == VERSION
    assert VERSION in TESTED_PARSL
    assert all(v in SpecifierSet(PARSL_RANGE) for v in TESTED_PARSL)


@pytest.mark.parametrize("version", ["2026.11.2", "2027.1.4", "2026.10.19", "2025.1.6", "main"])
def test_a_parsl_outside_the_range_is_refused_naming_it_and_the_range(version: str) -> None:
    with pytest.raises(UnsupportedParslError) as refused:
        check_parsl(version)
    assert str(refused.value) == (
        f"Parsl {version} is installed, but resilient-flows relies on internals of Parsl >=2026.10.26,<2026.11 "
        "(tested with 2026.10.26): pip install 'parsl>=2026.10.26,<2026.11'"
    )


def test_the_cli_says_so_in_one_line_before_anything_relies_on_an_unknown_parsl() -> None:
    """A user with a newer Parsl: ``validate`` (which builds the site's configuration) stops with
    the error's one line and status 2, not a traceback from deep inside Parsl."""
    program = (
        "import parsl.version; parsl.version.VERSION = '2027.1.4'\n"
        "from resilient_flows.cli._app import main\n"
        f"raise SystemExit(main(['validate', {str(REPO / 'workflows' / 'quickstart.yaml')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert "error: Parsl 2027.1.4 is installed, but resilient-flows relies on internals of Parsl" in done.stderr


def test_the_worker_side_names_the_pool_as_the_adapter_does() -> None:
    """An attempt finds its pool among its ancestors by the pool's module on their command line
    (:mod:`resilient_flows.training._pool` cannot import the adapter: it runs on the worker's side)."""
    from resilient_flows.training._pool import POOL_COMMAND

    assert POOL_MODULE.rsplit(".", 1)[-1] == POOL_COMMAND
