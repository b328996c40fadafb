"""Warm workers: site files that ask for them, and a member whose worker is SIGKILLed resuming on a
worker forked from the pool's preloaded fork server (real Parsl, the local site)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, python_env
from slurm import wait_for

from resilient_flows.errors import SiteConfigError
from resilient_flows.rundir._heartbeat import attempt_heartbeat_path, read_attempt_heartbeat
from resilient_flows.sites import load_site
from resilient_flows.sites._parsl import (
    DEFAULT_PRELOAD,
    POOL_PRELOAD,
    TRAINING_PRELOAD,
    WARM_MODULE,
    is_warm,
    set_preload,
    split_argv,
)
from resilient_flows.training import preloaded_modules, read_events, run_member
from resilient_flows.workflow import load_workflow, plan_workflow, read_plan
from resilient_flows.workflow._runner import worker_preload

CLI = Path(sys.executable).with_name("resilient-flows")


def site(tmp_path: Path, executor: dict[str, Any]) -> Path:
    path = tmp_path / "site.yaml"
    provider = {"provider": {"type": "LocalProvider"}} if executor["type"] == "HighThroughputExecutor" else {}
    path.write_text(yaml.safe_dump({"executors": [{**executor, **provider}]}))
    return path


def test_warm_workers_start_the_pool_through_the_warm_module_with_the_default_preload(tmp_path: Path) -> None:
    (executor,) = load_site(
        site(tmp_path, {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True})
    ).executors
    assert is_warm(executor)
    head, _, pool_args = executor.launch_cmd.partition(" -- ")
    assert head == f"python3 -m {WARM_MODULE} --preload {','.join(DEFAULT_PRELOAD)}"
    assert pool_args.startswith("{debug} {max_workers_per_node} -a {addresses} ")
    (plain,) = load_site(
        site(tmp_path, {"type": "HighThroughputExecutor", "label": "p", "warm_workers": False})
    ).executors
    assert not is_warm(plain) and plain.launch_cmd.startswith("process_worker_pool.py ")


def test_a_run_sets_its_pools_preload_once_each_and_only_python_names(tmp_path: Path) -> None:
    (executor,) = load_site(
        site(tmp_path, {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True})
    ).executors
    set_preload(executor, ["mine", "torch", "mine", "x;rm -rf ~", "pkg.sub"])
    argv = executor.launch_cmd.split()[3:]
    modules, standby, pool_argv = split_argv(argv)
    assert modules == [*POOL_PRELOAD, "mine", "torch", "pkg.sub"]
    assert standby is False
    assert pool_argv[:2] == ["{debug}", "{max_workers_per_node}"]
    set_preload(executor, [])
    assert split_argv(executor.launch_cmd.split()[3:])[0] == list(POOL_PRELOAD)


def test_pools_import_torch_only_where_a_worker_trains_or_evaluates(tmp_path: Path) -> None:
    """A one-rank workload member trains in its worker: torch and its workload are preloaded. A
    command member or a member on several ranks only starts processes from its worker: nothing
    more than the pool's own modules, unless stages or analytics run in the workers."""
    (tmp_path / "wf.yaml").write_text(
        "name: p\nmembers:\n"
        "  - {name: one, workload: mlp-digits, steps: 2}\n"
        "  - {name: two, workload: mlp-digits, steps: 2, ranks: 2}\n"
        f"  - {{name: cmd, steps: 2, command: [{sys.executable}, x.py]}}\n"
    )
    members = plan_workflow(load_workflow(tmp_path / "wf.yaml"), build_site=False).members
    one, two, cmd = sorted(members, key=lambda m: ["one", "two", "cmd"].index(m.name))
    assert worker_preload([one, two, cmd], stages=False, analytics=False) == TRAINING_PRELOAD
    assert worker_preload([two, cmd], stages=False, analytics=False) == ()
    assert worker_preload([two, cmd], stages=True, analytics=False) == TRAINING_PRELOAD
    assert worker_preload([cmd], stages=False, analytics=True) == TRAINING_PRELOAD


def test_a_builtin_workload_preloads_nothing_more_and_a_module_workload_its_module() -> None:
    assert preloaded_modules("mlp-digits") == ()
    assert preloaded_modules("mine.sub:train") == ("mine.sub",)
    assert preloaded_modules("nonsense") == ()


