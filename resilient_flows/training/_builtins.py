"""The built-in workloads' names and defaults, importable without torch: the workflow schema checks
names against them and a clone's overrides against their parameters."""

from __future__ import annotations

#: The built-in workloads, by name (see :mod:`resilient_flows.training._workloads`).
BUILTIN_WORKLOADS = ("mlp-digits", "mlp-breast-cancer", "cnn-digits")
#: Defaults of the built-ins; a member's ``params`` override them.
DEFAULTS = {"lr": 0.05, "momentum": 0.9, "hidden": 64, "batch_size": 64, "dropout": 0.1, "weight_decay": 0.0}
#: Params that decide the shape of a model: a clone cannot change them.
STRUCTURAL = frozenset({"hidden", "channels"})
