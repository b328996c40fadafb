"""One rank of a Hugging Face ``Trainer`` under DDP (two CPU ranks over gloo, started by ``torchrun``),
trained from resilient-flows' resumable loader; for tests/test_transformers_ddp.py.

usage: torchrun --standalone --nproc-per-node 2 hf_ddp_worker.py DIR NAME [HOLD_AT]

``hf_ids``'s Trainer (tiny GPT-2, two loader workers per rank, a token replaced at random as each
sample loads, labels masked at random in the collator), 2 samples per rank and step: the global
batch is ``hf_ids``'s 4. Its tiers are ``DIR/out/checkpoints``; a run there resumes from them.
Each rank appends ``{"step", "ids"}`` per step to ``DIR/NAME-RANK.jsonl`` and writes, once the
loader is restored (at ``on_train_begin``), its state to ``DIR/NAME-RANK.start.json``; at the end,
the weights' digest to ``DIR/NAME-RANK.json``. With ``HOLD_AT``, each rank stops at the end of that
global step, waits until the checkpoints saved so far are committed, writes ``DIR/NAME-RANK.held.json``
(its pid, the newest committed step) and sleeps: the test then SIGKILLs every process, as a node
failure would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import hf_ids
import torch
import transformers

from resilient_flows.integrations.transformers import resilient_trainer
from resilient_flows.training import state_digest

STEPS, SAVE_STEPS, PER_RANK = 10, 3, 2


class Recorder(transformers.TrainerCallback):
    """Writes the loader's restored position, and holds the rank at ``hold_at`` for the kill."""

    def __init__(self, prefix: Path, hold_at: int | None) -> None:
        self.prefix, self.hold_at = prefix, hold_at
        self.resilient: Any = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        position = {"global_step": state.global_step, **train_dataloader.state_dict()}
        Path(f"{self.prefix}.start.json").write_text(json.dumps(position))

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.hold_at:
            return
        checkpointer = self.resilient.checkpointer
        checkpointer.wait()  # every rank: the checkpoints saved so far are committed
        held = {"pid": os.getpid(), "committed": checkpointer.latest_step()}
        Path(f"{self.prefix}.held.json").write_text(json.dumps(held))
        while True:
            time.sleep(60)


def main() -> None:
    torch.set_num_threads(1)
    directory, name = Path(sys.argv[1]), sys.argv[2]
    hold_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    rank = int(os.environ["RANK"])
    prefix = directory / f"{name}-{rank}"
    recorder = Recorder(prefix, hold_at)
    trainer = hf_ids.make_trainer(
        directory / "out", STEPS, SAVE_STEPS, batch=PER_RANK, record=f"{prefix}.jsonl", callbacks=[recorder]
    )
    recorder.resilient = resilient = resilient_trainer(trainer)
    trainer.train(resume_from_checkpoint=resilient.last_checkpoint())
    result = {"digest": state_digest(trainer.model), "world_size": trainer.args.world_size}
    Path(f"{prefix}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
