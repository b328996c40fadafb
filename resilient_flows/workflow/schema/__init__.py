"""The workflow file: typed, strict, and expanded into one :class:`MemberSpec` per ensemble member.

Unknown keys and wrong types are errors naming the key and its line (see :func:`load_workflow`).
Member names become directory names in the run directory, so they are restricted to a safe
alphabet; every other path a workflow names is resolved inside the run directory.

The package in layers, each importing only those above it: ``fields`` (the strict base, names,
durations, confined paths), ``models`` (the sections), ``expansion`` (entries to specs),
``checks`` (what holds across sections), ``workflow`` (the whole file), ``loading`` (YAML in,
errors out).
"""

from resilient_flows.workflow.schema.expansion import AUTO_WARMUP_STEPS, DEFAULT_NODE_MTBF_S
from resilient_flows.workflow.schema.fields import (
    FAULT_KINDS,
    TIERS,
    check_one_way_to_run,
    check_workload,
    confined,
    run_path,
)
from resilient_flows.workflow.schema.loading import load_workflow, parse_workflow
from resilient_flows.workflow.schema.models import (
    AnalyticsConfig,
    AnalyticsWhen,
    CheckpointConfig,
    CloneConfig,
    CoschedConfig,
    ExploreConfig,
    FaultConfig,
    HyperparameterSpace,
    MemberConfig,
    ReportConfig,
    StageConfig,
)
from resilient_flows.workflow.schema.workflow import Workflow

__all__ = [
    "AUTO_WARMUP_STEPS",
    "DEFAULT_NODE_MTBF_S",
    "FAULT_KINDS",
    "TIERS",
    "AnalyticsConfig",
    "AnalyticsWhen",
    "CheckpointConfig",
    "CloneConfig",
    "CoschedConfig",
    "ExploreConfig",
    "FaultConfig",
    "HyperparameterSpace",
    "MemberConfig",
    "ReportConfig",
    "StageConfig",
    "Workflow",
    "check_one_way_to_run",
    "check_workload",
    "confined",
    "load_workflow",
    "parse_workflow",
    "run_path",
]
