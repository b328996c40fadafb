"""A batch scheduler that fits in a directory: the engine behind the fake Cobalt and PBS Pro commands.

The fake ``qsub``, ``qstat`` and ``qdel`` in ``cobalt/`` and ``pbspro/`` parse their real
counterparts' arguments and print their real output formats; this module keeps the jobs. A job
runs at once, on this machine, as a *runner* process that leads its own session (and so its own
process group), waits out an optional queue delay, runs the job script with its stdout and stderr
sent to the requested files, records the exit status and clears up what the script left behind.

State lives in ``$FAKESCHED_DIR``:

``jobs/<n>.json``
    what ``qsub`` was asked for, written once.
``jobs/<n>.lock``
    locked (``flock``, exclusive) for exactly as long as the runner lives. ``qsub`` takes the lock
    before it starts the runner and hands the open file over, so there is no moment at which a
    submitted job looks finished. A job is alive while its lock is held: liveness needs no pid
    bookkeeping, survives zombies and cannot be fooled by a recycled pid.
``jobs/<n>.pid``
    the runner's pid, which is also the job's process group.
``jobs/<n>.started``, ``jobs/<n>.exit``, ``jobs/<n>.deleted``, ``jobs/<n>.walltime``
    markers: the script started; its exit status; ``qdel`` was asked; the walltime ran out.
``jobs/<n>.rerun``, ``jobs/<n>.runs``
    ``qrerun`` was asked (the runner removes it once the job is queued again); how many times the
    script has started.

The runner re-reads the record while the job waits, so a hold set or released later (``qhold``,
``qrls``) takes effect; a rerun kills the script and sends the job back to waiting, under the same
runner and lock, so it never looks finished in between. The runner shrugs off the signals users
send to jobs (:data:`PASSED_ON`), which ``qsig`` delivers to the whole process group: they are for
the script.

Knobs (environment of ``qsub``): ``FAKESCHED_QUEUE_SECONDS`` keeps each job queued that long before
it starts (default 0); ``update(root, n, queue_seconds=0)`` starts a queued job at once.
``FAKESCHED_PBS_NODES`` names the hosts a PBS job's nodes are (comma-separated, one per node; a
test picks names that resolve here, since every "node" is this machine), else ``fakenode-NNNN``.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DIR_ENV = "FAKESCHED_DIR"
QUEUE_SECONDS_ENV = "FAKESCHED_QUEUE_SECONDS"
NODES_ENV = "FAKESCHED_PBS_NODES"
KILL_GRACE_S = 5.0
#: Signals that ``qsig`` delivers to the job's process group and the runner ignores (the script keeps
#: the default actions: a handler, unlike SIG_IGN, does not survive exec).
PASSED_ON = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)
POLL_S = 0.05


def root_dir(prog: str) -> Path:
    """``$FAKESCHED_DIR``, created if needed; exits like a client that cannot reach its server."""
    value = os.environ.get(DIR_ENV)
    if not value:
        print(f"{prog}: cannot connect to server ({DIR_ENV} is not set)", file=sys.stderr)
        raise SystemExit(1)
    root = Path(value)
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    return root


def user() -> str:
    return getpass.getuser()


def host() -> str:
    return socket.gethostname()


def _file(root: Path, number: int, suffix: str) -> Path:
    return root / "jobs" / f"{number}.{suffix}"


def new_number(root: Path) -> int:
    """The next job number, unique under concurrent ``qsub`` calls."""
    with open(root / "next-id", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        number = int(f.read().strip() or "0") + 1
        f.seek(0)
        f.truncate()
        f.write(str(number))
    return number


def submit(root: Path, number: int, record: dict[str, Any], env: dict[str, str]) -> None:
    """Start job ``number``: ``record`` has ``command`` (argv), ``cwd``, ``stdout``, ``stderr``,
    ``walltime_s`` (or None), ``held`` and whatever the scheduler front end wants to show later;
    ``env`` is the script's environment."""
    record = {**record, "number": number, "submit_time": time.time()}
    record.setdefault("queue_seconds", float(os.environ.get(QUEUE_SECONDS_ENV, "0") or 0))
    _write(_file(root, number, "json"), json.dumps(record, indent=1))
    fd = os.open(_file(root, number, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runner = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "run", str(root), str(number), str(fd)],
            pass_fds=(fd,),
            start_new_session=True,
            env=env,
            cwd=str(root),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(_file(root, number, "runner.log"), "ab"),  # noqa: SIM115 (inherited, then closed)
        )
        _write(_file(root, number, "pid"), str(runner.pid))
    finally:
        os.close(fd)


