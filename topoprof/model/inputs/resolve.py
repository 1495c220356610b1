"""The model's inputs (`ModelInputs`) from the request and what was gathered for it
(`evidence.Evidence`, filled by `gather.gather`): the workload from a parameter count, a preset
or the user's model; links from a bench measurement, a topology or explicit numbers (one GPU or
one GPU per node needs no intra-node link); compute from a measurement, a calibration, a GPU name
or the model's own ops priced. Pure: it runs no process, reads no file and no hardware, and imports no torch."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from topoprof.errors import InputError
from topoprof.model.comm import links
from topoprof.model.comm.collectives import HierarchicalComm
from topoprof.model.compute.datasheet import NamedGpu, lookup_gpu_quietly
from topoprof.model.compute.timing import Compute
from topoprof.model.compute.traced import fallback_note, priced
from topoprof.model.fsdp.plan import fsdp_plan
from topoprof.model.inputs.evidence import (
    Evidence,
    LinkEvidence,
    UserModelRun,
    needs_no_link,
    timing_stands,
    what_if_priced,
)
from topoprof.model.inputs.request import ClusterRequest, ComputeRequest, MemoryRequest, WorkloadRequest
from topoprof.model.inputs.user_record import flop_order_reason, user_compute, user_layout
from topoprof.model.memory.traced import TracedMemory
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.whatif import standard_link
from topoprof.topology.build import with_compute_capability
from topoprof.topology.constants import STANDARD_NODE_GPUS
from topoprof.workload.checkpointing import describe_wrapped


def resolve(evidence: Evidence) -> tuple[ModelInputs, dict]:
    """(ModelInputs, what was described of the links and the sources) for the gathered request."""
    request = evidence.request
    done = _workload_and_compute(evidence)
    workload, notes = done.workload, done.notes
    if workload.fsdp_unit is not None:  # a unit that wraps nothing is a bad option, not a silent n/a
        fsdp_plan(workload.layout, workload.fsdp_unit)
    cl = request.cluster
    comm, gpn, described = comm_of(evidence.links, cl, request.compute.named)
    if request.workload.rmsnorm != "eager":
        notes = [f"{request.workload.preset_name} with its RMSNorm {request.workload.rmsnorm}: each norm keeps its "
                 "input and the reciprocal RMS for backward, not its fp32 upcast (topoprof/zoo/llama.py)", *notes]
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
    cluster = Cluster(comm, nodes=cl.nodes, gpus_per_node=gpn,
                      backend="gloo" if described.get("backend") == "gloo" else "nccl")
    resolved = _compute(done.compute, done.memory, evidence.calibration, done.modelled)
    if done.origins:
        resolved = replace(resolved, origins=tuple(done.origins))
    return ModelInputs(workload, resolved, cluster, accumulation_steps=request.accum), described


def _no_link_text(nodes: int) -> str:
    return ("one GPU: nothing to all-reduce" if nodes == 1 else
            "one GPU per node, so no intra-node link: every ring edge crosses the network")


def _no_link(cluster: ClusterRequest) -> tuple[None, int, dict]:
    """One GPU per node: no edge inside a node, so no intra-node link is needed (and with one
    node, no link at all); link options given anyway are ignored, with a note."""
    described: dict = {"no_link": _no_link_text(cluster.nodes)}
    if cluster.gpus:
        described["gpus"] = list(cluster.gpus)
    ignored = cluster.link_options_given()
    if ignored:
        why = "one GPU needs no link" if cluster.nodes == 1 else "one GPU per node has no intra-node link"
        described["notes"] = [f"{', '.join(ignored)} ignored: {why}"]
    return None, 1, described


def comm_of(evidence: LinkEvidence, cluster: ClusterRequest, gpu: NamedGpu | None = None):
    """(CommModel for one node or None when none is needed, gpus_per_node, description) from
    the first source given (`gather.gather_links` read the file or the machine); `gpu` (--gpu)
    pins a topology's NVLink generation."""
    gpn, chosen = cluster.given_gpus_per_node(), list(cluster.gpus) if cluster.gpus else None
    if evidence.bench_fit is not None:
        lat, bw, world, fit = evidence.bench_fit
        comm = links.measured_comm(fit["rows"], fit, world, f"all-reduce measured in {cluster.bench}")
        return comm, world, {"bench": cluster.bench, **({"backend": fit["backend"]} if fit.get("backend") else {})}
    # One GPU per node needs no intra-node link: do not ask for one nor probe this machine.
    # A single --gpus index is checked against a --topology file when one is given.
    if needs_no_link(cluster):
        return _no_link(cluster)
    if cluster.link_bandwidth_gbps is not None:
        if not gpn:
            raise InputError("--link-bandwidth needs --world-size (or --gpus-per-node with --nodes)")
        lat = cluster.link_latency_us if cluster.link_latency_us is not None else 0.0
        return (links.comm_explicit(cluster.link_bandwidth_gbps, lat, gpn), gpn,
                {"link_bandwidth_gbps": cluster.link_bandwidth_gbps})
    topology = evidence.topology
    if evidence.read_here:
        if gpu is not None and gpn and not _holds(topology, gpu):  # a what-if: the GPU's own node
            return _standard_node(gpu, gpn, cluster)
        if not topology.gpus:
            raise InputError("no link information: this machine has no GPU; give --bench FILE, "
                             "--topology FILE or --link-bandwidth GB/s (or --world-size 1 for one GPU)")
    topology, origin, notes = _pin_nvlink_generation(topology, gpu, chosen)
    comm, ring = links.comm_from_topology(topology, chosen, rate_origin=origin)
    return comm, comm.world_size, {"topology": cluster.topology or "this machine", **ring,
                                   **({"notes": notes} if notes else {})}


