"""MkDocs hooks: the reference pages are generated from the code at every build.

``mkdocs.yml`` names this file under ``hooks:``. Each page of :data:`gen_reference.PAGES` is added
to the site as a generated file (nothing is written into ``docs/``), so a command, a workflow key
or a run-directory file added to the code appears in the next build, and a link to a page that
the code no longer produces fails ``mkdocs build --strict``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_reference


def on_files(files: Files, config) -> Files:
    for path, text in gen_reference.pages().items():
        files.append(File.generated(config, path, content=text))
    return files
