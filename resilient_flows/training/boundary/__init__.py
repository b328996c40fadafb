"""The step boundary, written once for every training loop (see :mod:`._runtime`).

- :mod:`._signals`: SIGTERM and SIGUSR1 become a stop that waits for the next boundary.
- :mod:`._requests`: what a rank asks for at a boundary, and the faults injected there.
- :mod:`._ranks`: how the member's ranks agree, over whichever collectives the loop has.
- :mod:`._cadence`: when a checkpoint is due, and ``interval: auto``'s tuning.
- :mod:`._saver`: how the boundary saves, over our checkpointer or a framework's.
- :mod:`._runtime`: :class:`StepRuntime`, which runs a boundary, and the :class:`Stop` it ends in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resilient_flows.lazy import lazy_exports

_SOURCES = {
    "resilient_flows.training.boundary._cadence": ("Cadence",),
    "resilient_flows.training.boundary._ranks": (
        "CommRanks",
        "Ranks",
    ),
    "resilient_flows.training.boundary._requests": ("Request",),
    "resilient_flows.training.boundary._runtime": (
        "StepRuntime",
        "Stop",
        "member_events",
    ),
    "resilient_flows.training.boundary._saver": (
        "CheckpointSaver",
        "Saver",
    ),
    "resilient_flows.training.boundary._signals": ("StopSignals",),
}

if TYPE_CHECKING:  # the names' definitions, for type checkers and editors (a test keeps them equal to _SOURCES)
    from resilient_flows.training.boundary._cadence import (
        Cadence as Cadence,
    )
    from resilient_flows.training.boundary._ranks import (
        CommRanks as CommRanks,
    )
    from resilient_flows.training.boundary._ranks import (
        Ranks as Ranks,
    )
    from resilient_flows.training.boundary._requests import (
        Request as Request,
    )
    from resilient_flows.training.boundary._runtime import (
        StepRuntime as StepRuntime,
    )
    from resilient_flows.training.boundary._runtime import (
        Stop as Stop,
    )
    from resilient_flows.training.boundary._runtime import (
        member_events as member_events,
    )
    from resilient_flows.training.boundary._saver import (
        CheckpointSaver as CheckpointSaver,
    )
    from resilient_flows.training.boundary._saver import (
        Saver as Saver,
    )
    from resilient_flows.training.boundary._signals import (
        StopSignals as StopSignals,
    )

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
