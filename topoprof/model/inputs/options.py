"""The model's inputs from what `topoprof model` is asked (`request.ModelRequest`): a parameter
count, preset or the user's model; links from a bench measurement, a topology or explicit numbers
(one GPU or one GPU per node needs no intra-node link); compute from a measurement, a calibration
or a GPU name. `build_inputs` measures or traces only what the request leaves open."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from topoprof.errors import InputError
from topoprof.jsonio import load_json
from topoprof.measure.runner import visible_gpus
from topoprof.model.comm import links
from topoprof.model.comm.collectives import HierarchicalComm
from topoprof.model.compute.datasheet import lookup_gpu, lookup_gpu_quietly
from topoprof.model.compute.profile import load_profile
from topoprof.model.compute.timing import CALIBRATION_KEYS, Compute
from topoprof.model.compute.traced import (
    fallback_note,
    model_on_gpu,
    params_request,
    preset_request,
    priced,
    target_for,
)
from topoprof.model.fsdp.plan import fsdp_plan
from topoprof.model.inputs.request import ClusterRequest, ComputeRequest, MemoryRequest, ModelRequest, WorkloadRequest
from topoprof.model.inputs.traces import with_traced_memory
from topoprof.model.inputs.user_model import (
    choose_ready_order,
    flop_order_reason,
    here_device,
    measure_here,
    measure_preset,
    names_this_gpu,
    stated_shape,
    trace_only,
    trace_wanted,
    user_compute,
    user_layout,
)
from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
from topoprof.model.strategies.whatif import standard_link
from topoprof.topology.build import with_compute_capability
from topoprof.topology.collect import collect_topology
from topoprof.topology.constants import STANDARD_NODE_GPUS
from topoprof.topology.load import topology_from_file
from topoprof.workload.checkpointing import describe_wrapped
from topoprof.workload.presets import context_sequences, is_vision

Progress = Callable[[str], None]  # hears what a long stage waits for (`topoprof model` shows it on a terminal)


def _load_topology(path: str):
    """A saved `nvidia-smi topo -m` text or a `topoprof topo --json` document."""
    return topology_from_file(path)


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


def build_comm(cluster: ClusterRequest, gpu: str | None = None, progress: Progress | None = None):
    """(CommModel for one node or None when none is needed, gpus_per_node, description) from
    the first source given; `gpu` (--gpu) pins a topology's NVLink generation; `progress` hears
    when this machine's topology is read."""
    gpn, chosen = cluster.given_gpus_per_node(), list(cluster.gpus) if cluster.gpus else None
    if cluster.bench:
        lat, bw, world, fit = links.load_bench_fit(cluster.bench)
        comm = links.measured_comm(fit["rows"], fit, world, f"all-reduce measured in {cluster.bench}")
        return comm, world, {"bench": cluster.bench, **({"backend": fit["backend"]} if fit.get("backend") else {})}
    # One GPU per node needs no intra-node link: do not ask for one nor probe this machine.
    # A single --gpus index is checked against a --topology file when one is given.
    one_index = chosen is not None and len(chosen) == 1
    if (gpn == 1 and chosen is None) or (one_index and not cluster.topology):
        return _no_link(cluster)
    if cluster.link_bandwidth_gbps is not None:
        if not gpn:
            raise InputError("--link-bandwidth needs --world-size (or --gpus-per-node with --nodes)")
        lat = cluster.link_latency_us if cluster.link_latency_us is not None else 0.0
        return (links.comm_explicit(cluster.link_bandwidth_gbps, lat, gpn), gpn,
                {"link_bandwidth_gbps": cluster.link_bandwidth_gbps})
    if cluster.topology:
        topology = _load_topology(cluster.topology)
    else:
        if progress is not None:
            progress("reading this machine's topology (NVML, nvidia-smi)")
        topology = collect_topology()
        if gpu is not None and gpn and not _holds(topology, gpu):  # a what-if: the GPU's own node
            return _standard_node(gpu, gpn, cluster)
        if not topology.gpus:
            raise InputError("no link information: this machine has no GPU; give --bench FILE, "
                             "--topology FILE or --link-bandwidth GB/s (or --world-size 1 for one GPU)")
    topology, origin, notes = _pin_nvlink_generation(topology, gpu, chosen)
    comm, ring = links.comm_from_topology(topology, chosen, rate_origin=origin)
    return comm, comm.world_size, {"topology": cluster.topology or "this machine", **ring,
                                   **({"notes": notes} if notes else {})}


