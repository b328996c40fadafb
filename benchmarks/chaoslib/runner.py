"""The runner of a run, driven as an operator would: ``resilient-flows run``, then ``resume`` after
each kill of ours; its CPU and memory read from outside, exactly once after each exit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaoslib.procs import peak_rss_kib, read_proc

CLI = Path(sys.executable).with_name("resilient-flows")
#: How many times a runner that exits on its own with members unfinished is resumed, as an operator would.
RESUMES_AFTER_EXIT = 3


class Runner:
    """The runner of a run: ``resilient-flows run``, and ``resume`` after every kill of ours, and
    after a runner that exited on its own with members unfinished (recorded in ``exits``: a crash,
    or members out of retries), up to :data:`RESUMES_AFTER_EXIT` times.

    Its CPU time is read from ``/proc`` while it lives and exactly once it exits: ``waitid`` with
    ``WNOWAIT`` leaves it a zombie whose counters can still be read, then it is reaped.
    """

    def __init__(self, workflow: Path, run_dir: Path, site: str, log: Path, env: dict[str, str]) -> None:
        self.workflow, self.run_dir, self.site, self.log, self.env = workflow, run_dir, site, log, env
        self.pids: list[int] = []
        self.peak_rss_kib = 0
        self.returncode: int | None = None
        self.exits: list[str] = []
        self._ended_cpu_s = 0.0
        self._live_cpu_s = 0.0
        self._proc: subprocess.Popen[bytes] | None = None
        self._doomed: int | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            self._start(resume=False)

    def _start(self, resume: bool) -> None:
        if resume:
            command = [str(CLI), "resume", str(self.run_dir)]
        else:
            command = [str(CLI), "run", str(self.workflow), "--site", self.site, "--run-dir", str(self.run_dir)]
        with self.log.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.pids.append(self._proc.pid)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return None if proc is None else proc.pid

    @property
    def cpu_s(self) -> float:
        return self._ended_cpu_s + self._live_cpu_s

    def kill(self) -> int | None:
        """SIGKILL the runner (the next :meth:`poll` resumes the run); its pid, or None if it had ended."""
        with self._lock:
            proc = self._proc
            if proc is None or (now := read_proc(proc.pid)) is None or now.state == "Z" or self._doomed == proc.pid:
                return None
            self._doomed = proc.pid
            os.kill(proc.pid, signal.SIGKILL)
            return proc.pid

    def poll(self) -> bool:
        """Sample the runner; resume after our kill. True once the run is over (the runner exited by itself)."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return True
            now = read_proc(proc.pid)
            if now is not None:
                self._live_cpu_s = now.cpu_s
                self.peak_rss_kib = max(self.peak_rss_kib, peak_rss_kib(proc.pid))
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                return False
            final = read_proc(proc.pid)  # a zombie: its counters are final
            self._ended_cpu_s += final.cpu_s if final is not None else self._live_cpu_s
            self._live_cpu_s = 0.0
            proc.wait()
            if proc.pid == self._doomed:
                self._start(resume=True)
                return False
            if proc.returncode != 0 and len(self.exits) < RESUMES_AFTER_EXIT and self._unfinished():
                self.exits.append(f"runner {proc.pid} exited with status {proc.returncode}, members unfinished")
                self._start(resume=True)
                return False
            self.returncode = proc.returncode
            self._proc = None
            return True

    def _unfinished(self) -> bool:
        """Whether the run exists (``resume`` can continue it) and a member has no result yet."""
        try:
            names = [m["name"] for m in json.loads((self.run_dir / "plan.json").read_text())["members"]]
        except (OSError, ValueError, KeyError):
            return False
        return any(not (self.run_dir / "members" / name / "result.json").exists() for name in names)

    def stop(self) -> None:
        """SIGKILL the runner for good (a run past its timeout)."""
        with self._lock:
            proc, self._proc = self._proc, None
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
