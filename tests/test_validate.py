"""What ``validate`` (and ``run``, before anything is queued) refuses: functions that do not import
as a worker imports them, params a workload does not declare, site files with a mistake in a
provider or launcher, and site options that do not exist; each one line and exit status 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.errors import SiteConfigError, WorkloadError
from resilient_flows.sites import SITE_OPTIONS, SiteFile, SiteOptions
from resilient_flows.training import FunctionCheck, MemberSpec, StageSpec, probe_functions, run_member, run_stage
from resilient_flows.workflow import load_workflow, plan_workflow, read_plan
from resilient_flows.workflow._recorded_plan import create_run_dir

REPO = Path(__file__).resolve().parents[1]

MODULES = {
    "mods.py": (
        "import dataclasses\nimport pydantic\n\nVALUE = 3\n\n\ndef train(ctx):\n    return {}\n\n\n"
        "class Params(pydantic.BaseModel):\n    lr: float = 0.1\n    width: int\n\n\n"
        "def declared(ctx):\n    return {}\n\n\ndeclared.params = Params\n\n\n"
        "@dataclasses.dataclass\nclass Shape:\n    depth: int = 2\n    act: str = 'relu'\n\n\n"
        "def shaped(ctx):\n    return {}\n\n\nshaped.params = Shape\n\n\n"
        "def odd(ctx):\n    return {}\n\n\nodd.params = {'lr': float}\n"
    ),
    "loops.py": (
        "def loop(ctx, output, inputs, size: int = 4, rate: float = 0.1):\n    return None\n\n\n"
        "def anything(ctx, output, inputs, **params):\n    return None\n"
    ),
    "broken.py": "def train(ctx)\n    return {}\n",
    "raising.py": "raise RuntimeError('no GPU on this node')\n",
    "chatty.py": "print('hello from an import')\n\n\ndef train(ctx):\n    return {}\n",
    "slow.py": "import time\n\ntime.sleep(60)\n",
    "exiting.py": "import os\n\nos._exit(4)\n",
}


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user modules above, in a directory on the workers' ``PYTHONPATH``."""
    directory = tmp_path / "lib"
    directory.mkdir()
    for name, text in MODULES.items():
        (directory / name).write_text(text)
    monkeypatch.setenv("PYTHONPATH", f"{directory}:{REPO}")
    return directory


def member(workload: str, extra: str = "") -> str:
    return f"name: w\nmembers:\n  - name: m\n    workload: '{workload}'\n    steps: 3\n{extra}"


