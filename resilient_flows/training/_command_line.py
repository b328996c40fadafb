"""``command:`` in a workflow: a member's program and arguments, checked when the workflow is
validated and filled per member when it is planned.

A command is an argv (a string is split as a shell would split it). ``{param}`` in a word is
replaced by the member's value of that param (or its ``name``, ``seed``, ``steps``); ``{{`` and
``}}`` are literal braces. Only plain names are placeholders, so that a word cannot fail to fill
once validated. The program must be found when the workflow is validated: on ``PATH``, or as an
executable file relative to the workflow's directory, which is then written into the plan as an
absolute path so that a worker finds it wherever it runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import string
from pathlib import Path
from typing import Any

#: Placeholders every command may use besides its member's params.
COMMAND_FIELDS = ("name", "seed", "steps")


def check_command(value: str | list[Any], params: set[str], member: str, directory: Path | None) -> list[str]:
    """A member's command as an argv, checked: not empty, placeholders that are plain names of its
    params (or :data:`COMMAND_FIELDS`), well-formed braces (``{{`` and ``}}`` are literal ones), and
    a program found on ``PATH`` or in ``directory`` (the workflow's, when it is known)."""
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"member {member!r}: command {value!r} cannot be split into words ({exc})") from None
    else:
        argv = [str(word) for word in value]
    if not argv or not argv[0].strip():
        raise ValueError(f"member {member!r}: command is empty; give the program and its arguments")
    known = {*params, *COMMAND_FIELDS}
    for index, word in enumerate(argv):
        for name in _placeholders(word, member):
            if index == 0:
                raise ValueError(f"member {member!r}: the program {word!r} cannot be a placeholder")
            if name not in known:
                listed = ", ".join(sorted(params)) or "none"
                raise ValueError(
                    f"member {member!r}: command has placeholder {{{name}}}, but no param {name!r} "
                    f"(params: {listed}; also {', '.join(COMMAND_FIELDS)})"
                )
    if directory is not None:
        _find_program(argv[0], directory, member)
    return argv


def _placeholders(word: str, member: str) -> list[str]:
    """The ``{name}`` placeholders in one word of a command."""
    try:
        parsed = list(string.Formatter().parse(word))
    except ValueError as exc:
        raise ValueError(
            f"member {member!r}: command word {word!r} has a malformed brace ({exc}); "
            "write {{ or }} for a literal brace"
        ) from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"member {member!r}: command word {word!r}: a placeholder is a param's name in braces, "
                f"like {{lr}}; write {{{{ or }}}} for a literal brace"
            )
        names.append(name)
    return names


def _find_program(program: str, directory: Path, member: str) -> Path | None:
    """Where ``program`` is: None when it is found on ``PATH``, else its file in ``directory``
    (relative paths are the workflow's), which must be executable."""
    if "/" not in program and shutil.which(program) is not None:
        return None
    path = directory / program
    if not path.is_file():
        raise ValueError(f"member {member!r}: program {program!r} not found on PATH nor in {directory}")
    if not os.access(path, os.X_OK):
        raise ValueError(
            f"member {member!r}: program {program!r} in {directory} is not executable; "
            f"chmod +x it, or run it through its interpreter (command: [python, {program}])"
        )
    return Path(os.path.abspath(path))  # not resolved: a venv's python is a symlink that must stay one


def fill_command(argv: list[str], values: dict[str, Any], directory: Path | None) -> list[str]:
    """``argv`` with its placeholders filled from ``values``, its program resolved in ``directory``
    when it is not on ``PATH`` (so that the worker finds it wherever it runs)."""
    filled = [word.format_map(values) for word in argv]
    if directory is not None:
        found = _find_program(filled[0], directory, str(values.get("name")))
        if found is not None:
            filled[0] = str(found)
    return filled
