"""One place that turns a launcher's environment into a ``torch.distributed`` process group.

A member with ``ranks: N`` runs N processes started by whatever the site uses: ``mpiexec`` (our
default, and Parsl's ``MPIExecutor``), ``srun``, PBS Pro's Cray PALS ``mpiexec`` (Polaris,
Aurora) or ``torchrun``. Each says who a process is in its own variables; this module reads them
(:func:`read_launch_env`, a pure function of the environment, so that every launcher's case is
testable without one) and forms the group (:func:`init_process_group`).

Where the ranks were started by MPI and ``mpi4py`` works, rank 0 opens the rendezvous store on a
free port of its host and broadcasts the address over MPI: nothing is guessed, and two members
sharing a node cannot pick the same port. Elsewhere the address comes from ``MASTER_ADDR`` /
``MASTER_PORT``, or from the batch system (first host of the job, a port derived from its id).

Across nodes, the site may name the interface the nodes reach each other on (its
``facts.network_interface``): it is exported as ``GLOO_SOCKET_IFNAME`` (and
``NCCL_SOCKET_IFNAME``) unless the environment names one already, and checked on this host
before the group forms, so that a wrong name is one error naming the variable, not a hang.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, overload

import torch
import torch.distributed as dist

from resilient_flows.errors import LaunchError
from resilient_flows.training._nodefile import pbs_hosts

logger = logging.getLogger(__name__)

#: How long a collective (and the rendezvous) waits for the slowest rank: torch's own default.
DEFAULT_TIMEOUT = timedelta(minutes=30)
#: Ports derived from a batch job's id fall in ``[PORT_BASE, PORT_BASE + PORT_SPAN)``.
PORT_BASE = 20000
PORT_SPAN = 20000
#: The variables through which gloo and NCCL's bootstrap take the interface between nodes.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class LaunchEnv:
    """What a launcher told this process: who it is, and where rank 0 listens (when it says).

    ``master_addr`` / ``master_port`` are None where the environment does not say; ``missing`` then
    names what to set, and :meth:`endpoint` raises with it. MPI launches (``mpi``) can do without:
    their ranks agree on the address over MPI. ``master_from`` says where ``master_addr`` came
    from, for errors (``MASTER_ADDR``, or the first host of ``SLURM_STEP_NODELIST=...``).
    """

    launcher: str
    rank: int
    world_size: int
    local_rank: int = 0
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    missing: str = ""
    master_from: str = "MASTER_ADDR"

    @property
    def mpi(self) -> bool:
        """Started by an MPI launcher, so that ``mpi4py`` can carry the rendezvous."""
        return self.launcher in ("mpiexec", "pals")

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's address and port; a :class:`LaunchError` naming the missing variable."""
        if self.master_addr is None or self.master_port is None:
            raise LaunchError(f"{self.launcher} launch of {self.world_size} ranks: {self.missing}")
        return self.master_addr, self.master_port


@dataclass(frozen=True)
class DistributedInfo:
    """The process group a member trains in, and how it came about.

    ``group`` is what DDP, FSDP and the :class:`~resilient_flows.checkpoint.Checkpointer` take;
    ``backend`` is ``gloo`` or ``nccl`` (whose group also has gloo for CPU tensors); ``device`` is
    where this rank computes (``cuda:local_rank % devices`` with nccl, else the CPU).
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    launcher: str
    device: torch.device
    group: Any


def parse_first_host(nodelist: str) -> str:
    """The first host of a Slurm node list without ``scontrol``: ``nid[003-008,012],login1`` -> ``nid003``.

    Every bracket contributes the first number it lists, as written (zero padding kept), which
    is how Slurm expands the first host, also with several brackets (``r[1-2]-n[01-04]``).
    """
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    host = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], first)
    if not host or "[" in host or "]" in host:
        raise LaunchError(f"cannot read the first host of the Slurm node list {nodelist!r}; set MASTER_ADDR")
    return host


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``scontrol show hostnames`` where Slurm is installed."""
    scontrol = shutil.which("scontrol")
    if scontrol is not None:
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
            ).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            logger.debug("scontrol show hostnames %s failed (%s); parsing it", nodelist, exc)
        else:
            if out:
                return out[0]
    return parse_first_host(nodelist)


