"""The parts of the chaos harness, whose entry script and description are ``benchmarks/chaos.py``.

The modules follow the harness's own seams: what a run is (:mod:`chaoslib.config`,
:mod:`chaoslib.members`), how it is struck (:mod:`chaoslib.schedule`, :mod:`chaoslib.targets`,
:mod:`chaoslib.faults`), how it is driven and watched (:mod:`chaoslib.procs`, :mod:`chaoslib.runner`,
:mod:`chaoslib.slurm`, :mod:`chaoslib.execution`), what it cost (:mod:`chaoslib.rundata`,
:mod:`chaoslib.losses`, :mod:`chaoslib.resumes`, :mod:`chaoslib.drains`, :mod:`chaoslib.figures`),
and how that is told (:mod:`chaoslib.report`, :mod:`chaoslib.cli`; :mod:`chaoslib.agent` for
``--agent``). Its modules import ``harness``, ``recovery_split`` and ``clusterenv`` from
``benchmarks/``, which must be on ``sys.path`` (``chaos.py`` puts it there).
"""