def update(root: Path, number: int, **changes: Any) -> None:
    """Change job ``number``'s record (``held``, say), one writer at a time."""
    with open(root / "records.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        job = record(root, number)
        assert job is not None
        _write(_file(root, number, "json"), json.dumps({**job, **changes}, indent=1))


def numbers(root: Path) -> list[int]:
    return sorted(int(p.stem) for p in (root / "jobs").glob("*.json"))


def record(root: Path, number: int) -> dict[str, Any] | None:
    try:
        return json.loads(_file(root, number, "json").read_text())
    except FileNotFoundError:
        return None


def alive(root: Path, number: int) -> bool:
    """Whether job ``number``'s runner still holds its lock."""
    try:
        fd = os.open(_file(root, number, "lock"), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        return False
    finally:
        os.close(fd)


def phase(root: Path, number: int) -> str:
    """One of ``held``, ``queued``, ``running``, ``exiting``, ``killing``, ``done``."""
    if not alive(root, number):
        return "done"
    if _file(root, number, "deleted").exists():
        return "killing"
    if _file(root, number, "exit").exists():
        return "exiting"
    if _file(root, number, "started").exists():
        return "running"
    if (record(root, number) or {}).get("held"):
        return "held"
    return "queued"


def started_at(root: Path, number: int) -> float | None:
    try:
        return float(_file(root, number, "started").read_text())
    except (FileNotFoundError, ValueError):
        return None


def run_count(root: Path, number: int) -> int:
    try:
        return int(_file(root, number, "runs").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def exit_status(root: Path, number: int) -> int | None:
    """The script's exit status, 256 + signal if a signal ended it; None while it runs."""
    try:
        return int(_file(root, number, "exit").read_text())
    except (FileNotFoundError, ValueError):
        pass
    if alive(root, number):
        return None
    return 256 + signal.SIGTERM if _file(root, number, "deleted").exists() else None


def ended_at(root: Path, number: int) -> float | None:
    path = _file(root, number, "exit")
    return path.stat().st_mtime if path.exists() else None


def delete(root: Path, number: int) -> bool:
    """Kill job ``number``'s process group (TERM, then KILL after a grace period); False if it had ended."""
    if not alive(root, number):
        return False
    _write(_file(root, number, "deleted"), str(time.time()))
    pgid = int(_file(root, number, "pid").read_text())
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while alive(root, number) and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_group(pgid, signal.SIGKILL)
    return True


def signal_job(root: Path, number: int, sig: int) -> None:
    """Send ``sig`` to every process of job ``number`` (the runner ignores :data:`PASSED_ON`)."""
    _signal_group(int(_file(root, number, "pid").read_text()), sig)


def rerun(root: Path, number: int) -> bool:
    """Kill running job ``number``'s script (TERM now, KILL after the grace period) and queue the job
    again, held if its record says so; returns once it is queued, or False if it was not running."""
    if phase(root, number) != "running":
        return False
    marker = _file(root, number, "rerun")
    _write(marker, str(time.time()))
    signal_job(root, number, signal.SIGTERM)
    while marker.exists() and alive(root, number):
        time.sleep(0.02)
    if marker.exists():  # the script ended on its own first: the job finished, nothing to requeue
        marker.unlink(missing_ok=True)
        return False
    return True


def delete_all(root: Path) -> list[int]:
    """Kill every job still alive under ``root`` (test clean-up); the numbers it killed."""
    return [n for n in numbers(root) if delete(root, n)]


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _run(root: Path, number: int) -> int:
    """The runner: the scheduler's agent for one job (keeps the inherited lock until it exits)."""
    for sig in PASSED_ON:
        signal.signal(sig, lambda *_: None)
    job = record(root, number)
    assert job is not None
    log = job.get("log")
    _log(log, f"job {number} queued by {user()}")
    requeued = False
    while True:
        # qdel's TERM ends a job that has not started; once the script runs, the TERM is for the script.
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while not _may_start(root, number, job, requeued):
            time.sleep(0.02)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if _file(root, number, "deleted").exists():  # qdel came between the last check and now
            return 0
        _write(_file(root, number, "started"), str(time.time()))
        _write(_file(root, number, "runs"), str(run_count(root, number) + 1))
        _log(log, f"job {number} starting: {' '.join(job['command'])}")
        with open(job["stdout"], "ab") as out, open(job["stderr"], "ab") as err:
            script = subprocess.Popen(
                job["command"],
                cwd=job["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL),
            )
        code = _wait(root, number, job, script)
        if code is not None:
            break
        _log(log, f"job {number} requeued (qrerun)")
        _clear_node()
        _file(root, number, "started").unlink()
        _file(root, number, "rerun").unlink()
        requeued = True
    status = code if code >= 0 else 256 - code
    _log(log, f"job {number} exited with status {status}")
    _write(_file(root, number, "exit"), str(status))
    _clear_node()
    return 0


def _may_start(root: Path, number: int, job: dict[str, Any], requeued: bool) -> bool:
    """Not held, and its queue time over (a requeued job waits for its hold only). The record is
    read again each time: a test that changes ``queue_seconds`` starts a job, as a scheduler would."""
    current = record(root, number) or job
    if current.get("held"):
        return False
    return requeued or time.time() >= current["submit_time"] + current["queue_seconds"]


def _wait(root: Path, number: int, job: dict[str, Any], script: subprocess.Popen[bytes]) -> int | None:
    """The script's exit code, once it ends (killed at its walltime); None if ``qrerun`` ended it."""
    began = time.monotonic()
    rerun_asked: float | None = None
    while True:
        try:
            code = script.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
        else:
            return None if _file(root, number, "rerun").exists() else code
        if job["walltime_s"] is not None and time.monotonic() - began >= job["walltime_s"]:
            _write(_file(root, number, "walltime"), str(time.time()))
            _log(job.get("log"), f"job {number} exceeded its walltime of {job['walltime_s']:.0f} s; killing it")
            os.killpg(os.getpgrp(), signal.SIGTERM)
            try:
                return script.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                script.kill()
                return script.wait()
        if rerun_asked is None and _file(root, number, "rerun").exists():
            rerun_asked = time.monotonic()  # qrerun sent the TERM; KILL follows, as from PBS's MoM
        if rerun_asked is not None and time.monotonic() - rerun_asked >= KILL_GRACE_S:
            script.kill()


def _clear_node() -> None:
    """Like a real scheduler, clear the node: whatever the script left running in the job dies too."""
    os.killpg(os.getpgrp(), signal.SIGTERM)
    time.sleep(0.05)


def _log(path: str | None, message: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{time.strftime('%a %b %d %H:%M:%S %Y')} {message}\n")


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "run":
    raise SystemExit(_run(Path(sys.argv[2]), int(sys.argv[3])))


def node_names(count: int) -> list[str]:
    """The host names of a job's ``count`` nodes: from :data:`NODES_ENV`, else ``fakenode-NNNN``."""
    given = [name for name in os.environ.get(NODES_ENV, "").split(",") if name]
    if not given:
        return [f"fakenode-{i:04d}" for i in range(count)]
    if len(given) < count:
        raise SystemExit(f"qsub: {NODES_ENV} names {len(given)} hosts, the job needs {count}")
    return given[:count]
