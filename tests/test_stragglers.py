"""What a block leaves behind is found by its runner's token: a job or group number alone, or
running the same Python, never makes a process ours (another run, on another cluster, may share
them). The Slurm end-to-end test, with two clusters that number their jobs alike, is
``tests/test_slurm_stragglers.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from resilient_flows.rundir import read_records, run_layout
from resilient_flows.sites import SiteFile
from resilient_flows.workflow._blocks import BlockLedger, _stragglers_of
from resilient_flows.workflow._stragglers import TOKEN_ENV, carry_token, is_straggler, kill_stragglers, new_token

SLEEP = "import time; time.sleep(120)"


def wait_for_exec(processes: list[subprocess.Popen]) -> None:
    """Until each process runs this Python (its environment is then the one it was given)."""
    deadline = time.monotonic() + 30
    for process in processes:
        while not Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(sys.executable.encode()):
            assert time.monotonic() < deadline, f"process {process.pid} did not start"
            time.sleep(0.02)


@contextmanager
def pythons(*environments: Mapping[str, str], **popen: object) -> Iterator[list[subprocess.Popen]]:
    """One sleeping process of this Python per environment (added to this one's), killed afterwards."""
    started = [
        subprocess.Popen([sys.executable, "-c", SLEEP], env={**os.environ, **env}, **popen)  # type: ignore[call-overload]
        for env in environments
    ]
    try:
        wait_for_exec(started)
        yield started
    finally:
        for process in started:
            process.kill()
            process.wait()


def test_a_process_of_the_slurm_job_is_killed_only_with_the_token() -> None:
    """Job 987654 of another cluster (no token, or another runner's) is spared; ours is killed."""
    token = new_token()
    job = {"SLURM_JOB_ID": "987654"}
    with pythons(
        {**job, TOKEN_ENV: token},  # ours: the job's orphan, carrying the runner's token
        job,  # the same job number on another cluster, without a token
        {**job, TOKEN_ENV: new_token()},  # another runner's
        {TOKEN_ENV: token, "SLURM_JOB_ID": "9876540"},  # ours, of another job
    ) as (ours, stranger, other_run, other_job):
        assert kill_stragglers(None, slurm_job="987654") == 0  # a block recorded without a token
        assert [is_straggler(p.pid, token, slurm_job="987654") for p in (ours, stranger, other_run, other_job)] == [
            True,
            False,
            False,
            False,
        ]
        assert kill_stragglers(token, slurm_job="987654") == 1
        assert ours.wait(timeout=30) == -signal.SIGKILL
        assert [p.poll() for p in (stranger, other_run, other_job)] == [None, None, None]


def test_a_process_of_the_group_is_killed_only_with_the_token() -> None:
    """A local block's group number, once free, may be another process group's."""
    token = new_token()
    with (
        pythons({TOKEN_ENV: token}, process_group=0) as (leader,),
        pythons({}, {TOKEN_ENV: new_token()}, {TOKEN_ENV: token}, process_group=leader.pid) as group,
    ):
        stranger, other_run, ours = group
        assert kill_stragglers(token, group=leader.pid + 1) == 0
        assert kill_stragglers(token, group=leader.pid) == 2  # the leader and ours
        assert leader.wait(timeout=30) == -signal.SIGKILL and ours.wait(timeout=30) == -signal.SIGKILL
        assert [stranger.poll(), other_run.poll()] == [None, None]


def test_a_process_that_is_not_this_python_is_spared() -> None:
    token = new_token()
    env = {**os.environ, TOKEN_ENV: token, "SLURM_JOB_ID": "987654"}
    sleeper = subprocess.Popen(["sleep", "120"], env=env)
    try:
        deadline = time.monotonic() + 30
        while b"sleep" not in Path(f"/proc/{sleeper.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert kill_stragglers(token, slurm_job="987654") == 0
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_local_block_carries_the_token_and_its_leftovers_are_found_by_it(tmp_path: Path) -> None:
    """The token goes first in each provider's ``worker_init``, which a block's script runs before
    its pool: here a LocalProvider's block, as ``run`` starts it on the local site; the ledger
    records the token with the block, and the block's processes are found by it."""
    ledger = BlockLedger(tmp_path)
    config = SiteFile.open("local").config(run_dir=str(tmp_path / "parsl"))
    (executor,) = config.executors
    provider = executor.provider
    before = provider.worker_init
    carry_token(config, ledger.token)
    assert provider.worker_init == f"export {TOKEN_ENV}={ledger.token}\n{before}"
    provider.script_dir = str(tmp_path)
    seen = tmp_path / "seen"
    program = f"import os, time; print(os.environ['{TOKEN_ENV}'], flush=True); time.sleep(120)"
    job = provider.submit(f'{sys.executable} -c "{program}" > {seen}', 1)
    executor.blocks_to_job_id["0"] = job  # as the executor's scale-out records it
    group = os.getpgid(int(job))
    try:
        ledger.record([executor])
        deadline = time.monotonic() + 30
        while not seen.is_file() or not seen.read_text():
            assert time.monotonic() < deadline, "the block did not start"
            time.sleep(0.05)
        assert seen.read_text() == f"{ledger.token}\n"
        (record,) = read_records(run_layout(tmp_path))
        assert (record["block"], record["job_id"], record["token"], record["pgid"]) == ("0", job, ledger.token, group)
        assert _stragglers_of(record) == {"token": ledger.token, "group": group}
        assert _stragglers_of({**record, "token": None}) == {}  # recorded before runners had tokens
        assert kill_stragglers(new_token(), group=group) == 0
        assert kill_stragglers(ledger.token, group=group) == 1  # the block's Python; its bash is not
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)


def test_a_block_record_is_searched_for_by_its_token_and_its_job_or_group() -> None:
    record = {"executor": "e", "block": "0", "job_id": "2", "provider": "SlurmProvider", "token": "t"}
    assert _stragglers_of(record) == {"token": "t", "slurm_job": "2"}
    assert _stragglers_of({k: v for k, v in record.items() if k != "token"}) == {}
    assert _stragglers_of({**record, "token": ""}) == {}
    local = {**record, "provider": "LocalProvider", "pgid": 4242}
    assert _stragglers_of(local) == {"token": "t", "group": 4242}
    assert _stragglers_of({**local, "pgid": "4242"}) == {}  # a damaged ledger names no group
    assert _stragglers_of({**record, "provider": "PBSProProvider"}) == {}  # Slurm jobs only
