"""The dashboard's model and server, without a browser (tests/test_dashboard_browser.py drives the page).

The sampled curves are checked against every line read (the points they keep are the log's own,
the curve a resumed attempt replaces is dropped), the family bands against percentiles computed
by brute force, the documents against a run written with the library's own writers, and the
server's token, its answers and its assets through real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dashboard_server import served
from test_views import append, make_run

from resilient_flows.cli import main
from resilient_flows.rundir import member_layout
from resilient_flows.training import MemberSpec, ParentSpec, register_member
from resilient_flows.workflow.dashboard import RunModel, dashboard_app, write_dashboard_report
from resilient_flows.workflow.dashboard._curves import LossSampler, family_band
from resilient_flows.workflow.dashboard._page import page_html
from resilient_flows.workflow.dashboard._server import SECURITY_HEADERS, server_name


def write_metrics(path: Path, records: list[dict]) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def line(step: int, attempt: int = 1, loss: float | None = None) -> dict:
    return {"step": step, "attempt": attempt, "time": 100.0 + step, "loss": 1.0 / (step + 2) if loss is None else loss}


@pytest.mark.parametrize("steps", [50, 5000, 200_000])  # one read, one read with sampling, reads per point
def test_a_sampled_curve_keeps_lines_of_the_log_within_its_budget_and_ends_at_the_newest(
    tmp_path: Path, steps: int
) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, [line(s) for s in range(steps)])
    sampler = LossSampler(path, points=64)
    assert sampler.update()
    got_steps, losses = sampler.curve()
    assert got_steps[-1] == steps - 1 and got_steps == sorted(set(got_steps))
    assert losses == [1.0 / (s + 2) for s in got_steps]  # each point is its line, exactly
    assert min(steps, 2) <= len(got_steps) <= 2 * 64 + 1
    if steps > 64:  # spread over the whole log, not bunched at one end
        assert max(np.diff(got_steps)) <= 4 * steps / 64
    assert not sampler.update()  # nothing new


def test_a_sampled_curve_follows_appends_and_keeps_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    sampler = LossSampler(path, points=32)
    assert not sampler.update()  # no log yet
    for start in range(0, 20_000, 1000):
        write_metrics(path, [line(s) for s in range(start, start + 1000)])
        assert sampler.update()
        steps, losses = sampler.curve()
        assert steps[-1] == start + 999 and len(steps) <= 2 * 32 + 1
        assert losses == [1.0 / (s + 2) for s in steps]
    assert max(np.diff(steps)) <= 4 * 20_000 / 32
    assert sampler.rate() == pytest.approx(1.0)  # one step per second of its times


def test_a_resumed_attempt_replaces_the_steps_it_redoes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    write_metrics(path, [line(s, loss=5.0) for s in range(300)])  # the first attempt reached 299
    sampler = LossSampler(path, points=1000)
    sampler.update()
    write_metrics(path, [line(s, attempt=2, loss=1.0) for s in range(200, 400)])  # resumed from 199
    sampler.update()
    steps, losses = sampler.curve()
    assert steps == list(range(400))
    assert losses == [5.0] * 200 + [1.0] * 200
    assert sampler.newest is not None and sampler.newest.attempt == 2 and sampler.attempt_began[2].step == 200


def test_a_partial_last_line_waits_and_damaged_lines_are_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(line(0)) + "\nnot json\n" + '{"step": "x"}\n' + json.dumps(line(1))[:10])
    sampler = LossSampler(path, points=1000)
    sampler.update()
    assert sampler.curve() == ([0], [0.5])
    with path.open("a") as f:
        f.write(json.dumps(line(1))[10:] + "\n")
    sampler.update()
    assert sampler.curve() == ([0, 1], [0.5, 1 / 3])


def test_a_family_band_is_the_percentiles_of_the_members_at_each_grid_step() -> None:
    rng = np.random.default_rng(0)
    curves = []
    for k in range(9):
        steps = sorted(rng.choice(np.arange(1, 1000), size=40, replace=False).tolist())
        curves.append(([0, *steps], [float(v) for v in rng.random(41) + k]))
    band = family_band(curves, grid_steps=50)
    assert band is not None and band.count == 9
    for i, step in enumerate(band.steps):
        values = [np.interp(step, s, v) for s, v in curves if s[0] <= step <= s[-1]]
        assert band.p50[i] == pytest.approx(np.percentile(values, 50))
        assert band.p10[i] == pytest.approx(np.percentile(values, 10))
        assert band.p90[i] == pytest.approx(np.percentile(values, 90))
    assert family_band([([3], [1.0])]) is None  # a single point is no curve


def checkpoints_heartbeat(run_dir: Path, name: str, step: int) -> None:
    tier = member_layout(run_dir, name).checkpoints
    tier.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "committed": 50.0, "written": 50.0, "host": "n1", "pid": 1}
    (tier / "checkpoint-heartbeat.json").write_text(json.dumps({**record, "format": "resilient-flows-heartbeat/1"}))


def test_the_document_says_what_the_run_did(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 4, running=2)  # m-0, m-1 at step 9; m-2, m-3 finished
    append(
        run_dir,
        [
            {"time": 3.0, "kind": "started", "member": "m-0", "attempt": 1, "host": "n1", "block": "0"},
            {"time": 4.0, "kind": "checkpointed", "member": "m-0", "step": 4, "stall_ms": 2.0},
            {"time": 5.0, "kind": "checkpointed", "member": "m-0", "step": 9, "stall_ms": 4.0},
            {"time": 6.0, "kind": "failed", "member": "m-1", "attempt": 1, "error": "WorkerLost: <b>gone</b>"},
            {"time": 6.5, "kind": "retried", "member": "m-1", "attempt": 2, "from_step": 4},
            {"time": 7.0, "kind": "ondemand", "member": None, "request": "viz", "slots": 1, "policy": "dp"},
            {"time": 8.0, "kind": "tuned", "member": "m-0", "step": 9, "interval_s": 30.0, "shared_every": 4},
        ],
    )
    checkpoints_heartbeat(run_dir, "m-0", 4)
    parent = ParentSpec("m-0", "r1", {"lr": 0.5}, 1.0)
    register_member(run_dir, MemberSpec("m-0.c1", "mlp-digits", {}, steps=50, parent=parent, family="m"))
    member_layout(run_dir, "m-0.c1").write_seed({"parent": "m-0", "step": 4, "transport": "p2p"})

    model = RunModel(run_dir)
    assert model.update() == 1
    doc = model.document()
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc
    rows = {row["name"]: row for row in doc["members"]}
    assert list(rows) == ["m-0", "m-1", "m-2", "m-3", "m-0.c1"]
    assert rows["m-0"]["checkpoint"] == {"node": 9, "shared": 4} and rows["m-0"]["saves"] == 2
    assert rows["m-0"]["stall_ms_median"] == 3.0 and rows["m-0"]["host"] == "n1" and rows["m-0"]["block"] == "0"
    assert rows["m-1"]["state"] == "retrying" and rows["m-1"]["retries"] == 1
    assert rows["m-1"]["error"] == "WorkerLost: <b>gone</b>"  # as written: the page shows it as text
    assert rows["m-3"]["state"] == "finished" and rows["m-3"]["steps_done"] == 50 and rows["m-0.c1"]["parent"] == "m-0"
    (family,) = doc["families"]
    assert family["members"] == 5 and family["states"]["finished"] == 2 and family["failures"] == 1
    assert family["steps_done"] == 10 + 10 + 50 + 50 and family["steps_total"] == 250
    assert [(e["kind"], e["member"]) for e in doc["timeline"]] == [
        ("failed", "m-1"),
        ("retried", "m-1"),
        ("ondemand", None),
        ("tuned", "m-0"),
    ]
    assert doc["blocks"] == {"0": ["n1"]}
    assert doc["run"]["started"] == 1.0 and doc["run"]["last_event"] == 60.0  # the newest, not the last line
    assert [s["stall_ms"] for s in doc["saves"]] == [2.0, 4.0]
    assert doc["tuned"][0]["interval_s"] == 30.0 and doc["decisions"][0]["request"] == "viz"
    clone = next(e for e in doc["lineage"] if e["name"] == "m-0.c1")
    assert clone == {"name": "m-0.c1", "parent": "m-0", "overrides": {"lr": 0.5}, "step": 4, "transport": "p2p"}
    assert doc["highlighted"]["m"] == ["m-3", "m-2", "m-1"]  # lowest newest loss: 1/53, 1/52, 1/11
    assert doc["curves"]["m-3"]["steps"][-1] == 49

    assert model.update() == 1 and model.document() is doc  # nothing new: the same document
    append(run_dir, [{"time": 9.0, "kind": "finished", "member": "m-0", "step": 9}])
    assert model.update() == 2
    assert next(r for r in model.document()["members"] if r["name"] == "m-0")["state"] == "finished"


def test_a_member_s_details_place_its_failures_at_its_last_logged_step(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)  # m-0 logged steps 0..9 in attempt 1
    append(
        run_dir,
        [
            {"time": 6.0, "kind": "failed", "member": "m-0", "attempt": 1, "error": "boom"},
            {"time": 7.0, "kind": "resumed", "member": "m-0", "attempt": 2, "step": 4, "bytes_from": {"shared": 10}},
        ],
    )
    write_metrics(member_layout(run_dir, "m-0").metrics, [line(s, attempt=2) for s in range(5, 12)])
    model = RunModel(run_dir)
    model.update()
    details = model.member("m-0")
    assert details is not None and model.member("nobody") is None
    assert details["curve"]["steps"] == list(range(12))
    assert [(m["kind"], m["step"]) for m in details["markers"]] == [("failed", 9), ("resumed", 4)]
    assert [(a["attempt"], a["first_step"], a["last_step"]) for a in details["attempts"]] == [(1, 0, 9), (2, 5, 11)]
    assert details["markers"][1]["text"] == "from step 4 (shared: 10 B)"


def test_a_diverged_loss_is_null_in_what_the_server_sends(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    write_metrics(member_layout(run_dir, "m-0").metrics, [{"step": 10, "attempt": 1, "time": 20.0, "loss": math.nan}])
    with served(run_dir) as url:
        base, token = url.split("/?token=")
        body = get(f"{base}/api/run?token={token}")
        doc = json.loads(body, parse_constant=lambda name: pytest.fail(f"{name} in the document"))
        assert doc["members"][0]["loss"] is None
        details = json.loads(get(f"{base}/api/member/m-0?token={token}"))
        assert details["curve"]["steps"][-1] == 10 and details["curve"]["loss"][-1] is None


def get(url: str, headers: dict[str, str] | None = None) -> str:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
        return response.read().decode()


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_server_needs_its_token_and_serves_only_its_assets(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 3, running=1)
    with served(run_dir) as url:
        base, token = url.split("/?token=")
        assert base.startswith("http://127.0.0.1:")  # localhost unless --host says otherwise
        for path in ("/", "/api/run", "/api/member/m-0", "/assets/dashboard.js"):
            assert status_of(base + path) == 403
            assert status_of(f"{base}{path}?token=wrong") == 403
            assert status_of(base + path, {"X-RF-Token": token}) == 200
        with urllib.request.urlopen(f"{base}/?token={token}", timeout=30) as response:
            cookie = response.headers["Set-Cookie"]
            name = base.rsplit("/", 1)[1]  # the server's own: its path and its cookie's name
            assert cookie.startswith(f"rf_dashboard_{name}=") and f"Path=/{name}/" in cookie
            assert "HttpOnly" in cookie and "SameSite=strict" in cookie
            assert "<!-- rf-data -->" not in response.read().decode()
        with_cookie = {"Cookie": cookie.split(";")[0]}
        assert status_of(f"{base}/api/run", with_cookie) == 200
        for name in ("page.html", "..%2F_server.py", "%2Fetc%2Fpasswd", "x.js"):
            assert status_of(f"{base}/assets/{name}", with_cookie) == 404
        plotly_size = len(get(f"{base}/assets/plotly.min.js", with_cookie))
        assert plotly_size > 1_000_000  # Plotly's own bundle, served from the installed package
        doc = json.loads(get(f"{base}/api/run", with_cookie))
        assert [m["name"] for m in doc["members"]] == ["m-0", "m-1", "m-2"]
        unchanged = json.loads(get(f"{base}/api/run?since={doc['generation']}", with_cookie))
        assert unchanged == {"version": 1, "generation": doc["generation"], "unchanged": True}
        assert status_of(f"{base}/api/member/nobody", with_cookie) == 404
        append(run_dir, [{"time": 70.0, "kind": "finished", "member": "m-0", "step": 49}])
        time.sleep(1.1)  # the server looks at the run at most once a second
        changed = json.loads(get(f"{base}/api/run?since={doc['generation']}", with_cookie))
        assert changed["generation"] > doc["generation"] and changed["members"][0]["state"] == "finished"


def test_a_port_in_use_and_a_directory_that_is_no_run_are_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["dashboard", str(tmp_path)]) == 2
    assert "plan.json" in capsys.readouterr().err
    run_dir, _ = make_run(tmp_path, 2, running=0)
    with served(run_dir) as url:
        base = url.split("/?token=")[0]
        port = base.split(":")[2].split("/")[0]
        assert main(["dashboard", str(run_dir), "--port", port]) == 2
        err = capsys.readouterr().err
        assert f"cannot listen on 127.0.0.1:{port}" in err and "--port 0" in err


def test_the_report_page_carries_the_run_and_cannot_be_broken_out_of(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=0)
    append(run_dir, [{"time": 6.0, "kind": "failed", "member": "m-0", "attempt": 1, "error": "</script><script>x()"}])
    page = write_dashboard_report(run_dir, run_dir / "report" / "index.html")
    html = page.read_text()
    data = re.search(r'<script id="rf-data" type="application/json">(.*?)</script>', html, re.S)
    assert data is not None and "</script><script>x()" not in html
    embedded = json.loads(data.group(1))
    assert [m["name"] for m in embedded["document"]["members"]] == ["m-0", "m-1"]
    assert embedded["document"]["members"][0]["error"] == "</script><script>x()"
    assert embedded["members"]["m-1"]["curve"]["steps"][-1] == 49
    sample = embedded["members"]["m-0"]  # from the sampled lines: each attempt's first and last
    assert [(a["attempt"], a["first_step"], a["last_step"]) for a in sample["attempts"]] == [(1, 0, 49)]
    assert [(m["kind"], m["step"]) for m in sample["markers"]] == [("failed", 49)]
    for asset in ("plotly.min.js", "dashboard-look.js", "dashboard.js", "dashboard.css"):
        assert (page.parent / "assets" / asset).stat().st_size > 0
    assert page_html().count("<script") == 3  # the live page: Plotly and our two, no data


def test_the_dashboard_command_writes_the_report_page(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=0)
    assert main(["dashboard", str(run_dir), "--report"]) == 0
    assert (run_dir / "report" / "index.html").is_file()
    assert main(["dashboard", str(run_dir), "--report", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "index.html").is_file() and (tmp_path / "elsewhere" / "assets").is_dir()
    assert "no server needed" in capsys.readouterr().out


# ---------------------------------------------------------------------- what the server answers, in-process


def ask(app: Any, path: str, query: str = "", token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One GET answered by the ASGI application ``app``: status, headers (lower-case names), body."""
    sent: list[dict] = []
    headers = [] if token is None else [(b"x-rf-token", token.encode())]

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": headers,
        "server": ("127.0.0.1", 8050),
        "client": ("127.0.0.1", 40000),
    }
    with contextlib.suppress(RuntimeError):  # an error the application let out, after its 500
        asyncio.run(app(scope, receive, send))
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


