"""Site YAML -> parsl.Config, and a real app on the local site."""

from __future__ import annotations

import os
from pathlib import Path

import parsl
import pytest
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider, SlurmProvider

from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import SiteFacts, SiteFile, load_site, site_facts, site_names
from resilient_flows.sites._blockerrors import PatientBlockErrorHandler
from resilient_flows.units import parse_size

REPO = Path(__file__).resolve().parents[1]


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


# --- site files for real machines, user values from the environment, facts ---------------------

PROVIDERS = {
    "local": "LocalProvider",
    "theta": "CobaltProvider",
    "polaris": "PBSProProvider",
    "aurora": "PBSProProvider",
    "slurm": "SlurmProvider",
}


@pytest.fixture
def user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user exports before using the ALCF and Slurm site files; optional ones unset."""
    monkeypatch.setenv("PROJECT", "MyAlloc")
    monkeypatch.setenv("VIRTUAL_ENV", "/home/me/venv")
    monkeypatch.setenv("SHARED_FS", "/shared/me")
    # What `. DIR/env` of `.ci/slurm-up --nodes N DIR` exports, for local-slurm-nodes.
    monkeypatch.setenv("RESILIENT_FLOWS_TEST_BRIDGE_ADDR", "10.247.0.1")
    monkeypatch.setenv("RESILIENT_FLOWS_TEST_IFNAME", "rf0")
    monkeypatch.setenv("RESILIENT_FLOWS_TEST_NODES_DIR", "/tmp/cluster/nodes")
    for name in ("PBS_QUEUE", "COBALT_QUEUE", "SLURM_PARTITION", "SLURM_ACCOUNT", "LOCAL_SCRATCH"):
        monkeypatch.delenv(name, raising=False)


def test_the_machine_site_files_are_there() -> None:
    assert set(PROVIDERS) <= set(site_names())


@pytest.mark.parametrize("name", site_names())
def test_every_site_file_loads_with_its_facts(user_env: None, name: str) -> None:
    config = load_site(name)
    (executor,) = config.executors
    assert isinstance(executor, HighThroughputExecutor)
    assert type(executor.provider).__name__ == PROVIDERS.get(name, type(executor.provider).__name__)
    facts = site_facts(name)
    assert facts.name == name and facts.nodes == executor.provider.nodes_per_block
    if name in PROVIDERS and name != "local":
        assert "/home/me/venv/bin/activate" in executor.provider.worker_init
        assert facts.walltime_s == 3600 and facts.node_mtbf_s == 1825 * 86400


def test_the_multinode_site_reaches_its_nodes_over_their_network(user_env: None) -> None:
    """The interchange runs on the host, the worker pools inside the nodes: they connect to the
    bridge's address; members find the nodes' interface and their node's scratch in the facts."""
    executor = load_site("local-slurm-nodes").executors[0]
    assert executor.address == "10.247.0.1" and executor.provider.nodes_per_block == 2
    assert type(executor.provider.launcher).__name__ == "SimpleLauncher"
    facts = site_facts("local-slurm-nodes")
    assert facts.network_interface == "rf0"
    assert facts.local_scratch == "/tmp/cluster/nodes/${SLURMD_NODENAME}/local"


