"""The step boundary, written once for every training loop (see :mod:`.runtime`).

- :mod:`.signals`: SIGTERM and SIGUSR1 become a stop that waits for the next boundary.
- :mod:`.requests`: what a rank asks for at a boundary, and the faults injected there.
- :mod:`.ranks`: how the member's ranks agree, over whichever collectives the loop has.
- :mod:`.cadence`: when a checkpoint is due, and ``interval: auto``'s tuning.
- :mod:`.saver`: how the boundary saves, over our checkpointer or a framework's.
- :mod:`.runtime`: :class:`StepRuntime`, which runs a boundary, and the :class:`Stop` it ends in.
"""

from resilient_flows.training.boundary.cadence import Cadence
from resilient_flows.training.boundary.ranks import CommRanks, Ranks
from resilient_flows.training.boundary.requests import Request
from resilient_flows.training.boundary.runtime import StepRuntime, Stop, member_events
from resilient_flows.training.boundary.saver import CheckpointSaver, Saver
from resilient_flows.training.boundary.signals import StopSignals

__all__ = [
    "Cadence",
    "CheckpointSaver",
    "CommRanks",
    "Ranks",
    "Request",
    "Saver",
    "StepRuntime",
    "Stop",
    "StopSignals",
    "member_events",
]
