"""Framework integrations against the frameworks' own checkpointing, side by side in one run.

Two sections, each training one model in this process and comparing checkpoint plugins on it:

``lightning``
    A PyTorch Lightning ``LightningModule``: an MLP of ``DEPTH`` square layers and its Adam moments
    (parameters are a third of the bytes; 512 MiB in all by default), trained on one fixed batch.
    Variants: no checkpoints, Lightning's default ``TorchCheckpointIO`` (``torch.save`` on the
    training thread), ``AsyncCheckpointIO(TorchCheckpointIO())`` (clones the tensors on the
    training thread, then ``torch.save`` in a thread) and ours, ``ResilientCheckpointIO`` with
    ``ResilientCallback`` (copies into reused host buffers, then writes, fsyncs and commits in
    the background).
``hf``
    A Hugging Face ``Trainer`` on a GPT-2 built from a config (no download; ``HF_HUB_OFFLINE=1``)
    and AdamW, on random token ids. Variants: no checkpoints, ``Trainer``'s own synchronous save
    (``checkpoint-N/``: safetensors weights, ``optimizer.pt``, scheduler, RNG, trainer state) and
    ours, :func:`resilient_flows.integrations.transformers.resilient_trainer`.

Checkpoints are taken by this benchmark's own callback at steps it chooses (``trainer.save_checkpoint``
for Lightning, ``control.should_save`` for ``Trainer``), so that every variant checkpoints at the same
steps; ``ModelCheckpoint``'s and ``save_steps``' bookkeeping is left out.

What is measured, per variant, in runs interleaved across variants (the order rotates each round):

* stall: how long the training thread is blocked in one checkpoint call (Lightning:
  ``trainer.save_checkpoint``, which builds the checkpoint dict and calls the plugin; ``Trainer``:
  ``_save_checkpoint``), median over the checkpoints of the stall runs after each run's first
  (the first allocates host buffers; it is shown apart). The plugin call alone is shown too.
  Step excess: the step that holds a checkpoint against the median step without one, which also
  counts a background writer slowing the step down.
* throughput: steps/s over a window in which a checkpoint is taken every ``k`` steps, where ``k``
  steps take 30 s of training (``--quick``: 2 s), ``k`` computed from the step time of a calibration
  run, against the same window without checkpoints. The window starts at the step that takes the
  first checkpoint and ends once every write is done (ours: ``wait``; async: its thread joined),
  so a background write that spills past the window is charged. A checkpointing run saves once
  before the window opens and the window waits for that write: a process's first save allocates
  host buffers (ours) once per training run, not once per 30 s; the stall runs show it apart.
* paced throughput: the same window's steps/s against the run's own pace, its median step
  without a checkpoint (``window steps * median step / window time``). A machine shared with other
  jobs changes speed between runs, which moves the plain ratio by several percent; the paced
  figure compares each run with itself, so that what remains is what checkpointing costs (the
  stall, a writer slowing the steps down, a write spilling past the window). Its ratio to the
  paced figure of the run without checkpoints (about 1: mean against median step) is the paced
  throughput ratio, the one the 0.95 target is judged on.
* torn checkpoints: at every save call in the stall runs, on the training thread and outside the
  stall timing, a SHA-1 of every tensor the call is given (Lightning: the whole checkpoint dict,
  model and optimizer; ``Trainer``: the model's state dict). After the run each checkpoint is read
  back (``torch.load``; safetensors; ours through its reader) and every tensor's digest compared: a
  checkpoint with any difference, or with no tensor to compare, is torn. Training updates every
  tensor in place at every step, so a write that reads live tensors after the call returns shows.

Targets (second table): our stall <= 1/5 of the framework's synchronous save's, our throughput
>= 0.95 of no checkpointing at a checkpoint every 30 s, no torn checkpoint of ours. Rows marked
``info`` carry no target.

Threads: training gets every core but one (``torch.set_num_threads``), as in ``checkpoint_bench``:
background writers need a core, as they have on a GPU node whose host cores idle during a step.
``torch.save`` leaves its file in the page cache; ours fsyncs every file before it commits, so its
background work includes the disk.

Modes (times measured on the 2-core, 24 GiB machine this was written on):

``--quick``
    64 MiB Lightning state, a ~20 MiB GPT-2 state, the interval scaled down to 2 s of training (so
    the throughput figures are *not* at the 30 s of the target: the ratio then charges a checkpoint
    every 2 s), 2 stall rounds of 3 checkpoints: 41 s.
default
    512 MiB Lightning state, a ~220 MiB GPT-2 state, a checkpoint every 30 s, 2 stall rounds, one
    throughput round: 402 s. One throughput round is noisy on a shared machine (see ``--full``).
``--full``
    512 MiB Lightning state, a ~650 MiB GPT-2 state, 30 s interval over two intervals per window,
    3 stall rounds of 4 checkpoints and 3 throughput rounds: about 20 minutes.

Run ``python benchmarks/frameworks_bench.py [--quick | --full] [--skip-hf | --skip-lightning] [--json PATH]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import shutil
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPT-2 is built from a config: never reach the Hub

# Lightning before our integration: its classes derive from the Lightning already imported
import harness
import pytorch_lightning as pl
import torch
from harness import Clock, options, rotated, scratch, size_of, with_units, write_json
from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from report import judge, print_checks, print_figures

from resilient_flows.integrations.lightning import ResilientCallback, ResilientCheckpointIO
from resilient_flows.integrations.pathstore import load as load_ref

MiB = 1 << 20
DEPTH = 8  # MLP layers
BATCH = 32  # MLP batch
WARMUP = 2  # steps before anything is measured: Adam allocates its moments in the first
HF_BATCH, HF_SEQ, HF_VOCAB = 4, 32, 1024
CALIBRATION_STEPS = 8
console = harness.console()


@dataclass(frozen=True)
class Mode:
    """Sizes and repetitions of one mode (see the module docstring)."""

    lit_bytes: int
    hf_width: int
    hf_layers: int
    interval_s: float  # training time between checkpoints in the throughput runs
    gap_s: float  # training time between checkpoints in the stall runs: long enough for a write to finish
    stall_rounds: int
    stall_checkpoints: int  # per stall run
    throughput_rounds: int
    intervals: int  # checkpoint intervals per throughput window


MODES = {
    "quick": Mode(64 * MiB, 256, 2, 2.0, 0.75, 2, 3, 1, 1),
    "default": Mode(512 * MiB, 512, 6, 30.0, 2.0, 2, 3, 1, 1),
    "full": Mode(512 * MiB, 768, 8, 30.0, 4.0, 3, 4, 3, 2),
}

LIT_VARIANTS = ("torch", "async", "ours")
HF_VARIANTS = ("trainer", "ours")
LIT_NAMES = {"none": "no checkpoints", "torch": "TorchCheckpointIO", "async": "AsyncCheckpointIO", "ours": "ours"}
HF_NAMES = {"none": "no checkpoints", "trainer": "Trainer save", "ours": "ours"}


def _figure_table() -> dict[str, tuple[str, str, str]]:
    """key: (section, unit, label), in print order."""
    table: dict[str, tuple[str, str, str]] = {}
    for section, variants, names in (("lit", LIT_VARIANTS, LIT_NAMES), ("hf", HF_VARIANTS, HF_NAMES)):
        name = "lightning" if section == "lit" else "hf"
        table[f"{section}_state_bytes"] = (name, "MiB", "state (model + optimizer)")
        table[f"{section}_step_time"] = (name, "s", "training step, no checkpoint (calibration)")
        table[f"{section}_interval_steps"] = (name, "steps", "throughput runs: checkpoint every k steps")
        table[f"{section}_interval_time"] = (name, "s", "  = training time between checkpoints")
        table[f"{section}_gap_steps"] = (name, "steps", "stall runs: checkpoint every")
        for v in variants:
            label = names[v]
            table[f"{section}_{v}_stall"] = (name, "s", f"{label}: stall per checkpoint (median)")
            table[f"{section}_{v}_stall_first"] = (name, "s", f"{label}:   first checkpoint of a run (median)")
            if section == "lit":
                table[f"{section}_{v}_plugin_stall"] = (name, "s", f"{label}:   of which the plugin call")
            table[f"{section}_{v}_step_excess"] = (name, "s", f"{label}: checkpoint step minus median step")
            table[f"{section}_{v}_checkpoints"] = (name, "count", f"{label}: checkpoints verified")
            table[f"{section}_{v}_torn"] = (name, "count", f"{label}: torn checkpoints")
        for v in ("none", *variants):
            table[f"{section}_{v}_throughput"] = (name, "steps/s", f"{names[v]}: throughput")
        for v in ("none", *variants):
            table[f"{section}_{v}_paced"] = (name, "ratio", f"{names[v]}: throughput / own undisturbed pace")
    return table


FIGURES = _figure_table()


# ------------------------------------------------------------------------------------------ digests


def tensor_digests(tree: Any) -> dict[str, str]:
    """SHA-1 of every tensor in a nested checkpoint, by its key path: what a torn write changes."""
    found: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, torch.Tensor):
            found[prefix] = _sha1(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}/{key}")
        elif isinstance(node, list | tuple):
            for index, value in enumerate(node):
                walk(value, f"{prefix}/{index}")

    walk(tree, "")
    return found


def _sha1(tensor: torch.Tensor) -> str:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    digest = hashlib.sha1(usedforsecurity=False)
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy())
    return digest.hexdigest()


def is_torn(at_call: dict[str, str], loaded: dict[str, str]) -> bool:
    """Torn: a tensor differs, or nothing could be compared (the tensors went missing)."""
    common = at_call.keys() & loaded.keys()
    return not common or any(at_call[k] != loaded[k] for k in common)


# ------------------------------------------------------------------------------------------ records


@dataclass
class Save:
    """One checkpoint call, seen from the training thread."""

    step: int  # global step (optimizer steps done) at the call
    path: Path
    call_s: float = 0.0  # the whole call, digest excluded
    plugin_s: float = 0.0  # the plugin's save_checkpoint alone (Lightning)
    digest_s: float = 0.0
    digests: dict[str, str] | None = None
    torn: bool | None = None  # None: not read back


@dataclass
class Fit:
    """What one training run recorded."""

    starts: list[float] = field(default_factory=list)  # perf_counter at the start of each step
    saves: list[Save] = field(default_factory=list)
    window_start: float | None = None
    window_end: float | None = None
    window_steps: int = 0

    def step_times(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]

    def median_step(self) -> float:
        """Median step without a checkpoint, after the warm-up steps."""
        saved = {s.step - 1 for s in self.saves}  # index of the step whose end took the checkpoint
        times = [t for i, t in enumerate(self.step_times()) if i >= WARMUP and i not in saved]
        return statistics.median(times)

    def step_excess(self) -> list[float]:
        """For each checkpoint step: its duration (digest excluded) minus the median step."""
        times, median = self.step_times(), self.median_step()
        return [times[s.step - 1] - s.digest_s - median for s in self.saves if s.step - 1 < len(times)]

    def throughput(self) -> float:
        assert self.window_start is not None and self.window_end is not None
        return self.window_steps / (self.window_end - self.window_start)

    def paced(self) -> float:
        """The window's throughput against the run's own median step without a checkpoint."""
        return self.throughput() * self.median_step()


@dataclass
class Plan:
    """When one run checkpoints and what it measures."""

    max_steps: int
    save_at: frozenset[int] = frozenset()  # global steps after which to checkpoint
    window: tuple[int, int] | None = None  # (global step at the window's first step, global step at its end)
    digest: bool = False


def stall_plan(gap: int, checkpoints: int) -> Plan:
    """Checkpoints every ``gap`` steps after the warm-up, digests on, and one step after the last."""
    save_at = frozenset(WARMUP + 1 + j * gap for j in range(checkpoints))
    return Plan(max(save_at) + 2, save_at, None, True)


def throughput_plan(k: int, intervals: int, checkpoint: bool) -> Plan:
    """A window of ``intervals * k`` steps from the warm-up on, with a checkpoint at its first step
    and every ``k`` steps after (or none); the last checkpoint has ``k - 1`` steps to be written.

    A checkpointing run also saves once after its first step, and the window opens once that write
    is done: a process's first save allocates host buffers (ours) once per training run, which
    the stall runs show apart, not once per 30 s."""
    end = WARMUP + intervals * k
    save_at = frozenset({1, *(WARMUP + 1 + j * k for j in range(intervals))}) if checkpoint else frozenset()
    return Plan(end, save_at, (WARMUP, end), False)


# ------------------------------------------------------------------------------------------ Lightning


def _nothing() -> None:
    """The drain of a variant that leaves no write behind."""


class MLP(pl.LightningModule):
    """``DEPTH`` square linear layers with ReLU, mean-squared error against a fixed target, Adam."""

    def __init__(self, width: int) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = []
        for _ in range(DEPTH):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers[:-1])

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-5)


class FixedBatches(torch.utils.data.Dataset):
    """The same batch every step (``DataLoader(batch_size=None)``): no data cost in the step time."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.tensors