def read_launch_env(
    env: Mapping[str, str] | None = None, first_host_of: Callable[[str], str] = first_host
) -> LaunchEnv | None:
    """The launcher that started this process and what it says, or None when none did.

    Checked in this order, so that a launcher started inside another's allocation wins over the
    variables it inherited: ``torchrun`` (``RANK``, ``WORLD_SIZE``), Open MPI
    (``OMPI_COMM_WORLD_*``), PALS or MPICH (``PALS_RANKID``/``PMI_RANK`` with ``PMI_SIZE``; PALS
    when inside a PBS job), Slurm's ``srun`` (``SLURM_PROCID``, ``SLURM_NTASKS``). ``first_host_of``
    reads a Slurm node list (tests pass :func:`parse_first_host`). A launcher whose variables are
    incomplete is a :class:`LaunchError` naming the missing one.
    """
    env = os.environ if env is None else env
    master = env.get("MASTER_ADDR") or None
    port = _optional(env, "MASTER_PORT")
    if "RANK" in env or "WORLD_SIZE" in env:
        return _torchrun(env, master, port)
    if "OMPI_COMM_WORLD_RANK" in env:
        return _checked(
            LaunchEnv(
                "mpiexec",
                _integer(env, "OMPI_COMM_WORLD_RANK"),
                _required(env, "OMPI_COMM_WORLD_SIZE"),
                _optional(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
                _optional(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                master,
                port,
                _GENERIC,
            )
        )
    if "PALS_RANKID" in env or "PMI_RANK" in env:
        return _pals_or_mpich(env, master, port)
    if "SLURM_PROCID" in env:
        return _srun(env, master, port, first_host_of)
    return None


#: What to set when a launcher says nothing of rank 0's address.
_GENERIC = "set MASTER_ADDR and MASTER_PORT to rank 0's host and a free port"


def _torchrun(env: Mapping[str, str], master: str | None, port: int | None) -> LaunchEnv:
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not env.get(name)]
    if missing:
        raise LaunchError(f"torchrun-style launch: {', '.join(missing)} not set (torchrun sets all four)")
    return _checked(
        LaunchEnv(
            "torchrun",
            _integer(env, "RANK"),
            _integer(env, "WORLD_SIZE"),
            _optional(env, "LOCAL_RANK", 0),
            _optional(env, "LOCAL_WORLD_SIZE"),
            master,
            port,
        )
    )


def _pals_or_mpich(env: Mapping[str, str], master: str | None, port: int | None) -> LaunchEnv:
    """PALS (inside a PBS job: rank 0 is the node file's first host, the port from the job id)
    or MPICH's Hydra elsewhere."""
    rank = _integer(env, "PALS_RANKID") if "PALS_RANKID" in env else _integer(env, "PMI_RANK")
    size = _required(env, "PMI_SIZE")
    local = _first_of(env, ("PALS_LOCAL_RANKID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"), 0)
    local_size = _first_of(env, ("PALS_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"))
    if "PALS_RANKID" not in env and "PBS_JOBID" not in env and "PBS_NODEFILE" not in env:
        return _checked(LaunchEnv("mpiexec", rank, size, local, local_size, master, port, _GENERIC))
    if master is None and env.get("PBS_NODEFILE"):
        master = next(iter(pbs_hosts(env["PBS_NODEFILE"])), None)
    if port is None and env.get("PBS_JOBID"):
        port = _derived_port(env["PBS_JOBID"], "PBS_JOBID")
    missing = "set MASTER_ADDR (or run inside a PBS job: PBS_NODEFILE) and MASTER_PORT (or PBS_JOBID)"
    return _checked(LaunchEnv("pals", rank, size, local, local_size, master, port, missing))


def _srun(
    env: Mapping[str, str], master: str | None, port: int | None, first_host_of: Callable[[str], str]
) -> LaunchEnv:
    """An ``srun`` step: rank 0 is the step's first host, the port from the job and step ids."""
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nodes_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), "")
    source = "MASTER_ADDR"
    if master is None:
        if not nodes_var:
            raise LaunchError("srun launch: SLURM_JOB_NODELIST not set, and no MASTER_ADDR to use instead")
        master = first_host_of(env[nodes_var])
        source = f"the first host of {nodes_var}={env[nodes_var]}"
    if port is None:
        if not env.get("SLURM_JOB_ID"):
            raise LaunchError("srun launch: SLURM_JOB_ID not set, and no MASTER_PORT to use instead")
        port = _derived_port(env["SLURM_JOB_ID"], "SLURM_JOB_ID", _optional(env, "SLURM_STEP_ID", 0))
    per_node = re.match(r"\d+", env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "")
    return _checked(
        LaunchEnv(
            "srun",
            _integer(env, "SLURM_PROCID"),
            _required(env, size_var),
            _optional(env, "SLURM_LOCALID", 0),
            int(per_node.group()) if per_node else None,
            master,
            port,
            master_from=source,
        )
    )


