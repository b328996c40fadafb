"""The learned recommender: numpy evaluation equals scikit-learn's, JSON only, and the shipped model is good."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import asdict, replace

import numpy as np
import pytest

from resilient_flows.cli import main
from resilient_flows.mlc import MLCParams, optimal_interval, simulate_failures
from resilient_flows.mlc._dataset import label, read_rows, sample_params, write_rows
from resilient_flows.mlc._params import InvalidParameterError
from resilient_flows.mlc._recommender import KINDS, Recommender, features, train_model

EXAMPLE = MLCParams(
    l1_cost=10, l2_latency=300, l1_restart=10, l2_restart=300, l1_mtbf=6 * 3600, l2_mtbf=48 * 3600, solve_time=360000
)


@pytest.mark.parametrize("kind", KINDS)
def test_the_exported_model_predicts_what_scikit_learn_predicts(kind: str) -> None:
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.neural_network import MLPRegressor

    x = features(sample_params(120, seed=9))
    y = np.column_stack([np.sin(x[:, 0]) + x[:, 4] / 3, np.cos(x[:, 1])])  # any smooth targets will do
    exported = train_model(kind, x, y, seed=2)
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-12
    reference = (
        RandomForestRegressor(n_estimators=60, min_samples_leaf=2, max_depth=14, random_state=2)
        if kind == "forest"
        else MLPRegressor(hidden_layer_sizes=(64, 64), alpha=1e-3, max_iter=3000, random_state=2)
    ).fit((x - mean) / scale, y)
    np.testing.assert_allclose(exported.predict(x), reference.predict((x - mean) / scale), rtol=1e-9, atol=1e-9)
    reloaded = Recommender.from_json(exported.to_json())  # JSON round trip: the same predictions
    np.testing.assert_array_equal(reloaded.predict(x), exported.predict(x))


def test_a_model_file_is_json_in_our_format_and_nothing_else(tmp_path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(pickle.dumps({"format": "resilient-flows-mlc-model/1"}))
    with pytest.raises(InvalidParameterError, match="is not JSON"):
        Recommender.load(path)
    path.write_text(json.dumps({"format": "other", "kind": "mlp", "model": {}}))
    with pytest.raises(InvalidParameterError, match=r"is not a resilient-flows-mlc-model/2 document$"):
        Recommender.load(path)
    path.write_text(json.dumps({"format": "resilient-flows-mlc-model/1", "kind": "forest", "model": {}}))
    with pytest.raises(InvalidParameterError, match="but resilient-flows-mlc-model/1: retrain it"):
        Recommender.load(path)  # trained without l2_slowdown: its inputs would be misread
    path.write_text(json.dumps({"format": "resilient-flows-mlc-model/2", "kind": "mlp", "model": {}}))
    with pytest.raises(InvalidParameterError, match="the mlp model is malformed"):
        Recommender.load(path)


def test_the_shipped_model_is_as_good_as_the_search_on_the_example() -> None:
    recommended = Recommender.default().recommend(EXAMPLE)
    assert recommended.l2_every == 1
    ours = simulate_failures(EXAMPLE, recommended, trials=4000, seed=3).efficiency
    daly = simulate_failures(
        EXAMPLE, type(recommended)(optimal_interval(10, 10, 6 * 3600 * 48 / 49), 1), trials=4000, seed=3
    )
    assert ours >= daly.efficiency - 0.001  # within 0.1 percentage point of the best formula, or better


def test_the_shipped_model_spaces_out_flushes_that_slow_compute() -> None:
    """The README's 1,024-node job (64 GiB per node, 250 GB/s, flushes slowing compute by 20 %):
    the search flushes every sixth checkpoint, 5.5 points above Daly's flush-every-time."""
    flush = 64 * 2**30 / (250e9 / 1024)  # 64 GiB at a 1,024th of 250 GB/s
    job = MLCParams(
        l1_cost=10, l1_restart=10, l1_mtbf=6 * 3600, l2_mtbf=48 * 3600, solve_time=360000, l2_slowdown=0.2,
        l2_latency=flush, l2_restart=flush,
    )  # fmt: skip
    recommended = Recommender.default().recommend(job)
    assert recommended.l2_every > 1
    ours = simulate_failures(job, recommended, trials=2000, seed=3).efficiency
    daly = simulate_failures(
        job, type(recommended)(optimal_interval(10, 10, 6 * 3600 * 48 / 49), 1), trials=2000, seed=3
    )
    assert ours >= daly.efficiency + 0.04
    calm = Recommender.default().recommend(replace(job, l2_slowdown=0.0))
    assert calm.l2_every < recommended.l2_every  # it reads the slowdown: a harmless flush may come more often


def test_one_level_jobs_get_the_exact_daly_optimum() -> None:
    one = MLCParams(l1_cost=30, l1_restart=60, l1_mtbf=3600, solve_time=36000)
    config = Recommender.default().recommend(one)
    assert config.l2_every is None and config.interval == pytest.approx(optimal_interval(30, 60, 3600))


def test_training_rows_round_trip_and_train_writes_a_loadable_model(tmp_path) -> None:
    rows = [label(p, trials=20) for p in sample_params(10, seed=8)]
    data = tmp_path / "rows.jsonl"
    assert write_rows(rows, data) == 10
    pairs = list(read_rows(data))
    assert [asdict(p) for p, _ in pairs] == [r["params"] for r in rows]
    model = tmp_path / "model.json"
    assert main(["mlc", "train", str(data), "--out", str(model)]) == 0
    config = Recommender.load(model).recommend(EXAMPLE)
    assert config.l2_every >= 1 and 0 < config.interval <= EXAMPLE.solve_time and math.isfinite(config.interval)
    data.write_text(data.read_text() + "{not json\n")
    with pytest.raises(InvalidParameterError, match=r"rows.jsonl:11: not a training row"):
        list(read_rows(data))


def asdict_params(p: MLCParams) -> dict:
    return {
        k: getattr(p, k)
        for k in ("l1_cost", "l1_restart", "l1_mtbf", "solve_time", "l2_latency", "l2_restart", "l2_mtbf")
    }


def test_tune_prints_every_method(capsys) -> None:
    assert (
        main(
            ["tune", "--l1-cost", "10s", "--l2-latency", "5m", "--l1-mtbf", "6h", "--l2-mtbf", "2d", "--trials", "300"]
        )
        == 0
    )
    out = capsys.readouterr().out
    for method in ("Young", "Daly", "two-level (Benoit)", "learned"):
        assert method in out


@pytest.mark.slow
def test_generate_labels_in_parallel_through_parsl_on_the_local_site(tmp_path) -> None:
    out = tmp_path / "rows.jsonl"
    # seed 3 draws sets whose searches take a second in all (seed 5's take five): the test is of the labelling
    args = ["--samples", "4", "--chunk", "2", "--trials", "20", "--seed", "3", "--out", str(out)]
    assert main(["mlc", "generate", *args]) == 0
    pairs = list(read_rows(out))  # chunks finish in any order: compare as sets
    expected = [label(p, trials=20, seed=3) for p in sample_params(4, seed=3)]
    assert sorted(json.dumps(asdict(c)) for _, c in pairs) == sorted(json.dumps(r["config"]) for r in expected)
