"""Fake batch schedulers for tests: put ``tests/fakesched/cobalt`` or ``tests/fakesched/pbspro``
first on ``PATH`` and set ``FAKESCHED_DIR``; see :mod:`engine`."""

from pathlib import Path

COBALT = Path(__file__).parent / "cobalt"
PBSPRO = Path(__file__).parent / "pbspro"
