"""The preemption agent's PBS Pro adapter: parsing ``qstat -f -F json`` and ``pbsnodes -a -F json`` in
their real formats, the command lines it runs, and end to end against the fake PBS Pro commands of
``tests/fakesched/pbspro`` (which run each job on this machine in its own process group)."""

from __future__ import annotations

import getpass
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from fakesched import PBSPRO, engine

from resilient_flows.cosched._agent import ONDEMAND_MARKER, Agent, AgentConfig, is_marked
from resilient_flows.cosched._batch import BatchCommandError, BatchJob, uid_of
from resilient_flows.cosched._pbspro import HEARTBEAT_VARIABLE, PBSProBatch, parse_pbsnodes_json, parse_qstat_json

# Recorded in the format of PBS Pro 2022.1 (Polaris): four-space indents, one attribute a line,
# numbers bare, times as ctime(3) prints them.
QSTAT = """{
    "timestamp":1796396417,
    "pbs_version":"2022.1.1.20220926110806",
    "pbs_server":"polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
    "Jobs":{
        "4101.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov":{
            "Job_Name":"ens-member-3",
            "Job_Owner":"alice@polaris-login-02.hsn.cm.polaris.alcf.anl.gov",
            "resources_used":{
                "cpupercent":6395,
                "cput":"12:40:11",
                "mem":"51234560kb",
                "ncpus":128,
                "vmem":"60120340kb",
                "walltime":"00:11:53"
            },
            "job_state":"R",
            "queue":"prod",
            "server":"polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
            "Checkpoint":"u",
            "ctime":"Fri Dec  4 14:48:01 2026",
            "Error_Path":"polaris-login-02:/home/alice/run/ens-member-3.e4101",
            "exec_host":"x3006c0s13b1n0/0*64+x3006c0s19b0n0/0*64",
            "exec_vnode":"(x3006c0s13b1n0:ncpus=64:ngpus=4)+(x3006c0s19b0n0:ncpus=64:ngpus=4)",
            "Hold_Types":"n",
            "Join_Path":"oe",
            "Keep_Files":"n",
            "Mail_Points":"a",
            "mtime":"Fri Dec  4 15:00:20 2026",
            "Output_Path":"polaris-login-02:/home/alice/run/ens-member-3.o4101",
            "Priority":0,
            "qtime":"Fri Dec  4 14:48:01 2026",
            "Rerunable":"True",
            "Resource_List":{
                "ncpus":128,
                "ngpus":8,
                "nodect":2,
                "place":"scatter",
                "select":"2:ncpus=64:ngpus=4",
                "walltime":"06:00:00"
            },
            "stime":"Fri Dec  4 15:00:17 2026",
            "session_id":48211,
            "jobdir":"/home/alice",
            "substate":42,
            "Variable_List":{
                "PBS_O_HOME":"/home/alice",
                "PBS_O_LOGNAME":"alice",
                "PBS_O_WORKDIR":"/home/alice/run",
                "PBS_O_SYSTEM":"Linux",
                "RESILIENT_FLOWS_HEARTBEAT":"rf-heartbeat:/eagle/proj/alice/run/m3/checkpoint-heartbeat.json",
                "PBS_O_QUEUE":"prod",
                "PBS_O_HOST":"polaris-login-02.hsn.cm.polaris.alcf.anl.gov"
            },
            "comment":"Job run at Fri Dec 04 at 15:00 on (x3006c0s13b1n0:ncpus=64:ngpus=4)+(x3006c0s19b0n0:ncpus=64)",
            "etime":"Fri Dec  4 14:48:01 2026",
            "run_count":1,
            "Submit_arguments":"-v RESILIENT_FLOWS_HEARTBEAT=rf-heartbeat:/eagle/proj/m3/hb.json member.pbs",
            "project":"proj",
            "Submit_Host":"polaris-login-02.hsn.cm.polaris.alcf.anl.gov"
        },
        "4102.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov":{
            "Job_Name":"viz",
            "Job_Owner":"bob@polaris-login-01.hsn.cm.polaris.alcf.anl.gov",
            "job_state":"Q",
            "queue":"ondemand",
            "ctime":"Fri Dec  4 15:01:09 2026",
            "Hold_Types":"n",
            "Resource_List":{
                "ncpus":64,
                "nodect":1,
                "place":"scatter",
                "select":"1:ncpus=64",
                "walltime":"00:30:00"
            },
            "substate":10,
            "Variable_List":{
                "PBS_O_HOME":"/home/bob",
                "PBS_NCPUS":64
            },
            "comment":"Not Running: Insufficient amount of resource: ncpus (R: 64 A: 0 T: 256)",
            "etime":"Fri Dec  4 15:01:09 2026"
        },
        "4099.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov":{
            "Job_Name":"ens-member-1",
            "Job_Owner":"alice@polaris-login-02.hsn.cm.polaris.alcf.anl.gov",
            "job_state":"H",
            "queue":"prod",
            "ctime":"Fri Dec  4 13:02:44 2026",
            "Hold_Types":"u",
            "Resource_List":{
                "ncpus":64,
                "nodect":1,
                "select":"1:ncpus=64",
                "walltime":"120:00:00"
            },
            "stime":"Fri Dec  4 13:05:00 2026",
            "substate":20,
            "comment":"rf-ondemand",
            "run_count":1
        },
        "4098.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov":{
            "Job_Name":"post",
            "Job_Owner":"carol@polaris-login-01",
            "job_state":"E",
            "queue":"prod",
            "ctime":"Fri Dec  4 12:00:00 2026",
            "Resource_List":{
                "ncpus":64,
                "nodect":1,
                "walltime":"01:00:00"
            },
            "stime":"Fri Dec  4 12:01:00 2026",
            "substate":51
        },
        "4097[].polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov":{
            "Job_Name":"sweep",
            "Job_Owner":"carol@polaris-login-01",
            "job_state":"B",
            "queue":"prod",
            "ctime":"Fri Dec  4 11:00:00 2026",
            "array":"True",
            "Resource_List":{
                "ncpus":1,
                "nodect":1,
                "walltime":"00:10:00"
            }
        }
    }
}
"""

