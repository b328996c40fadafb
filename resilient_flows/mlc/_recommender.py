"""A learned checkpoint configuration: the simulator's optimum, predicted in microseconds.

The optimum does not depend on the unit of time, so the model sees only ratios (each cost against
the L1 MTBF or against the cost it follows from) and the fraction of compute speed a flush takes
(``l2_slowdown``, already scale-free), and predicts two numbers: the L1 interval as a
multiple of Young's, and the number of L1 checkpoints per L2 flush, both as logarithms. Trained
with scikit-learn (a random forest and a small MLP; :func:`fit` keeps the one with the smaller
validation error), a model is saved as JSON: the forest's split arrays or the MLP's weights,
evaluated here with numpy. Loading never unpickles anything, so a model file from elsewhere can at
worst recommend badly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from resilient_flows.mlc._analytic import optimal_interval, young_interval
from resilient_flows.mlc._params import InvalidParameterError, MLCConfig, MLCParams

FORMAT = "resilient-flows-mlc-model/2"
FEATURES = (
    "log l1_cost / l1_mtbf",
    "log l2_latency / l1_cost",
    "log l1_restart / l1_cost",
    "log l2_restart / l2_latency",
    "log l2_mtbf / l1_mtbf",
    "log solve_time / l1_mtbf",
    "l2_slowdown",
)
KINDS = ("forest", "mlp")
#: The largest number of L1 checkpoints per flush the model recommends.
MAX_L2_EVERY = 10_000


def features(params: Sequence[MLCParams]) -> np.ndarray:
    """One row per parameter set: the scale-free ratios the optimum depends on."""
    rows = []
    for p in params:
        latency = p.shared_latency
        if math.isinf(p.l2_mtbf) or p.l1_cost <= 0 or latency <= 0 or math.isinf(p.l1_mtbf) or p.three_level:
            raise InvalidParameterError(
                f"the learned model covers two levels with finite MTBFs and a non-zero l1_cost and flush time; got {p}"
            )
        rows.append(
            [
                math.log(p.l1_cost / p.l1_mtbf),
                math.log(latency / p.l1_cost),
                math.log(max(p.l1_restart, 1e-3) / p.l1_cost),
                math.log(max(p.l2_restart, 1e-3) / latency),
                math.log(p.l2_mtbf / p.l1_mtbf),
                math.log(p.solve_time / p.l1_mtbf),
                p.l2_slowdown,
            ]
        )
    return np.array(rows, dtype=float)


def targets(params: Sequence[MLCParams], configs: Sequence[MLCConfig]) -> np.ndarray:
    """What the model learns: log(interval / Young's) and log(l2_every)."""
    return np.array(
        [
            [math.log(c.interval / young_interval(p.l1_cost, p.l1_mtbf)), math.log(c.l2_every or MAX_L2_EVERY)]
            for p, c in zip(params, configs, strict=True)
        ]
    )


@dataclass(frozen=True)
class Recommender:
    """A fitted model as plain arrays; :meth:`recommend` is a few numpy operations."""

    kind: str
    model: dict[str, Any]
    meta: dict[str, Any]
    compiled: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            compiled = _compile_mlp(self.model) if self.kind == "mlp" else _compile_forest(self.model)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidParameterError(f"the {self.kind} model is malformed: {exc!r}") from None
        object.__setattr__(self, "compiled", compiled)

    @classmethod
    def default(cls) -> Recommender:
        """The model that ships with the package."""
        return cls.from_json(resources.files("resilient_flows.mlc").joinpath("model.json").read_text())

    @classmethod
    def load(cls, path: str | Path) -> Recommender:
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParameterError(f"{path} is not JSON: it is not UTF-8 text") from None
        return cls.from_json(text, where=str(path))

    @classmethod
    def from_json(cls, text: str, where: str = "the model") -> Recommender:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidParameterError(f"{where} is not JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            found = str(document.get("format")) if isinstance(document, dict) else ""
            older = found.startswith(FORMAT.rsplit("/", 1)[0])
            hint = f" but {found}: retrain it with 'resilient-flows mlc train'" if older else ""
            raise InvalidParameterError(f"{where} is not a {FORMAT} document{hint}")
        if document.get("kind") not in ("forest", "mlp"):
            raise InvalidParameterError(f"{where}: kind must be 'forest' or 'mlp', got {document.get('kind')!r}")
        return cls(document["kind"], document["model"], document.get("meta", {}))

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "kind": self.kind, "model": self.model, "meta": self.meta})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Raw predictions (log interval / Young, log l2_every) for feature rows ``x``."""
        x = np.atleast_2d(np.asarray(x, dtype=float))
        return (_mlp if self.kind == "mlp" else _forest)(self.compiled, x)

    def recommend(self, params: MLCParams) -> MLCConfig:
        """The configuration for ``params``; one level (no L2 failures) gets the exact Daly optimum."""
        if math.isinf(params.l2_mtbf):
            return MLCConfig(optimal_interval(params.l1_cost, params.l1_restart, params.l1_mtbf), None)
        log_ratio, log_every = self.predict(features([params]))[0]
        interval = young_interval(params.l1_cost, params.l1_mtbf) * math.exp(log_ratio)
        every = int(min(MAX_L2_EVERY, max(1, round(math.exp(log_every)))))
        return MLCConfig(interval=min(interval, params.solve_time), l2_every=every)


def fit(
    params: Sequence[MLCParams], configs: Sequence[MLCConfig], seed: int = 0, validation: float = 0.2
) -> tuple[Recommender, dict[str, float]]:
    """Fit a random forest and an MLP to the optima ``configs`` of ``params``; keep the better one.

    Returns the chosen model and each candidate's validation error (mean squared, in the log
    targets), measured on a held-out ``validation`` fraction before refitting on everything.
    """
    x, y = features(params), targets(params, configs)
    order = np.random.default_rng(seed).permutation(len(x))
    held = order[: max(1, int(len(x) * validation))]
    train = order[len(held) :]
    errors = {}
    for kind in KINDS:
        candidate = train_model(kind, x[train], y[train], seed)
        errors[kind] = float(np.mean((candidate.predict(x[held]) - y[held]) ** 2))
    kind = min(errors, key=lambda k: errors[k])
    chosen = train_model(kind, x, y, seed)
    meta = {"samples": len(x), "validation_mse": errors, "features": list(FEATURES)}
    return Recommender(chosen.kind, chosen.model, meta), errors


def train_model(kind: str, x: np.ndarray, y: np.ndarray, seed: int = 0) -> Recommender:
    """One scikit-learn model of ``kind`` (``forest`` or ``mlp``) on standardised ``x``, exported."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.neural_network import MLPRegressor

    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-12
    if kind == "forest":
        model = RandomForestRegressor(n_estimators=60, min_samples_leaf=2, max_depth=14, random_state=seed)
    elif kind == "mlp":
        model = MLPRegressor(hidden_layer_sizes=(64, 64), alpha=1e-3, max_iter=3000, random_state=seed)
    else:
        raise InvalidParameterError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    model.fit((x - mean) / scale, y)
    exported = _export_forest(model) if kind == "forest" else _export_mlp(model)
    exported.update(mean=mean.tolist(), scale=scale.tolist())
    return Recommender(kind, exported, {})


