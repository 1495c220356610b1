"""The model's inputs from what a user gives: a parameter count or preset, links from a bench
measurement, a topology or explicit numbers (one GPU or one GPU per node needs no intra-node
link), and compute from a measurement, a calibration or a GPU name."""
from __future__ import annotations

import re

from topoprof.errors import InputError
from topoprof.model.compute.traced import fallback_note


_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)\s*$")


_COUNT_UNITS = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_count(text: str) -> int:
    """'124439808', '125M', '1.3B', '7B' -> parameters (decimal units, as model names use)."""
    match = _COUNT_RE.match(text)
    if not match:
        raise InputError(f"--params {text!r}: expected a number with optional K, M, B or T (e.g. 125M, 1.3B, 7B)")
    value = float(match.group(1)) * _COUNT_UNITS[match.group(2).lower()]
    if value < 1:
        raise InputError(f"--params {text!r} = {value:g}: must be >= 1")
    return int(round(value))


def _gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        chosen = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        chosen = []
    if not chosen:
        raise InputError(f"--gpus {text!r}: expected a comma list of GPU indices, e.g. 0,1,2,3")
    return chosen


def _load_topology(path: str):
    """A saved `nvidia-smi topo -m` text or a `topoprof topo --json` document."""
    from topoprof.topology.load import topology_from_file

    return topology_from_file(path)


def _gpus_per_node(opts: dict) -> int | None:
    """GPUs per node from --gpus-per-node, or --world-size over --nodes; None when not given."""
    if opts["gpus_per_node"]:
        return opts["gpus_per_node"]
    world, nodes = opts["world_size"], opts["nodes"]
    if world is None:
        return None
    gpn, rest = divmod(world, nodes)
    if rest or gpn < 1:
        raise InputError(f"world_size({world}) != nodes({nodes}) * gpus_per_node(an integer)")
    return gpn


_LINK_OPTIONS = (("link_bandwidth", "--link-bandwidth"), ("link_latency", "--link-latency"),
                 ("topology", "--topology"))


def _no_link_text(nodes: int) -> str:
    return ("one GPU: nothing to all-reduce" if nodes == 1 else
            "one GPU per node, so no intra-node link: every ring edge crosses the network")


def _no_link(opts: dict, chosen: list[int] | None) -> tuple[None, int, dict]:
    """One GPU per node: no edge inside a node, so no intra-node link is needed (and with one
    node, no link at all); link options given anyway are ignored, with a note."""
    described: dict = {"no_link": _no_link_text(opts["nodes"])}
    if chosen:
        described["gpus"] = chosen
    ignored = [flag for key, flag in _LINK_OPTIONS if opts[key] is not None]
    if ignored:
        why = "one GPU needs no link" if opts["nodes"] == 1 else "one GPU per node has no intra-node link"
        described["notes"] = [f"{', '.join(ignored)} ignored: {why}"]
    return None, 1, described


def build_comm(opts: dict):
    """(CommModel for one node or None when none is needed, gpus_per_node, description) from
    the first source given."""
    from topoprof.model.comm import links

    gpn, chosen = _gpus_per_node(opts), _gpus(opts["gpus"])
    if opts["bench"]:
        lat, bw, world, fit = links.load_bench_fit(opts["bench"])
        comm = links.measured_comm(fit["rows"], fit, world, f"all-reduce measured in {opts['bench']}")
        return comm, world, {"bench": opts["bench"], **({"backend": fit["backend"]} if fit.get("backend") else {})}
    # One GPU per node needs no intra-node link: do not ask for one nor probe this machine.
    # A single --gpus index is checked against a --topology file when one is given.
    one_index = chosen is not None and len(chosen) == 1
    if (gpn == 1 and chosen is None) or (one_index and not opts["topology"]):
        return _no_link(opts, chosen)
    if opts["link_bandwidth"] is not None:
        if not gpn:
            raise InputError("--link-bandwidth needs --world-size (or --gpus-per-node with --nodes)")
        lat = opts["link_latency"] if opts["link_latency"] is not None else 0.0
        return links.comm_explicit(opts["link_bandwidth"], lat, gpn), gpn, {"link_bandwidth_gbps": opts["link_bandwidth"]}
    if opts["topology"]:
        topology = _load_topology(opts["topology"])
    else:
        from topoprof.topology.collect import collect_topology

        topology = collect_topology()
        if not topology.gpus:
            raise InputError("no link information: this machine has no GPU; give --bench FILE, "
                             "--topology FILE or --link-bandwidth GB/s (or --world-size 1 for one GPU)")
    topology, origin, notes = _pin_nvlink_generation(topology, opts.get("gpu"), chosen)
    comm, ring = links.comm_from_topology(topology, chosen, rate_origin=origin)
    return comm, comm.world_size, {"topology": opts["topology"] or "this machine", **ring,
                                   **({"notes": notes} if notes else {})}


