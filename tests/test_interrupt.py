"""Ctrl-C and SIGTERM stop a run cleanly: through a real terminal (a pty whose foreground process
group gets the SIGINT, as a terminal's Ctrl-C does), or sent to the runner alone.

Every process the run starts inherits a token in its environment (Parsl's interchange and worker
pools, the members, a command member's processes), so that what is left of a run is found by
the token, not by a name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from test_lease import CLI, quick_site, wait_for

from resilient_flows.checkpoint._tiers import Tier
from resilient_flows.cli import main
from resilient_flows.rundir._heartbeat import Heartbeat
from resilient_flows.training import read_events, run_member
from resilient_flows.training._command import run_command
from resilient_flows.workflow import read_plan
from resilient_flows.workflow._interrupt import Drain, Interrupts, StopNow
from resilient_flows.workflow._status import loss_curve

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "command_script.py"
TOKEN_VARIABLE = "RESILIENT_FLOWS_TEST_RUN_TOKEN"
#: A member that trains (``chaos:paced``: ``mlp-digits`` with a pause) and a command member that
#: trains, each waiting for the gate that the test opens once the runner asked them to stop (at 80 %
#: of the steps, as ``chaos:paced`` waits), so that both are caught mid-run on a loaded machine too.
TRAINING = (
    "name: stop\nretries: 1\ncheckpoint: {interval: 20}\nmembers:\n"
    "  - {name: m, workload: 'chaos:paced', steps: 200, params: {hidden: 16, pause_ms: 5}}\n"
    f"  - {{name: c, steps: 200, command: [{sys.executable}, {SCRIPT}, --step-s, '0.01', --gate, GATE,"
    " --hold-at, '160']}\n"
)
GATE_ENV = "RESILIENT_FLOWS_CHAOS_GATE"  # benchmarks/chaos.py's
BENCHMARKS = HERE.parent / "benchmarks"
#: A command member that ignores every stop and leaves a child behind, beside a training member.
STUBBORN = (
    "name: stuck\nretries: 1\ncheckpoint: {interval: 50}\nmembers:\n"
    "  - {name: m, workload: mlp-digits, steps: 1000000, params: {hidden: 16}}\n"
    "  - {name: s, steps: 1, command: [sh, -c, \"trap '' TERM INT; sleep 1000 & wait\"]}\n"
)
#: One member training for good.
ALONE = "name: alone\ncheckpoint: {interval: 50}\nmembers:\n  - {name: m, workload: mlp-digits, steps: 1000000}\n"
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\r")


class Terminal:
    """``resilient-flows ARGS`` as the session leader of a pty of 80 columns, the pty its
    controlling terminal and its process group the terminal's foreground one; what it writes is
    read from a thread (a full pty would stop it)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.master = master
        self.process = subprocess.Popen(  # not a group leader: setsid execs the runner in place
            ["setsid", "--ctty", CLI, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
        )
        os.close(slave)
        self._output = bytearray()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: every end of the pty's other side is closed
                return
            if not data:
                return
            self._output += data

    @property
    def output(self) -> str:
        return ANSI.sub(b"", bytes(self._output)).decode(errors="replace")

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")  # the kernel sends SIGINT to the foreground process group

    def wait(self, timeout: float) -> tuple[int, float]:
        """The exit status and the seconds it took."""
        began = time.monotonic()
        status = self.process.wait(timeout=timeout)
        took = time.monotonic() - began
        self._reader.join(5)
        os.close(self.master)
        return status, took

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def processes_of(token: str) -> list[str]:
    """The live processes that carry ``token`` in their environment."""
    found = []
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z":
            found.append(f"{entry}: {command[:160]}")
    return found


def kill_all(token: str) -> None:
    for line in processes_of(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def start(tmp_path: Path, text: str, **env: str) -> tuple[Terminal, Path, str]:
    """``run`` of the workflow ``text`` on the local site in a :class:`Terminal`; with its run
    directory and the token of its processes."""
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(text)
    run_dir, token = tmp_path / "run", uuid.uuid4().hex
    args = ["run", str(workflow), "--site", str(quick_site(tmp_path, "local")), "--run-dir", str(run_dir)]
    return Terminal(args, {**os.environ, **env, TOKEN_VARIABLE: token}), run_dir, token


def beating(run_dir: Path, names: list[str]) -> bool:
    """Every member named has committed a checkpoint and is training on."""
    events = list(read_events(run_dir))
    committed = {e["member"] for e in events if e["kind"] == "checkpointed"}
    ended = {e["member"] for e in events if e["kind"] in ("preempted", "finished", "failed")}
    return set(names) <= committed and not ended & set(names)


def digest_of(run_dir: Path, name: str) -> str:
    return json.loads((run_dir / "members" / name / "result.json").read_text())["digest"]


def asked(run_dir: Path, name: str) -> bool:
    return (run_dir / "members" / name / "control.json").exists()


def stopped(run_dir: Path, name: str) -> bool:
    return any(e["kind"] == "preempted" and e["member"] == name for e in read_events(run_dir))


def assert_stopped_with_a_checkpoint(run_dir: Path, names: list[str], signame: str) -> None:
    """Each member's last event says it was preempted by the stop, at the newest step it committed,
    and it trained no step beyond it."""
    events = list(read_events(run_dir))
    for name in names:
        last = [e for e in events if e["member"] == name][-1]
        assert (last["kind"], last["reason"]) == ("preempted", f"the runner was stopped ({signame})"), last
        newest = Tier(run_dir / "members" / name / "checkpoints", "shared").committed_steps()[0]
        assert last["step"] == newest
        steps = [json.loads(line)["step"] for line in (run_dir / "members" / name / "metrics.jsonl").open()]
        assert max(steps) == newest
        assert not (run_dir / "members" / name / "control.json").exists()


def assert_clean_stop(terminal: Terminal, status: int, run_dir: Path, token: str, expected: int) -> None:
    out = terminal.output
    assert status == expected, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert f"resilient-flows resume {run_dir}" in out, out[-3000:]
    wait_for(lambda: not processes_of(token), 10, f"the run's processes gone: {processes_of(token)}")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_stops_members_at_a_checkpoint_and_resume_ends_like_an_uninterrupted_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(BENCHMARKS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the reference trains chaos:paced here
    gate = tmp_path / "gate"
    terminal, run_dir, token = start(tmp_path, TRAINING.replace("GATE", str(gate)), **{GATE_ENV: str(gate)})
    try:
        wait_for(lambda: beating(run_dir, ["m", "c"]), 240, f"both members training: {terminal.output[-2000:]}")
        terminal.ctrl_c()
        wait_for(lambda: all(asked(run_dir, n) or stopped(run_dir, n) for n in "mc"), 60, "the members asked to stop")
        gate.touch()  # one waiting at the gate goes on to its next step, where it stops
        status, _ = terminal.wait(60)
        assert_clean_stop(terminal, status, run_dir, token, 130)
    finally:
        terminal.kill()
        kill_all(token)
    assert "SIGINT: the running members commit a checkpoint and stop" in terminal.output
    assert_stopped_with_a_checkpoint(run_dir, ["m", "c"], "SIGINT")
    kinds = {e["kind"] for e in read_events(run_dir)}
    assert "retried" not in kinds and "failed" not in kinds  # nothing requeued, nothing charged

    assert main(["resume", str(run_dir)]) == 0
    capsys.readouterr()
    plan = read_plan(run_dir)
    m, c = plan.members
    reference = tmp_path / "ref"
    quiet = replace(m, params={**m.params, "pause_ms": 0})  # the pause changes no weight
    plain = replace(c, command=[sys.executable, str(SCRIPT)])  # nor do the sleep and the gate
    assert digest_of(run_dir, "m") == run_member(quiet.to_dict(), str(reference))["digest"]
    assert digest_of(run_dir, "c") == run_command(plain.to_dict(), str(reference))["digest"]
    for name in ("m", "c"):
        assert loss_curve(run_dir, name) == loss_curve(reference, name), name


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_ctrl_c_stops_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    """The command member ignores its stop (it would hold the first Ctrl-C's drain for a minute)
    and has a child of its own: the second Ctrl-C kills them with everything else."""
    terminal, run_dir, token = start(tmp_path, STUBBORN)
    try:
        wait_for(lambda: beating(run_dir, ["m"]), 240, f"m training: {terminal.output[-2000:]}")
        wait_for(lambda: any("sleep 1000" in p for p in processes_of(token)), 60, "the command's child")
        terminal.ctrl_c()
        wait_for(lambda: stopped(run_dir, "m"), 60, "m stopped on the first Ctrl-C")
        terminal.ctrl_c()
        status, took = terminal.wait(60)
        assert_clean_stop(terminal, status, run_dir, token, 130)
    finally:
        terminal.kill()
        kill_all(token)
    assert took < 30, took  # not the minute the stubborn member's drain would have taken
    assert "stopped at once (SIGINT twice)" in terminal.output
    assert_stopped_with_a_checkpoint(run_dir, ["m"], "SIGINT")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_runner_alone_stops_the_run_cleanly(tmp_path: Path, sig: signal.Signals, expected: int) -> None:
    terminal, run_dir, token = start(tmp_path, ALONE)
    try:
        wait_for(lambda: beating(run_dir, ["m"]), 240, f"m training: {terminal.output[-2000:]}")
        os.kill(terminal.process.pid, sig)
        status, _ = terminal.wait(120)
        assert_clean_stop(terminal, status, run_dir, token, expected)
    finally:
        terminal.kill()
        kill_all(token)
    assert f"{sig.name}: the running members commit a checkpoint and stop" in terminal.output
    log = run_dir / "runner.log"  # a detached runner's output; created by a first warning
    assert not log.exists() or "Traceback" not in log.read_text()
    assert_stopped_with_a_checkpoint(run_dir, ["m"], sig.name)


def test_the_first_signal_asks_and_a_second_raises_only_where_armed() -> None:
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts:
        assert not interrupts.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert (interrupts.requested, interrupts.name, interrupts.status) == (True, "SIGTERM", 143)
        os.kill(os.getpid(), signal.SIGINT)  # not armed: recorded, nothing raised
        assert interrupts.again
        with pytest.raises(StopNow), interrupts.armed():
            pass
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_drain_asks_each_beating_member_once_and_withdraws_what_nobody_took(tmp_path: Path) -> None:
    drain = Drain(tmp_path, {"m", "n"}, "the runner was stopped (SIGINT)", wait_s=60)
    with Heartbeat(tmp_path, "m", attempt=2), Heartbeat(tmp_path, "analytics@a1", attempt=1):
        assert drain.update() is False  # m beats: asked, and waited for
        request = json.loads((tmp_path / "members/m/control.json").read_text())
        assert request == {"action": "preempt", "reason": "the runner was stopped (SIGINT)"}
        assert drain.asked == {("m", 2)} and not (tmp_path / "members/n").exists()
    assert drain.update() is True  # nothing of the members beats any more (analytics are not waited for)
    drain.finish()
    assert not (tmp_path / "members/m/control.json").exists()  # m ended without taking it
