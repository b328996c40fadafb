"""From an install to a first run: where site names lead, ``sites``, ``init``, ``--version``.

Fast: no Parsl run. The wheel itself, installed outside the checkout and run, is
``.ci/wheel-check``'s job.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from resilient_flows import shipped
from resilient_flows.cli import main
from resilient_flows.errors import SiteConfigError
from resilient_flows.sites import SITE_DIR, known_sites, site_description, site_dirs, site_path, user_site_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user configuration (no site directory of this machine's user), no RESILIENT_FLOWS_SITES."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("RESILIENT_FLOWS_SITES", raising=False)
    return tmp_path / "config" / "resilient-flows" / "sites"


def site_file(directory: Path, name: str, comment: str = "a test site.") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(f"# {comment}\nexecutors:\n  - type: ThreadPoolExecutor\n")
    return path


def test_names_are_looked_up_in_the_variables_directories_then_the_users_then_the_packaged(
    user_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.setenv("RESILIENT_FLOWS_SITES", f"{first}:{second}")
    assert [(d.origin, d.path) for d in site_dirs()] == [
        ("RESILIENT_FLOWS_SITES", first),
        ("RESILIENT_FLOWS_SITES", second),
        ("user", user_dir),
        ("packaged", SITE_DIR),
    ]
    assert site_path("local") == SITE_DIR / "local.yaml"
    user_local = site_file(user_dir, "local")
    assert site_path("local") == user_local
    second_local = site_file(second, "local")
    assert site_path("local") == second_local
    first_local = site_file(first, "local")
    assert site_path("local") == first_local
    local = known_sites()["local"]
    assert local.source.origin == "RESILIENT_FLOWS_SITES"
    assert [d.path for d in local.shadows] == [second, user_dir, SITE_DIR]
    assert site_path("polaris") == SITE_DIR / "polaris.yaml"  # names nobody else has stay the package's


def test_a_path_is_taken_as_it_is_and_an_unknown_name_says_where_it_looked(user_dir: Path, tmp_path: Path) -> None:
    site_file(user_dir, "mine")
    assert site_path(str(tmp_path / "elsewhere.yaml")) == tmp_path / "elsewhere.yaml"
    with pytest.raises(SiteConfigError, match=rf"unknown site 'nowhere'; known sites: .*local, .*mine.*{user_dir}"):
        site_path("nowhere")


def test_the_shipped_directories_are_the_wheels_copy_where_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shipped.shipped_dir("site-configs") == REPO / "site-configs"  # a checkout reads its own
    assert shipped.shipped_dir("workflows") == REPO / "workflows"
    (tmp_path / "site-configs").mkdir()
    monkeypatch.setattr(shipped, "PACKAGED", tmp_path)
    assert shipped.shipped_dir("site-configs") == tmp_path / "site-configs"


def test_a_sites_description_is_the_first_sentence_of_its_leading_comment(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("# A cluster: two lines\n# of comment. More detail\n#\n# another paragraph\nexecutors: []\n")
    assert site_description(path) == "A cluster: two lines of comment."
    path.write_text("executors: []  # no leading comment\n")
    assert site_description(path) == ""
    assert site_description(SITE_DIR / "local.yaml") == "The default site: this machine."


def test_sites_lists_each_name_with_where_it_comes_from(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site_file(user_dir, "local", "my own local site. With more.")
    assert main(["sites"]) == 0
    out = capsys.readouterr().out
    assert "local              user (hides packaged)  my own local site." in out
    assert "polaris            packaged               ALCF Polaris" in out
    assert f"user: {user_dir}\n" in out and f"packaged: {SITE_DIR}\n" in out


def test_sites_show_prints_the_file_as_it_is(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sites", "show", "polaris"]) == 0
    assert capsys.readouterr().out == (SITE_DIR / "polaris.yaml").read_text()


def test_sites_new_copies_a_site_into_the_user_directory_once(
    user_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sites", "new", "my-polaris", "--from", "polaris"]) == 0
    assert (user_dir / "my-polaris.yaml").read_text() == (SITE_DIR / "polaris.yaml").read_text()
    assert "`site: my-polaris`" in capsys.readouterr().out
    assert site_path("my-polaris") == user_dir / "my-polaris.yaml"
    (user_dir / "my-polaris.yaml").write_text("# edited\n")
    assert main(["sites", "new", "my-polaris", "--from", "local"]) == 2
    err = capsys.readouterr().err
    assert "my-polaris.yaml exists; not overwriting it" in err and "Traceback" not in err
    assert (user_dir / "my-polaris.yaml").read_text() == "# edited\n"


def test_sites_new_into_another_directory_says_how_to_name_it(
    user_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sites", "new", "polaris", "--from", "polaris", "--dir", str(tmp_path / "mine")]) == 0
    assert "is not searched for site names: use `--site" in capsys.readouterr().out
    assert (tmp_path / "mine" / "polaris.yaml").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sites", "new", "a/b", "--from", "local"], "site name 'a/b': use letters"),
        (["sites", "new", "mine.yaml", "--from", "local"], "site name 'mine.yaml'"),
        (["sites", "new", "mine", "--from", "nowhere"], "unknown site 'nowhere'"),
        (["sites", "show", "nowhere"], "unknown site 'nowhere'"),
    ],
)
def test_sites_mistakes_are_one_line_and_exit_2(
    user_dir: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not user_dir.exists()


@pytest.fixture
def forget_train_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The starter's ``train`` module imported in this process is forgotten, and ``sys.path`` restored."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    sys.modules.pop("train", None)


def test_init_writes_a_starter_that_validates_and_trains(
    user_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], forget_train_module: None
) -> None:
    from resilient_flows.training import MemberSpec, run_member
    from resilient_flows.workflow import plan_workflow
    from resilient_flows.workflow.schema import load_workflow

    project = tmp_path / "project"
    assert main(["init", str(project)]) == 0
    assert sorted(p.name for p in project.iterdir()) == ["train.py", "workflow.yaml"]
    assert f"next: cd {project} && resilient-flows validate workflow.yaml" in capsys.readouterr().out
    assert main(["validate", str(project / "workflow.yaml")]) == 0
    plan = plan_workflow(load_workflow(project / "workflow.yaml"), build_site=False)
    assert [m.name for m in plan.members] == ["mlp-0", "mlp-1"]
    assert {m.workdir for m in plan.members} == {str(project.resolve())}  # where train:train is imported from
    spec = MemberSpec.from_dict({**plan.members[0].to_dict(), "steps": 20})
    result = run_member(spec.to_dict(), str(tmp_path / "run"))  # the module is not on sys.path before this
    assert result["step"] == 19 and 0 <= result["test_accuracy"] <= 1 and "digest" in result


def test_init_refuses_a_directory_that_is_not_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["init", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is not empty (notes.txt)" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert main(["init", str(tmp_path / "notes.txt")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_init_takes_a_fresh_git_repository_as_empty(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    assert main(["init", str(tmp_path)]) == 0
    assert (tmp_path / "train.py").exists()


def test_init_example_writes_the_docs_workflow_and_the_files_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user with only the wheel gets ``workflows/NAME.yaml`` as the docs run it; the Lightning
    example's command member needs its script beside it."""
    assert main(["init", "--example", "quickstart", str(tmp_path / "q")]) == 0
    assert [p.relative_to(tmp_path / "q").as_posix() for p in (tmp_path / "q").rglob("*")] == [
        "workflows",
        "workflows/quickstart.yaml",
    ]
    quickstart = REPO / "workflows" / "quickstart.yaml"
    assert (tmp_path / "q" / "workflows" / "quickstart.yaml").read_bytes() == quickstart.read_bytes()
    assert "resilient-flows run workflows/quickstart.yaml" in capsys.readouterr().out
    assert main(["validate", str(tmp_path / "q" / "workflows" / "quickstart.yaml")]) == 0
    assert main(["init", "--example", "lightning", str(tmp_path / "l")]) == 0
    assert sorted(p.name for p in (tmp_path / "l" / "workflows").iterdir()) == ["lightning.yaml", "lightning_digits.py"]


def test_init_example_names_the_examples_when_one_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.txt").write_text("mine")  # the name is checked first: the directory is not the problem
    assert main(["init", "--example", "quikstart", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no example named 'quikstart'; the examples are " in err and "quickstart" in err and "gpt" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"resilient-flows {metadata.version('resilient-flows')}\n"


def test_user_site_directory_follows_xdg_config_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert user_site_dir() == tmp_path / "resilient-flows" / "sites"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert user_site_dir() == Path.home() / ".config" / "resilient-flows" / "sites"
