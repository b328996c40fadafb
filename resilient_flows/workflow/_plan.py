"""The plan: a workflow bound to a site, what ``validate`` checks and ``run`` starts from.

Planning reads the site's facts (node-local scratch, node MTBF) and builds its ``parsl.Config``
(which imports Parsl), so that a mistake in the site file is found by ``validate`` as by ``run``,
and imports the workflow's functions as a worker will (:mod:`resilient_flows.workflow._preflight`),
so that a member that cannot start is found before anything is queued. A run records its plan in
its run directory (:mod:`resilient_flows.workflow._recorded_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resilient_flows.errors import WorkflowError
from resilient_flows.sites import SiteFile, SiteOptions
from resilient_flows.training import MemberSpec
from resilient_flows.workflow._monitoring import check_monitoring
from resilient_flows.workflow._preflight import check_functions
from resilient_flows.workflow.schema import SiteConfig, Workflow


@dataclass(frozen=True)
class Plan:
    """A validated workflow bound to a site: what ``run`` starts and ``resume`` continues.

    ``site_file``: the site as planning read it, so that the run builds its Parsl configuration
    from the same reading; None in a plan read back from the run directory (a resume reads the
    site anew, once).
    """

    workflow: Workflow
    site: str
    members: tuple[MemberSpec, ...]
    site_file: SiteFile | None = field(default=None, compare=False, repr=False)


def plan_workflow(
    workflow: Workflow,
    site: str | None = None,
    run_name: str | None = None,
    build_site: bool = True,
    options: SiteOptions | None = None,
) -> Plan:
    """Bind a workflow to a site: the workflow's own, with its options, unless ``site`` names
    another (without them); ``options`` change either's (``--set nodes=4``). The site's facts are
    checked, and with ``build_site`` its Parsl configuration is built, which imports Parsl; a
    workflow with ``monitoring: true`` is refused where Parsl's monitoring does not import.

    The plan's workflow names the site it was bound to, options included, so that ``resume``
    reads the same site again.
    """
    choice = workflow.site if site is None else SiteConfig(name=site)
    if options is not None:
        choice = choice.merged(options)
    workflow = workflow.model_copy(update={"site": choice})
    site_name = choice.name
    site_file = SiteFile.open(site_name, choice)
    facts = site_file.facts()
    run = run_name or workflow.name
    local_root = f"{facts.local_scratch}/resilient-flows/{run}" if facts.local_scratch else None
    memory_root = f"{facts.memory_scratch}/resilient-flows/{run}" if facts.memory_scratch else None
    if memory_root is None and workflow.names_tier("memory"):
        raise WorkflowError(
            f"checkpoint tiers name 'memory', but site {site_name!r} has no memory_scratch: add "
            "'memory_scratch: /dev/shm' (node memory as a file system) to its facts, or drop the tier"
        )
    node_root = memory_root or local_root  # peer copies go to node memory where the site has it
    peer_root = None if node_root is None else f"{node_root}/.peer"
    if peer_root is None and workflow.names_tier("peer"):
        raise WorkflowError(
            f"checkpoint tiers name 'peer', but site {site_name!r} has neither memory_scratch nor "
            "local_scratch for the copies of other nodes' shards: add one to its facts, or drop the tier"
        )
    if build_site:
        site_file.config()
    if workflow.monitoring:
        check_monitoring()
    specs = workflow.member_specs(
        local_root,
        facts.node_mtbf_s,
        facts.stop_grace_s,
        memory_root,
        network_interface=facts.network_interface,
        peer_root=peer_root,
        peer_capacity=facts.peer_memory,
    )
    _check_nodes(specs, site_file, facts.nodes)
    check_functions(workflow, specs, workflow.stage_specs())
    return Plan(workflow, site_name, tuple(specs), site_file)


#: Providers whose blocks can start a member's ranks across their nodes (see ``apps.launch_prefix``).
SPANNING_PROVIDERS = frozenset({"SlurmProvider", "PBSProProvider"})


def _check_nodes(specs: list[MemberSpec], site_file: SiteFile, per_block: int) -> None:
    """A member's ranks start inside one block (an ``srun`` step, or PALS's ``mpiexec`` on the
    block's nodes): one spanning more nodes than a block holds would wait for them forever, and on
    a site of neither Slurm nor PBS Pro fail at every attempt."""
    spanning = [spec for spec in specs if spec.nodes > 1]
    if not spanning:
        return
    site = site_file.name
    for spec in spanning:
        if spec.nodes > per_block:
            raise WorkflowError(
                f"member {spec.name!r} spans {spec.nodes} nodes, but a block of site {site!r} holds {per_block} "
                "(its facts.nodes): choose a site whose blocks hold as many, such as local-slurm-nodes"
            )
    providers = site_file.provider_types()
    if not providers or not providers <= SPANNING_PROVIDERS:
        raise WorkflowError(
            f"member {spanning[0].name!r} spans {spanning[0].nodes} nodes, which starts its ranks inside a Slurm "
            f"or PBS Pro block (srun, or PALS's mpiexec), but site {site!r} has "
            f"{', '.join(sorted(providers)) or 'no'} provider(s): use a site whose blocks hold several nodes, "
            "such as local-slurm-nodes"
        )
