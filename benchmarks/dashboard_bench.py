"""The dashboard's cost: how soon its page first renders, and the CPU its server takes while a run goes on.

For runs of 100 and 1,000 members (``--full`` adds 3,000), written by ``synthetic_run.py`` as a
run writes them and kept growing while measured (every member logs ``--pace`` steps a second and
checkpoints every 200 steps):

- **first render**: a fresh headless Chromium (Debian's ``chromium`` and ``chromium-driver``)
  opens the printed URL; the time from navigation until the page says it has drawn everything in
  view, plots included (``document.body.dataset.rendered``), the median over rounds. Target: under
  2 s at 1,000 members, measured while the run grows (the members' lines are written by a thread
  of this process, on the same two cores). For information, the time until its tables (header,
  families, members) are drawn, before Plotly's 4.8 MB bundle has been compiled (``data-tables``),
  and the full render before anything is appended.
  The baseline beside it: ``resilient-flows status`` of the same run, the terminal's view, from
  start to exit.
- **server CPU**: with one page open and polling, the server process's CPU seconds over a window,
  as a share of one core, and as a share of the members' CPU, counting a member as one busy core
  (a training member keeps at least one). Target: under 1 %. The baseline beside it: what the
  terminal user does instead, ``resilient-flows status --json`` every 2 s over the same window;
  the ratio of the two is for information.

The default (and ``--full``) also measures a real run: the quick-start workflow trains while the
dashboard is open, and the server's CPU is compared with the CPU that the processes running its
members (the worker pids of the ``started`` events) used in the same window.

Run ``python benchmarks/dashboard_bench.py [--quick | --full] [--json PATH] [--rounds N]``:
``--quick``: 100 members, 3 rounds, a 10 s window (under a minute); default: 100 and 1,000
members, 5 rounds, 30 s windows, and the real run (a few minutes).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import harness
from harness import Clock, options, rounds_of, size_of, write_json
from report import judge, print_checks, print_figures
from synthetic_run import SyntheticRun, plan_run

REPO = Path(__file__).resolve().parents[1]
SIZES = {
    "quick": {"members": (100,), "rounds": 3, "window": 10.0, "real": False},
    "default": {"members": (100, 1000), "rounds": 5, "window": 30.0, "real": True},
    "full": {"members": (100, 1000, 3000), "rounds": 7, "window": 60.0, "real": True},
}
STEPS = 4000
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Server:
    """``resilient-flows dashboard RUN --port 0`` in a subprocess."""

    def __init__(self, run_dir: Path) -> None:
        command = [sys.executable, "-m", "resilient_flows.cli", "dashboard", str(run_dir), "--port", "0"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in self.process.stdout:
            match = re.search(r"(http://\S+/\?token=\S+)", line)
            if match:
                self.url = match.group(1)
                break
        else:
            raise RuntimeError(f"the dashboard of {run_dir} did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


#: Records, in the page, when it first marked its body: tables drawn, then everything in view.
WATCH = """
window.rfMarks = window.rfMarks || {};
const mark = () => {
  for (const key of ["tables", "rendered"]) {
    const seen = document.body && document.body.dataset[key];
    if (seen && !(key in window.rfMarks)) window.rfMarks[key] = performance.now();
  }
};
new MutationObserver(mark).observe(document, {attributes: true, subtree: true});
mark();
"""


def first_render_ms(url: str, deadline_s: float = 60.0) -> tuple[float, float]:
    """Milliseconds from navigation to the page's tables, and to its first full draw (plots
    included), in a fresh browser; each taken in the page when the body was marked."""
    driver = browser()
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
        driver.get(url)
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            marks = driver.execute_script("return window.rfMarks || {}")
            if "rendered" in marks and "tables" in marks:
                return float(marks["tables"]), float(marks["rendered"])
            time.sleep(0.05)
        raise RuntimeError(f"the page never said it rendered: {url}")
    finally:
        driver.quit()


def status_seconds(run_dir: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "resilient_flows.cli", "status", str(run_dir)], capture_output=True, check=False
    )
    return time.perf_counter() - start


def status_polling_cpu(run_dir: Path, window: float) -> float:
    """CPU seconds of ``status --json`` run every 2 s for ``window`` seconds (the terminal's live view)."""
    before = os.times()
    end = time.monotonic() + window
    while time.monotonic() < end:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "resilient_flows.cli", "status", "--json", str(run_dir)],
            capture_output=True,
            check=False,
        )
        time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


