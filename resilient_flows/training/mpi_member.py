"""``python -m resilient_flows.training.mpi_member SPEC.json RUN_DIR``: one rank of a data-parallel member.

Launched by ``mpiexec`` (or Parsl's ``$PARSL_MPI_PREFIX``); the ranks agree over ``MPI.COMM_WORLD``
on a torch.distributed process group (see :mod:`resilient_flows.training.distributed`), which the
workload's DDP or FSDP and the shared checkpointer use. Exit status :data:`EXIT_PREEMPTED` tells
the retry handler that the member stopped on request after committing a checkpoint, which is not
a failure.
"""

from __future__ import annotations

import sys

from resilient_flows.capped import DOCUMENT_CAP, read_json_capped
from resilient_flows.errors import Preempted

#: ``EX_TEMPFAIL`` from sysexits.h: try again later.
EXIT_PREEMPTED = 75


def main(argv: list[str] | None = None) -> int:
    spec_path, run_dir = argv if argv is not None else sys.argv[1:]
    from mpi4py import MPI

    from resilient_flows.training.run import run_member

    spec = read_json_capped(spec_path, DOCUMENT_CAP, "member spec")
    try:
        run_member(spec, run_dir, comm=MPI.COMM_WORLD)
    except Preempted as exc:
        print(exc, file=sys.stderr)
        return EXIT_PREEMPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
