"""Run the docs' blocks that a user types, as written, one page at a time from an empty directory.

Used by ``.ci/wheel-check`` with the installed wheel's ``bin`` first on ``PATH``, so that the
pages are tested against the package a user gets, not the checkout. Only the standard library:
it runs with the wheel's Python and imports nothing of the package.

A block runs when the line ``<!-- from-wheel -->`` comes before its opening fence (other comment
lines, such as ``<!-- runnable -->``, may stand between them). In page order, in one directory per
page that starts empty:

- ``console``: each ``$ `` line is a command, run by bash (``-eo pipefail``); the other lines are
  sample output and are not compared;
- ``bash`` / ``sh``: the whole block is one bash script;
- a block whose first line is a comment naming a relative file (``# train.py``,
  ``# workflows/x.yaml``) is that file: written there, not run;
- ``python``: run by ``--python`` from the page's directory, as ``python -`` would.

A run directory named by example in a command, ``runs/NAME-YYYYMMDD-HHMMSS``, stands for the run
the page's earlier blocks made: it is replaced by the one directory of that shape that ``runs/``
holds (none, or several, fails the block). ``--after`` is a bash command run in the page's
directory after each command, file and Python block (``.ci/wheel-check`` shortens the quick
start's workflow with it once ``init`` wrote it, before ``run`` reads it).

A block that fails stops the run with exit status 1, naming the page, the block's line, the
command, and its output.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "<!-- from-wheel -->"
SHELLS = ("console", "bash", "sh")
#: A run directory named by example: ``runs/quickstart-20261202-201500``.
EXAMPLE_RUN = re.compile(r"\bruns/([A-Za-z0-9_.-]+?)-[0-9]{8}-[0-9]{6}\b")
#: A file block's first line: a comment that names a relative path with a suffix.
FILE_LINE = re.compile(r"#\s*([A-Za-z0-9_][A-Za-z0-9_./-]*\.[A-Za-z0-9]+)\s*")
#: Seconds one block may take: a whole workflow run on a loaded CI machine.
BLOCK_TIMEOUT_S = 1200


class BlockFailed(Exception):
    """A block did not run as written; the message names the page, line and command."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, counted from 1
    language: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(path: Path, name: str) -> list[Block]:
    """The page's marked blocks, in order; a marker before anything but a fence is an error."""
    lines = path.read_text().split("\n")
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = index + 1
        while fence < len(lines) and re.fullmatch(r"\s*<!--.*-->\s*", lines[fence]):
            fence += 1
        if fence >= len(lines) or not lines[fence].startswith("```"):
            raise BlockFailed(f"{name}:{index + 1}: {MARKER} must come before a ``` fence")
        try:
            end = lines.index("```", fence + 1)
        except ValueError:
            raise BlockFailed(f"{name}:{fence + 1}: the block is never closed") from None
        language = lines[fence].removeprefix("```").strip()
        blocks.append(Block(name, fence + 1, language, "\n".join(lines[fence + 1 : end]) + "\n"))
    return blocks


def commands(block: Block) -> list[str]:
    """What a shell block runs: a console block's ``$`` lines (a trailing ``\\`` continues one),
    or a script block whole."""
    if block.language != "console":
        return [block.text]
    found: list[str] = []
    continued = False
    for line in block.text.split("\n"):
        if continued:
            found[-1] += "\n" + line
        elif line.startswith("$ "):
            found.append(line[2:])
        else:
            continue
        continued = line.endswith("\\")
    return found


def with_runs(command: str, directory: Path, block: Block) -> str:
    """The command with each example run directory replaced by the run the page made."""

    def actual(match: re.Match[str]) -> str:
        shape = re.compile(re.escape(match[1]) + r"-[0-9]{8}-[0-9]{6}")
        runs = sorted(p for p in (directory / "runs").glob(f"{match[1]}-*") if shape.fullmatch(p.name) and p.is_dir())
        if len(runs) != 1:
            made = ", ".join(p.name for p in runs) or "none"
            raise BlockFailed(f"{block.where}: {match[0]} stands for the page's run of {match[1]}; runs/ holds {made}")
        return f"runs/{runs[0].name}"

    return EXAMPLE_RUN.sub(actual, command)


def run_block(block: Block, directory: Path, python: str, env: dict[str, str], after: str | None = None) -> None:
    """Run (or write) the block in ``directory``, saying what it ran and how long it took; ``after``
    runs after each of its commands (or after the file is written)."""
    first = block.text.split("\n", 1)[0]
    named = FILE_LINE.fullmatch(first)
    if block.language not in SHELLS and named is not None:
        target = directory / named[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        print(f"   {block.where}: wrote {named[1]}", flush=True)
        _after(block, after, directory, env)
    elif block.language in SHELLS:
        found = commands(block)
        if not found:
            raise BlockFailed(f"{block.where}: a console block without a `$ ` command")
        for command in found:
            command = with_runs(command, directory, block)
            _run(block, f"$ {command}", ["bash", "-eo", "pipefail", "-c", command], directory, env)
            _after(block, after, directory, env)
    elif block.language == "python":
        _run(block, "python -", [python, "-"], directory, env, stdin=block.text)
        _after(block, after, directory, env)
    else:
        raise BlockFailed(f"{block.where}: a {block.language or 'plain'} block is neither run nor a file (# PATH)")


def _after(block: Block, after: str | None, directory: Path, env: dict[str, str]) -> None:
    if after:
        _run(block, f"(after it) {after}", ["bash", "-eo", "pipefail", "-c", after], directory, env, say=False)


def _run(
    block: Block, shown: str, argv: list[str], directory: Path, env: dict[str, str], stdin: str = "", say: bool = True
) -> None:
    began = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=directory,
            env=env,
            input=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=BLOCK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.output if isinstance(exc.output, str) else (exc.output or b"").decode(errors="replace")
        raise BlockFailed(f"{block.where}: `{shown}` ran past {BLOCK_TIMEOUT_S} s; its output:\n{output}") from None
    if done.returncode != 0:
        raise BlockFailed(f"{block.where}: `{shown}` failed with status {done.returncode}; its output:\n{done.stdout}")
    if say:
        print(f"   {block.where} ({time.monotonic() - began:.1f} s): {shown}", flush=True)


def run_page(path: Path, name: str, directory: Path, python: str, after: str | None, env: dict[str, str]) -> int:
    """Every marked block of the page, in order, in ``directory`` (made empty); the blocks run."""
    blocks = page_blocks(path, name)
    if not blocks:
        raise BlockFailed(f"{name}: no block marked {MARKER}")
    directory.mkdir(parents=True)
    for block in blocks:
        run_block(block, directory, python, env, after)
    return len(blocks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("pages", nargs="+", type=Path, help="docs pages (Markdown)")
    parser.add_argument("--docs", type=Path, required=True, help="the docs directory: pages are named relative to it")
    parser.add_argument("--work", type=Path, required=True, help="where each page's directory is made")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of python blocks")
    parser.add_argument("--after", help="a bash command run in the page's directory after each command")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        for page in args.pages:
            name = page.resolve().relative_to(args.docs.resolve()).as_posix()
            directory = args.work / name.removesuffix(".md").replace("/", "-")
            count = run_page(page, name, directory, args.python, args.after, env)
            print(f"-- docs: {name}: {count} blocks ran as written in {directory}", flush=True)
    except BlockFailed as exc:
        print(f"docs from the wheel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
