"""Your own training script as a workflow member: :func:`from_env` and the :class:`ScriptRun` it returns.

A command member's script reads its run contract (:mod:`resilient_flows.training._contract`) and
gets the same checkpointing, resume, metrics, stop signals and control requests as a
:class:`~resilient_flows.training.TrainContext`, which does the work underneath::

    run = from_env()
    start = run.restore(model=model, optimizer=optimizer)   # 0, or the step after the checkpoint
    for step in range(start, run.params["steps"]):
        loss = train_one_step(step)                          # the batch must depend on step only
        run.step(step, loss=loss)                            # metrics line; checkpoint when due
    run.close(model=model)                                   # commit the last step, report

:meth:`ScriptRun.step` ends the process when the member must stop: after committing a checkpoint
on SIGTERM/SIGUSR1 or a preemption request it exits with status 75 (requeued for free); on a
retirement request with status 0.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from resilient_flows.errors import Preempted, ResilientFlowsError
from resilient_flows.training._context import TrainContext
from resilient_flows.training._contract import EXIT_PREEMPTED, RunContract
from resilient_flows.training._distributed import read_launch_env
from resilient_flows.training._members import read_spec
from resilient_flows.training._spec import MemberSpec

logger = logging.getLogger(__name__)


def from_env(environ: Mapping[str, str] | None = None) -> ScriptRun:
    """The member this process runs, from its run contract; ready to :meth:`~ScriptRun.restore`.

    The contract carries the member's whole checkpoint configuration; its registered spec supplies
    the rest (injected faults, ``parallel``); a process started by another launcher that sets only
    the contract's required variables gets the defaults. Under ``torchrun`` every rank calls it;
    they form one process group and write one sharded checkpoint. (``mpiexec`` and ``srun``
    ranks are not recognised: their variables may be inherited from the worker pool's launch.)
    """
    contract = RunContract.from_env(environ)
    return ScriptRun(contract, _member_spec(contract))


class ScriptRun:
    """One attempt of a command member inside its script (see the module's example).

    Attributes
    ----------
    contract:
        The run contract this process was started with.
    params:
        The member's params, with ``seed`` and ``steps``.
    context:
        The :class:`~resilient_flows.training.TrainContext` underneath (its ``checkpointer``,
        ``rank``, ``wrap`` for DDP/FSDP on several ranks).
    """

    def __init__(self, contract: RunContract, spec: MemberSpec) -> None:
        self.contract = contract
        self.params = dict(contract.params)
        self.context = TrainContext(spec, contract.run_dir, attempt=contract.attempt)
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(self.context.runtime.signals)  # from now on a stop waits for a step boundary
        self._last_step: int | None = None
        self._closed = False
        atexit.register(self._abandon)

    @property
    def attempt(self) -> int:
        return self.contract.attempt

    def restore(
        self, model: Any = None, optimizer: Any = None, scheduler: Any = None, extra: dict[str, Any] | None = None
    ) -> int:
        """Declare what a checkpoint holds and restore the newest committed one; the first step to run.

        On a block drained before the member could reach a checkpoint (its walltime is near), it
        trains nothing and exits with status 75: requeued for free, on a fresh block."""
        restored = self.context.track(model, optimizer, scheduler, extra)
        self.context.report_if_cloned()
        first = 0 if restored is None else restored + 1
        if first < int(self.params.get("steps", first + 1)):
            declined = self.context.runtime.decline_start(first)
            if declined is not None:
                self._last_step = None
                self.close()
                print(f"member {self.contract.member}: not starting: {declined.reason}", file=sys.stderr)
                raise SystemExit(EXIT_PREEMPTED)
        return first

    def step(self, step: int, **metrics: float) -> None:
        """After training ``step``: log its metrics, checkpoint when due, honour stop requests.

        On SIGTERM/SIGUSR1 or a preemption request it commits a checkpoint of ``step`` and exits
        with status 75; on a retirement request it commits, reports and exits with status 0.
        """
        if self.context.state is None:
            raise ResilientFlowsError("call run.restore(model=..., optimizer=...) before run.step()")
        if metrics:
            self.context.log(step, **metrics)
        self._last_step = step
        try:
            retired = self.context.after_step(step)
        except Preempted as exc:
            self._last_step = None  # committed already
            self.close()
            print(exc, file=sys.stderr)
            raise SystemExit(EXIT_PREEMPTED) from None
        if retired:
            self.close()
            raise SystemExit(0)

    def close(self, model: Any = None, **values: Any) -> dict[str, Any]:
        """Commit the last step, write the member's report (its last metrics, the weights' digest
        when ``model`` is given, and ``values``), stop the checkpointer; the report. Idempotent."""
        ctx = self.context
        if self._closed:
            return ctx.result(model, **values)
        try:
            if self._last_step is not None:
                ctx.runtime.commit(self._last_step)
            report = ctx.result(model, **values)
            if ctx.rank == 0:
                ctx.layout.write_command_report(report)
        finally:
            self._closed = True
            self._signals.close()
            ctx.close()
        return report

    def __enter__(self) -> ScriptRun:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.close()
        else:
            self._abandon()

    def _abandon(self) -> None:
        """A script that ends without :meth:`close` (an exception, ``sys.exit``) waits for the
        checkpoints in flight but reports nothing: the attempt did not finish."""
        if not self._closed:
            self._closed = True
            self._signals.close()
            self.context.close()


def _member_spec(contract: RunContract) -> MemberSpec:
    """The member as registered, or one made from the contract alone, with the contract's
    checkpoint configuration as it is; its rank count is the launcher's."""
    registered = read_spec(contract.run_dir, contract.member)
    params = {k: v for k, v in contract.params.items() if k not in ("seed", "steps")}
    base = registered or MemberSpec(
        name=contract.member,
        workload="",
        params=params,
        seed=int(contract.params.get("seed", 0)),
        steps=int(contract.params.get("steps", 0)),
    )
    launched = read_launch_env()  # MPI and Slurm variables may be the worker pool's, inherited: not ours
    ranks = launched.world_size if launched is not None and launched.launcher == "torchrun" else 1
    return replace(base, params=params, checkpoint=contract.checkpoint_config(), ranks=ranks)
