"""A rank's keepalive to its peer's node (``resilient_flows.training._peerwatch``): a silent node is
told from a peer process that is gone, and the node watcher records a silent node as lost."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from resilient_flows.training import _nodewatch
from resilient_flows.training._faults import PEER_LOST, record_fault, record_silent_peer
from resilient_flows.training._peerwatch import PeerWatch, start_helper

pytestmark = pytest.mark.timeout(60)


def _watch(port: int, silent_s: float) -> tuple[PeerWatch, list[tuple[str, str]], threading.Event]:
    """A watch of ``127.0.0.1:port`` whose ``on_silent`` records its call and sets the event."""
    calls: list[tuple[str, str]] = []
    called = threading.Event()

    def on_silent(host: str, reason: str) -> None:
        calls.append((host, reason))
        called.set()

    return PeerWatch("127.0.0.1", port, silent_s, on_silent), calls, called


def test_a_peer_whose_node_accepts_but_never_answers_is_silent() -> None:
    """A stopped node's kernel still completes the connection; nothing echoes: silent."""
    with socket.create_server(("127.0.0.1", 0)) as stopped:
        watch, calls, called = _watch(stopped.getsockname()[1], silent_s=0.3)
        watch.start()
        assert called.wait(30)
        watch.stop()
    assert calls == [("127.0.0.1", "no answer to its keepalive for 0.3 s")]


def test_a_peer_process_that_is_gone_or_hangs_up_is_not_a_silent_node() -> None:
    """Refused (the process gone, its node answering), or a hang-up after answering: the watch
    stops without calling the peer's node silent; its collectives see the closed connection."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        watch, calls, _ = _watch(closed.getsockname()[1], silent_s=0.3)
        watch.start()
        watch._thread.join(30)
    assert not watch._thread.is_alive() and calls == []

    helper, port = start_helper()
    assert helper is not None and port is not None
    watch, calls, _ = _watch(port, silent_s=30.0)
    watch.start()
    while watch.echoes < 2 and watch._thread.is_alive():
        watch._thread.join(0.1)
    helper.kill()  # the peer dies: its node closes the connection
    helper.wait()
    watch._thread.join(30)
    assert watch.echoes >= 2 and not watch._thread.is_alive() and calls == []


def test_the_helper_echoes_and_ends_with_the_rank_that_started_it() -> None:
    rank = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from resilient_flows.training._peerwatch import start_helper; "
            "helper, port = start_helper(); print(helper.pid, port, flush=True); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid, port = (int(word) for word in rank.stdout.readline().split())
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"ab")
        assert connection.recv(2) == b"ab"
    rank.kill()
    rank.wait()
    for _ in range(200):  # the helper looks at its parent every 0.5 s
        if _gone(pid):
            break
        threading.Event().wait(0.1)
    else:
        pytest.fail(f"the helper {pid} outlived its rank")


def _gone(pid: int) -> bool:
    """Whether ``pid`` exited (a zombie that its new parent has not reaped yet counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_silent_peer_is_recorded_with_its_host_unless_the_attempt_recorded_its_failure(tmp_path: Path) -> None:
    member = tmp_path / "m"
    member.mkdir()
    (member / "attempts").write_text("3")
    record_silent_peer(member, 0, "n2", "the node n2 of the next rank went silent")
    fault = json.loads((member / "fault.json").read_text())
    assert (fault["attempt"], fault["kind"], fault["rank"], fault["silent_hosts"]) == (3, PEER_LOST, 0, ["n2"])
    other = tmp_path / "o"
    other.mkdir()
    (other / "attempts").write_text("1")
    record_fault(other, 1, ValueError("a bug in the workload"))
    record_silent_peer(other, 0, "n2", "silent")
    assert json.loads((other / "fault.json").read_text())["kind"] == "error"


def test_the_node_watcher_records_a_silent_node_that_its_probe_finds_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped node's slurmd port still accepts: the probe finds none dead, the rank's word
    that the node is silent makes it lost (and only a node of the block)."""
    nodefile, member, run_dir = tmp_path / "nodefile", tmp_path / "run/members/m", tmp_path / "run"
    nodefile.write_text("n1\nn2\nn3\n")
    member.mkdir(parents=True)
    monkeypatch.setattr(_nodewatch, "dead_hosts", lambda hosts, _port: [])
    monkeypatch.setenv("PBS_JOBID", "9.pbs")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    fault = {"kind": PEER_LOST, "attempt": 1, "silent_hosts": ["n2", "elsewhere"], "time": 1.0}
    assert _nodewatch._record_deaths(member, str(run_dir), 2, fault)
    record = json.loads((member / "fault.json").read_text())
    assert (record["lost_nodes"], record["nodes_left"]) == (["n2"], 2)
    assert not _nodewatch._record_deaths(member, str(run_dir), 2, {"kind": PEER_LOST, "attempt": 1})


def test_a_helper_started_ahead_is_the_one_the_watch_takes() -> None:
    from resilient_flows.training import _peerwatch

    _peerwatch.prestart_helper()
    ahead = _peerwatch._prestarted
    helper, port = start_helper()
    try:
        assert ahead is not None and helper is ahead and port is not None and _peerwatch._prestarted is None
        with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
            connection.sendall(b"x")
            assert connection.recv(1) == b"x"
    finally:
        helper.kill()
        helper.wait()
    second, _ = start_helper()  # none ahead any more: a new one
    assert second is not None and second is not ahead
    second.kill()
    second.wait()
