"""Stop signals that wait for a step boundary instead of ending the process."""

from __future__ import annotations

import signal
import threading
from typing import Any

from resilient_flows.training._contract import STOP_SIGNALS


class StopSignals:
    """SIGTERM and SIGUSR1 set :attr:`reason` while installed, on the main thread only (where
    Python delivers signals); elsewhere installing does nothing. Installs nest (a script's run
    holds them while its loop's context does too); the last :meth:`restore` puts back the
    handlers the first :meth:`install` replaced. Also a context manager."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}
        self._depth = 0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._depth == 0:
            self._previous = {sig: signal.signal(sig, self._request_stop) for sig in STOP_SIGNALS}
        self._depth += 1

    def restore(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous = {}

    def __enter__(self) -> StopSignals:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def _request_stop(self, signum: int, _frame: Any) -> None:
        self.reason = f"signal {signal.Signals(signum).name}"