def _holds(topology, gpu: NamedGpu) -> bool:
    """Whether this machine's GPUs are the one --gpu names (by their datasheet rows)."""
    here = [lookup_gpu_quietly(g.name) for g in topology.gpus]
    return gpu.row is not None and any(row is not None and row.name == gpu.row.name for row in here)


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


def _workload_options(w: WorkloadRequest, memory: MemoryRequest) -> dict:
    return dict(grad_bytes=w.grad_bytes, micro_batch_size=w.micro_batch_size, tokens_per_micro_batch=w.tokens,
                bucket_cap_mb=w.bucket_cap_mb, activation_memory_gb=memory.activation_memory_gb, **w.fsdp_bytes(),
                checkpointing=w.checkpointing)


@dataclass
class _Completed:
    """The workload, and the compute and memory requests completed with what was measured here or
    priced from the model's ops: where each measured value came from (`origins`), the notes for
    the user, and the modelled fields of the compute."""

    workload: Workload
    compute: ComputeRequest
    memory: MemoryRequest
    origins: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    modelled: dict = field(default_factory=dict)


def _workload_and_compute(evidence: Evidence) -> _Completed:
    work_kw = _workload_options(evidence.request.workload, evidence.request.memory)
    if evidence.user is not None:
        done = _user_model(evidence, evidence.user, work_kw)
    else:
        done = _preset_or_params(evidence, work_kw)
    if done.compute.compiled and not done.modelled.get("modelled_s"):
        done.notes.append("--compiled applies to compute modelled from the model's ops; here the compute is "
                          "measured or given, as it ran")
    done.workload, note = _with_traced_memory(done.workload, evidence.traced_memory, user=evidence.user is not None)
    done.notes += [note] if note else []
    return done


def _user_model(evidence: Evidence, user: UserModelRun, work_kw: dict) -> _Completed:
    """`_workload_and_compute` for a user's model, timed here or traced on meta only."""
    w, compute, memory = evidence.request.workload, evidence.compute, evidence.request.memory
    record, order = user.record, user.order
    origins: list = []
    notes: list[str] = [order.note] if order.note else []
    stands = user.timed and timing_stands(record, compute)
    workload = Workload(user_layout(record, order), **work_kw,
                        measured_memory=record.get("memory") if stands else None)
    if record.get("checkpointing"):
        notes.append(describe_wrapped(record["checkpointing"]))
    modelled, why = _user_model_modelled(record, compute, evidence)
    if why is not None:  # a what-if whose own ops could not be priced: the datasheet's range stands in
        _need_tokens_for_the_datasheet(w, compute, why)
        notes.append(fallback_note(why))
    if stands:
        if not modelled and why is None:
            compute, origins = _measured(compute, user_compute(record))
    elif user.timed:  # --time-here on a what-if: shown, never as the GPU predicted's compute
        notes.append(_timed_elsewhere_note(user_compute(record), record, compute.gpu))
    memory = _memory_of_the_timed_gpu(memory, compute, record, origins)
    # measured here: the model beside it
    if user.timed and not modelled and why is None and record["device"].startswith("cuda"):
        modelled, why = priced(record.get("op_trace"), evidence.pricing)
        if why is not None:
            notes.append(f"compute: the model's own ops could not be priced beside the measured time ({why})")
    return _Completed(workload, compute, memory, origins, notes, modelled)


def _preset_or_params(evidence: Evidence, work_kw: dict) -> _Completed:
    """`_workload_and_compute` for a preset (timed on this GPU where it has one) or `--params`."""
    w, compute, memory = evidence.request.workload, evidence.compute, evidence.request.memory
    origins: list = []
    notes: list[str] = []
    workload = (Workload.from_preset(w.preset, w.image_size, **work_kw) if w.preset
                else Workload.from_params(_param_count(w), **work_kw))
    timed = evidence.preset_timed
    if timed is not None:
        compute, origins = _measured(compute, timed)
        if timed.get("memory"):  # timed whole on this GPU: its memory too
            workload = replace(workload, measured_memory=timed["memory"])
        memory = _memory_of_the_timed_gpu(memory, compute, timed, origins)
    timed_gpu = (timed or {}).get("device_name")
    main, why = evidence.main_trace, None
    modelled: dict = {}
    if main is not None:
        if main.why is not None:
            why = main.why
        else:
            modelled, why = priced(main.trace, evidence.pricing, main.note)
    if why is not None:
        notes.append(fallback_note(why) if timed_gpu is None else
                     f"compute: the model's own ops could not be priced beside the measured time ({why})")
    return _Completed(workload, compute, memory, origins, notes, modelled)


