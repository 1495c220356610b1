"""The job's links and shape (`Cluster`) from the first source the request gives or `gather`
read (`evidence.LinkEvidence`): a bench's all-reduce fit, explicit numbers, a topology file or
this machine's topology; one GPU per node needs no intra-node link, and a --gpu what-if on a
machine without that GPU is priced on the node its datasheet's form is sold in. Pure, as
`resolve` is: it runs no process, reads no file and no hardware."""
from __future__ import annotations

from topoprof.errors import InputError
from topoprof.model.comm import links
from topoprof.model.comm.collectives import HierarchicalComm
from topoprof.model.compute.datasheet import NamedGpu, named_gpu
from topoprof.model.inputs.evidence import LinkEvidence
from topoprof.model.inputs.request import ClusterRequest
from topoprof.model.strategies.job import Cluster
from topoprof.model.strategies.whatif import standard_link
from topoprof.topology.build import with_compute_capability
from topoprof.topology.constants import STANDARD_NODE_GPUS


def job_cluster(evidence: LinkEvidence, cl: ClusterRequest, gpu: NamedGpu | None,
                notes: list[str]) -> tuple[Cluster, dict]:
    """(the Cluster, what was described of its links and their sources, `notes` added to its
    notes) for the request's shape (`comm_of`, then across its nodes)."""
    comm, gpn, described = comm_of(evidence, cl, gpu)
    if notes:
        described["notes"] = [*described.get("notes", []), *notes]
    if cl.world_size is not None and cl.world_size != cl.nodes * gpn:
        raise InputError(f"world_size({cl.world_size}) != nodes({cl.nodes}) * gpus_per_node({gpn})")
    comm = links.across_nodes(comm, cl.nodes, gpn, cl.network_bandwidth_gbps, cl.network_latency_us)
    if "no_link" in described:  # a one-GPU topology may be one node of several
        described["no_link"] = _no_link_text(cl.nodes)
    if isinstance(comm, HierarchicalComm):  # the network level, for the `links` echo
        described.update(network_bandwidth_gbps=comm.inter.link_bandwidth_gbps,
                         network_latency_us=comm.inter.hop_latency_us)
    # the links measured by a bench on gloo (CPU ranks) carry its blocking collectives to FSDP
    return Cluster(comm, nodes=cl.nodes, gpus_per_node=gpn,
                   backend="gloo" if described.get("backend") == "gloo" else "nccl"), described


def _no_link_text(nodes: int) -> str:
    return ("one GPU: nothing to all-reduce" if nodes == 1 else
            "one GPU per node, so no intra-node link: every ring edge crosses the network")


def _no_link(cluster: ClusterRequest) -> tuple[None, int, dict]:
    """One GPU per node: no edge inside a node, so no intra-node link is needed (and with one
    node, no link at all); link options given anyway are ignored, with a note."""
    described: dict = {"no_link": _no_link_text(cluster.nodes)}
    if cluster.gpus:
        described["gpus"] = list(cluster.gpus)
    ignored = cluster.link_options_given
    if ignored:
        why = "one GPU needs no link" if cluster.nodes == 1 else "one GPU per node has no intra-node link"
        described["notes"] = [f"{', '.join(ignored)} ignored: {why}"]
    return None, 1, described


def comm_of(evidence: LinkEvidence, cluster: ClusterRequest, gpu: NamedGpu | None = None):
    """(CommModel for one node or None when none is needed, gpus_per_node, description) from
    the first source given (`gather.gather_links` read the file or the machine); `gpu` (--gpu)
    pins a topology's NVLink generation."""
    gpn = cluster.gpus_per_node_given
    if evidence.bench_fit is not None:
        lat, bw, world, fit = evidence.bench_fit
        comm = links.measured_comm(fit["rows"], fit, world, f"all-reduce measured in {cluster.bench}")
        return comm, world, {"bench": cluster.bench, **({"backend": fit["backend"]} if fit.get("backend") else {})}
    # One GPU per node needs no intra-node link: do not ask for one nor probe this machine.
    # A single --gpus index is checked against a --topology file when one is given.
    if cluster.needs_no_link:
        return _no_link(cluster)
    if cluster.link_bandwidth_gbps is None:
        return _from_topology(evidence, cluster, gpu)
    if not gpn:
        raise InputError("--link-bandwidth needs --world-size (or --gpus-per-node with --nodes)")
    lat = cluster.link_latency_us if cluster.link_latency_us is not None else 0.0
    return (links.comm_explicit(cluster.link_bandwidth_gbps, lat, gpn), gpn,
            {"link_bandwidth_gbps": cluster.link_bandwidth_gbps})