def local_slice(total: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous share of ``total`` items, sizes differing by at most one.

    Data-parallel workloads take this slice of every global batch: the ranks together see
    exactly the batch a single-rank run draws.
    """
    return slice(total * rank // world_size, total * (rank + 1) // world_size)


def comm_size(comm: Any) -> int:
    """How many ranks ``comm`` (None, an mpi4py communicator or a torch ProcessGroup) holds."""
    if comm is None:
        return 1
    if hasattr(comm, "Get_size"):
        return int(comm.Get_size())
    if isinstance(comm, dist.ProcessGroup):
        return dist.get_world_size(comm)
    return int(comm.size)  # the engine's own Comm wrappers


#: How many callers hold the group this module created (0: none, or someone else's).
_holders = 0
_info: DistributedInfo | None = None


def init_process_group(
    timeout: timedelta | float = DEFAULT_TIMEOUT,
    comm: Any = None,
    backend: str | None = None,
    interface: str | None = None,
) -> DistributedInfo:
    """Form (or join) the process group of this process's ranks; pair with :func:`shutdown_process_group`.

    Idempotent: when ``torch.distributed`` is initialised already (by an earlier call, or by the
    user), that group is reused. ``comm``: an mpi4py communicator to carry the rendezvous (else
    ``MPI.COMM_WORLD`` when an MPI launcher started the ranks and mpi4py imports), or a torch
    ProcessGroup to use as it is. ``backend``: None chooses nccl where every rank of a node has a
    GPU of its own, gloo otherwise. ``timeout``: a timedelta or seconds. ``interface``: the
    site's interface between nodes (see :func:`use_interface`).
    """
    global _holders, _info
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    if dist.is_initialized():
        group = comm if isinstance(comm, dist.ProcessGroup) else None
        if _holders:  # ours: one more holder, released by its own shutdown_process_group
            _holders += 1
            if group is None and _info is not None:  # set while we hold the group
                return _info
        return _existing(group)
    use_interface(interface)
    if comm is not None and comm_size(comm) > 1:
        _info = _over_mpi(comm, _launch_if_readable(), backend, timeout)
    else:
        launch = read_launch_env()
        world = _mpi_world() if launch is not None and launch.mpi else None
        if world is not None:
            _info = _over_mpi(world, launch, backend, timeout)
        elif launch is None:
            raise LaunchError(
                "no launcher environment found: start the ranks with mpiexec, srun or torchrun, "
                "or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
            )
        else:
            _info = _from_env(launch, backend, timeout)
    _holders = 1
    logger.info(
        "rank %d of %d: %s process group via %s on %s",
        _info.rank,
        _info.world_size,
        _info.backend,
        _info.launcher,
        _info.device,
    )
    return _info


def shutdown_process_group() -> None:
    """Release one :func:`init_process_group`; the last release destroys the group it created.

    A group this module did not create (the user's) is left alone.
    """
    global _holders, _info
    if _holders == 0:
        return
    _holders -= 1
    if _holders == 0:
        _info = None
        if dist.is_initialized():
            dist.destroy_process_group()


def use_interface(interface: str | None, env: MutableMapping[str, str] | None = None) -> str | None:
    """Export the site's interface between nodes for gloo and NCCL; the one gloo will use, checked.

    A ``GLOO_SOCKET_IFNAME`` (or ``NCCL_SOCKET_IFNAME``) already in the environment wins: the
    user's word on their node. Every name it lists must be an interface of this host, else a
    :class:`LaunchError` naming the variable, where it came from and the interfaces there are:
    gloo would otherwise fail later with less to go on, or, on another rank, wait for this one
    until the timeout.
    """
    env = os.environ if env is None else env
    for name in INTERFACE_VARIABLES:
        if interface and not env.get(name):
            env[name] = interface
    value = env.get("GLOO_SOCKET_IFNAME")
    if not value:
        return None
    present = sorted(name for _, name in socket.if_nameindex())
    absent = [name for name in value.split(",") if name not in present]
    if absent:
        origin = "the site's facts.network_interface" if value == interface else "set in the environment"
        raise LaunchError(
            f"GLOO_SOCKET_IFNAME={value} ({origin}): {socket.gethostname()} has no interface "
            f"{', '.join(absent)}; it has {', '.join(present)}"
        )
    return value


def _network_hint() -> str:
    """What a failed rendezvous should say about the network it tried."""
    value = os.environ.get("GLOO_SOCKET_IFNAME")
    if value:
        return f"over GLOO_SOCKET_IFNAME={value}"
    return "GLOO_SOCKET_IFNAME unset: gloo took the interface of this host's name (set facts.network_interface)"


def _resolved(launch: LaunchEnv, host: str) -> None:
    """Rank 0's host must resolve here, or every rank would wait for the rendezvous in vain."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise LaunchError(
            f"{launch.launcher}: rank 0's host {host!r} ({launch.master_from}) does not resolve on "
            f"{socket.gethostname()}: {exc.strerror or exc}; set MASTER_ADDR to an address the ranks reach it at"
        ) from None


def _over_mpi(comm: Any, launch: LaunchEnv | None, backend: str | None, timeout: timedelta) -> DistributedInfo:
    """Rank 0 opens the store on a free port of its host and broadcasts where; every rank fails together.

    ``MASTER_ADDR``, where set, names the address the other ranks reach rank 0 at.
    """
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    chosen, device = _backend(backend, local_rank, local_size)
    if backend is None:  # one backend for all: a node short of GPUs puts every rank on gloo
        everyone = comm.allreduce(chosen == "nccl", op=MPI.LAND)
        if chosen == "nccl" and not everyone:
            chosen, device = "gloo", torch.device("cpu")
    store, where, problem = None, None, None
    if rank == 0:
        # every rank on this node: loopback, which needs no name service; else this host's name
        host = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if local_size == size else socket.gethostname())
        try:
            # torch.distributed imports TCPStore from torch._C without re-exporting it to type checkers
            store = dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]
                host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False
            )
            where = (host, store.port)
        except (RuntimeError, OSError) as exc:
            problem = f"rank 0 could not open the rendezvous store on {host}: {exc}"
    where, problem = comm.bcast((where, problem))
    if problem is not None:
        raise LaunchError(problem)
    host, port = where
    try:
        if store is None:
            store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)  # pyright: ignore[reportPrivateImportUsage]
        _select(device)
        dist.init_process_group(_devices(chosen), store=store, rank=rank, world_size=size, timeout=timeout)
    except (RuntimeError, OSError) as exc:
        raise LaunchError(f"rank {rank} of {size} could not join the {chosen} group at {host}:{port}: {exc}") from exc
    name = launch.launcher if launch is not None else "mpiexec"
    return DistributedInfo(rank, size, local_rank, chosen, name, device, dist.group.WORLD)