def test_interchanges_and_fork_servers_skip_parsl_s_type_checks_and_the_process_that_builds_the_config_keeps_them(
    tmp_path: Path,
) -> None:
    """Each pool, its fork server and each interchange import Parsl without the run-time checks
    typeguard compiles into it (a third of the import); the site's own interchange command is
    kept. A wrong type in the process that builds the configuration stays an error."""
    (executor,) = load_site(site(tmp_path, {"type": "HighThroughputExecutor", "label": "w"})).executors
    assert executor.interchange_launch_cmd == [sys.executable, "-m", "resilient_flows.sites._interchange"]
    own = {"type": "HighThroughputExecutor", "label": "o", "interchange_launch_cmd": ["my-interchange"]}
    assert load_site(site(tmp_path, own)).executors[0].interchange_launch_cmd == ["my-interchange"]
    launcher = {"type": "SimpleLauncher"}
    mpi = {"type": "MPIExecutor", "label": "m", "provider": {"type": "LocalProvider", "launcher": launcher}}
    assert load_site(site(tmp_path, mpi)).executors[0].interchange_launch_cmd == ["interchange.py"]  # a str, it says
    checked = (
        "import resilient_flows.sites._preload, parsl.utils\n"
        "try:\n    print(parsl.utils.get_all_checkpoints(rundir=3))\n"
        "except Exception as exc:\n    print(type(exc).__name__)"
    )
    outs = [
        subprocess.run([sys.executable, "-c", checked], capture_output=True, text=True, check=True, env=env).stdout
        for env in (python_env(), {**python_env(), "RESILIENT_FLOWS_WARM_PRELOAD": "parsl.utils"})
    ]
    assert outs == ["TypeCheckError\n", "[]\n"]  # a process that builds a config; a fork server


def test_preloading_scikit_learn_starts_no_thread_but_the_fork_safe_blas_pools() -> None:
    """A fresh interpreter, as a fork server is, with BLAS free to start its threads: what the
    preload reports for scikit-learn, which a workload module may import (and with it SciPy and
    pandas)."""
    env = {k: v for k, v in python_env().items() if not k.endswith("_NUM_THREADS")}
    code = (
        "from resilient_flows.sites._preload import preload;"
        "print(preload(['torch', 'sklearn.datasets', 'no_such_module_here']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    failed, started = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert started == 0
    assert failed == ["no_such_module_here: ModuleNotFoundError: No module named 'no_such_module_here'"]


def test_the_preload_report_on_a_full_disk_does_not_end_the_fork_server() -> None:
    """The block's log on a full disk: the fork server's report of what it did not preload fails
    to write, and the fork server goes on (an error here ended it, and every worker after)."""
    code = "from resilient_flows.sites._preload import _report; _report(['mine: ImportError'], 1); print('alive')"
    with open("/dev/full", "w") as full:
        out = subprocess.run(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=full, text=True, env=python_env()
        )
    assert (out.returncode, out.stdout) == (0, "alive\n")


_FORK_SERVER_DIES = """
import multiprocessing, multiprocessing.forkserver, os, signal, sys, functools
import probe
from resilient_flows.sites._parsl._pool import _WorkerContext
from resilient_flows.sites._warmpool import start_fork_server

context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["resilient_flows.sites._preload"])
preloaded = functools.partial(start_fork_server, ["wave"])
preloaded()
workers = _WorkerContext(context, context, preloaded, {})
for out in sys.argv[1:]:
    worker = workers.Process(target=probe.report, args=(out,))
    worker.start()
    worker.join()
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGKILL)
    while open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # dead, not yet reaped
        pass
"""


def test_a_fork_server_that_died_is_replaced_by_one_that_preloads_too(tmp_path: Path) -> None:
    """A fork server lost mid-run (an error at its preload, a kill): the next worker comes from a
    new one, which must preload as the first did, or every restarted member imports torch again."""
    (tmp_path / "probe.py").write_text(
        "import sys\n\ndef report(path):\n    open(path, 'w').write(str('wave' in sys.modules))\n"
    )
    env = {**python_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), python_env()["PYTHONPATH"]])}
    outs = [tmp_path / "first", tmp_path / "after-the-kill"]
    subprocess.run([sys.executable, "-c", _FORK_SERVER_DIES, *map(str, outs)], check=True, env=env, timeout=120)
    assert [out.read_text() for out in outs] == ["True", "True"]


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        (
            {"type": "ThreadPoolExecutor", "label": "t", "warm_workers": True},
            "executors[0] (ThreadPoolExecutor): warm_workers applies to a "
            "HighThroughputExecutor (its worker pool) only",
        ),
        (
            {"type": "HighThroughputExecutor", "label": "w", "warm_workers": "yes"},
            "executors[0] (HighThroughputExecutor): warm_workers must be true or false, got 'yes'",
        ),
        (
            {"type": "HighThroughputExecutor", "label": "w", "warm_workers": True, "launch_cmd": "mine"},
            "executors[0] (HighThroughputExecutor): warm_workers replaces launch_cmd: give one of them",
        ),
    ],
)
def test_a_misplaced_warm_workers_key_is_one_clear_line(tmp_path: Path, executor: dict[str, Any], message: str) -> None:
    path = site(tmp_path, executor)
    with pytest.raises(SiteConfigError) as caught:
        load_site(path)
    assert str(caught.value) == f"{path}: {message}"