PBSNODES = """{
    "timestamp":1796396417,
    "pbs_version":"2022.1.1.20220926110806",
    "pbs_server":"polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
    "nodes":{
        "x3006c0s13b1n0":{
            "Mom":"x3006c0s13b1n0.hsn.cm.polaris.alcf.anl.gov",
            "ntype":"PBS",
            "state":"free",
            "pcpus":64,
            "resources_available":{
                "arch":"linux",
                "host":"x3006c0s13b1n0",
                "mem":"527672488kb",
                "ncpus":64,
                "ngpus":4,
                "vnode":"x3006c0s13b1n0"
            },
            "resources_assigned":{
            },
            "resv_enable":"True",
            "sharing":"default_shared",
            "license":"l",
            "last_state_change_time":1796390000,
            "last_used_time":1796390000
        },
        "x3006c0s19b0n0":{
            "Mom":"x3006c0s19b0n0.hsn.cm.polaris.alcf.anl.gov",
            "ntype":"PBS",
            "state":"free",
            "pcpus":64,
            "jobs":[
                "4100.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov"
            ],
            "resources_available":{
                "ncpus":64,
                "vnode":"x3006c0s19b0n0"
            },
            "resources_assigned":{
                "ncpus":24,
                "mem":"1048576kb"
            },
            "license":"l"
        },
        "x3008c0s37b1n0":{
            "ntype":"PBS",
            "state":"job-exclusive",
            "pcpus":64,
            "resources_available":{
                "ncpus":64
            },
            "resources_assigned":{
                "ncpus":1
            }
        },
        "x3009c0s19b0n0":{
            "ntype":"PBS",
            "state":"down,offline",
            "pcpus":64,
            "resources_available":{
                "ncpus":64
            },
            "resources_assigned":{
            },
            "comment":"node down: communication closed"
        },
        "x3009c0s25b0n0":{
            "ntype":"PBS",
            "state":"resv-exclusive",
            "resources_available":{
                "ncpus":64
            },
            "resources_assigned":{
            }
        },
        "polaris-svc-01":{
            "ntype":"PBS",
            "state":"free",
            "resources_available":{
                "ncpus":0
            },
            "resources_assigned":{
            }
        }
    }
}
"""