def _with_traced_memory(workload: Workload, traced: TracedMemory | str | None, user: bool):
    """(`workload` with the memory its passes counted, a note or None): a user's model keeps why
    its passes failed for the search to say; a preset's failure is a note, and its main pass
    alone counts it."""
    if traced is None:
        return workload, None
    if isinstance(traced, TracedMemory):
        return replace(workload, traced_memory=traced), None
    if user:
        return replace(workload, traced_memory_failure=traced), None
    return workload, f"memory: the passes at 1 and 2 blocks failed ({traced}); counted from the main pass only"


def _param_count(w: WorkloadRequest) -> int:
    """--params, where the request names no preset (it names one or the other)."""
    count = w.param_count
    assert count is not None
    return count


def _timed_elsewhere_note(measured: dict, record: dict, gpu: str | None) -> str:
    return (f"timed here (--time-here): {measured['micro_batch_time_s'] * 1e3:,.1f} ms per micro-batch on "
            f"{record.get('device_name') or record['device']}, this machine, not the {gpu} predicted: not used")


def _need_tokens_for_the_datasheet(w: WorkloadRequest, compute: ComputeRequest, why: str) -> None:
    """The datasheet's range prices tokens: a text model's what-if without them cannot stand in."""
    if w.tokens is None and not compute.given and compute.utilization is None:
        raise InputError(f"--model {w.user_model}: its own ops could not be priced ({why}), and the datasheet range "
                         "that stands in needs --tokens N (tokens per GPU per micro-batch); or give --micro-batch-time")


def _user_model_modelled(record: dict, compute: ComputeRequest, evidence: Evidence) -> tuple[dict, str | None]:
    """The user's model on the GPU predicted: ({}, None) where the timing stands (no --gpu, or
    timed on that GPU; the modelled range then goes beside it), else the modelled fields, or
    ({}, why) where its ops could not be priced."""
    if not what_if_priced(compute):
        return {}, None
    if compute.gpu is not None and flop_order_reason(record["device"], record.get("device_name"), compute.gpu,
                                                     None) is None:
        return {}, None  # timed on the GPU predicted
    return priced(record.get("op_trace"), evidence.pricing)


def _measured(compute: ComputeRequest, measured: dict) -> tuple[ComputeRequest, list]:
    """The compute request completed with measured values where the user gave none, and where
    each came from."""
    origins, filled = [], {}
    for key in ("micro_batch_time_s", "backward_fraction", "optimizer_time_s"):
        if getattr(compute, key) is None and not compute.calibration:
            filled[key] = measured[key]
            origins.append((key, measured["source"]))
    return replace(compute, **filled), origins


def _memory_of_the_timed_gpu(memory: MemoryRequest, compute: ComputeRequest, timed: dict,
                             origins: list) -> MemoryRequest:
    """The GPU the compute was timed on, when no other is named: its memory (as CUDA saw it in the
    worker that timed it) is what the strategies must fit in, unless --gpu-memory says otherwise."""
    total = timed.get("device_memory_bytes")
    if memory.gpu_memory_gb is not None or compute.gpu is not None or not total:
        return memory
    origins.append(("gpu_memory_gb", f"{timed.get('device_name') or 'the GPU'}'s memory as CUDA reported it "
                                     "where the compute was timed"))
    return replace(memory, gpu_memory_gb=total / 1e9)


def _compute(compute: ComputeRequest, memory: MemoryRequest, calibration: dict | None, modelled: dict | None = None):
    common = dict(gpu=compute.gpu, precision=compute.precision, utilization=compute.utilization,
                  gpu_memory_gb=memory.gpu_memory_gb, optimizer=compute.optimizer,
                  optimizer_time_s=compute.optimizer_time_s, backward_fraction=compute.backward_fraction,
                  **(modelled or {}))
    if calibration is not None:
        return Compute.from_calibration(calibration, **{k: v for k, v in common.items()
                                                        if v is not None and k not in calibration})
    if compute.micro_batch_time_s is None and compute.gpu is None and not (modelled or {}).get("modelled_s"):
        raise InputError("compute per micro-batch is unknown: give --micro-batch-time SECONDS (measured), "
                         "--calibration FILE (from `topoprof validate`), or --gpu NAME with --tokens N")
    return Compute(micro_batch_time_s=compute.micro_batch_time_s, **common)