def test_alcf_sites_take_the_allocation_from_the_environment(user_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    polaris = load_site("polaris").executors[0]
    assert polaris.provider.account == "MyAlloc" and polaris.provider.queue == "debug"
    assert polaris.provider.select_options == "ngpus=4"
    assert polaris.provider.scheduler_options == "#PBS -l filesystems=home:eagle"
    assert polaris.provider.launcher.bind_cmd == "--cpu-bind"
    assert polaris.provider.launcher.overrides == "--depth=64 --ppn 1"
    assert polaris.available_accelerators == ["0", "1", "2", "3"] and polaris.cpu_affinity == "block-reverse"
    aurora = load_site("aurora").executors[0]
    assert aurora.available_accelerators == [f"{gpu}.{tile}" for gpu in range(6) for tile in range(2)]
    assert aurora.cpu_affinity.startswith("list:0-7,104-111:") and aurora.cpu_affinity.count(":") == 12
    monkeypatch.setenv("PBS_QUEUE", "prod")
    assert load_site("polaris").executors[0].provider.queue == "prod"
    assert load_site("theta").executors[0].provider.account == "MyAlloc"


SLURM_POLLED = "executors:\n  - type: HighThroughputExecutor\n    provider: {type: SlurmProvider, %s}\n"


def test_a_site_file_sets_how_often_parsl_polls_its_provider(tmp_path: Path, user_env: None) -> None:
    """Parsl asks Slurm about its blocks every 60 s: a lost pilot job waits that long for its
    replacement. A site sets its own interval; the provider is otherwise Parsl's, unchanged."""
    assert (
        load_site(write(tmp_path, SLURM_POLLED % "partition: debug")).executors[0].provider.status_polling_interval
        == 60
    )
    provider = (
        load_site(write(tmp_path, SLURM_POLLED % "partition: debug, status_polling_interval: 2.5"))
        .executors[0]
        .provider
    )
    assert isinstance(provider, SlurmProvider) and type(provider).__name__ == "SlurmProvider"
    assert provider.status_polling_interval == 2.5 and provider.partition == "debug"
    assert SlurmProvider(partition="debug").status_polling_interval == 60  # Parsl's class itself is untouched
    for name in ("local-slurm", "local-slurm-nodes"):  # the local clusters answer at once: seconds, not a minute
        assert load_site(name).executors[0].provider.status_polling_interval == 2, name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            SLURM_POLLED % "status_polling_interval: 0",
            r"status_polling_interval must be a positive number of seconds, got 0",
        ),
        (SLURM_POLLED % "status_polling_interval: 30s", r"must be a positive number of seconds, got '30s'"),
        (
            SLURM_POLLED % "status_poling_interval: 5",
            r"unknown key 'status_poling_interval' \(did you mean 'status_polling_interval'\?\)",
        ),
        (
            "executors:\n  - {type: HighThroughputExecutor, status_polling_interval: 5}\n",
            r"\(HighThroughputExecutor\): unknown key 'status_polling_interval'",
        ),
    ],
)
def test_a_bad_polling_interval_is_named(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SiteConfigError, match=message):
        load_site(write(tmp_path, text))


def test_a_site_tolerates_lost_blocks(user_env: None) -> None:
    """One cancelled pilot must not fail the executor: our patient handler, not Parsl's default;
    each executor has its own, since the handler remembers that executor's failures."""
    handlers = [load_site(name).executors[0].block_error_handler for name in ("local", "polaris", "local-slurm")]
    assert all(isinstance(handler, PatientBlockErrorHandler) for handler in handlers)
    assert len({id(handler) for handler in handlers}) == 3


def test_site_facts_describe_the_machine(user_env: None) -> None:
    assert site_facts("polaris") == SiteFacts(
        name="polaris",
        nodes=1,
        cores_per_node=32,
        gpus_per_node=4,
        local_scratch="/local/scratch",
        memory_scratch="/dev/shm",
        shared_fs="/eagle/MyAlloc",
        node_mtbf_s=1825 * 86400.0,
        walltime_s=3600.0,
        stall_timeout_s=300.0,
        stop_grace_s=8.0,
        peer_memory=64 << 30,
    )
    assert site_facts("theta").shared_fs == "/lus/theta-fs0/projects/MyAlloc"
    assert site_facts("aurora").gpus_per_node == 12 and site_facts("aurora").local_scratch == "/tmp"
    local = site_facts("local")
    assert local.cores_per_node == os.cpu_count() and local.local_scratch is None and local.walltime_s is None
    assert local.memory_scratch is None
    assert local.stall_timeout_s == 30.0


