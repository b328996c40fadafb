"""PBS Pro's node file (``$PBS_NODEFILE``): the hosts a job holds, in order.

Read where a member's ranks are launched (the launch prefix, in a worker that need not import
torch) and where a rank finds rank 0 (the first host); one reading, under a size cap.
"""

from __future__ import annotations

from resilient_flows.capped import DOCUMENT_CAP, read_capped
from resilient_flows.errors import LaunchError


def pbs_hosts(nodefile: str) -> list[str]:
    """The distinct hosts of a PBS node file, in order (it lists a host once per chunk or CPU)."""
    try:
        lines = read_capped(nodefile, DOCUMENT_CAP, "PBS_NODEFILE").decode(errors="replace").splitlines()
    except (OSError, ValueError) as exc:
        raise LaunchError(f"PBS_NODEFILE {nodefile}: {getattr(exc, 'strerror', None) or exc}") from None
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))