def validate(tmp_path: Path, text: str, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """``validate`` of ``text`` as a workflow file: the exit status, what it said (its one line
    of stderr, else its first line of stdout) and the file's path."""
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    status = main(["validate", str(path), *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 1, err
    return status, (err or out).strip().splitlines()[0], str(path)


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ("mypackage.train:train", r"no module named 'mypackage' where workers import from .*PYTHONPATH"),
        ("json:nosuchfunction", r"json has no function 'nosuchfunction'$"),
        ("mods:trian", r"mods has no function 'trian' \(did you mean 'train'\?\)"),
        ("mods:VALUE", r"mods.VALUE is a value of type int, not a function"),
        ("broken:train", r"broken.py:1: expected ':'"),
        ("raising:train", r"importing raising raised RuntimeError: no GPU on this node \(.*raising.py:1\)"),
        ("exiting:train", r"importing it ended the process: exit status 4"),
        ("mods:odd", r"its 'params' attribute declares the params it takes, as a pydantic model or a dataclass"),
    ],
)
def test_a_workload_that_does_not_import_is_one_line_naming_its_key(
    tmp_path: Path, modules: Path, capsys: pytest.CaptureFixture, workload: str, message: str
) -> None:
    status, err, path = validate(tmp_path, member(workload), capsys)
    assert status == 2
    assert err.startswith(f"error: {path}:4: members[0].workload: workload '{workload}': ")
    assert re.search(message, err), err


def test_evaluate_and_loop_functions_are_imported_too(tmp_path: Path, modules: Path, capsys) -> None:
    status, err, path = validate(tmp_path, member("mods:train", "    evaluate: 'mods:evaluat'\n"), capsys)
    assert status == 2
    assert (
        err == f"error: {path}:6: members[0].evaluate: evaluate function 'mods:evaluat': mods has no function 'evaluat'"
    )
    text = (
        "name: w\nstages:\n  - {name: s, loop: 'nosuch.module:loop'}\n"
        "members:\n  - {name: m, workload: mlp-digits, steps: 3}\n"
    )
    status, err, path = validate(tmp_path, text, capsys)
    assert status == 2
    assert err.startswith(f"error: {path}:3: stages[0].loop: loop function 'nosuch.module:loop': no module")


def test_what_a_module_prints_while_imported_does_not_garble_the_answer(tmp_path: Path, modules: Path, capsys) -> None:
    status, said, path = validate(tmp_path, member("chatty:train"), capsys)
    assert status == 0 and said == f"{path}: valid; 1 member(s) on site local"


def test_workers_import_from_their_path_and_the_workflow_directory_not_the_current_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A worker is a spawned child of Parsl's worker pool: ``sys.path`` is the pool's (its script's
    directory, ``PYTHONPATH``, site-packages), without the runner's current directory; a member
    puts its workflow file's directory first. A module in the current directory is found only
    once it is on ``PYTHONPATH``; one beside the workflow file always is."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "nearby.py").write_text("def train(ctx):\n    return {}\n")
    monkeypatch.chdir(here)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    status, err, _ = validate(tmp_path, member("nearby:train"), capsys)
    assert status == 2 and "no module named 'nearby'" in err and "the workflow file's directory" in err
    monkeypatch.setenv("PYTHONPATH", f"{here}:{REPO}")
    assert validate(tmp_path, member("nearby:train"), capsys)[0] == 0
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    (tmp_path / "beside.py").write_text("def train(ctx):\n    return {}\n")
    assert validate(tmp_path, member("beside:train"), capsys)[0] == 0


def test_a_module_that_hangs_while_imported_is_stopped_and_named(modules: Path) -> None:
    (problem,) = probe_functions([FunctionCheck("slow:train"), FunctionCheck("json:dumps")], timeout_s=2)
    assert problem.ref == "slow:train" and problem.member is None
    assert problem.message == (
        "workload 'slow:train': importing it took longer than 2 s; a module should not train or wait while it is "
        "imported"
    )


@pytest.mark.parametrize(
    ("extra", "where", "message"),
    [
        (
            "    params: {lr: fast, hiddenn: 3}\n",
            "6: members[0].params.hiddenn",
            "workload 'mlp-digits': unknown param 'hiddenn' (did you mean 'hidden'?); declared: batch_size, dropout, "
            "hidden, lr, momentum, weight_decay",
        ),
        ("    params: {lr: fast}\n", "6: members[0].params.lr", "param 'lr' = 'fast': Input should be a valid number"),
        (
            "    grid: {batch_size: [32, 64.5]}\n    seeds: [1, 2]\n",
            "6: members[0].grid.batch_size",
            "member 'm-2': workload 'mlp-digits': param 'batch_size' = 64.5: Input should be a valid integer "
            "(and 1 more)",
        ),
        (
            "    params: {dropout: 1.0}\n",
            "6: members[0].params.dropout",
            "param 'dropout' = 1.0: Input should be less than 1",
        ),
    ],
)
def test_a_builtin_refuses_params_it_does_not_declare(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, extra: str, where: str, message: str
) -> None:
    monkeypatch.setattr(
        "resilient_flows.workflow._preflight.probe_functions", lambda checks: [] if not checks else 1 / 0
    )
    status, err, path = validate(tmp_path, member("mlp-digits", extra), capsys)
    assert status == 2 and err.startswith(f"error: {path}:{where}: ") and err.endswith(message), err


def test_a_channels_param_is_the_cnns_and_hidden_the_mlps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert validate(tmp_path, member("cnn-digits", "    params: {channels: 8, lr: 1}\n"), capsys)[0] == 0
    status, err, _ = validate(tmp_path, member("cnn-digits", "    params: {hidden: 8}\n"), capsys)
    assert status == 2 and "unknown param 'hidden'" in err


@pytest.mark.parametrize(
    ("workload", "params", "message"),
    [
        ("mods:declared", "{lr: 1}", r"6: members\[0\].params: workload 'mods:declared': param 'width' is required"),
        ("mods:declared", "{width: 2, lr: x}", r"params.lr: workload 'mods:declared': param 'lr' = 'x': Input should"),
        ("mods:declared", "{width: '2'}", r"params.width: .*param 'width' = '2': Input should be a valid integer"),
        (
            "mods:shaped",
            "{depth: 3, ac: tanh}",
            r"params.ac: .*unknown param 'ac' \(did you mean 'act'\?\); declared: act, depth",
        ),
        ("mods:shaped", "{depth: 3, act: tanh}", None),
        ("mods:declared", "{width: 2, lr: 1}", None),
        ("mods:train", "{anything: [1, 2]}", None),  # no declaration: anything goes
    ],
)
def test_a_user_workload_declares_its_params_with_a_model_or_a_dataclass(
    tmp_path: Path, modules: Path, capsys: pytest.CaptureFixture, workload: str, params: str, message: str | None
) -> None:
    status, err, _ = validate(tmp_path, member(workload, f"    params: {params}\n"), capsys)
    if message is None:
        assert status == 0, err
    else:
        assert status == 2 and re.search(message, err), err


def test_a_campaigns_sample_is_checked_where_its_hyperparameter_is_written(
    tmp_path: Path, modules: Path, capsys: pytest.CaptureFixture
) -> None:
    text = (
        "name: w\nexplore:\n  - name: c\n    strategy: grid\n    workload: mods:declared\n    steps: 3\n"
        "    params: {width: 2}\n    hyperparameters: {lr: {values: [0.1, x]}}\n"
    )
    status, err, path = validate(tmp_path, text, capsys)
    assert status == 2
    assert err == (
        f"error: {path}:8: explore[0].hyperparameters.lr: member 'c-1': workload 'mods:declared': param 'lr' = 'x': "
        "Input should be a valid number"
    )


@pytest.mark.parametrize(
    ("loop", "params", "message"),
    [
        (
            "loop",
            "{siz: 8}",
            r"5: stages\[0\].params.siz: loop function 'loops:loop': unknown param 'siz' \(did you mean",
        ),
        ("loop", "{size: x}", r"5: stages\[0\].params.size: loop function 'loops:loop': param 'size' = 'x': Input"),
        ("loop", "{size: 8, rate: 1}", None),
        ("anything", "{whatever: 1}", None),  # **params: it takes any
    ],
)
def test_a_stages_loop_declares_its_params_by_its_signature(
    tmp_path: Path, modules: Path, capsys: pytest.CaptureFixture, loop: str, params: str, message: str | None
) -> None:
    text = (
        f"name: w\nstages:\n  - name: s\n    loop: 'loops:{loop}'\n    params: {params}\n"
        "members:\n  - {name: m, workload: mlp-digits, steps: 3}\n"
    )
    status, said, _ = validate(tmp_path, text, capsys)
    if message is None:
        assert status == 0, said
    else:
        assert status == 2 and re.search(message, said), said


def test_a_member_refuses_undeclared_params_before_it_trains(tmp_path: Path) -> None:
    """A plain Parsl script gets the line ``validate`` gives, before anything is recorded."""
    spec = MemberSpec(name="m", workload="mlp-digits", params={"lr": "fast"}, steps=3)
    with pytest.raises(WorkloadError, match=r"^workload 'mlp-digits': param 'lr' = 'fast': Input should be a valid"):
        run_member(spec.to_dict(), str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_stage_refuses_params_its_loop_does_not_take_before_it_runs(
    tmp_path: Path, modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(modules))
    stage = StageSpec(name="s", loop="loops:loop", params={"siz": 8})
    with pytest.raises(WorkloadError, match=r"^loop function 'loops:loop': unknown param 'siz' \(did you mean 'size'"):
        run_stage(stage.to_dict(), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_run_refuses_before_anything_is_queued(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(member("json:nosuchfunction"))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert "json has no function 'nosuchfunction'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_command_whose_program_is_missing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = "name: w\nmembers:\n  - {name: c, command: [no-such-program-here, x], steps: 1}\n"
    status, err, _ = validate(tmp_path, text, capsys)
    assert status == 2 and "program 'no-such-program-here' not found on PATH nor in" in err


def test_the_cli_says_one_line_and_exits_2_for_the_reported_case(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(member("mypackage.train:train"))
    done = subprocess.run(
        [sys.executable, "-m", "resilient_flows.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no module named 'mypackage'" in done.stderr


@pytest.mark.parametrize("name", ["quickstart", "clone", "cosched", "gpt", "heat-surrogate", "lightning", "pbt"])
def test_the_example_workflows_still_validate(name: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(REPO / "workflows" / f"{name}.yaml")]) == 0
    assert "valid;" in capsys.readouterr().out


# ---------------------------------------------------------------------- sites


@pytest.fixture
def alcf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECT", "MYPROJ")
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    monkeypatch.setenv("SHARED_FS", "/shared")


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        (
            ("cpus_per_node: 32", "cpus_per_nod: 32"),
            r"executors\[0\]\.provider \(PBSProProvider\): unknown key 'cpus_per_nod' "
            r"\(did you mean 'cpus_per_node'\?\)",
        ),
        (
            ("bind_cmd: --cpu-bind", "bind_cm: --cpu-bind"),
            r"executors\[0\]\.provider\.launcher \(MpiExecLauncher\): unknown key 'bind_cm' "
            r"\(did you mean 'bind_cmd'\?\)",
        ),
        (
            ("cpu_affinity: block-reverse", "cpu_affinity: 7"),
            r"executors\[0\] \(HighThroughputExecutor\): cpu_affinity",
        ),
    ],
)
def test_validate_names_a_mistake_in_a_copied_site_file(
    tmp_path: Path, alcf: None, capsys: pytest.CaptureFixture, typo: tuple[str, str], message: str
) -> None:
    site = tmp_path / "my-polaris.yaml"
    text = (REPO / "site-configs" / "polaris.yaml").read_text()
    assert typo[0] in text
    site.write_text(text.replace(typo[0], typo[1]))
    status, err, _ = validate(tmp_path, member("mlp-digits"), capsys, "--site", str(site))
    assert status == 2 and re.search(message, err), err


def test_an_annotated_parsl_argument_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(
        "executors:\n  - type: HighThroughputExecutor\n    provider: {type: SlurmProvider, nodes_per_block: '4'}\n"
        "facts: {nodes: 1, cores_per_node: 2}\n"
    )
    with pytest.raises(SiteConfigError, match=r"\(SlurmProvider\): nodes_per_block must be int, got '4'$"):
        SiteFile.open(site).config()


def test_site_options_in_the_workflow_reach_the_provider_and_the_facts(tmp_path: Path, alcf: None) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(
        "name: w\nsite: {name: polaris, nodes: 4, walltime: 2h, queue: prod, account: OTHER}\n"
        "members:\n  - {name: m, workload: mlp-digits, steps: 3}\n"
    )
    plan = plan_workflow(load_workflow(path))
    provider = plan.site_file.config().executors[0].provider
    assert (provider.nodes_per_block, provider.walltime, provider.queue, provider.account) == (
        4,
        "02:00:00",
        "prod",
        "OTHER",
    )
    facts = plan.site_file.facts()
    assert (facts.nodes, facts.walltime_s) == (4, 7200.0)
    # --set changes the workflow's options; a run directory keeps them for resume
    plan = plan_workflow(load_workflow(path), options=SiteOptions(walltime="30m", queue="debug"))
    assert plan.workflow.site.given() == {"nodes": 4, "walltime": "30m", "queue": "debug", "account": "OTHER"}
    run_dir = create_run_dir(tmp_path / "run", plan, path.read_text())
    back = read_plan(run_dir)
    provider = SiteFile.open(back.site, back.workflow.site).config().executors[0].provider
    assert (provider.nodes_per_block, provider.walltime, provider.queue) == (4, "00:30:00", "debug")


def test_the_slurm_queue_is_its_partition(alcf: None) -> None:
    site = SiteFile.open("slurm", SiteOptions(queue="gpu", walltime="01:30:00", nodes=2))
    provider = site.config().executors[0].provider
    assert (provider.partition, provider.walltime, provider.nodes_per_block) == ("gpu", "01:30:00", 2)
    assert (site.facts().walltime_s, site.facts().nodes) == (5400.0, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "nodez=4"],
            r"--set 'nodez=4': unknown site option 'nodez' \(did you mean 'nodes'\?\); "
            r"allowed: nodes, walltime, queue, account$",
        ),
        (["--set", "nodes=four"], r"--set nodes=four: Input should be a valid integer"),
        (["--set", "nodes=0"], r"--set nodes=0: Input should be greater than or equal to 1"),
        (["--set", "walltime=soon"], r"--set walltime=soon: walltime must be a duration like 2h, 90m or HH:MM:SS"),
        (["--set", "queue"], r"--set 'queue': expected KEY=VALUE"),
        (
            ["--set", "queue=debug"],
            r"local.yaml: executors\[0\]: its provider, LocalProvider, takes no site options \(queue\)",
        ),
    ],
)
def test_bad_site_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    status, err, _ = validate(tmp_path, member("mlp-digits"), capsys, *args)
    assert status == 2 and re.search(message, err), err


def test_an_unknown_option_in_the_workflows_site_is_named_with_its_line(tmp_path: Path, capsys) -> None:
    text = "name: w\nsite: {name: slurm, nodez: 4}\nmembers:\n  - {name: m, workload: mlp-digits, steps: 3}\n"
    status, err, path = validate(tmp_path, text, capsys)
    assert status == 2
    allowed = "nodes, walltime, queue, account, name"
    assert err == f"error: {path}:2: site.nodez: unknown key (did you mean 'nodes'?); allowed: {allowed}"


def test_validate_shows_the_options_and_help_names_them(tmp_path: Path, alcf: None, capsys) -> None:
    status, said, path = validate(tmp_path, member("mlp-digits"), capsys, "--site", "slurm", "--set", "nodes=2")
    assert status == 0 and said == f"{path}: valid; 1 member(s) on site slurm (nodes 2)"
    for command in ("validate", "run", "resume"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        shown = capsys.readouterr().out
        assert all(key in shown for key in SITE_OPTIONS)