def local(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float:
    return time.mktime((year, month, day, hour, minute, second, 0, 0, -1))


# ------------------------------------------------------------------------------------- parsing


def test_qstat_json_gives_each_job_in_the_agents_terms() -> None:
    jobs = {job.id.split(".")[0]: job for job in parse_qstat_json(QSTAT)}

    assert jobs["4101"] == BatchJob(
        id="4101.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
        name="ens-member-3",
        user="alice",
        queue="prod",
        state="running",
        nodes=2,
        cpus=128,
        submitted=local(2026, 12, 4, 14, 48, 1),
        start=local(2026, 12, 4, 15, 0, 17),
        time_limit=6 * 3600.0,
        comment="Job run at Fri Dec 04 at 15:00 on (x3006c0s13b1n0:ncpus=64:ngpus=4)+(x3006c0s19b0n0:ncpus=64)",
        heartbeat="/eagle/proj/alice/run/m3/checkpoint-heartbeat.json",
    )
    queued = jobs["4102"]
    assert (queued.state, queued.held, queued.queue, queued.nodes, queued.cpus) == ("pending", False, "ondemand", 1, 64)
    assert queued.start is None and queued.time_limit == 1800.0
    assert not is_marked(queued.comment, ONDEMAND_MARKER) and queued.heartbeat == ""  # PBS's "Not Running: ..."

    held = jobs["4099"]
    assert (held.state, held.held, held.start) == ("pending", True, None)  # stime of its last run is not a start
    assert held.time_limit == 120 * 3600.0
    assert is_marked(held.comment, ONDEMAND_MARKER)  # an operator's marker in the comment attribute
    assert jobs["4098"].state == "other"  # exiting
    assert jobs["4097[]"].state == "other"  # an array job whose subjobs have begun


def test_the_heartbeat_comes_from_the_environment_and_the_marker_from_the_comment_only() -> None:
    record = {"job_state": "R", "comment": "rf-ondemand", "Variable_List": {HEARTBEAT_VARIABLE: "rf-heartbeat:/x"}}
    [job] = parse_qstat_json(json.dumps({"pbs_server": "s", "Jobs": {"1.s": record}}))
    assert (job.heartbeat, job.comment) == ("/x", "rf-ondemand")
    record["Variable_List"] = {HEARTBEAT_VARIABLE: "/x/checkpoint-heartbeat.json"}  # no prefix: not a heartbeat
    [job] = parse_qstat_json(json.dumps({"pbs_server": "s", "Jobs": {"1.s": record}}))
    assert job.heartbeat == ""


def test_qstat_json_without_jobs_leaves_the_job_table_out() -> None:
    assert (
        parse_qstat_json('{\n    "timestamp":1796396417,\n    "pbs_version":"2022.1.1",\n    "pbs_server":"s"\n}\n')
        == []
    )


def test_bare_values_that_are_no_json_numbers_are_read_as_strings() -> None:
    # PBS before cJSON prints whatever strtod() accepts unquoted (openpbs/openpbs#1255).
    lines = QSTAT.splitlines()
    at = lines.index('                "PBS_O_HOME":"/home/bob",')
    lines[at + 1 : at + 1] = [
        '                "RUN_ID":007,',
        '                "MASK":0x1f,',
        '                "SCALE":nan,',
    ]
    jobs = {job.id.split(".")[0]: job for job in parse_qstat_json("\n".join(lines))}
    assert jobs["4102"].cpus == 64 and len(jobs) == 5


@pytest.mark.parametrize(
    "text",
    [
        "qstat: cannot connect to server polaris-pbs-01 (errno=15010)",
        "[]",
        '{"pbs_server": "s", "Jobs": []}',
        '{"pbs_server": "s", "Jobs": {"1.s": {"queue": "prod"}}}',  # no job_state
        '{"pbs_server": "s", "Jobs": {"1.s": {"job_state": "Q", "ctime": "2026-12-04T15:00:17"}}}',
        '{"pbs_server": "s", "Jobs": {"1.s": {"job_state": "R", "Resource_List": {"nodect": "two"}}}}',
        '{"pbs_server": "s", "Jobs": {"1.s": {"job_state": "R", "Variable_List": "A=1,B=2"}}}',
    ],
)
def test_malformed_qstat_output_names_the_command(text: str) -> None:
    with pytest.raises(BatchCommandError, match=r"qstat -f -F json"):
        parse_qstat_json(text)


def test_pbsnodes_json_counts_idle_free_hosts_or_their_unassigned_cpus() -> None:
    assert parse_pbsnodes_json(PBSNODES, "nodes") == 1  # partly used, busy, down, reserved and CPU-less hosts do not
    assert parse_pbsnodes_json(PBSNODES, "cpus") == 64 + 40
    assert parse_pbsnodes_json("", "nodes") == 0  # "pbsnodes: No nodes found" goes to standard error


@pytest.mark.parametrize(
    "text",
    [
        "pbsnodes: cannot connect to server s, error=15034",
        '{"pbs_server": "s"}',
        '{"nodes": {"n1": {"resources_available": {"ncpus": 4}}}}',  # no state
        '{"nodes": {"n1": {"state": "free", "resources_available": {"ncpus": "many"}}}}',
    ],
)
def test_malformed_pbsnodes_output_names_the_command(text: str) -> None:
    with pytest.raises(BatchCommandError, match=r"pbsnodes -a -F json"):
        parse_pbsnodes_json(text, "cpus")


# ------------------------------------------------------------------------------- command lines


class Recorder:
    """Stands in for the commands: records each argv, answers from ``replies`` (an exception is raised)."""

    def __init__(self, replies: dict[str, str | BatchCommandError] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.replies = replies or {}

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        reply = self.replies.get(argv[0], "")
        if isinstance(reply, BatchCommandError):
            raise reply
        return reply


def test_the_adapter_acts_with_pbs_pro_command_lines() -> None:
    run = Recorder()
    batch = PBSProBatch(run=run)
    batch.signal("4101.polaris-pbs-01", "USR1")
    batch.signal("4101.polaris-pbs-01", "sigterm")
    batch.signal("4101", "10")
    batch.requeue("4101.polaris-pbs-01", hold=False)
    batch.requeue("4101.polaris-pbs-01", hold=True)
    batch.release("4097[].polaris-pbs-01")
    assert run.calls == [
        ["qsig", "-s", "SIGUSR1", "4101.polaris-pbs-01"],
        ["qsig", "-s", "SIGTERM", "4101.polaris-pbs-01"],
        ["qsig", "-s", "10", "4101"],
        ["qrerun", "4101.polaris-pbs-01"],
        ["qhold", "4101.polaris-pbs-01"],
        ["qrerun", "4101.polaris-pbs-01"],
        ["qrls", "4097[].polaris-pbs-01"],
    ]
    assert PBSProBatch(run=Recorder({"qstat": QSTAT})).jobs()[0].id.startswith("4101.")
    assert PBSProBatch(run=Recorder({"pbsnodes": PBSNODES})).free("cpus") == 104


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda b: b.signal("-s KILL 1", "USR1"), "not a PBS job id"),
        (lambda b: b.requeue("1.server; rm -rf ~", hold=True), "not a PBS job id"),
        (lambda b: b.release("all"), "not a PBS job id"),
        (lambda b: b.signal("1.server", "USR 1"), "not a signal name"),
    ],
)
def test_job_ids_and_signals_are_checked_before_any_command_runs(
    call: Callable[[PBSProBatch], None], problem: str
) -> None:
    run = Recorder()
    with pytest.raises(BatchCommandError, match=problem):
        call(PBSProBatch(run=run))
    assert run.calls == []


