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

from typing import TYPE_CHECKING

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
        "CheckpointSection",
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

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.workflow.schema._expansion import (
        AUTO_WARMUP_STEPS as AUTO_WARMUP_STEPS,
    )
    from resilient_flows.workflow.schema._expansion import (
        DEFAULT_NODE_MTBF_S as DEFAULT_NODE_MTBF_S,
    )
    from resilient_flows.workflow.schema._fields import (
        FAULT_KINDS as FAULT_KINDS,
    )
    from resilient_flows.workflow.schema._fields import (
        TIERS as TIERS,
    )
    from resilient_flows.workflow.schema._fields import (
        check_one_way_to_run as check_one_way_to_run,
    )
    from resilient_flows.workflow.schema._fields import (
        check_workload as check_workload,
    )
    from resilient_flows.workflow.schema._fields import (
        confined as confined,
    )
    from resilient_flows.workflow.schema._fields import (
        run_path as run_path,
    )
    from resilient_flows.workflow.schema._loading import (
        load_workflow as load_workflow,
    )
    from resilient_flows.workflow.schema._loading import (
        parse_workflow as parse_workflow,
    )
    from resilient_flows.workflow.schema._models import (
        AnalyticsConfig as AnalyticsConfig,
    )
    from resilient_flows.workflow.schema._models import (
        AnalyticsWhen as AnalyticsWhen,
    )
    from resilient_flows.workflow.schema._models import (
        CheckpointSection as CheckpointSection,
    )
    from resilient_flows.workflow.schema._models import (
        CloneConfig as CloneConfig,
    )
    from resilient_flows.workflow.schema._models import (
        CoschedConfig as CoschedConfig,
    )
    from resilient_flows.workflow.schema._models import (
        ExploreConfig as ExploreConfig,
    )
    from resilient_flows.workflow.schema._models import (
        FaultConfig as FaultConfig,
    )
    from resilient_flows.workflow.schema._models import (
        HyperparameterSpace as HyperparameterSpace,
    )
    from resilient_flows.workflow.schema._models import (
        MemberConfig as MemberConfig,
    )
    from resilient_flows.workflow.schema._models import (
        ReportConfig as ReportConfig,
    )
    from resilient_flows.workflow.schema._models import (
        SiteConfig as SiteConfig,
    )
    from resilient_flows.workflow.schema._models import (
        StageConfig as StageConfig,
    )
    from resilient_flows.workflow.schema._workflow import (
        Workflow as Workflow,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
