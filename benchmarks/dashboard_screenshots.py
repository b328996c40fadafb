"""The docs' dashboard screenshots, and how long the page takes to draw a run.

Makes a quick-start run (real training, about 40 s) and a synthetic run of a thousand members
(``synthetic_run.py``), serves each with ``resilient-flows dashboard``, opens it in headless
Chromium at 1400x900, sorts the member table by failures and chooses the first member, and saves
``dashboard-quickstart.png`` and ``dashboard-1000.png``. Prints the seconds from navigation to the
page's first full draw (``data-rendered`` on its body), the server already started.

    python benchmarks/dashboard_screenshots.py [--out docs/images] [--work DIR] [--quickstart RUN_DIR]

Needs Debian's ``chromium`` and ``chromium-driver`` and selenium; reaches no network.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import synthetic_run
from dashboard_bench import Server, browser

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1400, 900


def screen_browser() -> Any:
    """The benchmark's headless Chromium, its screen exactly the screenshots' size."""
    driver = browser()
    metrics = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver


def until(driver: Any, script: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            raise SystemExit(f"the page did not get there: {script}")
        time.sleep(0.02)


def shoot(driver: Any, url: str, image: Path) -> float:
    """Save the page at ``url`` with a troubled member chosen as ``image``; seconds to its first draw."""
    driver.get("about:blank")
    started = time.monotonic()
    driver.get(url)
    until(driver, "return document.body.dataset.rendered")
    drawn = time.monotonic() - started
    failures = driver.find_element("css selector", '#members-table th[data-key="failures"]')
    failures.click()
    failures.click()  # the most failures first
    driver.find_element("css selector", "#members-table tbody tr").click()
    until(driver, "return (document.getElementById('detail-plot').data || []).length > 1")
    time.sleep(0.5)  # Plotly's transitions
    image.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(image))
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--work", type=Path, help="where the runs go (default: a temporary directory)")
    parser.add_argument("--quickstart", type=Path, help="a finished quick-start run to show instead of a new one")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="dashboard-shots-"))
    quickstart = args.quickstart
    if quickstart is None:
        quickstart = work / "quickstart"
        workflow = REPO / "workflows" / "quickstart.yaml"
        subprocess.run(
            [sys.executable, "-m", "resilient_flows.cli", "run", str(workflow), "--run-dir", str(quickstart)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    many = work / "synthetic-1000"
    if not many.exists():
        synthetic_run.main([str(many), "--members", "1000", "--steps", "2000"])
    driver = screen_browser()
    try:
        for run_dir, image in ((quickstart, "dashboard-quickstart.png"), (many, "dashboard-1000.png")):
            server = Server(run_dir)
            try:
                drawn = shoot(driver, url=server.url, image=args.out / image)
            finally:
                server.close()
            size = (args.out / image).stat().st_size
            print(f"{image}: first drawn {drawn:.2f} s after navigation, {size / 1024:.0f} KiB")
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