def test_a_refused_qrerun_counts_when_pbs_has_requeued_the_job_held_itself() -> None:
    refused = BatchCommandError("qrerun 4099.s: exit status 168 after 0.1 s: qrerun: Request invalid for state of job")
    held = json.dumps({"pbs_server": "s", "Jobs": {"4099.s": {"job_state": "H", "Hold_Types": "u"}}})
    run = Recorder({"qrerun": refused, "qstat": held})
    PBSProBatch(run=run).requeue("4099.s", hold=True)
    assert run.calls == [["qhold", "4099.s"], ["qrerun", "4099.s"], ["qstat", "-f", "-F", "json", "4099.s"]]


def test_a_failed_requeue_takes_its_hold_off_again() -> None:
    refused = BatchCommandError("qrerun 4101.s: exit status 190 after 0.1 s: qrerun: job is not rerunnable 4101.s")
    running = json.dumps({"pbs_server": "s", "Jobs": {"4101.s": {"job_state": "R", "Hold_Types": "u"}}})
    run = Recorder({"qrerun": refused, "qstat": running})
    with pytest.raises(BatchCommandError, match="not rerunnable"):
        PBSProBatch(run=run).requeue("4101.s", hold=True)
    assert run.calls[-1] == ["qrls", "4101.s"]