def test_an_unset_variable_names_the_file_the_key_and_the_variable(
    user_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROJECT")
    with pytest.raises(
        SiteConfigError,
        match=r"polaris\.yaml: executors\[0\]\.provider\.account uses \$\{PROJECT\}, which is not set; "
        r"export PROJECT=<your allocation>",
    ):
        load_site("polaris")
    with pytest.raises(SiteConfigError, match=r"theta\.yaml: facts\.shared_fs uses \$\{PROJECT\}, which is not set"):
        site_facts("theta")


def test_environment_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RF_QUEUE", "")
    monkeypatch.setenv("RF_ACCOUNT", "acct")
    monkeypatch.delenv("RF_UNSET", raising=False)
    site = write(
        tmp_path,
        "executors:\n  - type: HighThroughputExecutor\n    label: ${RF_UNSET:-x}-${RF_ACCOUNT}\n"
        "    provider:\n      type: PBSProProvider\n      queue: ${RF_QUEUE:-debug}\n      account: ${RF_QUEUE}\n"
        "      worker_init: cd $${PBS_O_WORKDIR} && echo $HOME $$\n",
    )
    executor = load_site(site).executors[0]
    assert executor.label == "x-acct"
    assert executor.provider.queue == "debug" and executor.provider.account == ""
    assert executor.provider.worker_init == "cd ${PBS_O_WORKDIR} && echo $HOME $$"

    site.write_text("executors:\n  - type: HighThroughputExecutor\n    label: ${RF_UNSET}\n")
    with pytest.raises(SiteConfigError, match=r"executors\[0\]\.label uses \$\{RF_UNSET\}.*export RF_UNSET=<value>"):
        load_site(site)
    site.write_text("executors:\n  - type: HighThroughputExecutor\n    label: ${RF_QUEUE:?a queue}\n")
    with pytest.raises(SiteConfigError, match=r"export RF_QUEUE=<a queue>"):
        load_site(site)
    site.write_text("executors:\n  - type: HighThroughputExecutor\n    label: ${1bad}\n")
    with pytest.raises(SiteConfigError, match=r"executors\[0\]\.label has a '\$\{' that is not"):
        load_site(site)


LOCAL = "executors:\n  - type: ThreadPoolExecutor\n"


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        (
            "  nodes: 1\n  cores_per_node: 8\n  node_mtfb: 100d\n",
            r"facts: unknown key 'node_mtfb' \(did you mean 'node_mtbf'\?\)",
        ),
        ("  nodes: '2'\n  cores_per_node: 8\n", r"facts\.nodes must be an integer >= 1, got '2'"),
        ("  nodes: 1\n  cores_per_node: true\n", r"facts\.cores_per_node must be an integer >= 1 or 'auto'"),
        ("  nodes: 1\n", r"facts: missing 'cores_per_node'"),
        ("  nodes: 1\n  cores_per_node: 8\n  node_mtbf: 5y\n", r"facts\.node_mtbf must be a duration like 1825d"),
        ("  nodes: 1\n  cores_per_node: 8\n  shared_fs: scratch\n", r"facts\.shared_fs must be an absolute path"),
        ("  nodes: 1\n  cores_per_node: 8\n  walltime: 0s\n", r"facts\.walltime must be positive"),
    ],
)
def test_bad_facts_name_the_file_and_key(tmp_path: Path, facts: str, message: str) -> None:
    site = write(tmp_path, LOCAL + "facts:\n" + facts)
    with pytest.raises(SiteConfigError, match=r"site\.yaml: " + message):
        site_facts(site)
    load_site(site)  # Parsl never sees the facts


