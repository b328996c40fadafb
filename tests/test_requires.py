"""``tests/requires.py``: a missing extra, root or service skips a test locally and fails it in CI
(``RESILIENT_FLOWS_REQUIRE_ALL=1``), the Slurm cluster included. Checked on a small test file run
by a pytest of its own, the way CI runs the suite."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import python_env

NEEDS = """
from requires import require, require_module, unmet_in_part
from slurm import require_slurm


def test_extra():
    require_module("resilient_flows_no_such_extra", "the extra is not installed")


def test_root():
    require(False, "not root")


def test_service():
    require_slurm()


def test_part():
    unmet_in_part("a part of the test is left out")
"""

AT_MODULE_LEVEL = """
from requires import require_module

require_module("resilient_flows_no_such_extra", "the extra is not installed")


def test_never_collected():
    pass
"""


def outcomes(directory: Path, require_all: str) -> dict[str, str]:
    """Each test's outcome (or, for a file that cannot be collected, the file's) in a run of ``directory``."""
    env = python_env()
    env.pop("RESILIENT_FLOWS_REQUIRE_SLURM", None)
    env["RESILIENT_FLOWS_REQUIRE_ALL"] = require_all
    # No cluster, whatever runs on this machine: a configuration naming none, on which sinfo fails at
    # once (for an absent file it retries for a minute, and require_slurm gives up after 20 s).
    (directory / "no-cluster.conf").write_text("")
    env["SLURM_CONF"] = str(directory / "no-cluster.conf")
    report = directory / f"report-{require_all}.xml"
    # a file that fails at collection stops a run (as in CI): here the other file must run too
    options = ["-p", "no:cacheprovider", "--continue-on-collection-errors", f"--junitxml={report}"]
    subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(directory)],
        cwd=directory,
        env=env,
        capture_output=True,
        timeout=120,
    )
    found = {}
    for case in ET.parse(report).iter("testcase"):
        kinds = {child.tag for child in case} & {"skipped", "failure", "error"}
        found[case.get("name") or case.get("classname", "")] = kinds.pop() if kinds else "passed"
    return found


@pytest.mark.parametrize(("require_all", "unmet"), [("0", "skipped"), ("1", "failure")])
def test_an_unmet_need_skips_unless_every_need_is_required(tmp_path: Path, require_all: str, unmet: str) -> None:
    (tmp_path / "test_needs.py").write_text(NEEDS)
    (tmp_path / "test_module_level.py").write_text(AT_MODULE_LEVEL)
    found = outcomes(tmp_path, require_all)
    module_level = "error" if require_all == "1" else "skipped"  # a failed collection is an error
    part = "failure" if require_all == "1" else "passed"
    assert found == {
        "test_extra": unmet,
        "test_root": unmet,
        "test_service": unmet,
        "test_part": part,
        "test_module_level": module_level,
    }