def _export_mlp(model: Any) -> dict[str, Any]:
    return {
        "weights": [w.tolist() for w in model.coefs_],
        "biases": [b.tolist() for b in model.intercepts_],
        "activation": model.activation,
    }


def _export_forest(model: Any) -> dict[str, Any]:
    trees = []
    for estimator in model.estimators_:
        t = estimator.tree_
        trees.append(
            {
                "left": t.children_left.tolist(),
                "right": t.children_right.tolist(),
                "feature": t.feature.tolist(),
                "threshold": t.threshold.tolist(),
                "value": t.value[:, :, 0].tolist(),
            }
        )
    return {"trees": trees}


def _compile_mlp(model: dict[str, Any]) -> dict[str, Any]:
    if model.get("activation") != "relu":
        raise ValueError(f"the activation must be relu, got {model.get('activation')!r}")
    layers = [
        (np.array(w, dtype=float), np.array(b, dtype=float))
        for w, b in zip(model["weights"], model["biases"], strict=True)
    ]
    return {"mean": np.array(model["mean"]), "scale": np.array(model["scale"]), "layers": layers}


def _compile_forest(model: dict[str, Any]) -> dict[str, Any]:
    """Every tree in one set of arrays (children as absolute indices), so that all are walked at once."""
    left, right, feature, threshold, value, roots = [], [], [], [], [], []
    offset = 0
    for tree in model["trees"]:
        lo, hi = np.array(tree["left"]), np.array(tree["right"])
        roots.append(offset)
        left.append(np.where(lo >= 0, lo + offset, -1))
        right.append(np.where(hi >= 0, hi + offset, -1))
        feature.append(np.maximum(np.array(tree["feature"]), 0))
        threshold.append(np.array(tree["threshold"], dtype=float))
        value.append(np.array(tree["value"], dtype=float))
        offset += len(lo)
    return {
        "mean": np.array(model["mean"]),
        "scale": np.array(model["scale"]),
        "left": np.concatenate(left),
        "right": np.concatenate(right),
        "feature": np.concatenate(feature),
        "threshold": np.concatenate(threshold),
        "value": np.concatenate(value),
        "roots": np.array(roots),
    }


def _mlp(model: dict[str, Any], x: np.ndarray) -> np.ndarray:
    h = (x - model["mean"]) / model["scale"]
    for i, (w, b) in enumerate(model["layers"]):
        h = h @ w + b
        if i < len(model["layers"]) - 1:
            h = np.maximum(h, 0.0)
    return h


def _forest(model: dict[str, Any], x: np.ndarray) -> np.ndarray:
    z = (x - model["mean"]) / model["scale"]
    left, right = model["left"], model["right"]
    node = np.broadcast_to(model["roots"], (len(z), len(model["roots"]))).copy()
    rows = np.arange(len(z))[:, None]
    while (inner := left[node] >= 0).any():
        go_left = z[rows, model["feature"][node]] <= model["threshold"][node]
        node = np.where(inner, np.where(go_left, left[node], right[node]), node)
    return model["value"][node].mean(axis=1)