def test_facts_are_required_and_take_either_walltime_form(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigError, match=r"site\.yaml: needs a 'facts' mapping with nodes, cores_per_node"):
        site_facts(write(tmp_path, LOCAL))
    facts = site_facts(write(tmp_path, LOCAL + "facts:\n  nodes: 3\n  cores_per_node: 8\n  walltime: '02:30:00'\n"))
    assert facts == SiteFacts("site", 3, 8, walltime_s=9000.0)
    assert (
        site_facts(write(tmp_path, LOCAL + "facts:\n  nodes: 3\n  cores_per_node: 8\n  walltime: 90m\n")).walltime_s
        == 5400
    )


def test_site_files_name_only_known_classes(tmp_path: Path) -> None:
    with pytest.raises(SiteConfigError, match=r"unknown type 'subprocess\.Popen'"):
        load_site(write(tmp_path, "executors:\n  - type: subprocess.Popen\n"))
    # a class a Parsl package imports for itself is not one of its public names
    with pytest.raises(SiteConfigError, match=r"unknown type 'BlockProviderExecutor'"):
        load_site(write(tmp_path, "executors:\n  - type: BlockProviderExecutor\n"))


HTEX_WITH_HANDLER = (
    "executors:\n  - type: HighThroughputExecutor\n    block_error_handler: {type: PatientBlockErrorHandler, %s}\n"
)


def test_a_site_file_sets_how_patient_its_executor_is_with_failing_blocks(tmp_path: Path) -> None:
    (executor,) = load_site(write(tmp_path, HTEX_WITH_HANDLER % "patience_s: 300, threshold: 2")).executors
    handler = executor.block_error_handler
    assert isinstance(handler, PatientBlockErrorHandler) and (handler.patience_s, handler.threshold) == (300, 2)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("patience: 300", r"unknown key 'patience' \(did you mean 'patience_s'\?\)"),
        ("patience_s: -5", "patience_s must be non-negative, got -5"),
        ("clock: 5", "clock must be a function returning seconds, got 5"),
    ],
)
def test_a_bad_block_error_handler_in_a_site_file_is_named(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(SiteConfigError, match=r"executors\[0\]\.block_error_handler.*" + message):
        load_site(write(tmp_path, HTEX_WITH_HANDLER % setting))


def test_a_run_reads_its_site_file_once_and_a_resume_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning, the Parsl configuration and the facts the runner needs all come from one reading."""
    from resilient_flows.cli import main
    from resilient_flows.sites._sitefile import site_path

    site = site_path("local").resolve()
    reads: list[Path] = []
    read_text = Path.read_text

    def counting(path: Path, *args: object, **kwargs: object) -> str:
        if path.resolve() == site:
            reads.append(path)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    workflow = tmp_path / "wf.yaml"
    workflow.write_text("name: once\nmembers:\n  - {name: m, workload: mlp-digits, steps: 2, params: {hidden: 8}}\n")
    run_dir = tmp_path / "run"
    assert main(["run", str(workflow), "--run-dir", str(run_dir)]) == 0
    assert len(reads) == 1
    assert main(["resume", str(run_dir)]) == 0  # nothing left to run; the site is read anew
    assert len(reads) == 2


def test_a_blocks_walltime_comes_from_its_provider_and_the_facts_may_not_promise_more(tmp_path: Path) -> None:
    """The runner drains blocks by facts.walltime: facts that promise more than the provider asks
    for would drain them after the batch system killed them; facts that say nothing take the
    provider's."""
    text = (REPO / "site-configs" / "local-slurm.yaml").read_text()
    site = tmp_path / "short.yaml"
    site.write_text(text.replace('walltime: "00:30:00"', 'walltime: "00:10:00"').replace("  walltime: 30m\n", ""))
    facts = SiteFile.open(site).facts()
    assert facts.walltime_s == 600.0
    short = text.replace('walltime: "00:30:00"', 'walltime: "00:10:00"')
    site.write_text(short.replace("walltime: 30m", "walltime: 1h"))
    with pytest.raises(SiteConfigError, match=r"facts.walltime is 3600 s, but the provider of executor 'local-slurm'"):
        SiteFile.open(site).facts()
