"""The dashboard's page in a real headless Chromium: served live by ``resilient-flows dashboard``
and opened as a report file.

Debian's ``chromium`` and ``chromium-driver`` drive it through selenium; nothing is fetched from
the network (the page's Plotly is the installed package's). Run directories are written through
the library's own writers (``EventLog``, ``MetricsLog``, member specs), except the quick-start
run, which trains for real.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from dashboard_server import served
from requires import require, require_module

from resilient_flows.cli import main
from resilient_flows.rundir import EventLog, MetricsLog, member_layout
from resilient_flows.training import ParentSpec, read_spec, register_member
from resilient_flows.workflow._plan import plan_workflow
from resilient_flows.workflow._recorded_plan import create_run_dir
from resilient_flows.workflow.schema import load_workflow

webdriver = require_module("selenium.webdriver", "the dashboard's browser tests need selenium (pip install '.[test]')")
require(
    shutil.which("chromium") is not None and shutil.which("chromedriver") is not None,
    "the dashboard's browser tests need Chromium: apt-get install chromium chromium-driver",
)

#: Seconds a page may take to draw, on a loaded two-core machine.
DRAWN_S = 30
#: A member name that is markup: the page must show it as text and run none of it.
HOSTILE = "<img src=x onerror=window.__pwned=1>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium at 1400x900, its console kept."""
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,900")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The console's errors since the last call (reading the log empties it)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def open_page(driver: Any, url: str, generation: int = 1) -> None:
    """Open ``url`` and wait until the page has drawn ``generation`` or a later one. The page open
    before is left first and its console emptied: its last poll may fail on a server just stopped."""
    driver.get("about:blank")
    console_errors(driver)
    driver.get(url)
    wait_for(driver, f"return Number(document.body.dataset.rendered || 0) >= {generation}")


def wait_for(driver: Any, script: str, timeout: float = DRAWN_S) -> Any:
    """The first truthy result of ``script`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {script}")
        time.sleep(0.05)


def set_control(driver: Any, control: str, value: str, event: str) -> None:
    """Set the filter ``control`` to ``value`` as a user would, firing ``event``."""
    driver.execute_script(
        "const c = document.getElementById(arguments[0]); c.value = arguments[1];"
        "c.dispatchEvent(new Event(arguments[2]));",
        control,
        value,
        event,
    )


def click_row(driver: Any, name: str) -> None:
    driver.execute_script(
        "[...document.querySelectorAll('#members-table tbody tr')].find(tr => tr.dataset.name == arguments[0]).click()",
        name,
    )


def legend(driver: Any, plot: str) -> list[str]:
    """The names a plot shows in its legend."""
    return driver.execute_script(
        "const traces = document.getElementById(arguments[0]).data || [];"
        "return traces.filter(t => t.showlegend !== false).map(t => t.name);",
        plot,
    )


def table(driver: Any) -> list[dict[str, str]]:
    """The member table's rows on the current page: member name, state and loss as shown."""
    return driver.execute_script(
        """return [...document.querySelectorAll('#members-table tbody tr')].map(tr => ({
            name: tr.dataset.name,
            shown: tr.cells[0].textContent,
            state: tr.cells[2].textContent,
            loss: tr.cells[4].textContent,
        }));"""
    )


def make_run(root: Path, families: dict[str, int], steps: int = 50, logged: int = 10) -> Path:
    """A run of ``families`` (name -> members) that started and logged ``logged`` steps each, member
    k of the run at loss (k + 1) / (step + 1)."""
    source = root / "wf.yaml"
    members = "".join(
        f"  - {{name: {f}, workload: mlp-digits, steps: {steps}, count: {n}}}\n" for f, n in families.items()
    )
    source.write_text(f"name: browser\nmembers:\n{members}")
    plan = plan_workflow(load_workflow(source), build_site=False)
    run_dir = create_run_dir(root / "run", plan, source.read_text())
    for k, spec in enumerate(plan.members):
        start_member(run_dir, spec.name, [(k + 1) / (step + 1) for step in range(logged)])
    return run_dir


def start_member(run_dir: Path, name: str, losses: list[float]) -> None:
    """Member ``name`` started on block 0 and logged ``losses``, one a step."""
    events = EventLog(run_dir)
    events.emit("submitted", name)
    events.emit("started", name, attempt=1, host="node001", block="0")
    log_losses(run_dir, name, 0, losses)


