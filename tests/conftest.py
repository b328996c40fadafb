"""Shared fixtures: a small deterministic training problem whose losses we can compare exactly."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]


def on_slurm(nodeid: str) -> bool:
    """Whether a test runs jobs on a Slurm cluster, from its id alone (the xdist controller
    schedules by id and never sees markers): ``test_slurm.py``, or "slurm" in the test's name."""
    path, _, name = nodeid.partition("::")
    return path.endswith("test_slurm.py") or "slurm" in name.partition("[")[0].lower()


def on_slurm_nodes(nodeid: str) -> bool:
    """Whether a Slurm test runs on the multi-node cluster (``.ci/slurm-up --nodes 3``) rather than
    the one-node one: those are the ``test_multinode*`` files'."""
    return on_slurm(nodeid) and Path(nodeid.partition("::")[0]).name.startswith("test_multinode")


@functools.cache
def shares_a_module_fixture(path: str) -> bool:
    """Whether a test file has a module-scoped fixture (``scope="module"``): its tests run on one
    xdist worker, which makes the fixture (ranks that save a checkpoint, a run) once, not once on
    each worker that runs one of them."""
    file = REPO / path
    return file.is_file() and 'scope="module"' in file.read_text()


def pytest_configure() -> None:
    """The views fit piped output to ``COLUMNS`` where it is set, as ``ls`` does, and the tests
    read whole lines, so no test may inherit a width: neither one that the shell or a CI runner
    exported nor the one that GNU readline sets when pytest's capture imports it (``COLUMNS=80``,
    ``LINES=24``, written to the C environment behind ``os.environ``'s back, where only the
    subprocesses see it). A test that wants a width sets it itself."""
    for variable in ("COLUMNS", "LINES"):
        os.environ.pop(variable, None)
        os.unsetenv(variable)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``slurm`` that :func:`on_slurm` missed would run beside another Slurm test
    (one that it names but that needs no cluster only runs in the Slurm tests' turn). Under xdist
    the slow tests run first."""
    for item in items:
        if item.get_closest_marker("slurm") and not on_slurm(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid}: a test marked slurm must be in test_slurm.py or have 'slurm' in its name"
            )
    if "PYTEST_XDIST_WORKER" in os.environ:
        # The end-to-end tests first, then the quick ones: the workers end together, filling the
        # last minutes with tests of a second, not one waiting on a test of a minute. Every
        # worker sorts alike, as xdist requires.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under xdist the tests of each Slurm cluster run one after another on one worker: the
    one-node cluster's tests fill its CPUs and find their pilot jobs by name; the multi-node
    tests (``test_multinode*``) crash and boot its nodes. The two clusters are apart (their own
    controllers, nodes and jobs), so the two turns run side by side, each a worker's, and xdist
    starts the largest first: their minutes of waiting on the schedulers overlap the other tests.
    The tests of a file with a module-scoped fixture run on one worker too
    (:func:`shares_a_module_fixture`); every other test goes to whichever worker is free.
    (xdist's ``--dist loadgroup`` would do this from a marker, but it renames test ids, which
    pytest 9 no longer lets a plugin do.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SlurmTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if on_slurm_nodes(nodeid):
                return "slurm-nodes"
            if on_slurm(nodeid):
                return "slurm"
            path = nodeid.partition("::")[0]
            return path if shares_a_module_fixture(path) else nodeid

    return SlurmTestsTogether(config, log)


@pytest.fixture(autouse=True)
def _empty_slurm_cluster(request: pytest.FixtureRequest) -> None:
    """A one-node Slurm test starts on an empty one-node cluster: jobs an earlier test left behind
    (one that failed before its cleanup) would hold the CPUs its pilot jobs wait for, and it would
    time out for a reason of another test's making. They are cancelled here, and named. A
    multi-node test leaves that cluster alone: it runs beside the one-node tests, on its own."""
    nodeid = request.node.nodeid
    if not on_slurm(nodeid) or on_slurm_nodes(nodeid) or not os.environ.get("SLURM_CONF") or not shutil.which("squeue"):
        return
    from slurm import clear_cluster, slurm_problem

    if slurm_problem() is not None:
        return
    left = clear_cluster()
    if left:
        print(f"cancelled jobs an earlier test left on the cluster: {', '.join(left)}")


@pytest.fixture
def tiers(tmp_path: Path) -> tuple[Path, Path]:
    """A (shared, local) pair of tier directories."""
    return tmp_path / "shared", tmp_path / "local"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


@pytest.fixture(autouse=True)
def _stop_signals_as_found() -> Iterator[None]:
    """A benchmark's or CLI's ``main`` run in-process installs its own stop handlers; the next test
    in the same worker must start with the handlers the worker had, not inherit them."""
    found = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    for signum, handler in found.items():
        signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests compare losses bit for bit; keep reductions on one deterministic thread."""
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def python_env() -> dict[str, str]:
    """Environment for child processes: the repo importable, one thread each."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def mpiexec() -> str:
    """The ``mpiexec`` of this environment (the mpich wheel's); a test without one fails, never skips."""
    return shutil.which("mpiexec") or pytest.fail("mpiexec not found: pip install mpich mpi4py")


def run_worker(worker: Path, ranks: int, mode: str, directory: Path) -> list[dict]:
    """Run ``worker MODE DIR`` on ``ranks`` MPI ranks; each rank's JSON report ``MODE-RANKS-RANK.json``."""
    subprocess.run(
        [mpiexec(), "-n", str(ranks), sys.executable, str(worker), mode, str(directory)],
        check=True,
        env=python_env(),
        timeout=180,
    )
    return [json.loads((directory / f"{mode}-{ranks}-{r}.json").read_text()) for r in range(ranks)]
