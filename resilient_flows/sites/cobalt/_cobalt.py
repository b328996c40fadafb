"""``CobaltProvider``: Parsl blocks as Cobalt jobs (``qsub --mode script``, ``qstat``, ``qdel``)."""

import getpass
import logging
import math
import os
import shlex
import stat
import time

import typeguard
from parsl.jobs.states import TERMINAL_STATES, JobState, JobStatus
from parsl.launchers import AprunLauncher
from parsl.launchers.base import Launcher
from parsl.providers.cluster_provider import ClusterProvider
from parsl.providers.errors import SubmitException
from parsl.utils import RepresentationMixin

from resilient_flows.sites.cobalt._template import template_string

logger = logging.getLogger(__name__)

# The states Cobalt's qstat prints (its job state machine, as users see it). A job that has left
# the queue is no longer listed at all; the provider reports it as completed.
translate_table = {
    "queued": JobState.PENDING,
    "preempted": JobState.PENDING,  # back in the queue after a preemption
    "user_hold": JobState.HELD,
    "admin_hold": JobState.HELD,
    "dep_hold": JobState.HELD,
    "maxrun_hold": JobState.HELD,
    "dep_fail": JobState.HELD,  # a dependency failed; stays in the queue until released or deleted
    "starting": JobState.RUNNING,  # nodes assigned, prologue running
    "running": JobState.RUNNING,
    "preempting": JobState.RUNNING,
    "exiting": JobState.COMPLETED,  # the script has ended; epilogue running
    "done": JobState.COMPLETED,
    "killing": JobState.CANCELLED,
}


