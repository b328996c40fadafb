"""Types a user's editor understands: each package's public names, imported on first use at run
time, are the real definitions to a type checker (kept equal to the lazy mapping here), and
pyright, as an editor runs it, resolves them through the public imports and checks calls."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "resilient_flows"


def lazy_packages() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("__init__.py") if "lazy_exports(" in p.read_text())


def declared(tree: ast.Module) -> dict[str, list[str]]:
    """The package's ``_SOURCES``: module -> public names."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_SOURCES" for t in node.targets):
            return {module: list(names) for module, names in ast.literal_eval(node.value).items()}
    raise AssertionError("no _SOURCES")


def for_type_checkers(tree: ast.Module) -> dict[str, list[str]]:
    """What the ``if TYPE_CHECKING:`` block imports: module -> names, each re-exported (``X as X``)."""
    found: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module, ast.unparse(statement)
                assert all(alias.asname == alias.name for alias in statement.names), ast.unparse(statement)
                found.setdefault(statement.module, []).extend(alias.name for alias in statement.names)
    return found


@pytest.mark.parametrize("init", lazy_packages(), ids=lambda p: str(p.parent.relative_to(REPO)))
def test_a_package_s_names_for_type_checkers_are_its_lazy_ones(init: Path) -> None:
    tree = ast.parse(init.read_text())
    as_sets = {module: set(names) for module, names in for_type_checkers(tree).items()}
    assert as_sets == {module: set(names) for module, names in declared(tree).items()}


def test_the_package_says_it_is_typed() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert '"resilient_flows" = ["py.typed"]' in (REPO / "pyproject.toml").read_text()  # shipped in the wheel


PROBE = """\
from resilient_flows import Checkpointer as FromTheTop
from resilient_flows.checkpoint import Checkpointer
from resilient_flows.training import TrainContext

reveal_type(FromTheTop)
reveal_type(Checkpointer)
reveal_type(TrainContext)
Checkpointer("/tmp/ckpt", keep="two")
"""


@pytest.mark.slow  # basedpyright starts node: seconds
def test_pyright_resolves_the_public_names_and_flags_a_wrong_argument(tmp_path: Path) -> None:
    pyright = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    assert pyright is not None, "basedpyright is part of the test extra"
    (tmp_path / "probe.py").write_text(PROBE)
    # an editable install's import hook is invisible to type checkers: the checkout is the path
    config = f'{{"typeCheckingMode": "basic", "extraPaths": ["{REPO}"]}}'
    (tmp_path / "pyrightconfig.json").write_text(config)
    out = subprocess.run(
        [pyright, "--pythonpath", sys.executable, "probe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    ).stdout
    assert out.count('is "type[Checkpointer]"') == 2 and 'is "type[TrainContext]"' in out, out
    assert 'Argument of type "Literal[\'two\']" cannot be assigned to parameter "keep" of type "int"' in out, out
    assert "1 error" in out, out


@pytest.mark.slow  # the whole package: a minute of CPU
def test_pyright_finds_no_error_in_the_package() -> None:
    pyright = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    assert pyright is not None, "basedpyright is part of the test extra"
    # run in the checkout, so that pyproject's [tool.pyright] (basic mode, the package) applies
    command = [pyright, "--pythonpath", sys.executable, "resilient_flows"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stdout.splitlines() if " - error: " in line]
    assert not errors and "0 errors" in done.stdout, "\n".join(errors) or done.stdout + done.stderr