def _from_env(launch: LaunchEnv, backend: str | None, timeout: timedelta) -> DistributedInfo:
    host, port = launch.endpoint()
    _resolved(launch, host)
    chosen, device = _backend(backend, launch.local_rank, launch.local_world_size)
    method = "env://" if launch.launcher == "torchrun" else f"tcp://{_bracketed(host)}:{port}"
    _select(device)
    try:
        dist.init_process_group(
            _devices(chosen), init_method=method, rank=launch.rank, world_size=launch.world_size, timeout=timeout
        )
    except (RuntimeError, OSError) as exc:
        raise LaunchError(
            f"{launch.launcher}: rank {launch.rank} of {launch.world_size} could not join the {chosen} group "
            f"at {host}:{port} ({launch.master_from}; {_network_hint()}): {exc}"
        ) from exc
    return DistributedInfo(
        launch.rank, launch.world_size, launch.local_rank, chosen, launch.launcher, device, dist.group.WORLD
    )


def _existing(group: Any) -> DistributedInfo:
    """Someone else's group (or one of its subgroups): described, not owned."""
    launch = _launch_if_readable()
    backend = dist.get_backend(group)
    local_rank = launch.local_rank if launch is not None else int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    return DistributedInfo(
        dist.get_rank(group),
        dist.get_world_size(group),
        local_rank,
        backend,
        "existing",
        device,
        group if group is not None else dist.group.WORLD,
    )