def _from_topology(evidence: LinkEvidence, cluster: ClusterRequest, gpu: NamedGpu | None):
    """`comm_of` from a topology (a file's, or this machine's), its NVLink generation pinned by
    --gpu; on this machine, a what-if of a GPU it does not hold takes that GPU's standard node."""
    gpn, chosen = cluster.gpus_per_node_given, list(cluster.gpus) if cluster.gpus else None
    topology = evidence.topology
    pinned, origin, notes = _pin_nvlink_generation(topology, gpu, chosen)
    if evidence.read_here:
        if gpu is not None and gpn and not _holds(topology, gpu):  # a what-if: the GPU's own node
            return _standard_node(gpu, gpn, cluster)
        if not topology.gpus:
            raise InputError("no link information: this machine has no GPU; give --bench FILE, "
                             "--topology FILE or --link-bandwidth GB/s (or --world-size 1 for one GPU)")
    comm, ring = links.comm_from_topology(pinned, chosen, rate_origin=origin)
    return comm, comm.world_size, {"topology": cluster.topology or "this machine", **ring,
                                   **({"notes": notes} if notes else {})}


def _holds(topology, gpu: NamedGpu) -> bool:
    """Whether this machine's GPUs are the one --gpu names (by their datasheet rows)."""
    return any(gpu.same_row(named_gpu(g.name)) for g in topology.gpus)


def _standard_node(gpu: NamedGpu, gpn: int, cluster: ClusterRequest) -> tuple:
    """--gpu without a link: the node its datasheet's form is sold in (`whatif.standard_link`),
    said in one line; refused where it has no such link or the job's node holds more GPUs."""
    link, spec = standard_link(gpu.row), gpu.row
    if link is None:
        raise InputError(f"no link information: --gpu {gpu.name} has no nominal link in the datasheet table; give "
                         "--bench FILE, --topology FILE or --link-bandwidth GB/s")
    assert spec is not None  # a GPU with a standard link is in the datasheet table
    if gpn > STANDARD_NODE_GPUS:
        nodes = -(-gpn * cluster.nodes // STANDARD_NODE_GPUS)
        raise InputError(f"{gpn} GPUs per node: {spec.name}'s standard node holds {STANDARD_NODE_GPUS} and no network "
                         f"is assumed; give --nodes {nodes} with --network-bandwidth GB/s, or --link-bandwidth or "
                         "--topology for a node of your own")
    where = "on NVSwitch" if link.kind == "NVLink" else "over PCIe"
    line = (f"assumed {spec.name}'s standard node: {gpn} GPUs {where} (up to {STANDARD_NODE_GPUS} per node), "
            f"{link.basis}; --link-bandwidth or --topology overrides")
    return (links.standard_node_comm(link, gpn), gpn,
            {"assumed_node": line, "bus_bandwidth_gbps": list(link.bandwidth_gbps)})


def _pin_nvlink_generation(topology, gpu: NamedGpu | None, chosen: list[int] | None):
    """--gpu names the GPU, so its compute capability and with it the NVLink per-link rate, for
    the GPUs the topology gives none (a saved `nvidia-smi topo -m` text never does); a GPU's own
    capability is kept, with a note when --gpu disagrees. (topology, origin or None, notes)."""
    if gpu is None:
        return topology, None, []

    origin = f"--gpu {gpu.name}"
    used = set(chosen) if chosen is not None else {g.index for g in topology.gpus}
    lacking = any(g.compute_capability is None for g in topology.gpus if g.index in used)
    capability = gpu.capability
    assert capability is not None  # --gpu is a datasheet row (`request.check_gpu_name`), each with one
    topology, notes = with_compute_capability(topology, capability, origin)
    return topology, origin if lacking else None, notes
