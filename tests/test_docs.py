"""The documentation's promises that a test can keep, without MkDocs.

- Code blocks in ``docs/`` that follow a ``<!-- runnable -->`` line run: a ``python`` block as a
  script in a fresh directory, a ``yaml`` block as a workflow file that ``resilient-flows
  validate`` accepts on the local site. Only blocks that run on a laptop in seconds are marked.
- The README stays a front page: at most 250 lines, its links into ``docs/`` lead to pages that
  exist, and the two blocks ``.ci/run`` runs are there.
- The reference pages that ``docs/gen_reference.py`` generates at build time cover every command,
  workflow key and run-directory file the code has.
- User-facing pages name no issue numbers.

``mkdocs build --strict`` (``.ci/docs-check``) checks the rest: links, anchors, the nav.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
MARKER = "<!-- runnable -->"
#: How each language of a runnable block is run, in the block's own directory.
LANGUAGES = ("python", "yaml")


def runnable_blocks() -> list[tuple[str, str, str]]:
    """(id, language, code) of every block that follows the marker line, in every page."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text().split("\n")
        for index, line in enumerate(lines):
            if line.strip() != MARKER:
                continue
            fence = lines[index + 1] if index + 1 < len(lines) else ""
            language = fence.removeprefix("```").strip()
            if not fence.startswith("```"):
                raise AssertionError(
                    f"{page.relative_to(REPO)}:{index + 1}: {MARKER} must come right before a ``` block"
                )
            end = lines.index("```", index + 2)
            block_id = f"{page.relative_to(DOCS)}:{index + 2}"
            found.append((block_id, language, "\n".join(lines[index + 2 : end]) + "\n"))
    return found


BLOCKS = runnable_blocks()


def _env() -> dict[str, str]:
    """The test's environment, with this checkout first on the path (whatever is installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_runnable_blocks_are_found() -> None:
    """The extraction finds blocks of every language the guides use (a marker that stops matching
    would otherwise run nothing, silently)."""
    languages = {language for _, language, _ in BLOCKS}
    assert languages == set(LANGUAGES), languages
    assert len(BLOCKS) >= 10


@pytest.mark.parametrize(("block_id", "language", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_runnable_block(block_id: str, language: str, code: str, tmp_path: Path) -> None:
    if language == "python":
        script = tmp_path / "block.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    elif language == "yaml":
        (tmp_path / "workflow.yaml").write_text(code)
        command = [sys.executable, "-m", "resilient_flows.cli", "validate", "workflow.yaml", "--site", "local"]
    else:
        pytest.fail(f"{block_id}: a runnable block must be one of {', '.join(LANGUAGES)}, not {language!r}")
    done = subprocess.run(command, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{block_id} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"


# --- the README ---------------------------------------------------------------------------


def readme_block(marker: str) -> str:
    """The fenced block after ``<!-- marker -->``, as ``.ci/run`` reads it."""
    lines = (REPO / "README.md").read_text().split("\n")
    start = lines.index(f"<!-- {marker} -->")
    assert lines[start + 1].startswith("```")
    return "\n".join(lines[start + 2 : lines.index("```", start + 2)])


def test_readme_is_a_front_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.split("\n")) <= 250
    assert "pip install" in readme_block("install-and-run")
    assert "pytest" in readme_block("test")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert links, "the README maps the documentation"
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"README links to missing pages: {missing}"


def test_docs_name_no_issue_numbers() -> None:
    pages = [*DOCS.rglob("*.md"), REPO / "README.md"]
    found = [
        f"{page.relative_to(REPO)}: {match.group(0)}"
        for page in pages
        for match in re.finditer(r"\b[Ii]ssues? \d+|#\d{1,4}\b(?!-)", page.read_text())
    ]
    assert not found, found


# --- the generated reference --------------------------------------------------------------


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_has_every_command() -> None:
    from resilient_flows.cli._app import build_parser

    page = _generator().cli_page()

    def walk(parser, words):
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, sub in action.choices.items():
                    yield [*words, name], sub
                    yield from walk(sub, [*words, name])

    commands = list(walk(build_parser(), ["resilient-flows"]))
    assert commands
    for words, parser in commands:
        assert f"# {' '.join(words)}\n" in page, words
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and action.help != "==SUPPRESS==":
                    assert f"`{option}`" in page, (words, option)


def test_every_help_is_plain_text() -> None:
    """A terminal shows ``--help`` as it is: no reStructuredText roles or literals."""
    from resilient_flows.cli._app import build_parser

    def walk(parser):
        yield parser
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for sub in action.choices.values():
                    yield from walk(sub)

    markup = re.compile(r"``|:(mod|func|class|data|meth|attr|ref):`")
    helps = [parser.format_help() for parser in walk(build_parser())]
    assert len(helps) > 20
    assert [h.splitlines()[0] for h in helps if markup.search(h)] == []


def test_workflow_reference_has_every_key() -> None:
    from resilient_flows.workflow.schema import Workflow

    page = _generator().workflow_page()
    for key in Workflow.model_fields:
        assert f"| `{key}` |" in page, key
    assert "## MemberConfig" in page and "## CheckpointSection" in page


def test_rundir_reference_has_every_file() -> None:
    from resilient_flows.rundir import RunLayout, TaskLayout

    page = _generator().rundir_page()
    for layout, prefix in ((RunLayout, "<run>/"), (TaskLayout, "<run>/members/<name>/")):
        root = Path("/x")
        for name, member in vars(layout).items():
            if isinstance(member, property):
                path = getattr(layout(root), name).relative_to(root).as_posix()
                assert f"`{prefix}{path}`" in page, (layout.__name__, name)


def test_contract_and_facts_references() -> None:
    from resilient_flows.training import ENV_NAMES

    generator = _generator()
    contract = generator.contract_page()
    for variable in ENV_NAMES.values():
        assert f"`{variable}`" in contract
    assert "orphan_timeout" in generator.site_facts_page()
