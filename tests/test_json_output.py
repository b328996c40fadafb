"""``--json`` of the interval tuning commands: one versioned document on stdout, the table's figures
without its markup. (``status``, ``lineage`` and ``checkpoints list`` have theirs tested beside
their damage and listing: tests/test_damaged_rundir.py, tests/test_checkpoint_views.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from resilient_flows.cli import main
from resilient_flows.mlc._dataset import label, sample_params, write_rows

JOB = ["--l1-cost", "10s", "--l1-mtbf", "6h", "--l2-mtbf", "2d", "--trials", "50"]


def test_tune_json_has_every_method_the_table_has(capsys: pytest.CaptureFixture) -> None:
    assert main(["tune", *JOB, "--l2-latency", "5m"]) == 0
    table = capsys.readouterr().out
    assert main(["tune", *JOB, "--l2-latency", "5m", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["version"], document["three_level"], document["trials"]) == (1, False, 50)
    assert document["search_seconds"] is None
    methods = [c["method"] for c in document["candidates"]]
    assert methods == ["Young", "Daly", "async (interference)", "two-level (Benoit)", "learned"]
    for candidate in document["candidates"]:
        assert f"{candidate['efficiency']:.4f}" in table and f"{candidate['interval_s']:.0f} s" in table
        low, high = candidate["efficiency_ci"]
        assert low <= candidate["efficiency"] <= high
        assert candidate["traffic_bytes_per_hour_per_node"] is None  # the flush was given as a latency
        assert candidate["shared_flushes_per_hour"] > 0 and candidate["l3_every"] is None


def test_tune_json_with_bytes_and_a_search(capsys: pytest.CaptureFixture) -> None:
    job = [*JOB, "--checkpoint-bytes", "64GiB", "--nodes", "16", "--pfs-bandwidth", "250GB/s", "--search"]
    assert main(["tune", *job, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    search = document["candidates"][-1]
    assert search["method"] == "search" and document["search_seconds"] > 0
    assert all(math.isfinite(c["traffic_bytes_per_hour_per_node"]) for c in document["candidates"])


def test_mlc_train_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data, model = tmp_path / "rows.jsonl", tmp_path / "model.json"
    write_rows([label(p, trials=20) for p in sample_params(10, seed=8)], data)
    assert main(["mlc", "train", str(data), "--out", str(model), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["version"], document["rows"], document["model"]) == (1, 10, str(model))
    assert document["kept"] in document["validation_error"] and model.is_file()
