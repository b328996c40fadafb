"""``python -m resilient_flows.training.mpi_member SPEC.json RUN_DIR [ATTEMPT]``: one rank of a data-parallel member.

Launched by ``mpiexec`` (or Parsl's ``$PARSL_MPI_PREFIX``); the ranks agree over ``MPI.COMM_WORLD``
on a torch.distributed process group (see :mod:`resilient_flows.training._distributed`), which the
workload's DDP or FSDP and the shared checkpointer use. Launched by ``srun`` (a member spanning
the nodes of a Slurm block), the ranks form the group from Slurm's variables instead and never
initialise MPI: a Slurm without an MPI plugin would make each rank an MPI world of its own. Exit
status :data:`EXIT_PREEMPTED` tells the retry handler that the member stopped on request after
committing a checkpoint, which is not a failure; a rank that fails records whether it failed on
its own or saw a peer rank gone (:mod:`resilient_flows.training._faults`), which the launcher's
exit status cannot say; a rank that saw a peer gone exits with :data:`EXIT_PEER_LOST`, so that
the launcher's status says it too where no record can be read (a lost node's file system).

Given the ``ATTEMPT`` its launch counts as, each rank first sends its output to that attempt's
log of its rank (:meth:`~resilient_flows.rundir.TaskLayout.attempt_log`): rank 0's beside the
launcher's messages, every other rank's in a file of its own, so that no rank's traceback is lost
among the others' lines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from resilient_flows.capped import DOCUMENT_CAP
from resilient_flows.errors import LaunchError, Preempted
from resilient_flows.rundir import TaskLayout, member_dir, read_json
from resilient_flows.training._contract import EXIT_PEER_LOST, EXIT_PREEMPTED
from resilient_flows.training._faults import peer_gone, record_fault
from resilient_flows.training._output import launched_rank, redirect_for_good
from resilient_flows.training._peerwatch import prestart_helper


def main(argv: list[str] | None = None) -> int:
    spec_path, run_dir, *attempt = argv if argv is not None else sys.argv[1:]
    spec = read_json(Path(spec_path), DOCUMENT_CAP, "member spec")  # any path: the launcher names it
    if attempt:
        redirect_for_good(TaskLayout(member_dir(run_dir, str(spec.get("name")))), int(attempt[0]), launched_rank())
    if int(spec.get("nodes") or 1) > 1:  # its keepalive's helper starts beside the imports
        prestart_helper()
    from resilient_flows.training._run import run_member

    try:
        run_member(spec, run_dir, comm=_world())
    except Preempted as exc:
        print(exc, file=sys.stderr)
        return EXIT_PREEMPTED
    except LaunchError as exc:
        _report(run_dir, spec, exc)
        raise
    except Exception as exc:  # the launcher reports an exit status only: say whose fault it was
        record_fault(member_dir(run_dir, str(spec.get("name"))), _rank(), exc)
        if not peer_gone(exc):
            raise
        print(f"a peer rank is gone: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_PEER_LOST
    return 0


def _rank() -> int | None:
    """This process's rank, as its launcher tells it; None where it does not."""
    from resilient_flows.training._distributed import read_launch_env

    try:
        launch = read_launch_env()
    except LaunchError:
        return None
    return None if launch is None else launch.rank


def _report(run_dir: str, spec: dict[str, Any], exc: LaunchError) -> None:
    """Put why the ranks could not form their group where the user looks: the run's events. The
    retry handler only learns the launcher's exit status, and this rank's stderr ends up in a
    worker log on whichever node ran it."""
    import socket

    from resilient_flows.rundir import EventLog

    with contextlib.suppress(OSError):  # the launch error is what must come through
        EventLog(run_dir).emit("warning", spec.get("name"), host=socket.gethostname(), reason=str(exc))


def _world() -> Any:
    """``MPI.COMM_WORLD``, unless a launcher that is not MPI's (``srun``, ``torchrun``) started
    this process: then None, and the process group forms from that launcher's variables."""
    from resilient_flows.training._distributed import read_launch_env

    try:
        launch = read_launch_env()
    except LaunchError:  # incomplete: MPI, where it works, needs none of it
        launch = None
    if launch is not None and not launch.mpi:
        return None
    from mpi4py import MPI

    return MPI.COMM_WORLD


def _leave(status: int) -> NoReturn:
    """Exit without the interpreter's teardown, once the member's work is durable and its group left.

    FSDP's device mesh keeps gloo groups alive past ``destroy_process_group``; their worker
    threads then die with the interpreter and abort the process (torch 2.13, now and then), which
    the launcher reports as a failed rank of a member that finished. Nothing remains to run at
    exit: the context closed the checkpointer and left the group, so streams are flushed and MPI
    finalised here, and the process ends with the status the member earned. A rank whose peer is
    gone does not finalise MPI: that waits for the peer.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if status != EXIT_PEER_LOST and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(status)


if __name__ == "__main__":
    _leave(main())
