"""Sharded checkpoints of an FSDP2 model: our engine against PyTorch DCP, side by side, at 2 and 4 ranks.

A stack of square linear layers wrapped with ``fully_shard`` (one FSDP unit per layer) and Adam,
trained one step so that its moments exist: the state is parameters plus two moments, every one a
``DTensor`` sharded over the ranks. Real ranks: this script starts them as ``torchrun`` would
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, gloo on CPU, one thread each), first
4 then 2, and every rank measures, in the same run and on the same state:

- ``copy``: copying this rank's local shards into buffers allocated and touched beforehand, the
  least any snapshot can cost;
- ``ours``: ``Checkpointer.save`` after ``prepare`` (the stall: until it returns) and until
  ``wait`` returns (save to commit: every shard written and fsynced, the manifest renamed);
- ``dcp``: ``torch.distributed.checkpoint.async_save`` of ``get_state_dict``'s state dict with its
  default stager (blocking: until it returns; to completion: until its future's result);
  ``dcp-cached``: the same with ``FileSystemWriter(cache_staged_state_dict=True)``, which reuses
  its staging buffers as our arena does (it needs CUDA in torch 2.13, and says so);
  ``dcp-process``: ``AsyncCheckpointerType.PROCESS``. DCP's pinned-memory and asynchronous
  staging need CUDA, absent here;
- ``ours, overlap mode``: ``save(..., overlap=True)`` returns before the copy, which runs behind
  the next forward/backward pass; the stall is its return time plus how long that step's
  ``optimizer.step()`` waited for the copy (measured by step pre-hooks around the engine's);
- at 2 ranks, restoring the 4-rank checkpoints into a fresh 2-rank FSDP2 model and optimizer:
  ``Checkpointer.restore`` against ``dcp.load`` followed by ``set_state_dict``, as DCP's tutorial
  does. Both read through the page cache (the checkpoints were just written).

Each figure is the median over rounds on each rank; the table shows the median over ranks (and
the slowest rank's). Both engines fsync what they write (DCP's ``sync_files`` defaults to true).
Bytes written sum every rank's shard files of our checkpoint against the state's bytes.

``python benchmarks/sharded_bench.py [--quick | --full] [--json PATH] [--dir DIR]``: ``--quick``
about 64 MiB of state, 3 rounds; default 512 MiB, 5 rounds; ``--full`` 2 GiB, 3 rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: state MiB (parameters + Adam's two moments), layer width, rounds
SIZES = {"quick": (64, 1024, 3), "default": (512, 2048, 5), "full": (2048, 4096, 3)}
WORLDS = (4, 2)
#: Rows of the training batch in overlap mode: the copy hides behind its forward/backward.
BATCH = 64


# ------------------------------------------------------------------------------------------- one rank


def rank_main(size: str, directory: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard

    from resilient_flows.checkpoint import Checkpointer, TrainState

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    state_mib, width, rounds = SIZES[size]
    depth = max(1, round(state_mib * 2**20 / 3 / 4 / (width * width + width)))

    def build() -> TrainState:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(depth)))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        model(torch.randn(4, width)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return TrainState(model, optimizer, rng=False)

    state = build()
    locals_ = [t.to_local() for t in _tensors(state)]
    local_bytes = sum(t.numel() * t.element_size() for t in locals_)
    state_bytes = sum(t.numel() * t.element_size() for t in _tensors(state, full=True))
    out: dict = {"rank": rank, "world": world, "depth": depth, "local_bytes": local_bytes, "state_bytes": state_bytes}

    out["copy"] = _copy_time(locals_, rounds, dist.barrier)

    ours_dir = directory / f"ours-{world}"
    stalls, commits, overlapped = [], [], []
    batch = torch.randn(BATCH, width)
    marks: dict[str, float] = {}
    hooks = [state.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("in", time.perf_counter()))]

    def train_step() -> None:
        state.model(batch).square().mean().backward()
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)

    with Checkpointer(ours_dir, comm=dist.group.WORLD, keep=2) as ck:
        ck.prepare(state)
        ck.save(0, state)
        ck.wait()
        for step in range(1, rounds + 1):
            dist.barrier()
            started = time.perf_counter()
            ck.save(step, state)
            stalls.append(time.perf_counter() - started)
            ck.wait()
            commits.append(time.perf_counter() - started)
        for step in range(rounds + 1, 2 * rounds + 2):  # overlap mode: the copy runs behind the next step
            dist.barrier()
            started = time.perf_counter()
            ck.save(step, state, overlap=True)
            returned = time.perf_counter() - started
            if len(hooks) == 1:  # the engine's hook exists now; one registered after it sees it return
                hooks.append(
                    state.optimizer.register_step_pre_hook(lambda *_: marks.__setitem__("out", time.perf_counter()))
                )
            train_step()
            if step > rounds + 1:  # the first round is a warm-up
                overlapped.append(returned + marks["out"] - marks["in"])
            ck.wait()
        newest = ck.latest_step()
    for hook in hooks:
        hook.remove()
    out["ours_stall"], out["ours_commit"] = statistics.median(stalls), statistics.median(commits)
    out["ours_overlap_stall"] = statistics.median(overlapped)
    shard_dir = ours_dir / f"step-{newest:08d}"
    out["bytes_written"] = sum(
        p.stat().st_size - _header_bytes(p) for p in shard_dir.glob("shard-*.safetensors") if rank == 0
    )

    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    state_dict = {"model": model_sd, "optim": optim_sd}
    variants = {"dcp": {}, "dcp-cached": {"cached": True}, "dcp-process": {"process": True}}
    for name, how in variants.items():
        blocking, total = [], []
        target = directory / f"{name}-{world}"
        kwargs: dict = {"checkpoint_id": target}
        if how.get("cached"):  # one writer for every round: its staging buffers are reused
            kwargs = {"storage_writer": dcp.FileSystemWriter(target, cache_staged_state_dict=True)}
        if how.get("process"):
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            kwargs["async_checkpointer_type"] = AsyncCheckpointerType.PROCESS
        try:
            for step in range(rounds + 1):
                dist.barrier()
                started = time.perf_counter()
                future = dcp.async_save(state_dict, **kwargs)
                returned = time.perf_counter() - started
                future.result()
                finished = time.perf_counter() - started
                if step:  # the first round is a warm-up, as ours is
                    blocking.append(returned)
                    total.append(finished)
            out[f"{name}_block"], out[f"{name}_total"] = statistics.median(blocking), statistics.median(total)
        except Exception as exc:  # an unavailable variant is reported, not fatal
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        dist.barrier()
    del state_dict, model_sd, optim_sd

    if world == 2:
        ours_times, dcp_times = [], []
        source = directory / "ours-4"
        dcp_source = directory / "dcp-4"
        for _ in range(rounds):
            fresh = build()
            dist.barrier()
            started = time.perf_counter()
            with Checkpointer(source, comm=dist.group.WORLD) as ck:
                ck.restore(fresh)
            ours_times.append(time.perf_counter() - started)
            fresh = build()
            dist.barrier()
            started = time.perf_counter()
            model_sd, optim_sd = get_state_dict(fresh.model, fresh.optimizer)
            loaded = {"model": model_sd, "optim": optim_sd}
            dcp.load(loaded, checkpoint_id=dcp_source)
            set_state_dict(fresh.model, fresh.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
            dcp_times.append(time.perf_counter() - started)
        out["ours_restore_4to2"], out["dcp_restore_4to2"] = statistics.median(ours_times), statistics.median(dcp_times)
    (directory / f"rank-{world}-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _tensors(state, full: bool = False) -> list:
    """Every parameter and Adam moment (DTensors); their global sizes when ``full``."""
    import torch

    tensors = [p for p in state.model.parameters()]
    for moments in state.optimizer.state.values():
        tensors += [v for k, v in moments.items() if k != "step"]
    if full:
        return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
    return tensors


def _copy_time(tensors: list, rounds: int, barrier) -> float:
    """Median time to copy ``tensors`` into buffers allocated and touched beforehand.

    Every rank copies at the same moment, as every rank saves at the same moment: on a machine
    with fewer cores than ranks, copies that do not overlap would each look faster than a save.
    """
    import torch

    buffers = [torch.zeros_like(t) for t in tensors]
    times = []
    for _ in range(rounds + 1):
        barrier()
        started = time.perf_counter()
        for b, t in zip(buffers, tensors, strict=True):
            b.copy_(t)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def _header_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


# ------------------------------------------------------------------------------------------- launcher


def launch(world: int, size: str, directory: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    env["WORLD_SIZE"] = str(world)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank-of", size, str(directory)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(world)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a rank of the {world}-rank run failed: exit codes {codes}")
    return [json.loads((directory / f"rank-{world}-{r}.json").read_text()) for r in range(world)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="about 64 MiB of state, 3 rounds (under a minute)")
    group.add_argument("--full", action="store_true", help="2 GiB of state, 3 rounds")
    parser.add_argument("--json", type=Path, help="write every figure with its unit")
    parser.add_argument("--dir", type=Path, help="where the checkpoints go (default: a temporary directory)")
    parser.add_argument("--rank-of", nargs=2, metavar=("SIZE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_of:
        rank_main(args.rank_of[0], Path(args.rank_of[1]))
        return 0
    size = "quick" if args.quick else "full" if args.full else "default"
    directory = Path(tempfile.mkdtemp(prefix="sharded-bench-", dir=args.dir))
    started = time.perf_counter()
    try:
        runs = {world: launch(world, size, directory) for world in WORLDS}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return report(size, runs, time.perf_counter() - started, args.json)


def report(size: str, runs: dict[int, list[dict]], wall: float, json_path: Path | None) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    figures: dict[str, dict] = {}
    verdicts: dict[str, bool] = {}

    def figure(key: str, value: float, unit: str) -> None:
        figures[key] = {"value": value, "unit": unit}

    first = runs[WORLDS[0]][0]
    figure("state", first["state_bytes"] / 2**20, "MiB")
    figure("layers", first["depth"], "count")
    table = Table(title=f"FSDP2 checkpoints, {first['state_bytes'] / 2**20:.0f} MiB of state ({size})")
    for column in ("ranks", "figure", "median rank", "slowest rank", "target", "verdict"):
        table.add_column(column, justify="left" if column in ("figure", "target") else "right")
    for world, ranks in runs.items():

        def med(key: str, ranks: list[dict] = ranks) -> tuple[float, float]:
            values = [r[key] for r in ranks if key in r]
            return (statistics.median(values), max(values)) if values else (float("nan"), float("nan"))

        copy, _ = med("copy")
        stall, stall_max = med("ours_stall")
        commit, commit_max = med("ours_commit")
        overlap, _ = med("ours_overlap_stall")
        rows = [
            ("copy of the rank's local bytes", "copy", "ms", "", None),
            ("ours: stall", "ours_stall", "ms", "<= 1.5x copy", stall <= 1.5 * copy),
            ("ours: stall, overlap mode", "ours_overlap_stall", "ms", "", None),
            ("ours: save to commit", "ours_commit", "ms", "", None),
        ]
        for name in ("dcp", "dcp-cached", "dcp-process"):
            block, _ = med(f"{name}_block")
            total, _ = med(f"{name}_total")
            if block == block:  # not NaN: the variant ran
                rows.append((f"{name}: blocking", f"{name}_block", "ms", ">= 5x ours' stall", block >= 5 * stall))
                rows.append(
                    (f"{name}: blocking", f"{name}_block", "ms", ">= 5x ours' overlap stall", block >= 5 * overlap)
                )
                rows.append((f"{name}: to completion", f"{name}_total", "ms", ">= ours' commit", total >= commit))
                figure(f"{world}/{name}_block_over_ours_stall", block / stall, "ratio")
                figure(f"{world}/{name}_block_over_ours_overlap_stall", block / overlap, "ratio")
                figure(f"{world}/{name}_total_over_ours_commit", total / commit, "ratio")
            else:
                error = next((r[f"{name}_error"] for r in ranks if f"{name}_error" in r), "did not run")
                console.print(f"[yellow]{name} at {world} ranks: {error}[/]")
                figures[f"{world}/{name}_error"] = {"value": error, "unit": "text"}
        if world == 2:
            rows.append(("ours: restore 4 -> 2", "ours_restore_4to2", "ms", "<= dcp.load", None))
            rows.append(("dcp.load 4 -> 2", "dcp_restore_4to2", "ms", "", None))
        for label, key, unit, target, ok in rows:
            value, worst = med(key)
            figure(f"{world}/{key}", value * 1000, unit)
            figure(f"{world}/{key}_slowest", worst * 1000, unit)
            if ok is not None:
                verdicts[f"{world} ranks: {label} {target}"] = bool(ok)
            verdict = "" if ok is None else ("PASS" if ok else "FAIL")
            table.add_row(str(world), label, f"{value * 1000:.1f} ms", f"{worst * 1000:.1f} ms", target, verdict)
        figure(f"{world}/ours_stall_over_copy", stall / copy, "ratio")
        figure(f"{world}/ours_stall_slowest_over_copy", stall_max / copy, "ratio")
        figure(f"{world}/ours_commit_slowest", commit_max * 1000, "ms")
    console.print(table)
    for world, ranks in runs.items():
        state_bytes = ranks[0]["state_bytes"]
        written = _written(ranks)
        figure(f"{world}/bytes_written_over_state", written / state_bytes, "ratio")
        ok = abs(written / state_bytes - 1) <= 0.01
        verdicts[f"{world} ranks: bytes written = state bytes +-1 %"] = ok
        console.print(
            f"{world} ranks: bytes written {written / 2**20:.1f} MiB for {state_bytes / 2**20:.1f} MiB of state "
            f"({written / state_bytes:.4f}x) {'PASS' if ok else 'FAIL'}"
        )
    restore = [r for r in runs.get(2, []) if "ours_restore_4to2" in r]
    if restore:
        ours = statistics.median(r["ours_restore_4to2"] for r in restore)
        theirs = statistics.median(r["dcp_restore_4to2"] for r in restore)
        figure("2/dcp_restore_over_ours", theirs / ours, "ratio")
        verdicts["restore 4 -> 2: ours <= dcp.load"] = ours <= theirs
        console.print(f"restore 4 -> 2: dcp.load / ours = {theirs / ours:.2f}x")
    figure("wall", wall, "s")
    console.print(f"wall time {wall:.0f} s")
    for check, ok in verdicts.items():
        console.print(f"{'PASS' if ok else 'FAIL'}  {check}")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"size": size, "figures": figures, "verdicts": verdicts}, indent=2) + "\n")
    return 0


def _written(ranks: list[dict]) -> int:
    """Our shard data of the newest checkpoint (rank 0 measured every shard file of it)."""
    return sum(r["bytes_written"] for r in ranks)


if __name__ == "__main__":
    sys.exit(main())
