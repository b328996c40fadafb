"""``.ci/docblocks.py``, which ``.ci/wheel-check`` runs on the docs' pages from the installed wheel:
which blocks it selects and how, and how a failure is named. The pages' own run is wheel-check's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import REPO

DOCS = REPO / "docs"


def _docblocks():
    spec = importlib.util.spec_from_file_location("docblocks", REPO / ".ci" / "docblocks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docblocks"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


docblocks = _docblocks()

PAGE = """\
# A page

<!-- from-wheel -->
```yaml
# conf/settings.yaml
greeting: hello
```

Not marked, never run:

```console
$ false
```

<!-- from-wheel -->
<!-- runnable -->
```console
$ mkdir runs && cd runs && mkdir demo-20260101-000000-x demo-20250505-121212
$ cat conf/settings.yaml | grep greeting > seen.txt
greeting: hello
$ ls runs/demo-20261202-201500 > listed.txt && \\
  echo continued >> listed.txt
```

<!-- from-wheel -->
```python
import pathlib
pathlib.Path("from-python.txt").write_text(pathlib.Path("seen.txt").read_text().upper())
```
"""


def run(tmp_path: Path, text: str, name: str = "guides/page.md") -> tuple[int, Path]:
    docs = tmp_path / "docs"
    page = docs / name
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    work = tmp_path / "work"
    code = docblocks.main([str(page), "--docs", str(docs), "--work", str(work), "--python", sys.executable])
    return code, work / name.removesuffix(".md").replace("/", "-")


def test_marked_blocks_run_in_order_in_the_pages_own_directory(tmp_path: Path, capsys) -> None:
    code, directory = run(tmp_path, PAGE)
    assert code == 0, capsys.readouterr().err
    assert (directory / "conf/settings.yaml").read_text() == "# conf/settings.yaml\ngreeting: hello\n"
    assert (directory / "seen.txt").read_text() == "greeting: hello\n"
    # the example run stands for the one run of `demo` made by the page: runs/demo-20250505-121212
    assert (directory / "listed.txt").read_text() == "continued\n"
    assert (directory / "from-python.txt").read_text() == "GREETING: HELLO\n"
    out = capsys.readouterr().out
    assert "guides/page.md:17" in out and "$ ls runs/demo-20250505-121212 > listed.txt" in out
    assert out.splitlines()[-1].startswith("-- docs: guides/page.md: 3 blocks ran as written in ")


def test_a_failed_block_names_the_page_the_line_the_command_and_its_output(tmp_path: Path, capsys) -> None:
    page = "<!-- from-wheel -->\n```console\n$ echo fine\n$ echo the reason >&2; exit 3\n$ touch never\n```\n"
    code, directory = run(tmp_path, page, "getting-started/x.md")
    assert code == 1 and not (directory / "never").exists()
    err = capsys.readouterr().err
    assert err == (
        "docs from the wheel: getting-started/x.md:2: `$ echo the reason >&2; exit 3` failed with status 3; "
        "its output:\nthe reason\n\n"
    )


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (
            "<!-- from-wheel -->\n\n```console\n$ true\n```\n",
            "p.md:1: <!-- from-wheel --> must come before a ``` fence",
        ),
        ("<!-- from-wheel -->\n```yaml\nkey: 1\n```\n", "p.md:2: a yaml block is neither run nor a file (# PATH)"),
        ("<!-- from-wheel -->\n```console\nno command\n```\n", "p.md:2: a console block without a `$ ` command"),
        ("# nothing marked\n", "p.md: no block marked <!-- from-wheel -->"),
        (
            "<!-- from-wheel -->\n```console\n$ mkdir runs && cd runs && mkdir a-20260101-000000 a-20260101-000001\n"
            "$ ls runs/a-20261202-201500\n```\n",
            "p.md:2: runs/a-20261202-201500 stands for the page's run of a; runs/ holds a-20260101-000000, "
            "a-20260101-000001",
        ),
    ],
)
def test_mistakes_in_a_page_are_one_line(tmp_path: Path, capsys, page: str, message: str) -> None:
    code, _ = run(tmp_path, page, "p.md")
    assert code == 1
    assert capsys.readouterr().err == f"docs from the wheel: {message}\n"


def test_the_pages_wheel_check_runs() -> None:
    """The pages a user follows from an empty directory have their blocks marked; what each runs."""
    marked = {
        page.relative_to(DOCS).as_posix(): docblocks.page_blocks(page, page.name)
        for page in sorted(DOCS.rglob("*.md"))
        if docblocks.MARKER in page.read_text().split("\n")
    }
    assert sorted(marked) == ["getting-started/laptop.md", "guides/inspect-export.md", "guides/own-script.md"]
    laptop = [c for b in marked["getting-started/laptop.md"] if b.language == "console" for c in docblocks.commands(b)]
    assert [c.split("#")[0].strip() for c in laptop[:3]] == [
        "resilient-flows init --example quickstart",
        "resilient-flows validate workflows/quickstart.yaml",
        "resilient-flows run workflows/quickstart.yaml",
    ]
    assert any(c.startswith("resilient-flows checkpoints export ") for c in laptop)
    own = marked["guides/own-script.md"]
    assert [b.text.split("\n")[0] for b in own[:2]] == ["# workflow.yaml", "# train.py"]
    assert [b.language for b in marked["guides/inspect-export.md"]] == ["python", "python"]


def test_after_runs_between_the_commands_of_a_block(tmp_path: Path, capsys) -> None:
    """As wheel-check shortens the workflow that `init` wrote before the next line runs it."""
    page = "<!-- from-wheel -->\n```console\n$ echo 3000 > steps\n$ cp steps used\n```\n"
    docs, work = tmp_path / "docs", tmp_path / "work"
    docs.mkdir()
    (docs / "p.md").write_text(page)
    after = "[ ! -f steps ] || sed -i s/3000/300/ steps"
    argv = [str(docs / "p.md"), "--docs", str(docs), "--work", str(work), "--after", after]
    assert docblocks.main(argv) == 0, capsys.readouterr().err
    assert (work / "p" / "used").read_text() == "300\n"