class LitBench(pl.Callback):
    """Times every step, takes the plan's checkpoints itself and closes the throughput window."""

    def __init__(self, plan: Plan, directory: Path, drain: Callable[[], None]) -> None:
        self.plan, self.directory, self.drain = plan, directory, drain
        self.fit = Fit()
        self.pending: Save | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        if self.plan.window is not None and trainer.global_step == self.plan.window[0]:
            self.drain()  # the priming save's write: outside the window
            self.fit.window_start = time.perf_counter()
        self.fit.starts.append(time.perf_counter())

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        step = trainer.global_step
        if step in self.plan.save_at:
            save = self.pending = Save(step, self.directory / f"step={step}.ckpt")
            start = time.perf_counter()
            trainer.save_checkpoint(save.path, weights_only=False)
            save.call_s = time.perf_counter() - start - save.digest_s
            self.fit.saves.append(save)
            self.pending = None
        if self.plan.window is not None and step == self.plan.window[1]:
            self.drain()  # every write done: a write spilling past the window is charged to it
            self.fit.window_end = time.perf_counter()
            self.fit.window_steps = self.plan.window[1] - self.plan.window[0]


def instrument(io: Any, bench: LitBench) -> None:
    """Wrap the plugin's ``save_checkpoint`` of this one instance: digest what it is given (untimed),
    then time the call itself."""
    inner = io.save_checkpoint

    def save_checkpoint(checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        save = bench.pending
        if save is not None and bench.plan.digest:
            start = time.perf_counter()
            save.digests = tensor_digests(checkpoint)
            save.digest_s = time.perf_counter() - start
        start = time.perf_counter()
        inner(checkpoint, path, storage_options=storage_options)
        if save is not None:
            save.plugin_s = time.perf_counter() - start

    io.save_checkpoint = save_checkpoint


class Lightning:
    """The Lightning section: one model, reused by every run (each builds its own Adam)."""

    def __init__(self, nbytes: int, root: Path) -> None:
        torch.manual_seed(0)
        self.width = max(8, int(math.sqrt(nbytes / 12 / DEPTH)))  # parameters: a third of the bytes, 4 each
        self.module = MLP(self.width)
        x, y = torch.randn(BATCH, self.width), torch.randn(BATCH, self.width)
        self.loader = torch.utils.data.DataLoader(FixedBatches(x, y), batch_size=None)
        self.nbytes = 3 * sum(p.numel() * p.element_size() for p in self.module.parameters())
        self.root = root
        self.runs = 0

    def run(self, variant: str, plan: Plan) -> Fit:
        """Train with ``variant``'s checkpointing; verify its checkpoints if the plan digests."""
        self.runs += 1
        where = self.root / f"lit-{self.runs:03d}-{variant}"
        callbacks: list[pl.Callback] = []
        io: Any = None
        drain: Callable[[], None] = _nothing
        if variant == "torch":
            io = TorchCheckpointIO()
        elif variant == "async":
            io = AsyncCheckpointIO(TorchCheckpointIO())
            drain = io.teardown  # joins its thread; the next save starts a new one
        elif variant == "ours":
            io = ResilientCheckpointIO(where / "store", keep=1 << 20)
            callbacks.append(ResilientCallback())
            drain = io.wait
        bench = LitBench(plan, where / "ckpts", drain)
        if io is not None:
            instrument(io, bench)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=plan.max_steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            plugins=[io] if io is not None else None,
            callbacks=[bench, *callbacks],
            default_root_dir=where,
        )
        trainer.fit(self.module, train_dataloaders=self.loader)
        try:
            if plan.digest:
                for save in bench.fit.saves:
                    state = load_ref(save.path)[1] if variant == "ours" else torch.load(save.path, weights_only=False)
                    loaded = tensor_digests(state)
                    del state
                    save.torn = is_torn(save.digests or {}, loaded)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        return bench.fit