class Appender(threading.Thread):
    """Keeps the synthetic run growing: every member ``pace`` steps a second."""

    def __init__(self, run: SyntheticRun, pace: float) -> None:
        super().__init__(daemon=True)
        self.run_ = run
        self.pace = pace
        self.stop = threading.Event()
        run.step_s = 1 / pace

    def run(self) -> None:
        while not self.stop.is_set():
            self.run_.clock = time.time()
            self.run_.advance(max(1, round(self.pace)))
            self.stop.wait(max(0.0, 1.0 - (time.time() - self.run_.clock)))


def measure_size(root: Path, members: int, rounds: int, window: float, pace: float, out: Any) -> dict[str, float]:
    run_dir = root / f"run-{members}"
    run = SyntheticRun(run_dir, plan_run(run_dir, members, STEPS))
    run.clock = time.time() - STEPS * run.step_s
    run.advance(STEPS // 4)
    server = Server(run_dir)
    appender = Appender(run, pace)
    try:
        _, quiet = zip(*(first_render_ms(server.url) for _ in range(rounds)), strict=True)
        appender.start()
        tables, renders = zip(*(first_render_ms(server.url) for _ in range(rounds)), strict=True)
        statuses = [status_seconds(run_dir) for _ in range(rounds)]
        driver = browser()  # one page open and polling while the server's CPU is counted
        try:
            driver.get(server.url)
            before, started = cpu_seconds(server.process.pid), time.monotonic()
            time.sleep(window)
            server_cpu = cpu_seconds(server.process.pid) - before
            elapsed = time.monotonic() - started
        finally:
            driver.quit()
        polling_cpu = status_polling_cpu(run_dir, window)
    finally:
        appender.stop.set()
        if appender.is_alive():
            appender.join()
        server.close()
    out.print(f"  {members} members: tables {[round(t) for t in tables]} ms, full {[round(r) for r in renders]} ms")
    return {
        f"render_ms_{members}": statistics.median(renders),
        f"quiet_render_ms_{members}": statistics.median(quiet),
        f"tables_ms_{members}": statistics.median(tables),
        f"status_ms_{members}": 1000 * statistics.median(statuses),
        f"server_core_pct_{members}": 100 * server_cpu / elapsed,
        f"server_members_pct_{members}": 100 * server_cpu / (elapsed * members),
        f"status_poll_core_pct_{members}": 100 * polling_cpu / window,
    }


def member_pids(run_dir: Path) -> set[int]:
    """The processes that ran members so far: each ``started`` event names its worker's pid."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {int(e["pid"]) for e in map(json.loads, lines) if e.get("kind") == "started" and e.get("pid")}


class MemberCpu:
    """The CPU the member processes use from now on: each process counted from when it was first
    seen (a worker is idle until a member starts on it), its last reading kept when it ends."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.look()

    def look(self) -> None:
        for pid in member_pids(self.run_dir):
            try:
                now = cpu_seconds(pid)
            except (OSError, IndexError):
                continue  # ended: its last reading stands
            self.first.setdefault(pid, now)
            self.last[pid] = now

    def used(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.first)


def measure_real(root: Path, window: float, out: Any) -> dict[str, float]:
    """The quick-start workflow training with the dashboard open: the server's CPU against the CPU
    of the processes that ran its members, over the same window."""
    run_dir = root / "quickstart"
    command = [sys.executable, "-m", "resilient_flows.cli", "run", str(REPO / "workflows" / "quickstart.yaml")]
    runner = subprocess.Popen(
        [*command, "--run-dir", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=root
    )
    try:
        while not member_pids(run_dir):
            if runner.poll() is not None:
                raise RuntimeError("the quick-start run ended before a member started")
            time.sleep(0.2)
        server = Server(run_dir)
        driver = browser()
        try:
            driver.get(server.url)
            members = MemberCpu(run_dir)
            server_before, started = cpu_seconds(server.process.pid), time.monotonic()
            while time.monotonic() - started < window:
                time.sleep(0.25)
                members.look()
            elapsed = time.monotonic() - started
            server_cpu = cpu_seconds(server.process.pid) - server_before
        finally:
            driver.quit()
            server.close()
    finally:
        runner.wait(timeout=600)
    members_cpu = members.used()
    out.print(f"  quick-start: members {members_cpu:.1f} CPU s, server {server_cpu:.2f} CPU s in {elapsed:.0f} s")
    return {
        "real_members_cpu_s": members_cpu,
        "real_server_cpu_s": server_cpu,
        "real_window_s": elapsed,
    }


LABELS = {
    **{
        key.format(n=n): (section.format(n=n), unit, label.format(n=n))
        for n in (100, 1000, 3000)
        for key, section, unit, label in (
            ("tables_ms_{n}", "{n} members", "ms", "page's tables drawn ({n} members)"),
            ("render_ms_{n}", "{n} members", "ms", "page's first full render, plots too ({n} members)"),
            ("quiet_render_ms_{n}", "{n} members", "ms", "the same, nothing appended meanwhile ({n} members)"),
            ("status_ms_{n}", "{n} members", "ms", "`status` from start to exit ({n} members)"),
            ("server_core_pct_{n}", "{n} members", "% of a core", "server CPU, one page open ({n} members)"),
            ("server_members_pct_{n}", "{n} members", "%", "server CPU / members' CPU, a core each ({n} members)"),
            ("status_poll_core_pct_{n}", "{n} members", "% of a core", "`status --json` every 2 s ({n} members)"),
        )
    },
    "real_members_cpu_s": ("quick-start, real", "CPU s", "members' processes, in the window"),
    "real_server_cpu_s": ("quick-start, real", "CPU s", "dashboard server, in the window"),
    "real_window_s": ("quick-start, real", "s", "window"),
}


def main() -> int:
    parser, _ = options(__doc__, "100 members, 3 rounds, 10 s windows", "also 3,000 members, 7 rounds, 60 s windows")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--rounds", type=int, help="first renders per size (median)")
    parser.add_argument("--pace", type=float, default=5.0, help="steps per second each member logs while measured")
    args = parser.parse_args()
    size = SIZES[size_of(args)]
    rounds = rounds_of(parser, args.rounds, size["rounds"])
    out = harness.console()
    clock = Clock(out)
    figures: dict[str, float] = {}
    with harness.scratch("dashboard-") as root:
        for members in size["members"]:
            clock.phase(f"{members} members")
            figures |= measure_size(root, members, rounds, size["window"], args.pace, out)
        if size["real"]:
            clock.phase("the quick-start workflow, training")
            figures |= measure_real(root, min(size["window"], 20.0), out)
    ratios = []
    for n in size["members"]:
        ratios += [
            (
                f"render_{n}",
                f"first render, {n} members (s)",
                f"render_ms_{n}",
                "<=",
                "thousand",
                2.0 if n >= 1000 else None,
            ),
            (
                f"members_{n}",
                f"server CPU / members' CPU, {n} members (%)",
                f"server_members_pct_{n}",
                "<=",
                "one",
                1.0,
            ),
            (
                f"vs_status_{n}",
                f"server CPU / `status --json` every 2 s, {n}",
                f"server_core_pct_{n}",
                "<=",
                f"status_poll_core_pct_{n}",
                None,
            ),
        ]
    if "real_server_cpu_s" in figures:
        figures["real_server_members_pct"] = (
            100 * figures["real_server_cpu_s"] / max(figures["real_members_cpu_s"], 1e-9)
        )
        LABELS["real_server_members_pct"] = ("quick-start, real", "%", "server CPU / members' CPU")
        ratios.append(
            ("real", "quick-start: server CPU / members' CPU (%)", "real_server_members_pct", "<=", "one", 1.0)
        )
    checks = judge({**figures, "thousand": 1000.0, "one": 1.0}, ratios)
    print_figures(out, figures, LABELS)
    print_checks(out, checks)
    if args.json:
        write_json(args.json, {"size": size_of(args), "rounds": rounds, "figures": figures, "checks": checks})
    return 1 if harness.failed(checks) else 0


if __name__ == "__main__":
    sys.exit(main())
