"""A byte-level GPT on the Python reference every Python installation ships: the flagship workload.

``workflows/gpt.yaml`` trains two members of it; ``docs/guides/gpt.md`` describes the run, the
sizes (:data:`SIZES`) and what a fault costs.
"""

from resilient_flows.examples.gpt.model import GPT, SIZES, GPTConfig, parameter_count
from resilient_flows.examples.gpt.train import Params, evaluate, train

__all__ = ["GPT", "SIZES", "GPTConfig", "Params", "evaluate", "parameter_count", "train"]