def _holds(topology, name: str) -> bool:
    """Whether this machine's GPUs are the one --gpu names (by their datasheet rows)."""
    wanted = lookup_gpu_quietly(name)
    here = [lookup_gpu_quietly(g.name) for g in topology.gpus]
    return wanted is not None and any(row is not None and row.name == wanted.name for row in here)


def _standard_node(name: str, gpn: int, cluster: ClusterRequest) -> tuple:
    """--gpu without a link: the node its datasheet's form is sold in (`whatif.standard_link`),
    said in one line; refused where it has no such link or the job's node holds more GPUs."""
    link, spec = standard_link(name), lookup_gpu_quietly(name)
    if link is None:
        raise InputError(f"no link information: --gpu {name} has no nominal link in the datasheet table; give "
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


def _pin_nvlink_generation(topology, name: str | None, chosen: list[int] | None):
    """--gpu names the GPU, so its compute capability and with it the NVLink per-link rate, for
    the GPUs the topology gives none (a saved `nvidia-smi topo -m` text never does); a GPU's own
    capability is kept, with a note when --gpu disagrees. (topology, origin or None, notes)."""
    if name is None:
        return topology, None, []

    origin = f"--gpu {name}"
    used = set(chosen) if chosen is not None else {g.index for g in topology.gpus}
    lacking = any(g.compute_capability is None for g in topology.gpus if g.index in used)
    spec = lookup_gpu(name)
    assert spec is not None and spec.compute_capability is not None  # --gpu was looked up before
    topology, notes = with_compute_capability(topology, spec.compute_capability, origin)
    return topology, origin if lacking else None, notes


def _workload_options(w: WorkloadRequest, memory: MemoryRequest) -> dict:
    return dict(grad_bytes=w.grad_bytes, micro_batch_size=w.micro_batch_size, tokens_per_micro_batch=w.tokens,
                bucket_cap_mb=w.bucket_cap_mb, activation_memory_gb=memory.activation_memory_gb, **w.fsdp_bytes(),
                checkpointing=w.checkpointing)


def build_inputs(request: ModelRequest, progress: Progress | None = None):
    """(ModelInputs, what was described of the links and the sources) for the request;
    `progress` hears what it waits for (a model traced or timed, this machine's topology read)."""
    workload, compute, memory, origins, notes, modelled = _workload_and_compute(request, progress)
    if workload.fsdp_unit is not None:  # a unit that wraps nothing is a bad option, not a silent n/a

        fsdp_plan(workload.layout, workload.fsdp_unit)
    cl = request.cluster
    comm, gpn, described = build_comm(cl, request.compute.gpu, progress)
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
    resolved = _compute(compute, memory, modelled)
    if origins:
        resolved = replace(resolved, origins=tuple(origins))
    return ModelInputs(workload, resolved, cluster, accumulation_steps=request.accum), described


def _workload_and_compute(request: ModelRequest, progress: Progress | None = None):
    """The workload, and the compute and memory requests completed with what was measured here:
    (workload, compute, memory, origins of measured values, notes, modelled fields)."""
    w, compute, memory = request.workload, request.compute, request.memory
    if compute.gpu is None and compute.gpu_profile is not None:  # the profile's GPU: its memory, its optimizer
        profiled = lookup_gpu_quietly(_gpu_profile(compute).machine.device)
        compute = replace(compute, gpu=profiled.name) if profiled is not None else compute
    work_kw = _workload_options(w, memory)
    origins: list = []
    notes: list[str] = []
    timed_gpu = None  # the name of this machine's GPU where the compute was timed on it
    if w.user_model:
        record, order = _user_model_here(w, compute, progress)
        timed = "passes" in record  # else traced on meta only
        stands = timed and _timing_stands(record, compute)
        workload = Workload(user_layout(record, order), **work_kw,
                            measured_memory=record.get("memory") if stands else None)
        notes += [order.note] if order.note else []
        if record.get("checkpointing"):
            notes.append(describe_wrapped(record["checkpointing"]))
        modelled, why = _user_model_modelled(record, compute)
        if why is not None:  # a what-if whose own ops could not be priced: the datasheet's range stands in
            _need_tokens_for_the_datasheet(w, compute, why)
            notes.append(fallback_note(why))
        if stands:
            if not modelled and why is None:
                compute, origins = _measured(compute, user_compute(record))
        elif timed:  # --time-here on a what-if: shown, never as the GPU predicted's compute
            notes.append(_timed_elsewhere_note(user_compute(record), record, compute.gpu))
        memory = _memory_of_the_timed_gpu(memory, compute, record, origins)
        # measured here: the model beside it
        if timed and not modelled and why is None and record["device"].startswith("cuda"):
            modelled, why = priced(record.get("op_trace"), compute.gpu or record.get("device_name") or "GPU0",
                                   compute.precision, compute.compiled, None, _gpu_profile(compute),
                                   compute.gpu_profile)
            if why is not None:
                notes.append(f"compute: the model's own ops could not be priced beside the measured time ({why})")
    else:
        workload = (Workload.from_preset(w.preset, w.image_size, **work_kw) if w.preset
                    else Workload.from_params(_param_count(w), **work_kw))
        if w.preset and not compute.given and _this_gpu_predicted(compute):
            measured = _preset_on_this_gpu(w, compute, progress)
            if measured is not None:
                compute, origins = _measured(compute, measured)
                if measured.get("memory"):  # timed whole on this GPU: its memory too
                    workload = replace(workload, measured_memory=measured["memory"])
                timed_gpu = measured.get("device_name")
                memory = _memory_of_the_timed_gpu(memory, compute, measured, origins)
        modelled, why = _traced_modelled(w, compute, timed_gpu, progress)
        if why is not None:
            notes.append(fallback_note(why) if timed_gpu is None else
                         f"compute: the model's own ops could not be priced beside the measured time ({why})")
    if compute.compiled and not modelled.get("modelled_s"):
        notes.append("--compiled applies to compute modelled from the model's ops; here the compute is "
                     "measured or given, as it ran")
    if compute.gpu or timed_gpu:  # what a micro-batch holds under each checkpointing mode, from small passes

        if progress is not None and w.user_model:
            progress(f"tracing {w.user_model} at other micro-batch sizes and checkpointing modes on meta")
        workload, note = with_traced_memory(workload, w, compute.gpu or timed_gpu, compute.precision)
        notes += [note] if note else []
    return workload, compute, memory, origins, notes, modelled


def _this_gpu_predicted(compute: ComputeRequest) -> bool:
    """No --gpu, or --gpu naming this machine's GPU: what is timed here is the device predicted.
    A --gpu of another GPU (or any --gpu on a machine without one) is a what-if, which never runs
    the model here."""
    if compute.gpu is None:
        return True

    return names_this_gpu(compute.gpu)


def _user_model_here(w: WorkloadRequest, compute: ComputeRequest, progress: Progress | None = None):
    """The user's model and the gradient-ready order that fits the device predicted. A what-if
    (`_this_gpu_predicted` false) traces it on the meta device only, unless --time-here asks for
    a timing here too: its order is the backward FLOPs per tensor. Otherwise it is timed here, and
    its order is the timed one on this GPU, else the backward FLOPs per tensor from a pass on the
    meta device at the stated shape. The same pass, for the GPU predicted (or timed), prices its
    ops: one pass in the same worker, run where either may be needed."""
    assert w.user_model is not None
    say = progress or (lambda text: None)
    if not (w.time_here or _this_gpu_predicted(compute)):
        say(f"tracing {w.user_model} on the meta device for {compute.gpu} (starting its worker: importing torch)")
        return trace_only(w.user_model, w.micro_batch_size, w.tokens, compute.precision, progress,
                          w.checkpointing.text, w.fsdp_unit, compute.gpu)
    device = here_device()
    priced_for = compute.gpu or compute.gpu_profile or device.startswith("cuda")
    target = target_for(compute.precision, _gpu_profile(compute), compute.gpu) if priced_for else None
    wanted = trace_wanted(device, compute.gpu, compute.micro_batch_time_s) or target is not None
    say(f"timing {w.user_model} on {device} (starting its worker: importing torch)")
    record = measure_here(w.user_model, compute.precision, compute.optimizer, device=device,
                          trace=stated_shape(w.micro_batch_size, w.tokens) if wanted else None, target=target,
                          progress=progress, ac=w.checkpointing.text, unit=w.fsdp_unit)
    return record, choose_ready_order(record, compute.gpu, compute.micro_batch_time_s)


def _timing_stands(record: dict, compute: ComputeRequest) -> bool:
    """A timing here is the compute predicted where no --gpu is named, or the --gpu is the GPU it
    was timed on; never another device's."""
    return compute.gpu is None or flop_order_reason(record["device"], record.get("device_name"), compute.gpu,
                                                    None) is None


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


def _user_model_modelled(record: dict, compute: ComputeRequest) -> tuple[dict, str | None]:
    """The user's model on the GPU predicted: ({}, None) where the timing stands (no --gpu, or
    timed on that GPU; the modelled range then goes beside it), else the modelled fields, or
    ({}, why) where its ops could not be priced."""
    if (compute.gpu is None and compute.gpu_profile is None) or compute.given or compute.utilization is not None:
        return {}, None
    if compute.gpu is not None and flop_order_reason(record["device"], record.get("device_name"), compute.gpu,
                                                     None) is None:
        return {}, None  # timed on the GPU predicted
    return priced(record.get("op_trace"), compute.gpu, compute.precision, compute.compiled, None,
                  _gpu_profile(compute), compute.gpu_profile)


def _traced_modelled(w: WorkloadRequest, compute: ComputeRequest, timed_gpu: str | None,
                     progress: Progress | None = None) -> tuple[dict, str | None]:
    """A preset's or `--params` compute from its own ops: as the compute where nothing measured it
    on a --gpu what-if, or beside the time measured on this GPU. ({}, None) where neither
    applies (compute given, calibrated, or a utilization given); ({}, why) where it failed."""
    gpu = compute.gpu or timed_gpu
    profile = _gpu_profile(compute)
    what_if = (not compute.given and compute.utilization is None
               and (compute.gpu is not None or compute.gpu_profile is not None))
    if (gpu is None and profile is None) or not (what_if or timed_gpu is not None):
        return {}, None
    if timed_gpu is not None and profile is None and lookup_gpu_quietly(timed_gpu) is None:
        return {}, f"{timed_gpu} is not in the datasheet table"
    ac = w.checkpointing.text
    request = (preset_request(w.preset, w.micro_batch_size, w.tokens, w.image_size, ac, w.preset_sizes) if w.preset
               else params_request(_param_count(w), w.micro_batch_size, w.tokens, ac))
    if progress is not None and not isinstance(request, str):
        progress(f"tracing {w.what()} on the meta device for {gpu} (starting its worker: importing torch)")
    return model_on_gpu(request, gpu, compute.precision, compute.compiled, profile, compute.gpu_profile, progress)


def _gpu_profile(compute: ComputeRequest):
    """The --gpu-profile's profile (checked when the request was built), or None."""
    if compute.gpu_profile is None:
        return None

    return load_profile(compute.gpu_profile)


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


def _preset_on_this_gpu(w: WorkloadRequest, compute: ComputeRequest, progress: Progress | None = None) -> dict | None:
    """A preset timed at its real size on this machine's first GPU; None without a GPU (the
    datasheet estimate, or the user's own figures, then stand in)."""
    if not visible_gpus():
        return None

    batch, preset, ac = w.micro_batch_size, w.preset_name, w.checkpointing.text
    assert preset is not None  # timed only for a preset
    if progress is not None:
        progress(f"timing {preset} on cuda:0 (starting its worker: importing torch)")
    more: dict[str, Any] = {**({"progress": progress} if progress is not None else {}),
            **({"sizes": w.preset_sizes} if w.preset_sizes else {})}
    if is_vision(preset):
        return measure_preset(preset, batch, None, "cuda:0", compute.precision, compute.optimizer,
                              image_size=w.image_size, ac=ac, **more)
    # a sample past the context as sequences of it, as the op trace runs it
    sequences, seq_len = context_sequences(preset, batch, w.tokens)[:2] if w.tokens else (batch, None)
    return measure_preset(preset, sequences, seq_len, "cuda:0", compute.precision, compute.optimizer, ac=ac, **more)


def _compute(compute: ComputeRequest, memory: MemoryRequest, modelled: dict | None = None):
    common = dict(gpu=compute.gpu, precision=compute.precision, utilization=compute.utilization,
                  gpu_memory_gb=memory.gpu_memory_gb, optimizer=compute.optimizer,
                  optimizer_time_s=compute.optimizer_time_s, backward_fraction=compute.backward_fraction,
                  **(modelled or {}))
    if compute.calibration:
        calibration = _read_calibration(compute.calibration)
        return Compute.from_calibration(calibration, **{k: v for k, v in common.items()
                                                        if v is not None and k not in calibration})
    if compute.micro_batch_time_s is None and compute.gpu is None and not (modelled or {}).get("modelled_s"):
        raise InputError("compute per micro-batch is unknown: give --micro-batch-time SECONDS (measured), "
                         "--calibration FILE (from `topoprof validate`), or --gpu NAME with --tokens N")
    return Compute(micro_batch_time_s=compute.micro_batch_time_s, **common)


def _read_calibration(path: str) -> dict:
    doc = load_json(path)
    calibration = doc.get("calibration", doc)
    found = {k: calibration[k] for k in CALIBRATION_KEYS if calibration.get(k) is not None}
    if "micro_batch_time_s" not in found:
        raise InputError(f"{path}: no micro_batch_time_s in its calibration (expected `topoprof validate --json` "
                         f"output)")
    return found
