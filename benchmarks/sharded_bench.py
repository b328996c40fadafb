"""Sharded checkpoints of an FSDP2 model: our engine against PyTorch DCP, side by side, at 4 and 2 ranks.

What is checkpointed. A stack of square linear layers, each wrapped with ``fully_shard`` (FSDP2),
and Adam after one step, so that its two moments exist: parameters + ``exp_avg`` + ``exp_avg_sq``,
every one a ``DTensor`` sharded over the ranks (60 MiB with ``--quick``, 528 MiB by default, 2 GiB
with ``--full``). Ranks are real processes: this script starts them as ``torchrun`` would (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; gloo on CPU, one torch thread each), first 4 then
2; every rank measures and writes its figures, and the launcher takes the median over rounds on
each rank, then the median (and the slowest) over ranks, and prints one table with the ratios.

Why these figures. A checkpoint costs training the time ``save`` blocks (the stall), and until it
is durable a failure loses it. The least a stall can be is a copy of the rank's own bytes into
memory allocated and touched beforehand, so that copy is measured in the same rounds as the
baseline. The competitor is ``torch.distributed.checkpoint`` (DCP), used as its tutorial does: a
``Stateful`` app state whose ``state_dict`` calls ``get_state_dict(model, optimizer)`` and whose
``load_state_dict`` calls ``set_state_dict``, and, as its async recipe does, a gloo process group
of its own (its upload thread runs collectives while FSDP runs its own on the default group). Both
write to the same directory (a temporary one, or ``--dir``) and both fsync (DCP's
``FileSystemWriter(sync_files=True)`` is its default); both keep two checkpoints. Phases per rank:

1. ``plain`` (rounds interleaved, their order rotated each round, so that a noisy neighbour slows
   every variant alike): the copy baseline; ``Checkpointer.save`` after ``prepare`` (stall: until
   it returns; commit: until ``wait`` returns: shard fsynced, manifest renamed); DCP ``async_save``
   with its default stager (a fresh staging copy each save; blocking: until it returns;
   completion: until its future's result) and with one ``DefaultStager`` kept across saves, which
   reuses its staging buffers as our arena does. Bytes written: each rank's shard data (from its
   file's header) and ``stats.bytes_written`` (whole files), summed over ranks.
2. ``overlap``: ``save(..., overlap=True)`` returns before the copy, which runs behind the next
   forward/backward; its stall is the return time plus how long that step's ``optimizer.step``
   waited for the copy. DCP's counterpart is ``StagingOptions(use_async_staging=True)`` (staging on
   a background thread; it runs on CPU in torch 2.13 although its docstring says CUDA), with
   ``optimizer.step`` made to wait for ``staging_completion``. Also the whole step against a step
   without a checkpoint in the same round (paired): on a CPU the overlapped copy and the writer
   compete with the step for cores.
3. ``process``: DCP with ``AsyncCheckpointerType.PROCESS`` (a writer process per rank) and a kept
   shared-memory stager (``use_shared_memory=True``), as that mode is meant to be used.
4. at 2 ranks, restoring the 4-rank checkpoints of phase 1 (one state, saved by both) into fresh
   FSDP2 models and optimizers: ``Checkpointer.restore`` against ``dcp.load`` of the app state,
   twice as many rounds, alternating which goes first; the restored states are compared bit for
   bit. ``dcp.load`` creates the fresh optimizer's state with DCP's helper (an Adam step with zero
   gradients), timed apart; ``Checkpointer.restore`` creates it empty, from the checkpoint's
   shapes. Both read through the page cache (the checkpoints were just written).

Not available here (the run reports DCP's own messages): pinned staging memory (CUDA only: DCP
ignores ``use_pinned_memory`` with a warning), non-blocking copies (torch's default
``StagingOptions()`` raise without an accelerator), ``FileSystemWriter(cache_staged_state_dict=True)``
(needs an accelerator). On GPUs the device-to-host copy is part of every stall; this CPU run cannot
show it.

Memory. Each phase starts from a trimmed heap and reports the peak resident set of a rank. At the
default size a 4-rank rank peaks in the overlap phase at about 1.1 GiB over its 0.5 GiB start
(an FSDP2 training step on gloo alone takes about 0.6 GiB), so ``--full`` (4x the bytes) needs
roughly 4-5 GiB per rank, 18 GiB for 4 ranks: run it on an otherwise idle 24 GiB machine.

``python benchmarks/sharded_bench.py [--quick | --full] [--rounds N] [--json PATH] [--dir DIR]``
(rounds after a warm-up round: 5 by default, 3 with ``--quick`` or ``--full``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from harness import options, rounds_of, scratch, size_of, write_json
from ranks import launch_ranks, rank_options, torchrun_env

MiB = 1 << 20
#: state MiB (parameters + Adam's two moments), layer width, rounds
SIZES = {"quick": (64, 1024, 3), "default": (512, 2048, 5), "full": (2048, 4096, 3)}
WORLDS = (4, 2)
#: Rows of the training batch in the overlap phase.
BATCH = 64
#: Seconds a world of ranks may take before the launcher gives up on it.
TIMEOUT = {"quick": 600, "default": 1800, "full": 3600}


class Series(dict[str, list[float]]):
    """Seconds per figure of a phase, one value per measured round (round 0 warms up, unkept)."""

    def record(self, key: str, value: float, keep: bool) -> None:
        if keep:
            self.setdefault(key, []).append(value)


def interleaved(variants: list[Callable[[bool], None]], rounds: int, paired: Callable[[], None] | None = None) -> None:
    """Each variant once a round (told whether to keep its timings), in an order rotated each round
    (:func:`harness.rotated`) so that a noisy neighbour slows each alike; round 0 is a warm-up.
    ``paired``: called after each measured round, to pair its variants' figures."""
    for round_ in range(rounds + 1):
        for variant in harness.rotated(variants, round_):
            variant(round_ > 0)
        if round_ and paired is not None:
            paired()