class CobaltProvider(ClusterProvider, RepresentationMixin):
    """Cobalt Execution Provider

    This provider uses ``qsub`` to submit, ``qstat -u $USER`` for status and ``qdel`` to cancel
    jobs on Cobalt, the scheduler of ALCF's Theta. Each block is one job submitted in script mode::

        qsub -n NODES -t MINUTES [-q QUEUE] [-A ACCOUNT] --mode script -O PREFIX [scheduler_options] SCRIPT

    The job script is written from the template in this same package; Cobalt takes its options on
    the command line, so ``scheduler_options`` holds ``qsub`` flags rather than script lines.

    Parameters
    ----------
    account : str
        Project (allocation) the job will be charged against: ``qsub -A``.
    queue : str
        Cobalt queue to request blocks from, e.g. ``debug-cache-quad``: ``qsub -q``. If ``None``,
        the queue is Cobalt's default.
    scheduler_options : str
        Extra ``qsub`` flags, placed before the script path, e.g.
        ``'--attrs mcdram=cache:numa=quad:filesystems=home,theta-fs0'``.
    worker_init : str
        Command to be run before starting a worker, such as 'module load conda; source activate env'.
    nodes_per_block : int
        Nodes to provision per block: ``qsub -n``.
    init_blocks : int
        Number of blocks to provision at the start of the run. Default is 1.
    min_blocks : int
        Minimum number of blocks to maintain. Default is 0.
    max_blocks : int
        Maximum number of blocks to maintain. Default is 1.
    parallelism : float
        Ratio of provisioned task slots to active tasks. A parallelism value of 1 represents aggressive
        scaling where as many resources as possible are used; parallelism close to 0 represents
        the opposite situation in which as few resources as possible (i.e., min_blocks) are used.
    launcher : Launcher
        Launcher for this provider. The default is :class:`~parsl.launchers.AprunLauncher`, which
        starts the workers on the compute nodes from the launch node the script runs on.
    walltime : str
        Walltime requested per block in HH:MM:SS; Cobalt counts whole minutes (``qsub -t``), so
        it is rounded up to the next minute.
    cmd_timeout : int
        Timeout for the ``qsub``, ``qstat`` and ``qdel`` commands in seconds. Default is 120.
    """

    @typeguard.typechecked
    def __init__(
        self,
        account: str | None = None,
        queue: str | None = None,
        scheduler_options: str = "",
        worker_init: str = "",
        nodes_per_block: int = 1,
        init_blocks: int = 1,
        min_blocks: int = 0,
        max_blocks: int = 1,
        parallelism: float = 1,
        launcher: Launcher | None = None,
        walltime: str = "00:10:00",
        cmd_timeout: int = 120,
    ):
        super().__init__(
            "cobalt",
            nodes_per_block,
            init_blocks,
            min_blocks,
            max_blocks,
            parallelism,
            walltime,
            launcher if launcher is not None else AprunLauncher(),
            cmd_timeout=cmd_timeout,
        )
        self.account = account
        self.queue = queue
        self.scheduler_options = scheduler_options
        self.worker_init = worker_init
        self.template_string = template_string
        self.walltime_minutes = walltime_to_minutes(walltime)

    def submit(self, command, tasks_per_node, job_name="parsl.cobalt"):
        """Submits the command as one Cobalt job.

        Parameters
        ----------
        command : str
            Command to be executed on the remote side.
        tasks_per_node : int
            Command invocations to be launched per node.
        job_name : str
            Identifier for job.

        Returns
        -------
        job_id : str
            Cobalt's job id (an integer, as a string).

        Raises
        ------
        SubmitException
            If ``qsub`` fails or prints no job id.
        """
        job_name = f"{job_name}.{time.time()}"

        assert self.script_dir, "Expected script_dir to be set"
        prefix = os.path.abspath(os.path.join(self.script_dir, job_name))
        script_path = prefix + ".submit"
        job_stdout_path = prefix + ".output"  # where Cobalt's -O PREFIX sends them
        job_stderr_path = prefix + ".error"

        logger.debug("Requesting %s nodes_per_block, %s tasks_per_node", self.nodes_per_block, tasks_per_node)

        job_config = {}
        job_config["nodes_per_block"] = self.nodes_per_block
        job_config["walltime_minutes"] = self.walltime_minutes
        job_config["worker_init"] = self.worker_init
        job_config["job_stdout_path"] = job_stdout_path
        job_config["job_stderr_path"] = job_stderr_path
        job_config["user_script"] = self.launcher(command, tasks_per_node, self.nodes_per_block, self.script_dir)

        logger.debug("Writing submit script")
        self._write_submit_script(self.template_string, script_path, job_name, job_config)
        # Cobalt refuses script-mode jobs whose script is not executable.
        os.chmod(script_path, os.stat(script_path).st_mode | stat.S_IXUSR)

        launch_cmd = self.qsub_command(script_path, prefix)
        retcode, stdout, stderr = self.execute_wait(launch_cmd)

        job_id = parse_job_id(stdout) if retcode == 0 else None
        if job_id is None:
            message = (
                f"Submit command '{launch_cmd}' failed"
                if retcode != 0
                else f"Submit command '{launch_cmd}' printed no job id"
            )
            logger.error(
                "%s\n Return code: %s\n STDOUT: %s\n STDERR: %s", message, retcode, stdout.strip(), stderr.strip()
            )
            raise SubmitException(job_name=job_name, message=message, stdout=stdout, stderr=stderr, retcode=retcode)

        self.resources[job_id] = {
            "job_id": job_id,
            "status": JobStatus(JobState.PENDING),
            "job_stdout_path": job_stdout_path,
            "job_stderr_path": job_stderr_path,
        }
        return job_id

    def qsub_command(self, script_path, prefix):
        """The ``qsub`` command line for a job script; ``prefix`` names its .output/.error/.cobaltlog."""
        parts = ["qsub", "-n", str(self.nodes_per_block), "-t", str(self.walltime_minutes)]
        if self.queue is not None:
            parts += ["-q", shlex.quote(self.queue)]
        if self.account is not None:
            parts += ["-A", shlex.quote(self.account)]
        parts += ["--mode", "script", "-O", shlex.quote(prefix)]
        if self.scheduler_options.strip():
            parts.append(self.scheduler_options.strip())
        parts.append(shlex.quote(script_path))
        return " ".join(parts)

    def _status(self):
        """Update the status of every job from one ``qstat -u $USER``; jobs not listed have finished."""
        retcode, stdout, stderr = self.execute_wait(f"qstat -u {shlex.quote(getpass.getuser())}")

        # If qstat failed do not update job state
        if retcode != 0:
            logger.warning("qstat failed with retcode:%s STDOUT:%s STDERR:%s", retcode, stdout.strip(), stderr.strip())
            return

        states = parse_qstat(stdout)
        for job_id, job in self.resources.items():
            if job["status"].state in TERMINAL_STATES:
                continue
            cobalt_state = states.get(job_id)
            # Cobalt lists a job until it has left the queue; gone means finished.
            state = JobState.COMPLETED if cobalt_state is None else translate_table.get(cobalt_state, JobState.UNKNOWN)
            job["status"] = JobStatus(
                state, message=cobalt_state, stdout_path=job["job_stdout_path"], stderr_path=job["job_stderr_path"]
            )

    def cancel(self, job_ids):
        """Cancels the jobs specified by a list of job ids with one ``qdel``.

        Parameters
        ----------
        job_ids : list of str
            Job identifiers returned by :meth:`submit`.

        Returns
        -------
        list of bool
            One entry per job; all False if ``qdel`` failed.
        """
        retcode, stdout, stderr = self.execute_wait("qdel " + " ".join(shlex.quote(str(j)) for j in job_ids))
        if retcode != 0:
            logger.warning("qdel failed with retcode:%s STDOUT:%s STDERR:%s", retcode, stdout.strip(), stderr.strip())
            return [False for _ in job_ids]
        for job_id in job_ids:
            job = self.resources[job_id]
            job["status"] = JobStatus(
                JobState.CANCELLED, stdout_path=job["job_stdout_path"], stderr_path=job["job_stderr_path"]
            )
        return [True for _ in job_ids]

    @property
    def status_polling_interval(self):
        return 60


def walltime_to_minutes(walltime):
    """Whole minutes for ``qsub -t`` from an ``HH:MM:SS`` walltime, rounded up (at least one)."""
    parts = walltime.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"walltime {walltime!r} is not HH:MM:SS")
    hours, minutes, seconds = (int(p) for p in parts)
    return max(1, hours * 60 + minutes + math.ceil(seconds / 60))


def parse_job_id(stdout):
    """The job id ``qsub`` printed: the last non-empty line, which Cobalt makes a bare integer."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if lines and lines[-1].isdigit():
        return lines[-1]
    return None


def parse_qstat(stdout):
    """``{job id: state}`` from Cobalt's ``qstat`` table.

    The table is a header line (``JobID  User  WallTime  Nodes  State  Location`` by default), a
    rule of ``=`` and one line per job, columns separated by blanks. Columns are found by name,
    so a ``QSTAT_HEADER`` the user set in their environment changes nothing here as long as it
    keeps ``JobID`` and ``State``.
    """
    states = {}
    columns = None
    for line in stdout.splitlines():
        fields = line.split()
        if not fields:
            continue
        if columns is None:
            if "JobID" in fields and "State" in fields:
                columns = (fields.index("JobID"), fields.index("State"))
            continue
        if set(line.strip()) <= {"=", "-"}:
            continue
        id_at, state_at = columns
        if len(fields) > max(id_at, state_at):
            states[fields[id_at]] = fields[state_at]
    return states