# ------------------------------------------------------------------- end to end, fake PBS Pro


@pytest.fixture
def pbspro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake PBS Pro commands first on PATH, a fresh state directory; every job left is killed."""
    state = tmp_path / "sched"
    monkeypatch.setenv("PATH", f"{PBSPRO}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(engine.DIR_ENV, str(state))
    monkeypatch.delenv(engine.QUEUE_SECONDS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    yield state
    if state.exists():
        engine.delete_all(state)


def submit(tmp_path: Path, on_usr1: str, *options: str) -> str:
    """A job that counts its runs in ``runs`` and does ``on_usr1`` when USR1 arrives."""
    script = tmp_path / "victim.pbs"
    script.write_text(
        "#!/bin/bash\n"
        "#PBS -N victim\n"
        "#PBS -l select=1:ncpus=1\n"
        "#PBS -l walltime=00:10:00\n"
        f"echo run >> {tmp_path / 'runs'}\n"
        f"trap '{on_usr1}' USR1\n"
        "while true; do sleep 0.05; done\n"
    )
    heartbeat = f"{HEARTBEAT_VARIABLE}=rf-heartbeat:{tmp_path / 'checkpoint-heartbeat.json'}"
    argv = ["qsub", "-v", heartbeat, *options, str(script)]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def wait_until(what: Callable[[], object], timeout: float = 10.0) -> object:
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, f"still not so after {timeout} s"
        time.sleep(0.05)
    return found


def job(batch: PBSProBatch, job_id: str) -> BatchJob | None:
    return next((j for j in batch.jobs() if j.id == job_id), None)


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_signal_requeue_held_and_release_with_the_fake_pbs_pro(pbspro: Path, tmp_path: Path) -> None:
    batch = PBSProBatch(timeout=20)
    marker = tmp_path / "signalled"
    job_id = submit(tmp_path, f"echo $PBS_JOBID >> {marker}")
    before = time.time()

    running = wait_until(lambda: (j := job(batch, job_id)) and j.state == "running" and j)
    assert isinstance(running, BatchJob)
    assert (running.name, running.user, running.queue) == ("victim", getpass.getuser(), "workq")
    assert (running.nodes, running.cpus, running.time_limit, running.held) == (1, 1, 600.0, False)
    assert running.heartbeat == str(tmp_path / "checkpoint-heartbeat.json") and running.uid is None
    assert uid_of(running) == os.getuid()  # Job_Owner's user, looked up
    assert running.start is not None and before - 2 <= running.start <= time.time() + 1  # ctime has whole seconds
    assert running.submitted <= running.start
    cpus = os.cpu_count() or 1
    assert batch.free("cpus") == cpus - 1 and batch.free("nodes") == 0

    batch.signal(job_id, "USR1")
    assert wait_until(lambda: marker.exists() and marker.read_text().split()) == [job_id]

    batch.requeue(job_id, hold=True)
    held = job(batch, job_id)
    assert held is not None and (held.state, held.held, held.start) == ("pending", True, None)
    assert runs(tmp_path) == 1 and batch.free("cpus") == cpus and batch.free("nodes") == 1
    batch.requeue(job_id, hold=True)  # again: qrerun is refused, the job is found held, all is well
    time.sleep(0.3)
    assert job(batch, job_id).state == "pending" and runs(tmp_path) == 1  # type: ignore[union-attr]

    batch.release(job_id)
    wait_until(lambda: (j := job(batch, job_id)) and j.state == "running")
    wait_until(lambda: runs(tmp_path) == 2)  # the script started again from the top
    assert job(batch, job_id).held is False  # type: ignore[union-attr]


def test_a_job_that_exited_on_its_signal_cannot_be_requeued(pbspro: Path, tmp_path: Path) -> None:
    batch = PBSProBatch(timeout=20)
    job_id = submit(tmp_path, "exit 75")
    wait_until(lambda: (j := job(batch, job_id)) and j.state == "running")
    batch.signal(job_id, "USR1")
    wait_until(lambda: job(batch, job_id) is None)  # finished jobs leave qstat (without -x)
    with pytest.raises(BatchCommandError, match=r"qhold .*exit status 35.*Job has finished"):
        batch.requeue(job_id, hold=True)


def test_a_job_that_is_not_rerunnable_keeps_running_without_the_hold(pbspro: Path, tmp_path: Path) -> None:
    batch = PBSProBatch(timeout=20)
    job_id = submit(tmp_path, "", "-r", "n")
    wait_until(lambda: (j := job(batch, job_id)) and j.state == "running")
    with pytest.raises(BatchCommandError, match=r"qrerun .*exit status 190.*job is not rerunnable"):
        batch.requeue(job_id, hold=True)
    text = subprocess.run(["qstat", "-f", "-F", "json", job_id], check=True, capture_output=True, text=True).stdout
    record = json.loads(text)["Jobs"][job_id]
    assert (record["job_state"], record["Hold_Types"], record["Rerunable"]) == ("R", "n", "False")
    assert runs(tmp_path) == 1


def test_the_agent_does_not_rank_pbs_jobs_itself() -> None:
    """PBS Pro's scheduler ranks pending jobs by its job_sort_key and the queues' priority."""
    batch = PBSProBatch(run=lambda argv: pytest.fail(f"ran {argv}"))
    assert not batch.can_prioritize
    with pytest.raises(BatchCommandError, match="give the on-demand queue a higher priority"):
        batch.prioritize("4101.polaris-pbs-01", above=100.0)


def test_a_jobs_environment_makes_it_no_on_demand_job() -> None:
    """Users write their jobs' environment (``qsub -v``); only an operator's comment, or the queue,
    makes a job on demand."""
    running = {"job_state": "R", "queue": "workq", "stime": "Fri Dec  4 15:00:17 2026", "Resource_List": {"nodect": 1}}
    pending = {
        "job_state": "Q",
        "queue": "workq",
        "comment": "Not Running: Insufficient amount of resource: ncpus",
        "Variable_List": {HEARTBEAT_VARIABLE: "rf-ondemand", "NOTE": "rf-ondemand", "PBS_O_WORKDIR": "/x/rf-ondemand"},
    }

    def poll(comment: str | None) -> list[dict]:
        record = pending if comment is None else {**pending, "comment": comment}
        qstat = json.dumps({"pbs_server": "s", "Jobs": {"1.s": running, "2.s": record}})
        batch = PBSProBatch(run=Recorder({"qstat": qstat, "pbsnodes": ""}))
        return Agent(batch, AgentConfig(dry_run=True), clock=time.time).poll()

    assert poll(None) == []
    decision, requeue = poll("rf-ondemand")  # an operator's marker
    assert decision["request"] == "2.s" and decision["decision"]["preempt"] == ["1.s"]
    assert (requeue["event"], requeue["dry_run"]) == ("requeue", True)


# ------------------------------------------------------------------- the agent killed and restarted

AGENT = Path(sys.executable).with_name("resilient-flows")


def agent_command(tmp_path: Path, *more: str) -> list[str]:
    return [
        str(AGENT), "cosched", "agent", "--scheduler", "pbspro", "--partition-ondemand", "ondemand",
        "--interval", "0.2", "--grace", "30", "--log", str(tmp_path / "events.jsonl"), *more,
    ]  # fmt: skip


def logged(tmp_path: Path) -> list[dict]:
    path = tmp_path / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("fate", ["ran", "vanished"])
def test_an_agent_killed_after_requeueing_releases_its_victim_within_two_polls_of_its_restart(
    pbspro: Path, tmp_path: Path, fate: str
) -> None:
    """The agent requeues the victim held (``qhold``, ``qrerun``) and is SIGKILLed before it could
    release it. Restarted, it reads its state file and releases the victim at its first or second
    poll, once the request has run (or was deleted), instead of leaving it held for ever."""
    batch = PBSProBatch(timeout=20)
    victim = submit(tmp_path, "")
    wait_until(lambda: (j := job(batch, victim)) and j.state == "running")
    queued = {**os.environ, engine.QUEUE_SECONDS_ENV: "600"}  # waits until the test starts it
    argv = ["qsub", "-q", "ondemand", "-N", "viz", "-l", "select=1:ncpus=1", "--", "/bin/sleep", "60"]
    request = subprocess.run(argv, check=True, capture_output=True, text=True, env=queued).stdout.strip()
    with open(tmp_path / "agent.out", "ab") as out:
        first = subprocess.Popen(agent_command(tmp_path), stdout=out, stderr=out)
        try:
            wait_until(lambda: "requeue" in [e["event"] for e in logged(tmp_path)], timeout=30)
        finally:
            first.kill()
            first.wait()
    held = job(batch, victim)
    assert held is not None and (held.state, held.held) == ("pending", True)
    assert json.loads((tmp_path / "events.state.json").read_text())["preempting"][victim]["request"] == request
    if fate == "ran":
        engine.update(pbspro, int(request.split(".")[0]), queue_seconds=0)
        wait_until(lambda: (j := job(batch, request)) and j.state == "running")
    else:
        subprocess.run(["qdel", request], check=True, capture_output=True)
        wait_until(lambda: job(batch, request) is None)
    before = len(logged(tmp_path))
    with open(tmp_path / "agent.out", "ab") as out:
        subprocess.run(agent_command(tmp_path, "--polls", "2"), stdout=out, stderr=out, check=True, timeout=60)
    after = logged(tmp_path)[before:]
    assert [e["event"] for e in after] == ["resumed", "release"] and after[1]["job"] == victim
    wait_until(lambda: (j := job(batch, victim)) and j.state == "running")  # released: it runs again
    assert json.loads((tmp_path / "events.state.json").read_text())["preempting"] == {}


def test_the_chaos_harness_agent_faults_meet_their_targets(
    pbspro: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``benchmarks/chaos.py --agent``: killed between requeue and release, FIFO and oversized
    heartbeats, forged markers."""
    spec = importlib.util.spec_from_file_location("chaos_agent", Path(__file__).parents[1] / "benchmarks" / "chaos.py")
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "chaos_agent", harness)  # its dataclasses look their module up
    spec.loader.exec_module(harness)
    found = harness.agent_chaos(tmp_path / "work")
    assert [(f.key, f.value) for f in found if not f.ok] == []
    assert {f.key for f in found} >= {"agent_polls_to_release", "agent_heartbeat_read_s", "agent_forged_requests"}