# ------------------------------------------------------------------------------------------- one rank


def rank_main(spec: dict) -> None:
    """One rank: build the model, run the phases, write ``rank-{world}-{rank}.json``."""
    import gc
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    width, depth, rounds = spec["width"], spec["depth"], spec["rounds"]
    directory = Path(spec["dir"])
    bench = _RankBench(rank, world, width, depth, rounds, directory)
    out: dict[str, Any] = {"rank": rank, "world": world, "phase_seconds": {}}
    phases = [("plain", bench.phase_plain), ("overlap", bench.phase_overlap), ("process", bench.phase_process)]
    if world == 2:
        phases.append(("restore", lambda: bench.phase_restore(directory / "ours-4", Path(spec["dcp_source"]))))
    for name, phase in phases:
        if name == "restore":
            bench.state = None  # two fresh models at a time from here on
        gc.collect()
        _trim_heap()
        out[f"start_rss_{name}"] = _rss("VmRSS")
        _reset_peak_rss()
        started = time.perf_counter()
        out |= phase()
        out["phase_seconds"][name] = time.perf_counter() - started
        out[f"peak_rss_{name}"] = _rss("VmHWM")
    if rank == 0:
        out["unavailable"] = _unavailable_options(directory)
    (directory / f"rank-{world}-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


class _RankBench:
    def __init__(self, rank: int, world: int, width: int, depth: int, rounds: int, directory: Path) -> None:
        import torch.distributed as dist

        self.rank, self.world, self.width, self.depth, self.rounds = rank, world, width, depth, rounds
        self.directory = directory
        self.barrier = dist.barrier
        # DCP's collectives run on its upload thread while training runs FSDP's: a group of their own,
        # as DCP's async-checkpointing recipe sets up (ours duplicates the communicator it is given).
        self.dcp_group = dist.new_group(backend="gloo")
        self.state = self.build(train=True)

    def build(self, train: bool):
        """A fresh FSDP2 model and Adam (after one step when ``train``: the moments exist)."""
        import torch
        from torch.distributed.fsdp import fully_shard

        from resilient_flows.checkpoint import TrainState

        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(self.width, self.width) for _ in range(self.depth)))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        if train:
            model(torch.randn(4, self.width)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return TrainState(model, optimizer, rng=False)

    def app(self, state=None) -> dict:
        return {"app": _app_state(state or self.state)}

    def cleanup(self, *paths: Path) -> None:
        """Remove finished checkpoint directories (rank 0, once every rank is done with them)."""
        self.barrier()
        if self.rank == 0:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
        self.barrier()

    # ---------------------------------------------------------------- phase 1: plain saves
    def phase_plain(self) -> dict:
        import torch
        import torch.distributed as dist
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        from resilient_flows.checkpoint import Checkpointer

        state, world = self.state, self.world
        local = _local_tensors(state)
        out: dict[str, Any] = {
            "local_bytes": sum(t.numel() * t.element_size() for t in local),
            "state_bytes": sum(t.numel() * t.element_size() for t in _global_tensors(state)),
        }
        with torch.no_grad():
            buffers = [torch.empty_like(t).fill_(1) for t in local]  # allocated and touched beforehand
        series = Series()
        reuse = DefaultStager(StagingOptions(False, False, False, False))  # pinned, shared, async, non-blocking
        ck = Checkpointer(self.directory / f"ours-{world}", comm=dist.group.WORLD, keep=2)
        ck.prepare(state)
        step = 0
        dcp_dirs: dict[str, list[Path]] = {"dcp": [], "dcp_reuse": []}

        def copy(keep: bool) -> None:
            self.barrier()
            started = time.perf_counter()
            with torch.no_grad():
                for b, t in zip(buffers, local, strict=True):
                    b.copy_(t)
            series.record("copy", time.perf_counter() - started, keep)

        def ours(keep: bool) -> None:
            nonlocal step
            step += 1
            before = ck.stats.bytes_written
            self.barrier()
            started = time.perf_counter()
            ck.save(step, state)
            returned = time.perf_counter()
            ck.wait()
            done = time.perf_counter()
            series.record("ours_stall", returned - started, keep)
            series.record("ours_commit", done - started, keep)
            out["ours_file_bytes"] = ck.stats.bytes_written - before

        variants = [
            copy,
            ours,
            lambda keep: self.dcp_save(dcp_dirs["dcp"], "dcp", series, keep),
            lambda keep: self.dcp_save(dcp_dirs["dcp_reuse"], "dcp_reuse", series, keep, async_stager=reuse),
        ]
        interleaved(variants, self.rounds)
        self.barrier()
        started = time.perf_counter()
        self.app()["app"].state_dict()
        out["get_state_dict"] = time.perf_counter() - started
        ck.close()
        reuse.close()
        buffers.clear()  # the copies go; reuse.close() dropped the stager's
        local.clear()
        return out | self.plain_files(step, dcp_dirs) | {"series": series}

    def dcp_save(self, saves: list[Path], name: str, series: Series, keep: bool, **kwargs: Any) -> None:
        """One DCP ``async_save`` of the plain phase, into the next of ``saves``; two are kept, as ours keeps."""
        import torch.distributed.checkpoint as dcp

        target = self.directory / f"{name}-{self.world}" / f"save-{len(saves):03d}"
        saves.append(target)
        self.barrier()
        started = time.perf_counter()
        future = dcp.async_save(self.app(), checkpoint_id=target, process_group=self.dcp_group, **kwargs)
        returned = time.perf_counter()
        future.result()
        done = time.perf_counter()
        series.record(f"{name}_block", returned - started, keep)
        series.record(f"{name}_total", done - started, keep)
        if len(saves) > 2:  # removed outside the timing
            self.cleanup(saves[-3])

    def plain_files(self, step: int, dcp_dirs: dict[str, list[Path]]) -> dict[str, Any]:
        """The sizes of the plain phase's last checkpoints, and where its DCP checkpoint lies; then
        every checkpoint removed but those the 2-rank run restores (the 4-rank run's)."""
        world = self.world
        out: dict[str, Any] = {}
        shard = self.directory / f"ours-{world}" / f"step-{step:08d}"
        shard = shard / f"shard-{self.rank:05d}-of-{world:05d}.safetensors"
        out["ours_data_bytes"] = _safetensors_data_bytes(shard)
        if self.rank == 0:
            last = dcp_dirs["dcp"][-1]
            out["dcp_file_bytes"] = sum(p.stat().st_size for p in last.iterdir() if p.is_file())
        out["dcp_source"] = str(dcp_dirs["dcp"][-1])
        kept = [dcp_dirs["dcp"][-1]] if world == 4 else []
        self.cleanup(*(p for paths in dcp_dirs.values() for p in paths if p not in kept))
        if world != 4:
            self.cleanup(self.directory / f"ours-{world}")
        return out

    # ---------------------------------------------------------------- phase 2: overlap, async staging
    def phase_overlap(self) -> dict:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        from resilient_flows.checkpoint import Checkpointer

        state, world = self.state, self.world
        model, optimizer = state.model, state.optimizer
        batch = torch.randn(BATCH, self.width)
        marks: dict[str, float] = {}
        pending: list = []
        waits: list[float] = []
        hooks = _step_hooks(optimizer, marks, pending, waits)

        def train_step() -> None:
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        series = Series()
        stager = DefaultStager(StagingOptions(False, False, True, False))  # async staging, CPU memory
        ck = Checkpointer(self.directory / f"ours-overlap-{world}", comm=dist.group.WORLD, keep=2)
        ck.prepare(state)
        step = 0
        saves = 0

        def plain(keep: bool) -> None:
            self.barrier()
            started = time.perf_counter()
            train_step()
            series.record("step_alone", time.perf_counter() - started, keep)

        def ours(keep: bool) -> None:
            nonlocal step
            step += 1
            self.barrier()
            started = time.perf_counter()
            ck.save(step, state, overlap=True)
            returned = time.perf_counter()
            if len(hooks) == 2:  # the engine's hook exists now; one registered after it sees it return
                hooks.append(optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("out", time.perf_counter())))
            train_step()
            done = time.perf_counter()
            series.record("ours_overlap_stall", returned - started + marks["out"] - marks["in"], keep)
            series.record("ours_overlap_step", done - started, keep)
            ck.wait()

        def dcp_async(keep: bool) -> None:
            nonlocal saves
            saves += 1
            target = self.directory / f"dcp-async-{world}" / f"save-{saves:03d}"
            self.barrier()
            started = time.perf_counter()
            response = dcp.async_save(
                self.app(), checkpoint_id=target, process_group=self.dcp_group, async_stager=stager
            )
            returned = time.perf_counter()
            pending.append(response.staging_completion)
            waits.clear()
            train_step()
            done = time.perf_counter()
            series.record("dcp_async_stall", returned - started + sum(waits), keep)
            series.record("dcp_async_step", done - started, keep)
            response.upload_completion.result()
            self.cleanup(target)

        interleaved([plain, ours, dcp_async], self.rounds, lambda: _overlap_added(series))
        for hook in hooks:
            hook.remove()
        ck.close()
        stager.close()
        self.cleanup(self.directory / f"ours-overlap-{world}", self.directory / f"dcp-async-{world}")
        return {"series_overlap": series}

    # ---------------------------------------------------------------- phase 3: DCP process checkpointer
    def phase_process(self) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        stager = DefaultStager(StagingOptions(False, True, False, False))  # shared memory, kept across saves
        series: dict[str, list[float]] = {}
        targets = []
        try:
            for round_ in range(self.rounds + 1):  # round 0 also starts the writer processes
                target = self.directory / f"dcp-process-{self.world}" / f"save-{round_:03d}"
                targets.append(target)
                self.barrier()
                started = time.perf_counter()
                future = dcp.async_save(
                    self.app(),
                    checkpoint_id=target,
                    process_group=self.dcp_group,
                    async_stager=stager,
                    async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                )
                returned = time.perf_counter()
                future.result()
                done = time.perf_counter()
                if round_:
                    series.setdefault("dcp_process_block", []).append(returned - started)
                    series.setdefault("dcp_process_total", []).append(done - started)
                if len(targets) > 2:
                    self.cleanup(targets[-3])
        except Exception as exc:  # reported, not fatal: the other figures stand
            return {"dcp_process_error": f"{type(exc).__name__}: {exc}"}
        finally:
            stager.close()
            self.cleanup(self.directory / f"dcp-process-{self.world}")
        return {"series_process": series}

    # ---------------------------------------------------------------- phase 4: restore 4 -> 2
    def phase_restore(self, ours_source: Path, dcp_source: Path) -> dict:
        import gc

        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        from resilient_flows.checkpoint import Checkpointer

        series: dict[str, list[float]] = {}
        equal = None

        def ours(keep: bool):
            fresh = self.build(train=False)
            self.barrier()
            started = time.perf_counter()
            with Checkpointer(ours_source, comm=dist.group.WORLD) as ck:
                restored = ck.restore(fresh)
            if keep:
                series.setdefault("ours_restore", []).append(time.perf_counter() - started)
            if restored is None:
                raise RuntimeError(f"no checkpoint restored from {ours_source}")
            return fresh

        def theirs(keep: bool):
            fresh = self.build(train=False)
            self.barrier()
            started = time.perf_counter()
            dcp.load(self.app(fresh), checkpoint_id=dcp_source)
            if keep:
                series.setdefault("dcp_restore", []).append(time.perf_counter() - started)
            return fresh

        def shared(keep: bool) -> None:
            """What dcp.load pays first: the fresh optimizer's state created by DCP's helper."""
            fresh = self.build(train=False)
            self.barrier()
            started = time.perf_counter()
            get_state_dict(fresh.model, fresh.optimizer)
            if keep:
                series.setdefault("init_optimizer", []).append(time.perf_counter() - started)

        rounds = 2 * self.rounds  # restores are cheap next to saves; an even count balances who goes first
        for round_ in range(rounds + 1):
            order = (ours, theirs) if round_ % 2 else (theirs, ours)
            results = {fn: fn(round_ > 0) for fn in order}
            if round_ == rounds:
                a, b = _local_tensors(results[ours]), _local_tensors(results[theirs])
                equal = len(a) == len(b) and all(x.equal(y) for x, y in zip(a, b, strict=True))
                equal = equal and _steps(results[ours]) == _steps(results[theirs])
            del results
            gc.collect()
            if round_ % 2:
                shared(keep=True)
        return {"series_restore": series, "restore_equal": bool(equal)}


