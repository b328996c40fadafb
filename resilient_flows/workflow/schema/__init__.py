"""The workflow file: typed, strict, and expanded into one :class:`MemberSpec` per ensemble member.

Unknown keys and wrong types are errors naming the key and its line (see :func:`load_workflow`).
Member names become directory names in the run directory, so they are restricted to a safe
alphabet; every other path a workflow names is resolved inside the run directory.

The package in layers, each importing only those above it: ``fields`` (the strict base, names,
durations, confined paths), ``models`` (the sections), ``expansion`` (entries to specs),
``checks`` (what holds across sections), ``workflow`` (the whole file), ``loading`` (YAML in,
errors out).
"""

from __future__ import annotations

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.workflow.schema._expansion": (
        "AUTO_WARMUP_STEPS",
        "DEFAULT_NODE_MTBF_S",
    ),
    "resilient_flows.workflow.schema._fields": (
        "FAULT_KINDS",
        "TIERS",
        "check_one_way_to_run",
        "check_workload",
        "confined",
        "run_path",
    ),
    "resilient_flows.workflow.schema._loading": (
        "load_workflow",
        "parse_workflow",
    ),
    "resilient_flows.workflow.schema._models": (
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
        "SiteConfig",
        "StageConfig",
    ),
    "resilient_flows.workflow.schema._workflow": ("Workflow",),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
