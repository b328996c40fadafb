"""Site YAML -> parsl.Config, and a real app on the local site."""

from __future__ import annotations

import os
from pathlib import Path

import parsl
import pytest
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import load_site, site_names
from resilient_flows.units import parse_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


def test_local_site_is_one_worker_per_core_on_this_machine() -> None:
    config = load_site("local")
    (executor,) = config.executors
    assert isinstance(executor, HighThroughputExecutor) and isinstance(executor.provider, LocalProvider)
    assert executor.max_workers_per_node == os.cpu_count()
    assert config.retries == 2
    assert "local" in site_names()


def test_overrides_replace_config_arguments(tmp_path: Path) -> None:
    config = load_site("local", run_dir=str(tmp_path / "runinfo"), retries=5)
    assert config.run_dir == str(tmp_path / "runinfo") and config.retries == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "executors:\n  - type: HighThroughputExecutor\n    max_worker_per_node: 2\n",
            r"site.yaml: executors\[0\] \(HighThroughputExecutor\): unknown key 'max_worker_per_node' "
            r"\(did you mean 'max_workers_per_node'\?\); allowed: .*label",
        ),
        (
            "executors:\n  - type: HighThroughputExecutor\n    provider:\n      type: LocalProvidr\n",
            r"executors\[0\]\.provider: unknown type 'LocalProvidr'; did you mean LocalProvider",
        ),
        ("executors: []\n", "'executors' must be a non-empty list"),
        ("executors:\n  - label: x\n", "expected a mapping with a 'type' key"),
        ("executors: [\n", "not valid YAML"),
        ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
        (
            "executors:\n  - type: ThreadPoolExecutor\nretry: 3\n",
            r"unknown key 'retry' \(did you mean 'retries'\?\)",
        ),
    ],
)
def test_bad_site_files_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SiteConfigError, match=message):
        load_site(write(tmp_path, text))


def test_unknown_site_lists_the_known_ones() -> None:
    with pytest.raises(SiteConfigError, match=r"unknown site 'thetta'; known sites: .*local"):
        load_site("thetta")


@pytest.mark.slow
def test_an_app_runs_on_the_local_site(tmp_path: Path) -> None:
    size = parsl.python_app(parse_size)  # a function the worker processes can import
    with parsl.load(load_site("local", run_dir=str(tmp_path / "runinfo"))):
        futures = [size(text) for text in ("1KiB", "2MiB", "3GiB")]
        assert [f.result(timeout=120) for f in futures] == [1 << 10, 2 << 20, 3 << 30]
        assert {f.task_record["executor"] for f in futures} == {"local"}
