"""One checkpoint configuration from a workflow's YAML to the engine's tiers, and its bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilient_flows.checkpoint import CheckpointConfig, Checkpointer, TierSpec
from resilient_flows.errors import CheckpointConfigError
from resilient_flows.training import MemberSpec
from resilient_flows.training._contract import ENV_NAMES, RunContract
from resilient_flows.training._script import _member_spec
from resilient_flows.workflow import load_workflow

WORKFLOW = """\
name: cfg
checkpoint:
  interval: 7
  keep: 4
  overlap: true
  tiers: [memory, local, peer, shared]
  persist_every: {local: 2, shared: 3}
members:
  - name: m
    command: [sh, -c, "exit 0"]
    steps: 30
"""


def test_a_workflows_checkpoint_section_reaches_the_engines_tiers_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE", "n7")
    path = tmp_path / "wf.yaml"
    path.write_text(WORKFLOW)
    shm, disk = tmp_path / "shm", tmp_path / "disk/${NODE}"
    (planned,) = load_workflow(path).member_specs(
        str(disk), memory_root=str(shm), peer_root=str(shm / ".peer"), peer_capacity=1 << 20
    )
    sent = json.loads(json.dumps(planned.to_dict()))  # what travels to the worker
    spec = MemberSpec.from_dict(sent)
    assert spec == planned
    run_dir = tmp_path / "run"
    env = RunContract.for_member(spec, run_dir, attempt=1).to_env()  # on the node: ${NODE} expanded
    ran = _member_spec(RunContract.from_env(env))  # the script's side
    with Checkpointer.from_config(ran.checkpoint, heartbeat=False) as ck:
        got = [(t.name, Path(t.path), t.persist_every, t.peer, t.capacity) for t in ck.tier_specs]
    shared = (run_dir / "members/m/checkpoints").resolve()
    assert got == [
        ("memory", shm / "m", 1, False, None),
        ("local", tmp_path / "disk/n7/m", 2, False, None),
        ("peer", shm / ".peer/m", 1, True, 1 << 20),
        ("shared", shared, 3, False, None),
    ]
    assert (ck.keep, ck.shared_every) == (4, 3)
    cadence = ran.checkpoint
    assert (cadence.interval_steps, cadence.interval_s, cadence.keep, cadence.overlap) == (7, None, 4, True)
    assert env[ENV_NAMES["checkpoint_dir"]] == str(shared)


def test_the_json_form_round_trips(tmp_path: Path) -> None:
    config = CheckpointConfig(
        tiers=(TierSpec(str(tmp_path / "l")), TierSpec(str(tmp_path / "p"), peer=True, capacity=5), TierSpec("s", 2)),
        interval_steps=None,
        interval_s=30.0,
        auto=True,
        process_mtbf_s=600.0,
        node_mtbf_s=7200.0,
    )
    assert CheckpointConfig.from_json(config.to_json()) == config
    assert [t.name for t in config.tiers] == ["local", "peer", "shared"]


BAD_CONFIGS = [
    ({"tiers": [{"path": "a", "every": 2}]}, r"^checkpoint.tiers\[0\]: unknown tier option 'every' \(known: capacity,"),
    ({"tiers": [{"name": "x"}]}, r"^checkpoint.tiers\[0\].path is missing"),
    (
        {"tiers": [{"path": "a"}, {"path": "b", "persist_every": 0}]},
        r"tiers\[1\].persist_every must be an integer >= 1",
    ),
    ({"tiers": [{"path": "a"}, {"path": "./a"}]}, r"tiers\[1\].path and tiers\[0\].path are the same directory"),
    ({"tiers": "a"}, r"^checkpoint.tiers must be a list of tiers"),
    ({"keep": 0}, r"^checkpoint: keep must be an integer >= 1, got 0"),
    ({"interval_steps": 0}, r"^checkpoint: interval_steps must be an integer >= 1, got 0"),
    ({"interval_s": -1}, r"^checkpoint: interval_s must be a number of seconds > 0"),
    ({"overlap": "yes"}, r"^checkpoint: overlap must be true or false"),
    ({"persist_every": 2}, r"^checkpoint: unknown option 'persist_every'"),
]


@pytest.mark.parametrize(("data", "message"), BAD_CONFIGS)
def test_a_bad_configuration_is_one_error_naming_the_field(data: dict, message: str) -> None:
    with pytest.raises(CheckpointConfigError, match=message) as caught:
        CheckpointConfig.from_dict(data)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", r"^RESILIENT_FLOWS_CHECKPOINT is not a JSON checkpoint configuration"),
        ('{"keep": NaN}', r"^RESILIENT_FLOWS_CHECKPOINT is not a JSON .*NaN is not strict JSON"),
        ("[]", r"^RESILIENT_FLOWS_CHECKPOINT must be an object, got list"),
        ('{"tiers": [{"path": "a", "size": 1}]}', r"^RESILIENT_FLOWS_CHECKPOINT.tiers\[0\]: unknown tier option"),
        ('{"keep": 0}', r"^RESILIENT_FLOWS_CHECKPOINT: keep must be an integer >= 1"),
    ],
)
def test_a_bad_contract_variable_is_named(tmp_path: Path, value: str, message: str) -> None:
    spec = MemberSpec(name="m", workload="", params={}, command=["true"])
    env = RunContract.for_member(spec, tmp_path, attempt=1).to_env()
    with pytest.raises(CheckpointConfigError, match=message):
        RunContract.from_env({**env, ENV_NAMES["checkpoint"]: value})


def test_a_contract_without_a_configuration_checkpoints_to_its_directory_with_the_defaults(tmp_path: Path) -> None:
    env = {ENV_NAMES["run_dir"]: str(tmp_path), ENV_NAMES["member"]: "m", ENV_NAMES["checkpoint_dir"]: str(tmp_path)}
    config = RunContract.from_env(env).checkpoint_config()
    assert config == CheckpointConfig(tiers=(TierSpec(str(tmp_path), name="shared"),))