def _pin_nvlink_generation(topology, name: str | None, chosen: list[int] | None):
    """--gpu names the GPU, so its compute capability and with it the NVLink per-link rate, for
    the GPUs the topology gives none (a saved `nvidia-smi topo -m` text never does); a GPU's own
    capability is kept, with a note when --gpu disagrees. (topology, origin or None, notes)."""
    if name is None:
        return topology, None, []
    from topoprof.model.compute.datasheet import lookup_gpu
    from topoprof.topology.build import with_compute_capability

    _check_gpu_name(name)
    origin = f"--gpu {name}"
    used = set(chosen) if chosen is not None else {g.index for g in topology.gpus}
    lacking = any(g.compute_capability is None for g in topology.gpus if g.index in used)
    topology, notes = with_compute_capability(topology, lookup_gpu(name).compute_capability, origin)
    return topology, origin if lacking else None, notes


def build_inputs(opts: dict):
    from topoprof.model.comm import links
    from topoprof.model.comm.collectives import HierarchicalComm
    from topoprof.model.strategies.job import Cluster, ModelInputs, Workload
    from topoprof.model.compute.timing import Compute

    user = opts.get("user_model")
    if sum(x is not None for x in (opts["params"], opts["preset"], user)) != 1:
        raise InputError("give exactly one of --params N, --preset NAME or --model PATH.py:CALLABLE")
    check_image_options(opts["preset"], opts.get("image_size"), opts["tokens"])
    _check_tokens_for_a_what_if(opts)
    work_kw = dict(grad_bytes=opts["grad_bytes"], micro_batch_size=opts["micro_batch_size"],
                   tokens_per_micro_batch=opts["tokens"], bucket_cap_mb=opts["bucket_cap_mb"],
                   activation_memory_gb=opts.get("activation_memory"), **fsdp_options(opts))
    origins: list = []
    notes: list[str] = []
    timed_gpu = None  # the name of this machine's GPU where the compute was timed on it
    if user:
        from topoprof.model.inputs.user_model import user_compute, user_layout

        record, order = _user_model_here(user, opts)
        workload = Workload(user_layout(record, order), **work_kw, measured_memory=record.get("memory"))
        notes += [order.note] if order.note else []
        modelled, why = _user_model_modelled(record, opts)
        if why is not None:  # timed on another device than the GPU predicted, and its ops not priced
            notes.append(f"compute: the model's own ops could not be priced for {opts['gpu']} ({why}); "
                         f"the compute is the time measured on {record['device']}, another device")
        if not modelled:
            opts, origins = _measured(opts, user_compute(record))
        opts = _memory_of_the_timed_gpu(opts, record, origins)
        if not modelled and why is None and record["device"].startswith("cuda"):  # measured here: the model beside it
            from topoprof.model.compute.traced import priced

            modelled, why = priced(record.get("op_trace"), opts["gpu"] or record.get("device_name") or "GPU0",
                                   opts["precision"], bool(opts.get("compiled")))
            if why is not None:
                notes.append(f"compute: the model's own ops could not be priced beside the measured time ({why})")
    else:
        workload = (Workload.from_preset(opts["preset"], opts.get("image_size"), **work_kw) if opts["preset"]
                    else Workload.from_params(parse_count(opts["params"]), **work_kw))
        if opts["preset"] and opts["micro_batch_time"] is None and not opts["calibration"]:
            measured = _preset_on_this_gpu(opts)
            if measured is not None:
                opts, origins = _measured(opts, measured)
                if measured.get("memory"):  # timed whole on this GPU: its memory too
                    from dataclasses import replace

                    workload = replace(workload, measured_memory=measured["memory"])
                timed_gpu = measured.get("device_name")
                opts = _memory_of_the_timed_gpu(opts, measured, origins)
        modelled, why = _traced_modelled(opts, timed_gpu)
        if why is not None:
            notes.append(fallback_note(why) if timed_gpu is None else
                         f"compute: the model's own ops could not be priced beside the measured time ({why})")
    if opts.get("compiled") and not modelled.get("modelled_s"):
        notes.append("--compiled applies to compute modelled from the model's ops; here the compute is "
                     "measured or given, as it ran")
    if workload.fsdp_unit is not None:  # a unit that wraps nothing is a bad option, not a silent n/a
        from topoprof.model.fsdp.plan import fsdp_plan

        fsdp_plan(workload.layout, workload.fsdp_unit)
    comm, gpn, described = build_comm(opts)
    if notes:
        described["notes"] = [*described.get("notes", []), *notes]
    nodes = opts["nodes"]
    if opts["world_size"] is not None and opts["world_size"] != nodes * gpn:
        raise InputError(f"world_size({opts['world_size']}) != nodes({nodes}) * gpus_per_node({gpn})")
    comm = links.across_nodes(comm, nodes, gpn, opts["network_bandwidth"], opts["network_latency"])
    if "no_link" in described:  # a one-GPU topology may be one node of several
        described["no_link"] = _no_link_text(nodes)
    if isinstance(comm, HierarchicalComm):  # the network level, for the `links` echo
        described.update(network_bandwidth_gbps=comm.inter.link_bandwidth_gbps,
                         network_latency_us=comm.inter.hop_latency_us)
    # the links measured by a bench on gloo (CPU ranks) carry its blocking collectives to FSDP
    cluster = Cluster(comm, nodes=nodes, gpus_per_node=gpn,
                      backend="gloo" if described.get("backend") == "gloo" else "nccl")
    compute = _compute(opts, Compute, modelled)
    if origins:
        from dataclasses import replace

        compute = replace(compute, origins=tuple(origins))
    return ModelInputs(workload, compute, cluster, accumulation_steps=opts["accum"]), described