def log_losses(run_dir: Path, name: str, first: int, losses: list[float]) -> None:
    log = MetricsLog(member_layout(run_dir, name).metrics)
    for step, loss in enumerate(losses, first):
        log.append({"step": step, "attempt": 1, "time": time.time(), "loss": loss})
    log.close()


# --------------------------------------------------------------------------- a real quick-start run


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick-start workflow, shortened: two members of a few hundred steps, one killed and resumed."""
    document = yaml.safe_load((REPO / "workflows" / "quickstart.yaml").read_text())
    document["checkpoint"]["interval"] = 100
    document["members"][0].update(steps=400, seeds=[0, 1])
    document["faults"] = [{"kill": "cnn-1", "at_step": 250}]
    del document["analytics"]
    root = tmp_path_factory.mktemp("quickstart")
    (root / "wf.yaml").write_text(yaml.safe_dump(document))
    assert main(["run", str(root / "wf.yaml"), "--run-dir", str(root / "run")]) == 0
    return root / "run"


@pytest.mark.slow
def test_a_quick_start_run_shows_every_member_served_and_from_its_report_file(
    browser: Any, quickstart_run: Path, tmp_path: Path
) -> None:
    with served(quickstart_run) as url:
        open_page(browser, url)
        assert console_errors(browser) == []
        rows = {row["name"]: row["state"] for row in table(browser)}
        assert rows == {"cnn-0": "finished", "cnn-1": "finished"}
        browser.find_element("css selector", '#members-table tr[data-name="cnn-1"]').click()
        # the member's own details: two attempts, the failure and the resume marked on its curve
        wait_for(browser, "return document.querySelectorAll('#detail-attempts tbody tr').length == 2")
        marks = wait_for(
            browser,
            """const traces = document.getElementById('detail-plot').data || [];
               const names = traces.map(t => t.name);
               return names.includes('failed') && names.includes('resumed') && names;""",
        )
        assert "loss" in marks
        assert browser.find_element("id", "run-name").text == "quickstart"
        assert console_errors(browser) == []

    assert main(["dashboard", str(quickstart_run), "--report", str(tmp_path / "report")]) == 0
    open_page(browser, (tmp_path / "report" / "index.html").as_uri())
    assert console_errors(browser) == []
    assert {row["name"]: row["state"] for row in table(browser)} == {"cnn-0": "finished", "cnn-1": "finished"}
    assert "report written at" in browser.find_element("id", "run-facts").text


# --------------------------------------------------------------------------- run directories written here


def test_without_its_token_the_server_answers_403_to_every_request(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"m": 2})
    with served(run_dir) as url:
        base = url.split("?")[0]
        for path in ("", "?token=wrong", "api/run", "api/member/m-0", "assets/dashboard.js", "assets/plotly.min.js"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 403, path
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and b"rf-data" not in page.read()


def test_the_table_sorts_by_any_column_filters_and_pages_under_a_damage_warning(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"a": 70, "b": 50})  # a-k's loss grows with k; b's after all of a's
    EventLog(run_dir).emit("failed", "b-3", attempt=1, error="RuntimeError: boom", cause="crashed")
    with (run_dir / "events.jsonl").open("a") as events:
        events.write("{not json\n")
    with served(run_dir) as url:
        open_page(browser, url)
        damage = browser.find_element("id", "damage").text
        assert "events.jsonl: 1 damaged line" in damage, damage
        rows = table(browser)
        assert len(rows) == 100 and rows[0]["name"] == "a-0" and rows[1]["name"] == "a-1"  # natural order
        assert browser.find_element("id", "page-info").text == "1\N{EN DASH}100 of 120"
        browser.find_element("id", "page-next").click()
        assert [row["name"] for row in table(browser)] == [f"b-{k}" for k in range(30, 50)]

        loss = browser.find_element("css selector", '#members-table th[data-key="loss"]')
        loss.click()
        assert [row["name"] for row in table(browser)][:3] == ["a-0", "a-1", "a-2"]  # back on page 1
        loss.click()
        assert [row["name"] for row in table(browser)][:3] == ["b-49", "b-48", "b-47"]
        state = browser.find_element("css selector", '#members-table th[data-key="state"]')
        state.click()
        state.click()  # descending: failed before running
        assert table(browser)[0] == {"name": "b-3", "shown": "b-3", "state": "failed", "loss": "7.400"}

        browser.find_element("id", "filter-name").send_keys("B-4")
        assert sorted(row["name"] for row in table(browser)) == ["b-4", *(f"b-4{k}" for k in range(10))]
        assert browser.find_element("id", "page-info").text == "1\N{EN DASH}11 of 11 (filtered from 120)"
        set_control(browser, "filter-name", "", "input")
        set_control(browser, "filter-state", "failed", "change")
        assert [row["name"] for row in table(browser)] == ["b-3"]
        set_control(browser, "filter-state", "", "change")
        set_control(browser, "filter-family", "a", "change")
        assert browser.find_element("id", "page-info").text == "1\N{EN DASH}70 of 70 (filtered from 120)"
        assert console_errors(browser) == []


def test_chosen_rows_draw_their_own_curves_and_details(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"a": 5})
    with served(run_dir) as url:
        open_page(browser, url)
        # none chosen: the family's median and its three best members
        assert legend(browser, "curves-plot") == ["a-0", "a-1", "a-2", "a median (5)"]
        click_row(browser, "a-4")
        click_row(browser, "a-3")
        deadline = time.monotonic() + DRAWN_S
        while legend(browser, "curves-plot") != ["a-4", "a-3", "a median (5)"]:  # their details fetched
            assert time.monotonic() < deadline, legend(browser, "curves-plot")
            time.sleep(0.05)
        assert browser.find_element("css selector", "#detail-title .name").text == "a-3"
        chosen = browser.find_elements("css selector", "#members-table tr.chosen")
        assert [row.get_attribute("data-name") for row in chosen] == ["a-3", "a-4"]
        click_row(browser, "a-3")  # not chosen any more: the details show the other one
        wait_for(browser, "return document.querySelector('#detail-title .name').textContent == 'a-4'")
        browser.find_element("id", "clear-chosen").click()
        assert browser.find_element("id", "detail-empty").is_displayed()
        assert console_errors(browser) == []


def test_a_new_state_and_loss_appear_within_five_seconds_of_being_written(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"m": 3})
    with served(run_dir) as url:
        open_page(browser, url)
        assert {row["state"] for row in table(browser)} == {"running"}
        written = time.monotonic()
        EventLog(run_dir).emit("failed", "m-2", attempt=1, error="RuntimeError: out of patience", cause="crashed")
        log_losses(run_dir, "m-0", 10, [0.000123456])
        wait_for(
            browser,
            """const rows = [...document.querySelectorAll('#members-table tbody tr')];
               return rows.some(tr => tr.dataset.name == 'm-2' && tr.cells[2].textContent == 'failed');""",
            timeout=10,
        )
        wait_for(
            browser,
            "return document.getElementById('curves-plot').data.some(t => t.y.includes(0.000123456))",
            timeout=10,
        )
        took = time.monotonic() - written
        assert took < 5, f"the page showed what was written after {took:.1f} s"
        assert {row["name"]: row["loss"] for row in table(browser)}["m-0"] == "1.23e-4"
        browser.execute_script("document.getElementById('timeline-panel').scrollIntoView()")  # drawn when seen
        wait_for(browser, "return document.getElementById('timeline-plot').data")
        assert legend(browser, "timeline-plot") == ["failed"]
        assert console_errors(browser) == []


def test_the_server_gone_shows_a_banner_and_the_page_keeps_what_it_had(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"m": 2})
    with served(run_dir) as url:
        open_page(browser, url)
    banner = wait_for(
        browser, "const b = document.getElementById('banner'); return !b.hidden && b.textContent", timeout=10
    )
    assert "does not answer" in banner and "retrying" in banner
    assert [row["name"] for row in table(browser)] == ["m-0", "m-1"]
    assert browser.find_element("id", "live-text").text == "disconnected"


def clone(run_dir: Path, parent: str, name: str, step: int) -> None:
    """Register ``name`` as a clone of ``parent`` seeded at ``step``, as the clone command does."""
    spec = read_spec(run_dir, parent)
    assert spec is not None
    register_member(run_dir, dataclasses.replace(spec, name=name, parent=ParentSpec(parent, "r1", {"lr": 0.1}, 0.0)))
    member_layout(run_dir, name).write_seed({"parent": parent, "step": step, "transport": "p2p"})


def test_lineage_tuning_and_decisions_show_what_the_run_recorded(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"m": 2})
    with served(run_dir) as url:
        open_page(browser, url)
        for panel in ("lineage-tree", "tuned-table", "decisions-table"):
            assert browser.find_element("id", panel).text.endswith("none in this run")

    for k in range(3):
        clone(run_dir, "m-0", f"m-0.c{k}", step=5)
    clone(run_dir, "m-0.c0", "m-0.c0.c0", step=8)
    for k in range(40):  # a large tree: shown folded
        clone(run_dir, "m-1", f"m-1.c{k}", step=7)
    events = EventLog(run_dir)
    events.emit("tuned", "m-0", step=20, interval_s=12.5, shared_every=4, params={"mtbf_s": 3600}, observed={})
    events.emit("ondemand", None, request="peek", slots=1, policy="dp", free=0, jobs=[{}, {}], preempt=["m-1"], cost=3)
    with served(run_dir) as url:
        open_page(browser, url)
        tree = browser.find_element("id", "lineage-tree")
        assert browser.find_element("id", "lineage-note").text == "46 members in 2 trees, collapsed"
        assert tree.text.splitlines() == ["m-0 3 clones", "m-1 40 clones"]
        browser.find_element("css selector", "#lineage-tree summary").click()
        wait_for(browser, "return document.getElementById('lineage-tree').innerText.split('\\n').length > 2")
        assert tree.text.splitlines()[1:5] == [
            "m-0.c0 at step 5 · via p2p · lr=0.1 · 1 clone",
            "m-0.c1 at step 5 · via p2p · lr=0.1",
            "m-0.c2 at step 5 · via p2p · lr=0.1",
            "m-1 40 clones",
        ]
        tree.find_element("xpath", ".//button[text()='m-0.c2']").click()  # chooses the member
        wait_for(browser, "return document.querySelector('#detail-title .name').textContent == 'm-0.c2'")
        tuned = browser.find_element("id", "tuned-table").text.splitlines()
        assert tuned[1].split()[1:] == ["m-0", "20", "12.5", "4", "mtbf_s=3600", "—"]
        decisions = browser.find_element("id", "decisions-table").text.splitlines()
        assert decisions[1].split()[1:] == ["peek", "1", "dp", "0", "2", "preempt", "m-1", "3"]
        assert console_errors(browser) == []


def test_a_member_named_with_markup_shows_as_text_served_and_in_a_report(browser: Any, tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, {"m": 2})
    register_member(run_dir, dataclasses.replace(read_spec(run_dir, "m-0"), name=HOSTILE))
    start_member(run_dir, HOSTILE, [0.5, 0.01])  # the best member: drawn on the curves too
    EventLog(run_dir).emit("failed", HOSTILE, attempt=1, error=f"ValueError: {HOSTILE}", cause="crashed")

    def shows_it_as_text() -> None:
        rows = {row["name"]: row for row in table(browser)}
        assert rows[HOSTILE]["shown"] == HOSTILE
        # the best member, drawn: named to Plotly escaped, shown as the text it is
        assert html.escape(HOSTILE, quote=False) in legend(browser, "curves-plot")
        assert HOSTILE in browser.find_element("id", "curves-plot").text
        click_row(browser, HOSTILE)
        wait_for(browser, f"return document.querySelector('#detail-title .name').textContent == {json.dumps(HOSTILE)}")
        assert f"ValueError: {HOSTILE}" in browser.find_element("id", "detail-facts").text
        assert browser.find_elements("css selector", "img") == []
        assert browser.execute_script("return window.__pwned") is None

    with served(run_dir) as url:
        open_page(browser, url)
        shows_it_as_text()
        assert console_errors(browser) == []
    assert main(["dashboard", str(run_dir), "--report", str(tmp_path / "report")]) == 0
    open_page(browser, (tmp_path / "report" / "index.html").as_uri())
    shows_it_as_text()
    assert console_errors(browser) == []
