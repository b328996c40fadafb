"""The limits the code keeps so that a maintainer can read any one piece of it whole: no file over
1,000 lines and no function over 80 in the package or the benchmarks, and the checkpoint settings
named in few modules (they travel as one typed object, not as loose fields)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("resilient_flows", "benchmarks")
MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 80
#: The workflow schema and its expansion, the typed checkpoint configuration, the engine that reads
#: it, an integration that sets it: the modules that may name one tier option, with one to spare.
MAX_MODULES_NAMING_A_TIER_OPTION = 6


def _sources() -> list[Path]:
    return sorted(path for tree in TREES for path in (ROOT / tree).rglob("*.py"))


def test_no_file_is_over_the_line_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert long == {}, f"files over {MAX_FILE_LINES} lines: split them by what they do"


def test_no_function_is_over_the_line_limit() -> None:
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines"


def test_a_tier_option_is_named_in_few_modules() -> None:
    naming = [
        str(p.relative_to(ROOT)) for p in (ROOT / "resilient_flows").rglob("*.py") if "persist_every" in p.read_text()
    ]
    assert len(naming) <= MAX_MODULES_NAMING_A_TIER_OPTION, naming


def test_the_runner_member_protocol_lives_in_rundir_not_training() -> None:
    training = {p.stem.lstrip("_") for p in (ROOT / "resilient_flows" / "training").glob("*.py")}
    assert training.isdisjoint({"lease", "control", "heartbeat", "heartbeats"}), training