def fsdp_options(opts: dict) -> dict:
    """FSDP's MixedPrecisionPolicy bytes and wrap unit from `model`'s options (absent elsewhere)."""
    from topoprof.model.fsdp.timeline import DTYPE_BYTES

    out = {}
    for key, option in (("fsdp_param_bytes", "fsdp_param_dtype"), ("fsdp_reduce_bytes", "fsdp_reduce_dtype")):
        if opts.get(option) is not None:
            if opts[option] not in DTYPE_BYTES:
                raise InputError(f"--{option.replace('_', '-')} {opts[option]}: valid: {', '.join(DTYPE_BYTES)}")
            out[key] = DTYPE_BYTES[opts[option]]
    unit = opts.get("fsdp_unit")
    if unit is not None:
        if not unit.strip() or unit.strip(".") != unit.strip():
            raise InputError(f"--fsdp-unit {unit!r}: a module name such as model.layers")
        out["fsdp_unit"] = unit.strip()
    return out


def check_image_options(preset: str | None, image_size: int | None, tokens: int | None) -> None:
    """--image-size only with a vision preset; --tokens not with one (its FLOPs count the
    micro-batch's images, --micro-batch-size of them)."""
    from topoprof.model.workload.presets import VISION_PRESETS, get_preset, is_vision

    if is_vision(preset):
        if tokens is not None:
            raise InputError(f"--tokens: {preset.strip().lower()} is an image model: its FLOPs are per image, "
                             "--micro-batch-size images per micro-batch (at --image-size); leave --tokens out")
        if image_size is not None:
            from topoprof.model.workload.vision import check_image_size

            check_image_size(image_size)
    elif image_size is not None:
        if preset:
            get_preset(preset, image_size)  # unknown name, or a text preset: refused by name
        raise InputError(f"--image-size applies to a vision preset ({', '.join(VISION_PRESETS)}), "
                         "not to --params or --model")