WORKFLOW = """\
name: warm
checkpoint: {{interval: 5, tiers: [memory, shared]}}
members:
  - {{name: m, workload: 'warm_workload:train', steps: 240, params: {{step_s: 0.05, record: '{record}'}}}}
"""


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.slow
def test_a_member_whose_worker_is_killed_resumes_on_a_warm_worker_bit_exact_and_free(tmp_path: Path) -> None:
    """The retry's process did not import torch or the workload: its parent, the pool's fork
    server, did, once, with no thread of its own beyond those of a fresh interpreter. The retry
    restores from the node's memory tier, which survived the worker."""
    record = tmp_path / "attempts.jsonl"
    (tmp_path / "wf.yaml").write_text(WORKFLOW.format(record=record))
    site = tmp_path / "site.yaml"  # the local site with a memory tier (a directory standing in for /dev/shm)
    site.write_text(
        (REPO / "site-configs/local.yaml").read_text().replace("memory_scratch: null", f"memory_scratch: {tmp_path}")
    )
    run_dir = tmp_path / "run"
    env = python_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    runner = subprocess.Popen(
        [CLI, "run", tmp_path / "wf.yaml", "--site", site, "--run-dir", run_dir],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: sum(e["kind"] == "checkpointed" for e in read_events(run_dir)) >= 2, 180, "two checkpoints")
        beat = read_attempt_heartbeat(attempt_heartbeat_path(run_dir, "m"))
        assert beat is not None
        killed = int(beat["pid"])
        server = int(Path(f"/proc/{killed}/stat").read_text().rsplit(")", 1)[1].split()[1])
        server_threads = threads_of(server)
        os.kill(killed, signal.SIGKILL)
        out, _ = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    fresh = subprocess.run(
        [sys.executable, "-c", "import os, numpy; print(len(os.listdir('/proc/self/task')))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert server_threads == int(fresh.stdout)

    attempts = [json.loads(line) for line in record.read_text().splitlines()]
    assert [a["pid"] == killed for a in attempts] == [True, False]
    for attempt in attempts:  # imported by the fork server, the attempt's parent, not by the attempt
        assert attempt["imported_in"] == attempt["parent"] == server != attempt["pid"]

    events = list(read_events(run_dir))
    (failed,) = [e for e in events if e["kind"] == "failed"]
    assert (failed["error"].split(":")[0], failed["cost"], failed["cause"]) == (
        "WorkerLost",
        0.0,
        "lost after progress",
    )
    (resumed,) = [e for e in events if e["kind"] == "resumed"]
    assert resumed["attempt"] == 2 and [source.split()[0] for source in resumed["read_from"]] == ["memory"]

    (spec,) = read_plan(run_dir).members
    reference = replace(spec, params={**spec.params, "record": str(tmp_path / "reference.jsonl")})
    result = json.loads((run_dir / "members" / "m" / "result.json").read_text())
    assert result["digest"] == run_member(reference.to_dict(), str(tmp_path / "reference"))["digest"]