# ------------------------------------------------------------------------------------------ Hugging Face


class HF:
    """The Hugging Face section: one GPT-2, reused by every run (each ``train`` builds its own AdamW)."""

    def __init__(self, width: int, layers: int, root: Path) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # save_pretrained's per-save shard bar
        torch.manual_seed(0)
        config = GPT2Config(
            vocab_size=HF_VOCAB,
            n_positions=HF_SEQ,
            n_embd=width,
            n_layer=layers,
            n_head=max(1, width // 64),
            bos_token_id=0,
            eos_token_id=0,
        )
        self.model = GPT2LMHeadModel(config)
        self.nbytes = 3 * sum(p.numel() * p.element_size() for p in self.model.parameters())
        ids = torch.randint(0, HF_VOCAB, (64, HF_SEQ), generator=torch.Generator().manual_seed(0))
        self.data = TokenIds(ids)
        self.root = root
        self.runs = 0

    def run(self, variant: str, plan: Plan) -> Fit:
        """Train with ``variant``'s checkpointing; verify its checkpoints if the plan digests."""
        from transformers import PrinterCallback, Trainer, TrainingArguments

        from resilient_flows.checkpoint._reader import read_checkpoint
        from resilient_flows.integrations.transformers import resilient_trainer

        self.runs += 1
        where = self.root / f"hf-{self.runs:03d}-{variant}"
        args = TrainingArguments(
            output_dir=str(where / "out"),
            max_steps=plan.max_steps,
            per_device_train_batch_size=HF_BATCH,
            learning_rate=1e-4,
            save_strategy="no",  # the bench's callback asks for each checkpoint, for every variant alike
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
        )
        fit = Fit()
        trainer = Trainer(model=self.model, args=args, train_dataset=self.data)
        trainer.remove_callback(PrinterCallback)
        drain: Callable[[], None] = _nothing
        store = where / "checkpoints"
        if variant == "ours":
            # Trainer's own loader in both arms: the comparison is of checkpointing alone
            resilient = resilient_trainer(trainer, store, keep=1 << 20, resumable_data=False)
            drain = resilient.checkpointer.wait
        trainer.add_callback(hf_bench(plan, fit, drain))
        inner = trainer._save_checkpoint  # ours replaced it on this instance already

        def timed_save(model: Any, trial: Any = None) -> None:
            step = trainer.state.global_step
            save = Save(step, where / "out" / f"checkpoint-{step}")
            if plan.digest:
                start = time.perf_counter()
                save.digests = tensor_digests(dict(trainer.model.state_dict()))
                save.digest_s = time.perf_counter() - start
            start = time.perf_counter()
            inner(model, trial)
            save.call_s = time.perf_counter() - start
            fit.saves.append(save)

        trainer._save_checkpoint = timed_save
        trainer.train()
        try:
            if plan.digest:
                from safetensors.torch import load_file

                for save in fit.saves:
                    if variant == "ours":
                        found = read_checkpoint(store, save.step - 1)  # our steps count from 0
                        state = {} if found is None else found[1].get("model", {})
                    else:
                        state = load_file(save.path / "model.safetensors")
                    save.torn = is_torn(save.digests or {}, tensor_digests(state))
        finally:
            shutil.rmtree(where, ignore_errors=True)
        return fit


class TokenIds(torch.utils.data.Dataset):
    """Random token sequences, cycled: the model learns nothing in particular, the steps cost the same."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.ids[index % len(self.ids)]
        return {"input_ids": row, "labels": row}


def hf_bench(plan: Plan, fit: Fit, drain: Callable[[], None]) -> Any:
    """A ``TrainerCallback`` doing for ``Trainer`` what :class:`LitBench` does for Lightning."""
    from transformers import TrainerCallback

    class HFBench(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if plan.window is not None and state.global_step == plan.window[0]:
                drain()  # the priming save's write: outside the window
                fit.window_start = time.perf_counter()
            fit.starts.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in plan.save_at:
                control.should_save = True
            if plan.window is not None and state.global_step == plan.window[1]:
                drain()
                fit.window_end = time.perf_counter()
                fit.window_steps = plan.window[1] - plan.window[0]

    return HFBench()


# ------------------------------------------------------------------------------------------ measuring


def measure(
    section: str, runner: Any, variants: tuple[str, ...], mode: Mode, phase: Callable[[str], None]
) -> dict[str, float]:
    """Calibration, stall runs and throughput runs of one section; its figures."""
    fig: dict[str, float] = {f"{section}_state_bytes": runner.nbytes / MiB}
    phase(f"{section}: calibration")
    runner.run("none", Plan(WARMUP + CALIBRATION_STEPS))  # warms up allocator and kernels
    step = runner.run("none", Plan(WARMUP + CALIBRATION_STEPS)).median_step()
    fig[f"{section}_step_time"] = step
    gap = max(2, math.ceil(mode.gap_s / step))
    k = max(2, math.ceil(mode.interval_s / step))
    fig[f"{section}_gap_steps"], fig[f"{section}_interval_steps"] = gap, k
    fig[f"{section}_interval_time"] = k * step

    saves: dict[str, list[tuple[int, Save, float]]] = {v: [] for v in variants}
    for r in range(mode.stall_rounds):
        for v in rotated(variants, r):
            phase(f"{section}: stall round {r + 1}/{mode.stall_rounds}, {v}")
            fit = runner.run(v, stall_plan(gap, mode.stall_checkpoints))
            excess = fit.step_excess()
            saves[v] += [(i, s, excess[i] if i < len(excess) else math.nan) for i, s in enumerate(fit.saves)]
    for v, rows in saves.items():
        steady = [row for row in rows if row[0] > 0] or rows
        fig[f"{section}_{v}_stall"] = statistics.median(s.call_s for _, s, _ in steady)
        fig[f"{section}_{v}_stall_first"] = statistics.median(s.call_s for i, s, _ in rows if i == 0)
        if section == "lit":
            fig[f"{section}_{v}_plugin_stall"] = statistics.median(s.plugin_s for _, s, _ in steady)
        fig[f"{section}_{v}_step_excess"] = statistics.median(e for _, _, e in steady)
        fig[f"{section}_{v}_checkpoints"] = len(rows)
        fig[f"{section}_{v}_torn"] = sum(s.torn is not False for _, s, _ in rows)  # unread counts as torn

    rates: dict[str, list[float]] = {v: [] for v in ("none", *variants)}
    paced: dict[str, list[float]] = {v: [] for v in ("none", *variants)}
    for r in range(mode.throughput_rounds):
        for v in rotated(("none", *variants), r):
            phase(f"{section}: throughput round {r + 1}/{mode.throughput_rounds}, {v} ({k} steps per checkpoint)")
            fit = runner.run(v, throughput_plan(k, mode.intervals, v != "none"))
            rates[v].append(fit.throughput())
            paced[v].append(fit.paced())
    for v in rates:
        fig[f"{section}_{v}_throughput"] = statistics.median(rates[v])
        fig[f"{section}_{v}_paced"] = statistics.median(paced[v])
    return fig


#: key, label, numerator, op, denominator, target (None: information only).
RATIOS = [
    ("lit_stall", "Lightning: our stall / TorchCheckpointIO's", "lit_ours_stall", "<=", "lit_torch_stall", 0.2),
    (
        "lit_async_stall",
        "Lightning: AsyncCheckpointIO stall / TorchCheckpointIO's",
        "lit_async_stall",
        "",
        "lit_torch_stall",
        None,
    ),
    ("lit_ours_vs_async", "Lightning: our stall / AsyncCheckpointIO's", "lit_ours_stall", "", "lit_async_stall", None),
    (
        "lit_paced",
        "Lightning: our paced throughput / no checkpoints'",
        "lit_ours_paced",
        ">=",
        "lit_none_paced",
        0.95,
    ),
    ("lit_torch_paced", "Lightning: TorchCheckpointIO paced / none's", "lit_torch_paced", "", "lit_none_paced", None),
    ("lit_async_paced", "Lightning: AsyncCheckpointIO paced / none's", "lit_async_paced", "", "lit_none_paced", None),
    (
        "lit_throughput",
        "Lightning: our throughput / no checkpoints (runs apart)",
        "lit_ours_throughput",
        "",
        "lit_none_throughput",
        None,
    ),
    (
        "lit_torch_throughput",
        "Lightning: TorchCheckpointIO throughput / none",
        "lit_torch_throughput",
        "",
        "lit_none_throughput",
        None,
    ),
    (
        "lit_async_throughput",
        "Lightning: AsyncCheckpointIO throughput / none",
        "lit_async_throughput",
        "",
        "lit_none_throughput",
        None,
    ),
    ("hf_stall", "Trainer: our stall / Trainer save's", "hf_ours_stall", "<=", "hf_trainer_stall", 0.2),
    ("hf_paced", "Trainer: our paced throughput / no checkpoints'", "hf_ours_paced", ">=", "hf_none_paced", 0.95),
    ("hf_trainer_paced", "Trainer: Trainer save paced / none's", "hf_trainer_paced", "", "hf_none_paced", None),
    (
        "hf_throughput",
        "Trainer: our throughput / no checkpoints (runs apart)",
        "hf_ours_throughput",
        "",
        "hf_none_throughput",
        None,
    ),
    (
        "hf_trainer_throughput",
        "Trainer: Trainer save throughput / none",
        "hf_trainer_throughput",
        "",
        "hf_none_throughput",
        None,
    ),
]


def checks(figures: dict[str, float], mode: Mode) -> dict[str, dict[str, Any]]:
    """Every ratio whose figures exist, and the torn-checkpoint counts, with their verdicts."""
    result = judge(figures, RATIOS)
    for key, check in result.items():
        if "paced" in key and check["target"] and mode.interval_s != 30.0:
            check["target"] += f" (at {mode.interval_s:g} s, not 30 s)"
    for section, variants in (("lit", LIT_VARIANTS), ("hf", HF_VARIANTS)):
        for v in variants:
            key = f"{section}_{v}_torn"
            if key not in figures:
                continue
            ours = v == "ours"
            verdict = ("PASS" if figures[key] == 0 else "FAIL") if ours else "info"
            where = "Lightning" if section == "lit" else "Trainer"
            total = int(figures[f"{section}_{v}_checkpoints"])
            label = f"{where}: {FIGURES[key][2]} (of {total} verified)"
            result[key] = {"label": label, "value": figures[key], "target": "== 0" if ours else "", "result": verdict}
    return result


def quiet() -> None:
    """Lightning's and Trainer's per-run banners and advice would bury the tables."""
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*max_steps.*")
    warnings.filterwarnings("ignore", message=".*`srun` command is available.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", category=UserWarning, module="pytorch_lightning")


def main(argv: list[str] | None = None) -> None:
    parser, _ = options(
        __doc__,
        quick="64 MiB, interval scaled to 2 s: about a minute",
        full="512 MiB, bigger GPT-2, more rounds: about 20 minutes",
    )
    parser.add_argument("--skip-lightning", action="store_true", help="leave out the Lightning section")
    parser.add_argument("--skip-hf", action="store_true", help="leave out the Hugging Face Trainer section")
    parser.add_argument("--dir", type=Path, help="where checkpoints go (default: a temporary one in ./bench-results)")
    parser.add_argument("--json", type=Path, help="write every figure with its unit, the checks and the configuration")
    args = parser.parse_args(argv)
    name = size_of(args)
    mode = MODES[name]

    clock = Clock(console)
    quiet()
    threads = max(1, len(os.sched_getaffinity(0)) - 1)
    torch.set_num_threads(threads)
    figures: dict[str, float] = {}
    config: dict[str, Any] = {"mode": name, "torch_threads": threads, "torch": torch.__version__, "pl": pl.__version__}
    failed: dict[str, str] = {}
    with scratch("frameworks-bench-", args.dir) as root:
        if not args.skip_lightning:
            try:
                lit = Lightning(mode.lit_bytes, root)
                config["lightning"] = {"width": lit.width, "depth": DEPTH, "batch": BATCH, "state_bytes": lit.nbytes}
                figures |= measure("lit", lit, LIT_VARIANTS, mode, clock.phase)
                del lit
            except Exception as exc:  # the other section's figures are still worth printing
                console.print_exception()
                failed["lightning"] = repr(exc)
        if not args.skip_hf:
            try:
                hf = HF(mode.hf_width, mode.hf_layers, root)
                config["hf"] = {"n_embd": mode.hf_width, "n_layer": mode.hf_layers, "batch": HF_BATCH, "seq": HF_SEQ}
                config["hf"]["state_bytes"] = hf.nbytes
                figures |= measure("hf", hf, HF_VARIANTS, mode, clock.phase)
            except Exception as exc:
                console.print_exception()
                failed["hf"] = repr(exc)
    base = root.parent
    verdicts = checks(figures, mode)
    print_figures(console, figures, FIGURES)
    print_checks(console, verdicts)
    wall = clock.elapsed()
    if mode.interval_s != 30.0:
        console.print(f"[yellow]--{name}: throughput runs checkpoint every {mode.interval_s:g} s, not every 30 s")
    console.print(f"wall time {wall:.1f} s, torch threads {threads}, mode {name}, target {base}")
    for section, error in failed.items():
        console.print(f"[red]section {section} failed: {error}")
    if args.json:
        config |= {"mode_settings": dataclasses.asdict(mode), "wall_s": wall, "target_dir": str(base), "failed": failed}
        write_json(args.json, {"figures": with_units(figures, FIGURES), "checks": verdicts, "config": config})
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
