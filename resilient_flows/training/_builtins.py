"""The built-in workloads' names and the params each declares, importable without torch: the
workflow is checked against them before anything runs, and a clone's overrides too."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _SGDParams(BaseModel):
    """What every built-in trains with: SGD with momentum, mini-batches, dropout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.9, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(64, ge=1)
    dropout: float = Field(0.1, ge=0, lt=1)


class MLPParams(_SGDParams):
    """``mlp-digits`` and ``mlp-breast-cancer``: two hidden layers of ``hidden`` units, SGD."""

    hidden: int = Field(64, ge=1)


class CNNParams(_SGDParams):
    """``cnn-digits``: two convolutions of ``channels`` and twice as many filters, SGD."""

    channels: int = Field(16, ge=1)


#: The built-in workloads by name, each with the params it declares (see
#: :mod:`resilient_flows.training._params`); :mod:`resilient_flows.training._workloads` trains them.
BUILTIN_PARAMS: dict[str, type[BaseModel]] = {
    "mlp-digits": MLPParams,
    "mlp-breast-cancer": MLPParams,
    "cnn-digits": CNNParams,
}
BUILTIN_WORKLOADS = tuple(BUILTIN_PARAMS)
#: Params that decide the shape of a model: a clone cannot change them.
STRUCTURAL = frozenset({"hidden", "channels"})


def preloaded_modules(workload: str) -> tuple[str, ...]:
    """The modules a warm pool imports ahead for members of ``workload``: a ``module:function``'s
    module. A built-in needs none beyond the pool's own: its data ships as arrays."""
    if workload in BUILTIN_PARAMS:
        return ()
    module, colon, _ = workload.partition(":")
    return (module,) if colon else ()
