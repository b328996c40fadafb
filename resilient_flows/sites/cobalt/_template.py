"""The Cobalt job script: filled in by :class:`~resilient_flows.sites.cobalt.CobaltProvider` with
``string.Template`` (so a literal dollar is written ``$$``).

Cobalt takes its options on the ``qsub`` command line and runs this script in ``--mode script``
on a launch node; the launcher command in ``${user_script}`` places the workers on the compute
nodes. The script must be executable, which the provider makes it.
"""

template_string = """#!/bin/bash
# Cobalt job ${jobname}: ${nodes_per_block} node(s) for ${walltime_minutes} minute(s).
# stdout -> ${job_stdout_path}
# stderr -> ${job_stderr_path}

${worker_init}

export JOBNAME="${jobname}"

${user_script}
"""