def _step_hooks(optimizer: Any, marks: dict[str, float], pending: list, waits: list[float]) -> list:
    """Hooks before the optimizer's step: when the step began (``marks["in"]``), and a wait for
    DCP's staging in flight (``pending``, the wait added to ``waits``), which must finish before
    the step changes the state."""

    def dcp_wait(*_: Any) -> None:
        if pending:
            started = time.perf_counter()
            pending.pop().result()
            waits.append(time.perf_counter() - started)

    return [
        optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("in", time.perf_counter())),
        optimizer.register_step_pre_hook(dcp_wait),
    ]


def _overlap_added(series: Series) -> None:
    """What a step with each save added to the step alone, paired within the round: a slow spell
    of the machine slows all three."""
    alone = series["step_alone"][-1]
    series.setdefault("ours_overlap_added", []).append(series["ours_overlap_step"][-1] - alone)
    series.setdefault("dcp_async_added", []).append(series["dcp_async_step"][-1] - alone)


def _app_state(state):
    """DCP's tutorial ``AppState``: ``get_state_dict`` on save, ``set_state_dict`` on load."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class AppState(Stateful):
        def __init__(self, model, optimizer) -> None:
            self.model, self.optimizer = model, optimizer

        def state_dict(self) -> dict:
            model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
            return {"model": model_state, "optim": optimizer_state}

        def load_state_dict(self, state_dict: dict) -> None:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state_dict["model"],
                optim_state_dict=state_dict["optim"],
            )

    return AppState(state.model, state.optimizer)


def _dtensors(state) -> list:
    """Every parameter and Adam moment (DTensors), in a fixed order."""
    tensors = list(state.model.parameters())
    for param in state.model.parameters():
        moments = state.optimizer.state.get(param, {})
        tensors += [moments[k] for k in ("exp_avg", "exp_avg_sq") if k in moments]
    return tensors


def _local_tensors(state) -> list:
    return [t.to_local().detach() for t in _dtensors(state)]


def _global_tensors(state) -> list:
    import torch

    return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in _dtensors(state)]


def _steps(state) -> list[float]:
    return [float(s["step"]) for s in state.optimizer.state.values()]


def _rss(field: str) -> int:
    """This process's resident set (``VmRSS``) or its peak (``VmHWM``), in bytes; not DCP's writer processes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _trim_heap() -> None:
    """Hand freed heap memory back to the system (glibc keeps it), so that phases do not add up."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)


def _reset_peak_rss() -> None:
    """Start VmHWM afresh at the current resident set, so that each phase reports its own peak."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _safetensors_data_bytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors file, from its header (padding and header left out)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    return sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")