def _check_tokens_for_a_what_if(opts: dict) -> None:
    """A text model's --gpu what-if prices its tokens: without --tokens (or a compute measured
    or calibrated) it has nothing to price, so say which option is missing."""
    from topoprof.model.workload.presets import is_vision

    if (opts["gpu"] is None or opts["tokens"] is not None or opts["micro_batch_time"] is not None
            or opts["calibration"] or opts.get("user_model") or (opts["preset"] and is_vision(opts["preset"]))):
        return
    what = opts["preset"].strip().lower() if opts["preset"] else f"--params {opts['params']}"
    raise InputError(f"--tokens: a --gpu what-if of {what} needs the tokens per GPU per micro-batch (e.g. "
                     f"--tokens 1024 for one sequence of 1024), or give --micro-batch-time SECONDS (measured)")


def _user_model_here(spec: str, opts: dict):
    """The user's model timed here, and the gradient-ready order that fits the device predicted:
    the timed one on this GPU, else the backward FLOPs per tensor from a pass on the meta device
    at the stated shape. The same pass, for the GPU predicted (or timed), prices its ops: one pass
    in the same worker, run where either may be needed."""
    from topoprof.model.compute.traced import gpu_target
    from topoprof.model.inputs.user_model import (choose_ready_order, here_device, measure_here, stated_shape,
                                                  trace_wanted)

    device = here_device()
    target = gpu_target(opts["precision"]) if opts["gpu"] or device.startswith("cuda") else None
    wanted = trace_wanted(device, opts["gpu"], opts["micro_batch_time"]) or target is not None
    record = measure_here(spec, opts["precision"], opts["optimizer"], device=device,
                          trace=stated_shape(opts["micro_batch_size"], opts["tokens"]) if wanted else None,
                          target=target)
    return record, choose_ready_order(record, opts["gpu"], opts["micro_batch_time"])


def _user_model_modelled(record: dict, opts: dict) -> tuple[dict, str | None]:
    """The user's model on the GPU predicted: ({}, None) where the timing stands (no --gpu, or
    timed on that GPU; the modelled range then goes beside it), else the modelled fields, or
    ({}, why) where its ops could not be priced."""
    from topoprof.model.compute.traced import priced
    from topoprof.model.inputs.user_model import flop_order_reason

    gpu = opts["gpu"]
    if gpu is None or opts["micro_batch_time"] is not None or opts["calibration"] or opts["utilization"] is not None:
        return {}, None
    if flop_order_reason(record["device"], record.get("device_name"), gpu, None) is None:
        return {}, None  # timed on the GPU predicted
    return priced(record.get("op_trace"), gpu, opts["precision"], bool(opts.get("compiled")))


def _traced_modelled(opts: dict, timed_gpu: str | None) -> tuple[dict, str | None]:
    """A preset's or `--params` compute from its own ops: as the compute where nothing measured it
    on a --gpu what-if, or beside the time measured on this GPU. ({}, None) where neither
    applies (compute given, calibrated, or a utilization given); ({}, why) where it failed."""
    from topoprof.model.compute.traced import model_on_gpu, params_request, preset_request

    gpu = opts["gpu"] or timed_gpu
    what_if = (opts["micro_batch_time"] is None and not opts["calibration"] and opts["utilization"] is None
               and opts["gpu"] is not None)
    if gpu is None or not (what_if or timed_gpu is not None):
        return {}, None
    if timed_gpu is not None and _lookup_quietly(timed_gpu) is None:
        return {}, f"{timed_gpu} is not in the datasheet table"
    request = (preset_request(opts["preset"], opts["micro_batch_size"], opts["tokens"], opts.get("image_size"))
               if opts["preset"] else params_request(parse_count(opts["params"]), opts["micro_batch_size"], opts["tokens"]))
    return model_on_gpu(request, gpu, opts["precision"], bool(opts.get("compiled")))


def _lookup_quietly(name: str):
    import warnings

    from topoprof.model.compute.datasheet import lookup_gpu

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lookup_gpu(name)