def _launch_if_readable() -> LaunchEnv | None:
    """The launch environment where only its local rank matters: an incomplete one is no error."""
    try:
        return read_launch_env()
    except LaunchError:
        return None


def _backend(backend: str | None, local_rank: int, local_size: int | None) -> tuple[str, torch.device]:
    """nccl where this node has a GPU per local rank, else gloo on the CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend is None:
        backend = "nccl" if gpus and (local_size or local_rank + 1) <= gpus else "gloo"
    if backend == "nccl":
        if not gpus:
            raise LaunchError("backend nccl needs a GPU, and this node has none")
        return backend, torch.device("cuda", local_rank % gpus)
    return backend, torch.device("cpu")


def _devices(backend: str) -> str:
    """nccl for CUDA tensors and gloo for CPU ones in one group: the checkpointer's collectives
    (pickled objects, restored host buffers) are on the CPU."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def _select(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)


def _mpi_world() -> Any:
    """``MPI.COMM_WORLD`` when mpi4py imports and MPI started more than this process, else None."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD if MPI.COMM_WORLD.Get_size() > 1 else None


def _checked(launch: LaunchEnv) -> LaunchEnv:
    if launch.world_size < 1 or not 0 <= launch.rank < launch.world_size:
        raise LaunchError(f"{launch.launcher} launch: rank {launch.rank} is not in a world of {launch.world_size}")
    return launch


def _integer(env: Mapping[str, str], name: str) -> int:
    if not env.get(name):
        raise LaunchError(f"{name} is not set")
    try:
        return int(env[name])
    except ValueError:
        raise LaunchError(f"{name}={env[name]!r} is not an integer") from None


@overload
def _optional(env: Mapping[str, str], name: str, default: int) -> int: ...
@overload
def _optional(env: Mapping[str, str], name: str, default: None = None) -> int | None: ...
def _optional(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    return _integer(env, name) if env.get(name) else default


def _required(env: Mapping[str, str], name: str) -> int:
    if not env.get(name):
        raise LaunchError(f"launched as one rank of several, but {name} (how many ranks) is not set")
    return _integer(env, name)


@overload
def _first_of(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int: ...
@overload
def _first_of(env: Mapping[str, str], names: tuple[str, ...], default: None = None) -> int | None: ...
def _first_of(env: Mapping[str, str], names: tuple[str, ...], default: int | None = None) -> int | None:
    return next((_integer(env, name) for name in names if env.get(name)), default)


def _derived_port(job_id: str, name: str, step: int = 0) -> int:
    """A port from a batch job's numeric id (``1234.pbs01`` -> 1234) and step: the same on every rank."""
    digits = re.match(r"\d+", job_id)
    if digits is None:
        raise LaunchError(f"{name}={job_id!r} has no numeric job id to derive a port from; set MASTER_PORT")
    return PORT_BASE + (int(digits.group()) * 31 + step) % PORT_SPAN


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