def _unavailable_options(directory: Path) -> dict[str, str]:
    """What DCP offers for faster staging that this machine cannot use, in DCP's own words."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    found: dict[str, str] = {}
    for name, make in (
        ("StagingOptions() (pinned, shared, async, non-blocking)", lambda: DefaultStager(StagingOptions())),
        ("use_pinned_memory=True", lambda: DefaultStager(StagingOptions(True, False, False, False))),
        (
            "FileSystemWriter(cache_staged_state_dict=True)",
            lambda: dcp.FileSystemWriter(directory / "probe", cache_staged_state_dict=True).stage(
                {"x": torch.zeros(4)}
            ),
        ),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                stager = make()
                with contextlib.suppress(Exception):
                    stager.close()
                found[name] = "ignored: " + " ".join(str(w.message).strip() for w in caught) if caught else "works"
            except Exception as exc:
                found[name] = f"{type(exc).__name__}: {exc}"
    return found


# ------------------------------------------------------------------------------------------- launcher


def launch(world: int, spec: dict, timeout: float) -> list[dict]:
    """Start ``world`` ranks as torchrun would; their reports. A failed rank stops the others
    (and the writer process DCP's process mode started in its group)."""
    env = torchrun_env(world)
    envs = [{**env, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)]
    reports = [Path(spec["dir"]) / f"rank-{world}-{r}.json" for r in range(world)]
    return launch_ranks(__file__, spec, envs, reports, timeout)


def main(argv: list[str] | None = None) -> int:
    parser, _ = options(
        __doc__, quick="about 64 MiB of state, 3 rounds (under a minute)", full="2 GiB of state, 3 rounds"
    )
    parser.add_argument("--rounds", type=int, help="rounds per median after the warm-up (default 5; quick, full 3)")
    parser.add_argument("--json", type=Path, help="write every printed figure with its unit")
    rank_options(parser)
    args = parser.parse_args(argv)
    if args.rank_of:
        rank_main(args.rank_of)
        return 0
    size = size_of(args)
    state_mib, width, rounds = SIZES[size]
    rounds = rounds_of(parser, args.rounds, rounds)
    depth = max(1, round(state_mib * MiB / 3 / 4 / (width * width + width)))
    started = time.perf_counter()
    runs: dict[int, list[dict]] = {}
    with scratch("sharded-bench-", args.dir, fallback=None) as directory:
        spec = {"width": width, "depth": depth, "rounds": rounds, "dir": str(directory)}
        for world in WORLDS:
            print(f"{time.perf_counter() - started:5.0f} s: {world} ranks", flush=True)
            runs[world] = launch(world, spec, TIMEOUT[size])
            if world == 4:  # the 2-rank run restores DCP's last 4-rank checkpoint
                spec["dcp_source"] = runs[world][0]["dcp_source"]
    wall = time.perf_counter() - started
    return report(size, spec, runs, wall, args.json)


# ------------------------------------------------------------------------------------------- report


def _per_rank(ranks: list[dict], group: str, key: str) -> list[float]:
    """Each rank's median of ``key`` in its series ``group``."""
    return [statistics.median(r[group][key]) for r in ranks if key in r.get(group, {})]


#: DCP variants of the plain and process phases: key, series group, label.
DCP_VARIANTS = (
    ("dcp", "series", "DCP async_save, default stager"),
    ("dcp_reuse", "series", "DCP async_save, stager kept across saves"),
    ("dcp_process", "series_process", "DCP async_save, process checkpointer + shared-memory stager"),
)
#: Rows of the overlap phase: key, label.
OVERLAP_ROWS = (
    ("step_alone", "training step without a checkpoint"),
    ("ours_overlap_stall", "ours overlap mode: stall (return + optimizer.step wait)"),
    ("dcp_async_stall", "DCP async staging: stall (return + wait for staging)"),
    ("ours_overlap_step", "ours overlap mode: save + the next training step"),
    ("dcp_async_step", "DCP async staging: save + the next training step"),
    ("ours_overlap_added", "ours overlap mode: time added to the step (paired per round)"),
    ("dcp_async_added", "DCP async staging: time added to the step (paired per round)"),
)


class _Report:
    """The table and the JSON figures, filled row by row."""

    def __init__(self, title: str) -> None:
        from rich.table import Table

        self.figures: dict[str, dict] = {}
        self.verdicts: dict[str, bool] = {}
        self.table = Table(title=title)
        for column in ("ranks", "figure", "median rank", "slowest rank", "ratio", "target", "result"):
            self.table.add_column(
                column, justify="right" if column in ("median rank", "slowest rank", "ratio") else "left"
            )

    def figure(self, key: str, value: Any, unit: str, label: str) -> None:
        self.figures[key] = {"value": value, "unit": unit, "label": label}

    def row(self, world: int, key: str, label: str, values: list[float], unit: str = "ms") -> float:
        """Median and slowest rank of per-rank ``values`` (seconds or bytes); the median, in ``unit``."""
        if not values:
            self.table.add_row(str(world), label, "n/a")
            return float("nan")
        scale = 1000 if unit == "ms" else 1 / MiB
        med, worst = statistics.median(values) * scale, max(values) * scale
        self.figure(f"{world}/{key}", med, unit, label + " (median rank)")
        self.figure(f"{world}/{key}_slowest", worst, unit, label + " (slowest rank)")
        self.table.add_row(str(world), label, f"{med:.1f} {unit}", f"{worst:.1f} {unit}")
        return med

    def value(self, world: int, key: str, label: str, value: float, unit: str, shown: str) -> None:
        self.figure(f"{world}/{key}", value, unit, label)
        self.table.add_row(str(world), label, shown)

    def ratio(self, world: int, key: str, label: str, value: float, against: str, target: str = "", ok=None) -> None:
        self.figure(f"{world}/{key}", value, "ratio", label)
        shown = f"{value:.4f}x {against}" if against == "state" else f"{value:.3g}x {against}"
        verdict = ""
        if ok is not None:
            self.verdicts[f"{world} ranks: {label} {target}"] = bool(ok)
            verdict = "PASS" if ok else "FAIL"
        self.table.add_row(str(world), label, "", "", shown, target, verdict)


def report(size: str, spec: dict, runs: dict[int, list[dict]], wall: float, json_path: Path | None) -> int:
    """The table, the figures and the verdicts of both worlds; 0 (the verdicts are the reader's)."""
    console = harness.console(150)
    first = runs[WORLDS[0]][0]
    state_bytes = first["state_bytes"]
    title = (
        f"FSDP2 checkpoints: {state_bytes / MiB:.1f} MiB of state ({spec['depth']} layers of width {spec['width']}, "
        f"Adam), {size} size, medians of {spec['rounds']} rounds per rank, then over ranks"
    )
    out = _Report(title)
    out.figure("state", state_bytes / MiB, "MiB", "state: parameters + Adam's two moments")
    out.figure("layers", spec["depth"], "count", f"square linear layers of width {spec['width']}")
    out.figure("rounds", spec["rounds"], "count", "rounds per median, after a warm-up round")
    for world, ranks in runs.items():
        if world != WORLDS[0]:
            out.table.add_section()
        local = statistics.median(r["local_bytes"] for r in ranks)
        out.figure(f"{world}/local_bytes", local / MiB, "MiB", "state bytes per rank (median rank)")
        _plain_rows(out, world, ranks, local)
        _overlap_rows(out, world, ranks)
        _bytes_rows(out, world, ranks, state_bytes)
        if world == 2:
            out.table.add_section()
            _restore_rows(out, ranks)
    console.print(out.table)
    _phase_figures(out, console, runs)
    unavailable = first.get("unavailable", {})
    for name, what in unavailable.items():
        console.print(f"DCP {name} on this machine: {what}")
    out.figures["unavailable"] = {"value": unavailable, "unit": "text", "label": "DCP options this machine cannot use"}
    out.figure("wall", wall, "s", "wall time of the whole run")
    console.print(f"wall time {wall:.0f} s; both engines fsync (DCP's FileSystemWriter sync_files=True, its default)")
    failed = [k for k, ok in out.verdicts.items() if not ok]
    console.print(f"{len(out.verdicts) - len(failed)} of {len(out.verdicts)} targets PASS")
    for check in failed:
        console.print(f"FAIL {check}")
    if json_path:
        payload = {"size": size, "config": spec | {"batch": BATCH}, "figures": out.figures, "verdicts": out.verdicts}
        write_json(json_path, payload)
    return 0


def _plain_rows(out: _Report, world: int, ranks: list[dict], local: float) -> None:
    """The plain phase: a copy, our stall and commit, and each DCP variant against them."""
    plain = {key: _per_rank(ranks, "series", key) for key in ("copy", "ours_stall", "ours_commit")}
    copy = out.row(world, "copy", f"copy of the rank's {local / MiB:.0f} MiB into reused buffers", plain["copy"])
    stall = out.row(world, "ours_stall", "ours: stall (save returns, after prepare)", plain["ours_stall"])
    out.ratio(world, "ours_stall_over_copy", "ours: stall / copy", stall / copy, "copy", "<= 1.5", stall <= 1.5 * copy)
    commit = out.row(world, "ours_commit", "ours: save to commit (wait returns)", plain["ours_commit"])
    for name, group, label in DCP_VARIANTS:
        block = out.row(world, f"{name}_block", f"{label}: blocking", _per_rank(ranks, group, f"{name}_block"))
        total = out.row(world, f"{name}_total", f"{label}: to completion", _per_rank(ranks, group, f"{name}_total"))
        if block == block:  # not NaN: the variant ran
            out.ratio(
                world,
                f"{name}_block_over_ours_stall",
                f"{name} blocking / ours' stall",
                block / stall,
                "ours",
                ">= 5",
                block >= 5 * stall,
            )
            out.ratio(
                world,
                f"{name}_total_over_ours_commit",
                f"{name} to completion / ours' commit",
                total / commit,
                "ours",
                ">= 1",
                total >= commit,
            )
        else:
            error = next((r[f"{name}_error"] for r in ranks if f"{name}_error" in r), "did not run")
            out.figure(f"{world}/{name}_error", error, "text", f"{label}: error")
            out.table.add_row(str(world), f"{label}: failed", "", "", "", error[:60])
    getsd = [r["get_state_dict"] for r in ranks]
    out.row(world, "get_state_dict", "get_state_dict(model, optimizer) alone (part of every DCP save)", getsd)


def _overlap_rows(out: _Report, world: int, ranks: list[dict]) -> None:
    """The overlap phase: what each engine's save adds to the next training step."""
    got = {key: out.row(world, key, label, _per_rank(ranks, "series_overlap", key)) for key, label in OVERLAP_ROWS}
    out.ratio(
        world,
        "dcp_async_over_ours_overlap_stall",
        "DCP async-staging stall / ours' overlap stall",
        got["dcp_async_stall"] / got["ours_overlap_stall"],
        "ours",
    )
    added = got["dcp_async_added"] - got["ours_overlap_added"]
    out.value(
        world,
        "dcp_async_added_minus_ours",
        "time added to the step: DCP async staging minus ours overlap",
        added,
        "ms",
        f"{added:.1f} ms",
    )


def _bytes_rows(out: _Report, world: int, ranks: list[dict], state_bytes: int) -> None:
    """Bytes written against the state's, and the ranks' peak memory."""
    data = sum(r["ours_data_bytes"] for r in ranks)
    for key, label, value in (
        ("ours_data_bytes", "ours: shard data written, sum over ranks", data),
        (
            "ours_file_bytes",
            "ours: shard files (stats.bytes_written), sum",
            sum(r["ours_file_bytes"] for r in ranks),
        ),
        ("dcp_file_bytes", "DCP: files written, sum", sum(r.get("dcp_file_bytes", 0) for r in ranks)),
    ):
        out.value(world, key, label, value / MiB, "MiB", f"{value / MiB:.2f} MiB")
    out.ratio(
        world,
        "bytes_written_over_state",
        "ours: shard data / state bytes",
        data / state_bytes,
        "state",
        "1 +- 1 %",
        abs(data / state_bytes - 1) <= 0.01,
    )

    peaks = [max(v for k, v in r.items() if k.startswith("peak_rss")) for r in ranks]
    out.row(world, "peak_rss", "peak resident memory of a rank (VmHWM)", peaks, "MiB")
    out.value(
        world,
        "peak_rss_sum",
        "sum of the ranks' peaks (DCP's writer processes apart)",
        sum(peaks) / MiB,
        "MiB",
        f"{sum(peaks) / MiB:.0f} MiB",
    )


def _restore_rows(out: _Report, ranks: list[dict]) -> None:
    """The 2-rank run's restores of the 4-rank checkpoints: ours against ``dcp.load``, and equal."""
    world = 2
    restore = {
        key: _per_rank(ranks, "series_restore", key) for key in ("ours_restore", "dcp_restore", "init_optimizer")
    }
    ours = out.row(world, "ours_restore_4to2", "restore 4 -> 2 ranks: Checkpointer.restore", restore["ours_restore"])
    theirs = out.row(
        world, "dcp_restore_4to2", "restore 4 -> 2 ranks: dcp.load (+ set_state_dict)", restore["dcp_restore"]
    )
    out.row(
        world,
        "init_optimizer",
        "of which dcp.load pays: a fresh Adam's state created (get_state_dict on it)",
        restore["init_optimizer"],
    )
    out.ratio(
        world,
        "ours_restore_over_dcp",
        "restore 4 -> 2: ours / dcp.load",
        ours / theirs,
        "dcp.load",
        "<= 0.8",
        ours <= 0.8 * theirs,
    )
    equal = all(r["restore_equal"] for r in ranks)
    out.verdicts["2 ranks: restored states of ours and dcp.load equal bit for bit"] = equal
    out.figure("2/restore_equal", equal, "bool", "both restores bitwise equal")
    out.table.add_row("2", "restored states: ours = dcp.load, bit for bit", "", "", "", "", "PASS" if equal else "FAIL")


def _phase_figures(out: _Report, console: Any, runs: dict[int, list[dict]]) -> None:
    """Each phase's time and memory, slowest or largest over ranks."""
    for world, ranks in runs.items():
        seconds = {name: max(r["phase_seconds"][name] for r in ranks) for name in ranks[0]["phase_seconds"]}
        peaks = {name: max(r[f"peak_rss_{name}"] for r in ranks) / MiB for name in seconds}
        starts = {name: max(r[f"start_rss_{name}"] for r in ranks) / MiB for name in seconds}
        for name in seconds:
            out.figure(f"{world}/phase_{name}", seconds[name], "s", f"phase {name}, slowest rank")
            out.figure(f"{world}/peak_rss_{name}", peaks[name], "MiB", f"phase {name}, largest peak RSS of a rank")
            out.figure(
                f"{world}/start_rss_{name}", starts[name], "MiB", f"phase {name}, largest RSS of a rank at start"
            )
        console.print(
            f"{world} ranks, per phase: "
            + ", ".join(f"{k} {seconds[k]:.0f} s (RSS {starts[k]:.0f} -> peak {peaks[k]:.0f} MiB)" for k in seconds)
        )


if __name__ == "__main__":
    sys.exit(main())
