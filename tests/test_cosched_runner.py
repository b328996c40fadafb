"""On-demand analytics in a real run (local site, HTEX workers): the policy's victim is the one preempted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.cosched import OnDemandRequest, decide
from resilient_flows.errors import WorkflowError
from resilient_flows.training import read_events, run_member
from resilient_flows.workflow import load_workflow, read_plan
from resilient_flows.workflow._ondemand import job_from_record
from resilient_flows.workflow._status import loss_curve

# Both worker slots of the local site are busy when "peek" needs one. max_delay 0: the request
# cannot wait, so dp must pick the victim now; "steady" has a checkpoint a few steps old, "rare"
# none since its start, so dp preempts "steady".
WORKFLOW = """\
name: od
retries: 1
members:
  - {name: steady, workload: mlp-digits, steps: 600, params: {hidden: 512, batch_size: 256},
     checkpoint: {interval: 20}}
  - {name: rare, workload: mlp-digits, steps: 600, params: {hidden: 512, batch_size: 256}, seed: 1,
     checkpoint: {interval: 5000}}
analytics:
  - {name: peek, when: {member: steady, step: 200}, slots: 1}
cosched: {policy: dp, max_delay: 0s}
"""


@pytest.mark.slow
def test_the_member_dp_picks_is_preempted_and_ends_like_an_uninterrupted_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "od.yaml"
    path.write_text(WORKFLOW)
    run_dir = tmp_path / "run"
    assert main(["run", str(path), "--run-dir", str(run_dir)]) == 0
    assert "preempt steady" in (run_dir / "report/summary.txt").read_text()

    events = list(read_events(run_dir))
    (decided,) = [e for e in events if e["kind"] == "ondemand"]
    assert decided["free"] == 0 and [j["id"] for j in decided["jobs"]] == ["steady", "rare"]
    replayed = decide(
        "dp",
        now=decided["now"],
        free_nodes=decided["free"],
        running=[job_from_record(j) for j in decided["jobs"]],
        request=OnDemandRequest(nodes=1, arrival=decided["now"], duration=60.0, id="peek"),
        alpha=decided["alpha"],
        beta=decided["beta"],
        max_delay=decided["max_delay"],
    )
    assert (decided["delay"], decided["preempt"], decided["cost"]) == (0.0, ["steady"], replayed.cost)
    assert replayed.preempt == ("steady",)

    preempted = [e for e in events if e["kind"] == "preempted"]
    assert [(e["member"], e["reason"]) for e in preempted] == [("steady", "on-demand analytics peek")]
    (started,) = [e for e in events if e["kind"] == "analytics_started"]
    assert started["time"] >= preempted[0]["time"]  # it ran on the slot the victim gave up
    resumed = [e for e in events if e["kind"] == "resumed" and e["member"] == "steady"]
    assert [e["step"] for e in resumed] == [preempted[0]["step"]]
    assert not [e for e in events if e["member"] == "rare" and e["kind"] in ("preempted", "failed")]

    for spec in read_plan(run_dir).members:
        reference = run_member(replace(spec, faults=()).to_dict(), str(tmp_path / "ref"))
        result = json.loads((run_dir / "members" / spec.name / "result.json").read_text())
        assert result["digest"] == reference["digest"], spec.name
        assert loss_curve(run_dir, spec.name) == loss_curve(tmp_path / "ref", spec.name)


def test_an_on_demand_request_is_checked_when_the_workflow_loads(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(WORKFLOW.replace("when: {member: steady, step: 200}", "when: {member: nobody, step: 2}"))
    with pytest.raises(WorkflowError, match="analytics 'peek' waits for member 'nobody', which is not one of"):
        load_workflow(path)
    path.write_text(WORKFLOW.replace("when: {member: steady, step: 200}, ", ""))
    with pytest.raises(WorkflowError, match="give 'after' \\(a time\\) or 'when'"):
        load_workflow(path)
    path.write_text(WORKFLOW.replace("policy: dp", "policy: fastest"))
    with pytest.raises(WorkflowError, match=r"cosched\.policy"):
        load_workflow(path)
