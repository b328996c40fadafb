"""Members of several ranks: the launchers' environments, a real process group under mpiexec, DDP and
FSDP built-in members against one rank, resumes on another rank count, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import mpiexec, python_env
from torch import nn

from resilient_flows.checkpoint import CheckpointConfig
from resilient_flows.cli import main
from resilient_flows.errors import LaunchError, WorkflowError
from resilient_flows.training import (
    FaultSpec,
    MemberSpec,
    Preempted,
    TrainContext,
    local_slice,
    read_events,
    read_launch_env,
    run_member,
)
from resilient_flows.training._contract import EXIT_PREEMPTED
from resilient_flows.training._distributed import PORT_BASE, PORT_SPAN, parse_first_host
from resilient_flows.workflow._runner import resize_members
from resilient_flows.workflow._status import loss_curve

WORKER = Path(__file__).with_name("distributed_worker.py")
TOLERANCE = 1e-5

# ------------------------------------------------------------------ launchers' environments


def launch(env: dict[str, str]):
    return read_launch_env(env, first_host_of=parse_first_host)


def test_torchrun_environment() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    found = launch({**env, "MASTER_ADDR": "node7", "MASTER_PORT": "29500"})
    assert (found.launcher, found.rank, found.world_size, found.local_rank, found.local_world_size) == (
        "torchrun",
        3,
        8,
        1,
        4,
    )
    assert found.endpoint() == ("node7", 29500) and not found.mpi
    with pytest.raises(LaunchError, match=r"MASTER_ADDR, MASTER_PORT not set \(torchrun sets all four\)"):
        launch(env)


def test_srun_environment_takes_the_steps_first_host_and_a_port_from_the_job() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_STEP_NUM_TASKS": "6",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
        "SLURM_JOB_NODELIST": "login[1-2],nid[003-008]",
        "SLURM_STEP_NODELIST": "nid[003-005]",
        "SLURM_JOB_ID": "123456",
        "SLURM_STEP_ID": "2",
    }
    found = launch(env)
    assert (found.launcher, found.rank, found.world_size, found.local_rank, found.local_world_size) == (
        "srun",
        5,
        6,
        1,
        2,
    )
    host, port = found.endpoint()
    assert host == "nid003" and PORT_BASE <= port < PORT_BASE + PORT_SPAN
    assert launch({**env, "SLURM_STEP_ID": "3"}).master_port != port  # two steps of one job on one node
    assert launch({**env, "MASTER_ADDR": "ib-nid003", "MASTER_PORT": "4242"}).endpoint() == ("ib-nid003", 4242)
    assert launch({k: v for k, v in env.items() if k != "SLURM_STEP_NUM_TASKS"}).world_size == 8


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("SLURM_NTASKS", r"SLURM_NTASKS \(how many ranks\) is not set"),
        ("SLURM_JOB_ID", r"srun launch: SLURM_JOB_ID not set, and no MASTER_PORT"),
        ("SLURM_JOB_NODELIST", r"srun launch: SLURM_JOB_NODELIST not set, and no MASTER_ADDR"),
    ],
)
def test_incomplete_srun_environments_name_the_missing_variable(drop: str, message: str) -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
    with pytest.raises(LaunchError, match=message):
        launch({k: v for k, v in env.items() if k != drop})


def test_pbs_pals_environment_takes_the_first_host_of_the_node_file(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov\nx3005c0s13b1n0.hsn.cm.polaris.alcf.anl.gov\n")
    env = {
        "PALS_RANKID": "6",
        "PALS_LOCAL_RANKID": "2",
        "PMI_RANK": "6",
        "PMI_SIZE": "8",
        "PBS_NODEFILE": str(nodefile),
        "PBS_JOBID": "1234567.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov",
    }
    found = launch(env)
    assert (found.launcher, found.rank, found.world_size, found.local_rank, found.mpi) == ("pals", 6, 8, 2, True)
    host, port = found.endpoint()
    assert host == "x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov" and PORT_BASE <= port < PORT_BASE + PORT_SPAN
    assert launch({**env, "MASTER_ADDR": "head"}).master_addr == "head"
    with pytest.raises(LaunchError, match=r"PMI_SIZE \(how many ranks\) is not set"):
        launch({k: v for k, v in env.items() if k != "PMI_SIZE"})
    no_job = launch({"PALS_RANKID": "0", "PMI_SIZE": "2"})
    with pytest.raises(LaunchError, match=r"pals launch of 2 ranks: set MASTER_ADDR \(or run inside a PBS job"):
        no_job.endpoint()


def test_mpiexec_environments_leave_the_address_to_mpi() -> None:
    hydra = launch({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (hydra.launcher, hydra.rank, hydra.world_size, hydra.local_rank, hydra.local_world_size) == (
        "mpiexec",
        1,
        2,
        1,
        2,
    )
    assert hydra.mpi and hydra.master_addr is None
    with pytest.raises(LaunchError, match=r"mpiexec launch of 2 ranks: set MASTER_ADDR and MASTER_PORT"):
        hydra.endpoint()  # without mpi4py there is no other way
    openmpi = launch({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (openmpi.launcher, openmpi.rank, openmpi.world_size, openmpi.mpi) == ("mpiexec", 2, 4, True)
    inside_srun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "9"}
    assert launch({**inside_srun, "PMI_RANK": "1", "PMI_SIZE": "2"}).launcher == "mpiexec"  # mpiexec in a worker
    assert launch({}) is None and launch({"PATH": "/usr/bin"}) is None


def test_bad_values_are_named() -> None:
    with pytest.raises(LaunchError, match=r"PMI_RANK='one' is not an integer"):
        launch({"PMI_RANK": "one", "PMI_SIZE": "2"})
    with pytest.raises(LaunchError, match=r"rank 2 is not in a world of 2"):
        launch({"PMI_RANK": "2", "PMI_SIZE": "2"})


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("n1", "n1"),
        ("n1,n2", "n1"),
        ("nid[003-008,012],login1", "nid003"),
        ("nid[012,003-008]", "nid012"),
        ("rack[1-2]-node[01-04]", "rack1-node01"),
        ("gpu-a100-[7-9]", "gpu-a100-7"),
    ],
)
def test_the_first_host_of_a_slurm_node_list(nodelist: str, first: str) -> None:
    assert parse_first_host(nodelist) == first


def test_local_slices_cover_the_global_batch_once() -> None:
    for total, world in ((64, 2), (64, 3), (7, 7), (10, 4)):
        rows = [range(total)[local_slice(total, r, world)] for r in range(world)]
        assert [i for part in rows for i in part] == list(range(total))
        assert max(map(len, rows)) - min(map(len, rows)) <= 1


# ------------------------------------------------------------------ errors (one process)


def spec(name: str = "dp", workload: str = "mlp-digits", **changes) -> MemberSpec:
    base = MemberSpec(
        name=name,
        workload=workload,
        params={"hidden": 32},
        seed=3,
        steps=20,
        checkpoint=CheckpointConfig(interval_steps=10),
    )
    return replace(base, **changes)


def test_ranks_zero_and_unknown_parallel_modes_are_refused_naming_the_member(tmp_path: Path, capsys) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("name: w\nmembers:\n  - name: dp\n    workload: mlp-digits\n    steps: 10\n    ranks: 0\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("wf.yaml:6: members[0].ranks: member 'dp' needs at least one rank, got ranks: 0"), err
    path.write_text("name: w\nmembers:\n  - {name: dp, workload: mlp-digits, steps: 10, ranks: 2, parallel: zero}\n")
    assert main(["validate", str(path)]) == 2
    assert "members[0].parallel: Input should be 'ddp' or 'fsdp'" in capsys.readouterr().err
    with pytest.raises(WorkflowError, match=r"member 'dp' needs at least one rank, got ranks: 0"):
        spec(ranks=0)
    with pytest.raises(WorkflowError, match=r"member 'dp': parallel must be one of ddp, fsdp, got 'zero'"):
        spec(parallel="zero")


def test_parallel_reaches_the_member_spec(tmp_path: Path) -> None:
    from resilient_flows.workflow import load_workflow

    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: w\nmembers:\n  - {name: a, workload: mlp-digits, steps: 10, ranks: 4, parallel: fsdp}\n"
        "  - {name: b, workload: mlp-digits, steps: 10, ranks: 2}\n"
    )
    specs = load_workflow(path).member_specs(None)
    assert [(s.ranks, s.parallel) for s in specs] == [(4, "fsdp"), (2, "ddp")]
    assert MemberSpec.from_dict(specs[0].to_dict()) == specs[0]


def test_fsdp_of_a_workload_without_parameters_is_one_clear_error(tmp_path: Path) -> None:
    member = spec(workload="distributed_worker:parameterless", parallel="fsdp")
    with pytest.raises(LaunchError) as caught:
        run_member(member.to_dict(), str(tmp_path))
    assert str(caught.value) == (
        "member dp (workload distributed_worker:parameterless): parallel: fsdp needs a torch nn.Module with "
        "parameters to wrap, got a Sequential without parameters"
    )
    directory = tmp_path / "members/dp"
    assert not (directory / "result.json").exists() and not list((directory / "checkpoints").glob("step-*"))


def test_wrap_on_one_rank_returns_the_model_and_refuses_what_it_cannot_wrap(tmp_path: Path) -> None:
    ctx = TrainContext(spec(parallel="fsdp"), tmp_path)
    try:
        assert (ctx.rank, ctx.world_size, ctx.group, ctx.distributed) == (0, 1, None, None)
        model = nn.Linear(3, 2)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        assert ctx.wrap(model) is model and type(model) is nn.Linear
        assert all(v.equal(before[k]) for k, v in model.state_dict().items())
        with pytest.raises(LaunchError, match=r"member dp \(workload mlp-digits\): .* got a function"):
            ctx.wrap(lambda x: x)
    finally:
        ctx.close()


def test_a_member_of_several_ranks_without_a_launcher_says_so(tmp_path: Path, monkeypatch) -> None:
    for name in ("PMI_RANK", "PMI_SIZE", "RANK", "WORLD_SIZE", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PALS_RANKID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(LaunchError, match=r"member dp \(2 ranks\): no launcher environment found: start the ranks"):
        run_member(spec(ranks=2).to_dict(), str(tmp_path))


def test_resume_rank_overrides(tmp_path: Path, capsys) -> None:
    pending = [spec("a", ranks=2), spec("b")]
    assert [m.ranks for m in resize_members(pending, 4)] == [4, 4]
    assert [m.ranks for m in resize_members(pending, {"a": 1})] == [1, 1]
    assert resize_members(pending, None) == pending
    with pytest.raises(WorkflowError, match=r"--ranks c=2: 'c' already finished; pending: a, b"):
        resize_members(pending, {"c": 2}, ["a", "b", "c"])
    with pytest.raises(WorkflowError, match=r"'x' is not a member of this run"):
        resize_members(pending, {"x": 2}, ["a", "b"])
    for bad, message in (("0", "expected a count of at least 1"), ("a=two", "MEMBER=N"), ("=2", "MEMBER=N")):
        assert main(["resume", str(tmp_path), "--ranks", bad]) == 2
        assert message in capsys.readouterr().err
    assert main(["resume", str(tmp_path), "--ranks", "2", "--ranks", "a=1"]) == 2
    assert "--ranks 2 a=1: give a single N for every resumed member, or only MEMBER=N pairs" in capsys.readouterr().err


# ------------------------------------------------------------------ two real ranks


def assert_close(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in want)
    assert worst <= TOLERANCE, f"largest relative difference {worst:.2e}"


#: Members the launch trains on two ranks (``grow`` resumes there after one rank was preempted).
TWO_RANKS = {
    "mlp": spec("mlp", ranks=2),
    "cnn": spec("cnn", workload="cnn-digits", ranks=2, params={"channels": 8}),
    "fsdp": spec("fsdp", ranks=2, parallel="fsdp"),
    "shrink": spec("shrink", ranks=2, faults=(FaultSpec("preempt", 12),)),
    "fsdp-shrink": spec("fsdp-shrink", ranks=2, parallel="fsdp", faults=(FaultSpec("preempt", 12),)),
    "grow": spec("grow", ranks=2, faults=(FaultSpec("preempt", 12),)),
}


#: A workflow whose two-rank member fails: the launch runs its first attempt, ``resume --ranks`` the rest.
FAILING = (
    "name: dp\nretries: 0\ncheckpoint: {interval: 10}\n"
    "members:\n  - {name: dp, workload: mlp-digits, steps: 30, seed: 3, params: {hidden: 32}, ranks: 2}\n"
    "faults:\n  - {error: dp, at_step: 14}\n"
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """One ``mpiexec -n 2`` launch for every check that needs ranks; each rank's report."""
    from resilient_flows.workflow import load_workflow, plan_workflow
    from resilient_flows.workflow._recorded_plan import create_run_dir

    root = tmp_path_factory.mktemp("two-ranks")
    (root / "specs/run").mkdir(parents=True)
    for i, member in enumerate(TWO_RANKS.values()):
        (root / "specs/run" / f"{i:02d}-{member.name}.json").write_text(json.dumps(member.to_dict()))
    with pytest.raises(Preempted):  # grow's first attempt: one rank, SIGTERM at step 12
        run_member(replace(TWO_RANKS["grow"], ranks=1).to_dict(), str(root / "run"))
    (root / "wf.yaml").write_text(FAILING)
    plan = plan_workflow(load_workflow(root / "wf.yaml"))
    create_run_dir(root / "failing", plan, FAILING)
    (root / "specs/failing").mkdir()
    (root / "specs/failing/dp.json").write_text(json.dumps(plan.members[0].to_dict()))
    done = subprocess.run(
        [mpiexec(), "-n", "2", sys.executable, str(WORKER), str(root)],
        env=python_env(),
        timeout=240,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return root, [json.loads((root / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.mpi
def test_mpiexec_ranks_form_a_gloo_group_that_all_reduces(two_ranks) -> None:
    _, reports = two_ranks
    for rank, report in enumerate(reports):
        group = report["group"]
        assert (group["rank"], group["world_size"], group["local_rank"]) == (rank, 2, rank)
        assert (group["launcher"], group["backend"], group["device"], group["sum"]) == ("mpiexec", "gloo", "cpu", 3.0)
        assert group["same_info"] and group["initialized_after_first_shutdown"]
        assert not group["initialized_after_second_shutdown"]


@pytest.mark.slow
@pytest.mark.mpi
def test_fsdp_wrap_shards_each_layer_over_the_ranks(two_ranks) -> None:
    _, reports = two_ranks
    for rank, report in enumerate(reports):
        fsdp = report["fsdp"]
        assert fsdp["same_module"] and fsdp["class"] == "FSDPSequential" and fsdp["sharded"]
        assert fsdp["local_shapes"] == {
            "0.weight": [3, 4],
            "0.bias": [3],
            "2.weight": [2 if rank == 0 else 1, 6],
            "2.bias": [2 if rank == 0 else 1],
        }
        assert fsdp["ctx"] == [rank, 2, True]


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("name", ["mlp", "cnn", "fsdp"])
def test_a_member_on_two_ranks_trains_like_one_rank_on_the_same_global_batch(
    two_ranks, tmp_path: Path, name: str
) -> None:
    root, reports = two_ranks
    assert [r["members"][name] for r in reports] == [0, 0]
    reference = run_member(replace(TWO_RANKS[name], ranks=1).to_dict(), str(tmp_path))
    assert_close(loss_curve(root / "run", name), loss_curve(tmp_path, name))
    result = json.loads((root / f"run/members/{name}/result.json").read_text())
    assert abs(result["test_loss"] - reference["test_loss"]) <= TOLERANCE * reference["test_loss"]
    shards = sorted(p.name for p in (root / f"run/members/{name}/checkpoints/step-00000019").glob("shard-*"))
    assert shards == ["shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"]


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("name", ["shrink", "fsdp-shrink", "grow"])
def test_a_member_resumes_on_another_rank_count(two_ranks, tmp_path: Path, name: str) -> None:
    root, reports = two_ranks
    member = TWO_RANKS[name]
    run_dir = root / "run"
    if name == "grow":  # one rank, then two
        assert [r["members"][name] for r in reports] == [0, 0]
    else:  # two ranks, then one
        assert [r["members"][name] for r in reports] == [EXIT_PREEMPTED, EXIT_PREEMPTED]
        run_member(replace(member, ranks=1).to_dict(), str(run_dir))
    resumed = [e["step"] for e in read_events(run_dir) if e["member"] == name and e["kind"] == "resumed"]
    assert resumed == [12]
    run_member(replace(member, ranks=1, faults=()).to_dict(), str(tmp_path))
    assert_close(loss_curve(run_dir, name), loss_curve(tmp_path, name))


@pytest.mark.slow
@pytest.mark.mpi
def test_resume_ranks_runs_a_failed_two_rank_member_on_one(two_ranks, tmp_path: Path, capsys) -> None:
    root, reports = two_ranks
    run_dir = root / "failing"
    assert [r["members"]["dp"] for r in reports] == ["RuntimeError: injected error in member dp at step 14"] * 2
    assert main(["resume", str(run_dir), "--ranks", "dp=1"]) == 0
    assert "dp: 1 rank(s) instead of 2; its checkpoint is resharded" in capsys.readouterr().out
    assert [e["ranks"] for e in read_events(run_dir) if e["kind"] == "submitted"] == [1]
    assert [e["step"] for e in read_events(run_dir) if e["kind"] == "resumed"] == [9]
    run_member(spec(steps=30).to_dict(), str(tmp_path))
    assert_close(loss_curve(run_dir, "dp"), loss_curve(tmp_path, "dp"))