def test_every_answer_carries_the_security_headers_refusals_and_errors_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    model = RunModel(run_dir)
    model.update()
    app = dashboard_app(model, "t0ken", "d1")

    def broken(name: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(model, "member", broken)
    answers = {
        200: ask(app, "/d1/api/run", token="t0ken"),
        403: ask(app, "/d1/api/run"),
        404: ask(app, "/d1/assets/x.js", token="t0ken"),
        500: ask(app, "/d1/api/member/m-0", token="t0ken"),
    }
    for status, (found, headers, _) in answers.items():
        assert found == status
        assert {name.lower(): headers.get(name.lower()) for name in SECURITY_HEADERS} == {
            name.lower(): value for name, value in SECURITY_HEADERS.items()
        }, status
        assert headers["cache-control"] == ("no-cache" if status == 404 else "no-store")  # an asset's rule
    assert "default-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]
    assert SECURITY_HEADERS["X-Content-Type-Options"] == "nosniff"


def test_two_servers_cookies_have_names_of_their_own(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    model = RunModel(run_dir)
    model.update()
    cookies = []
    for _ in range(2):
        name = server_name()
        app = dashboard_app(model, "t0ken", name)
        status, headers, _ = ask(app, f"/{name}/", query="token=t0ken")
        assert status == 200
        cookie = headers["set-cookie"]
        assert cookie.startswith(f"rf_dashboard_{name}=t0ken;") and f"Path=/{name}/" in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        cookies.append(cookie.split(";")[0])
        assert ask(app, f"/{name}/api/run")[0] == 403  # no token, no cookie
        assert _ask_with(app, f"/{name}/api/run", [(b"cookie", cookie.split(";")[0].encode())])[0] == 200
        assert _ask_with(app, f"/{name}/api/run", [(b"cookie", b"rf_dashboard_token=t0ken")])[0] == 403  # not its own
        assert ask(app, "/api/run", token="t0ken")[0] == 404  # nothing outside its path
    assert cookies[0] != cookies[1] and all(re.fullmatch(r"rf_dashboard_[0-9a-f]{16}=t0ken", c) for c in cookies)


def _ask_with(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, str], bytes]:
    """:func:`ask` with the request's headers as given."""
    original = headers

    async def call(scope: dict, receive: Any, send: Any) -> None:
        await app({**scope, "headers": original}, receive, send)

    return ask(call, path)


def test_a_link_out_of_the_run_is_not_served(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path, 2, running=1)
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"member": "m-1", "step": 49, "loss": 0.5, "secret": "not the run\'s"}')
    result = member_layout(run_dir, "m-1").result
    result.unlink()
    result.symlink_to(outside)
    metrics = member_layout(run_dir, "m-0").metrics
    (tmp_path / "elsewhere.jsonl").write_text(json.dumps({"step": 0, "loss": 1.0, "secret": "x"}) + "\n")
    metrics.unlink()
    metrics.symlink_to(tmp_path / "elsewhere.jsonl")
    model = RunModel(run_dir)
    model.update()
    app = dashboard_app(model, "t0ken", "d1")
    bodies = [ask(app, "/d1" + path, token="t0ken") for path in ("/api/run", "/api/member/m-0", "/api/member/m-1")]
    assert [status for status, _, _ in bodies] == [200, 200, 200]
    assert all(b"secret" not in body for _, _, body in bodies)
    document = json.loads(bodies[0][2])
    assert [(d["file"], d["problem"]) for d in document["damage"]] == [
        ("members/m-0/metrics.jsonl", "a symbolic link, not followed"),
        ("members/m-1/result.json", "a symbolic link, not followed"),
    ]
