"""What every forked test rank imports (see :mod:`rank_launch`), imported once in the fork server,
with ``torch._dynamo``, which an optimizer's first step imports.

One thread, as the tests' launched ranks had (``OMP_NUM_THREADS=1``): reductions then add up in
the same order in every rank, and the server has no thread whose locks a fork would copy.
"""

import safetensors.torch  # noqa: F401
import sharded_worker  # noqa: F401
import torch
import torch.distributed.checkpoint
import torch.distributed.fsdp

import resilient_flows.checkpoint  # noqa: F401

torch.set_num_threads(1)
_weight = torch.zeros(1, requires_grad=True)
_weight.grad = torch.zeros(1)
torch.optim.SGD([_weight], lr=0.1).step()  # an optimizer's first step imports torch._dynamo