def _measured(opts: dict, measured: dict) -> tuple[dict, list]:
    """Options completed with measured compute where the user gave none, and where each came from."""
    origins = []
    for key, option in (("micro_batch_time_s", "micro_batch_time"), ("backward_fraction", "backward_fraction"),
                        ("optimizer_time_s", "optimizer_time")):
        if opts[option] is None and not opts["calibration"]:
            opts = {**opts, option: measured[key]}
            origins.append((key, measured["source"]))
    return opts, origins


def _memory_of_the_timed_gpu(opts: dict, timed: dict, origins: list) -> dict:
    """The GPU the compute was timed on, when no other is named: its memory (as CUDA saw it in the
    worker that timed it) is what the strategies must fit in, unless --gpu-memory says otherwise."""
    total = timed.get("device_memory_bytes")
    if opts.get("gpu_memory") is not None or opts["gpu"] is not None or not total:
        return opts
    origins.append(("gpu_memory_gb", f"{timed.get('device_name') or 'the GPU'}'s memory as CUDA reported it "
                                     "where the compute was timed"))
    return {**opts, "gpu_memory": total / 1e9}


def _preset_on_this_gpu(opts: dict) -> dict | None:
    """A preset timed at its real size on this machine's first GPU; None without a GPU (the
    datasheet estimate, or the user's own figures, then stand in)."""
    from topoprof.measure.runner import visible_gpus

    if not visible_gpus():
        return None
    from topoprof.model.workload.presets import is_vision
    from topoprof.model.inputs.user_model import measure_preset

    batch, preset = opts["micro_batch_size"], opts["preset"].strip().lower()
    if is_vision(preset):
        return measure_preset(preset, batch, None, "cuda:0", opts["precision"], opts["optimizer"],
                              image_size=opts.get("image_size"))
    seq_len = max(1, opts["tokens"] // batch) if opts["tokens"] else None
    return measure_preset(preset, batch, seq_len, "cuda:0", opts["precision"], opts["optimizer"])


def _check_gpu_name(name: str | None) -> None:
    """An explicit --gpu must be one the datasheet table knows: refuse it by name, with the list."""
    if name is None:
        return
    import warnings

    from topoprof.model.compute.datasheet import known_gpus, lookup_gpu

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = lookup_gpu(name)
    if found is None:
        why = str(caught[0].message) if caught else f"GPU {name!r} is not in the datasheet table"
        raise InputError(f"--gpu: {why.split(' (known')[0]}; known: {', '.join(known_gpus())}")


def _compute(opts: dict, Compute, modelled: dict | None = None):
    _check_gpu_name(opts["gpu"])
    common = dict(gpu=opts["gpu"], precision=opts["precision"], utilization=opts["utilization"],
                  gpu_memory_gb=opts.get("gpu_memory"),
                  optimizer=opts["optimizer"], optimizer_time_s=opts["optimizer_time"],
                  backward_fraction=opts["backward_fraction"], **(modelled or {}))
    if opts["calibration"]:
        calibration = _read_calibration(opts["calibration"])
        return Compute.from_calibration(calibration, **{k: v for k, v in common.items()
                                                        if v is not None and k not in calibration})
    if opts["micro_batch_time"] is None and opts["gpu"] is None and not (modelled or {}).get("modelled_s"):
        raise InputError("compute per micro-batch is unknown: give --micro-batch-time SECONDS (measured), "
                         "--calibration FILE (from `topoprof validate`), or --gpu NAME with --tokens N")
    return Compute(micro_batch_time_s=opts["micro_batch_time"], **common)


def _read_calibration(path: str) -> dict:
    from topoprof.model.compute.timing import CALIBRATION_KEYS

    from topoprof.jsonio import load_json

    doc = load_json(path)
    calibration = doc.get("calibration", doc)
    found = {k: calibration[k] for k in CALIBRATION_KEYS if calibration.get(k) is not None}
    if "micro_batch_time_s" not in found:
        raise InputError(f"{path}: no micro_batch_time_s in its calibration (expected `topoprof validate --json` output)")
    return found
