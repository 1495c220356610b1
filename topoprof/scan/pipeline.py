"""The scan from start to report: topology, rank work, copies, predictions, verdict, advice, and
the files. Every stage that fails is a status in the report, never the end of the scan; only rank
work that failed part-way makes the scan fail (exit 3), with what it measured kept. A report that
cannot be written where asked goes to the temporary directory (exit 3 too), never nowhere."""
from __future__ import annotations

import datetime
import os
import platform
from dataclasses import dataclass, replace

from topoprof.errors import RunFailed, TopoprofError
from topoprof.jsonio import dumps, envelope, from_jsonable, to_jsonable
from topoprof.measure.bench import bench_payload, copies_payload, read_bench
from topoprof.measure.cluster import ClusterReport, nodes_from_ranks, summarize
from topoprof.measure.fit import fit_rows
from topoprof.measure.launch import external_job
from topoprof.measure.profile import measure_device_profile
from topoprof.model.comm.links import comm_from_topology
from topoprof.model.compute.profile_choice import gpu_target
from topoprof.model.inputs.scan import composed_check, predictions, single_gpu_what_ifs
from topoprof.model.inputs.user_model import here_device, measure_here
from topoprof.model.inputs.user_record import stated_shape
from topoprof.model.strategies.model_report import made, read_predictions
from topoprof.model.validate.run import summary
from topoprof.probing import ERROR, OK, PARTIAL, SKIPPED, UNAVAILABLE, ProbeStatus, attempt
from topoprof.report import recommend as rec
from topoprof.report.files import save_report
from topoprof.report.verdict import judge, read_ring
from topoprof.scan.ranks import environment, run_ranks, versions
from topoprof.topology.build import Topology
from topoprof.topology.collect import collect_topology, identified
from topoprof.topology.visible import JobView, identify, job_devices, job_gpu


def _banner(opts, topology) -> tuple[str, str]:
    if opts.backend == "gloo" and not topology.gpus:
        job = external_job()
        where = (f"across {job.nodes} nodes of a {job.launcher} job (TCP between the nodes)"
                 if job is not None and job.nodes > 1 else "on loopback")
        return ("gloo, CPU ranks", f"No GPU on this machine: measured with {opts.nproc} CPU rank(s) over gloo {where}, "
                "the same method the GPU path uses with NCCL. Link bandwidths here are host-memory and TCP "
                "figures, not GPU links; predictions for large models use this machine's measured CPU FLOP rate."
                + (f" This process is {opts.note}." if job is not None else ""))
    return (f"{opts.backend}, {opts.nproc} rank(s)", f"{opts.note}.")


def used_gpus(topology, nproc: int, backend: str, ranks=()) -> list[int]:
    """The node's GPUs the ranks on rank 0's node ran on: each rank's device as CUDA named it
    (UUID, PCI bus id; `ranks` as the bench's metadata lists them), else the job's first nproc
    devices (`topology.job_gpus`: CUDA_VISIBLE_DEVICES read as CUDA does). Empty where one of them
    is not known to be a whole GPU of the node (a MIG device, an unknown entry): a nominal ring
    over the others would not be the job's."""
    if backend != "nccl":
        return []
    devices = job_devices(topology)[:nproc]
    here = [r for r in ranks if r.get("node") == ranks[0].get("node")] if ranks else []
    if here and all(r.get("device_uuid") or r.get("device_bus_id") for r in here):
        identities = [(r.get("device_uuid"), r.get("device_bus_id")) for r in here]
        devices = identify(JobView(()), identities, topology.gpus).devices
    if any(d.gpu is None or d.mig for d in devices):
        return []
    return [d.gpu for d in devices if d.gpu is not None]  # all of them


def _ring(topology, gpus: list[int]) -> dict | None:
    if len(gpus) < 2:
        return None
    try:
        return comm_from_topology(topology, gpus)[1]
    except TopoprofError:  # a topology without usable pair data has no nominal ring
        return None


def _recommendations(report: dict, topo: Topology) -> list:
    recs = []
    for pred in made(read_predictions(report["predictions"])):
        label = pred.label or ""
        recs += rec.strategy_recommendations(pred, label)
        fit = rec.fit_recommendation(pred, label)
        recs += [fit] if fit else []
        fewer = rec.fewer_gpus_recommendation(pred, label)
        if fewer:
            recs.append(fewer)
    # One model's advice is enough per kind: keep the largest gain of each key.
    best: dict[str, rec.Recommendation] = {}
    for r in recs:
        if r.key not in best or (r.gain_pct or 0) > (best[r.key].gain_pct or 0):
            best[r.key] = r
    recs = list(best.values())
    recs += rec.gpu_choice_recommendations(topo)
    numa = rec.numa_recommendation(topo)
    recs += [numa] if numa else []
    overrides: dict[str, str] = {}
    nccl = read_bench(report["bench"]).nccl
    for log in (nccl.logs if nccl is not None else []):
        overrides.update(log.get("env_overrides") or {})
    recs += rec.environment_recommendations(topo, report["environment"], overrides)
    cluster = from_jsonable(ClusterReport, report["cluster"], "cluster") if report.get("cluster") else None
    slow_start = rec.slow_start_recommendation(cluster, read_predictions(report["predictions"]),
                                               report["mode"]["backend"], report["environment"])
    recs += [slow_start] if slow_start else []
    return rec.rank(recs)


def _ranks_status(bench, vres):
    """What became of the rank work: it ran, never started (nothing measured), or failed part-way."""
    measured = f"{len(bench.rows)} bench row(s)" + (f", {len(vres.modes())} validation mode(s)" if vres.modes() else "")
    if bench.status == "ok":
        return ProbeStatus("ranks", OK, measured)
    if not bench.rows:
        return ProbeStatus("ranks", ERROR, f"could not start: {bench.error}")
    return ProbeStatus("ranks", ERROR, f"failed part-way after {measured}: {bench.error}")


def _copies(opts):
    """Host<->GPU and GPU<->GPU copy bandwidth on GPUs; a copy that fails is a status."""
    if opts.backend != "nccl":
        return None, ProbeStatus("copies", SKIPPED, "CPU ranks: no GPU memory to copy")
    copies, status = attempt("copies", lambda: copies_payload(True))
    if copies is not None and copies.get("status") != "ok":
        status = ProbeStatus("copies", UNAVAILABLE, copies.get("detail", ""))
    elif copies is not None and not status.detail:
        kinds = sorted({m["kind"] for m in copies.get("measurements", [])})
        status = replace(status, detail=f"{len(copies.get('measurements', []))} copies measured "
                                                    f"({', '.join(kinds)}), {copies.get('size_bytes', 0) >> 20} MiB "
                                                    f"each")
    return copies, status


def _predictions(opts, bench, vres, vopts, topology):
    """Predictions from what was measured; a model that cannot be built is a status, not the end."""
    job_rows = [r for r in bench.rows if r.level == "job"]
    fit = fit_rows(job_rows, "all_reduce") if job_rows else None
    # the GPU torch's cuda:0 is (CUDA_VISIBLE_DEVICES=6,2: GPU 6); none for a MIG device or an unknown one
    gpu, _ = job_gpu(topology, 0)
    levels = level_fits(bench.rows)
    preds, status = attempt("model", lambda: predictions(
        opts, fit, opts.nproc, vres.calibration, vopts, gpu.name if gpu else None, job_rows, levels,
        gpu.memory_total_bytes if gpu else None, f"NVML, GPU{gpu.index}" if gpu else ""))
    preds = preds or []
    if status.status == OK:
        skipped = [p["skipped"] for p in preds if p.get("skipped")]
        if not preds:
            status = ProbeStatus("model", SKIPPED, "it needs an all-reduce fit from at least 2 ranks")
        elif skipped:
            status = ProbeStatus("model", SKIPPED, skipped[0])
        else:
            status = ProbeStatus("model", OK, ", ".join(p["label"] for p in preds))
    return preds, status, levels


PROFILE_FILE = "device-profile.json"


def _device_profile(opts):
    """This GPU's quick device profile (`topoprof profile --quick`, in a worker), for the scan's
    what-if compute: (document or None, its status). Only where the ranks run on GPUs; a profile
    that fails is a status, and the profiles shipped with topoprof price the what-ifs instead."""
    if opts.backend != "nccl":
        return None, None

    doc, status = attempt("device profile", lambda: measure_device_profile("cuda", quick=True, timeout_s=120.0))
    if doc is None:
        return None, replace(status, detail=f"{status.detail}; the what-if compute priced from the profiles "
                                            "shipped with topoprof")
    if status.status == OK:
        status = ProbeStatus("device profile", OK, f"{doc['machine']['device']}, quick, {doc['seconds']:.1f} s: "
                                                   f"{len(doc['gemm'])} GEMM shapes, {len(doc['memory'])} memory "
                                                   f"points, {len(doc['sdpa'])} attention points ({PROFILE_FILE})")
    return doc, status


def _what_ifs(opts, topology):
    """One GPU, one rank: nothing to all-reduce here, so the report shows what more such GPUs
    or nodes would do instead (from nominal links, labelled as such). (what-if, its status), or
    (None, None) where it does not apply; a failed or partial one is a status in the summary.
    It applies where the job sees one GPU, whatever the node has (CUDA_VISIBLE_DEVICES=5 on an
    8-GPU node: GPU 5, its name and memory)."""
    if opts.nproc != 1 or len(job_devices(topology)) != 1:
        return None, None

    gpu, why = job_gpu(topology, 0)
    if gpu is None:  # a MIG device, or a device not tied to a GPU: more such GPUs is no question
        return {"skipped": why}, ProbeStatus("what-if", SKIPPED, why)
    result, status = attempt("what-if", lambda: single_gpu_what_ifs(opts, gpu))
    if result is None:
        return {"skipped": status.detail}, status
    if result.get("skipped"):
        return result, ProbeStatus("what-if", SKIPPED, result["skipped"])
    if result.get("timing_failed"):  # priced without this GPU's timing
        return result, ProbeStatus("what-if", PARTIAL, result["compute_source"])
    return result, status


@dataclass(frozen=True)
class Written:
    """A scan's report and where it went: `folder` is out_dir, or a folder in the temporary
    directory when out_dir could not be written (`moved_because` says why), or None if neither."""

    report: dict
    folder: str | None
    moved_because: str | None


def run(opts, stages, out_dir: str) -> Written | None:
    stages.begin("topology")
    topology = collect_topology()  # every probe degrades: a failed one is a status in topology.probes
    stages.end()
    if opts.user_model:
        stages.begin("your model")
        device = here_device()  # timed on GPU0: its ops priced beside, from a pass in the same worker
        cuda = device.startswith("cuda")
        # timed and traced as its callable builds it, the batch the validation trains
        opts = replace(opts, user_record=measure_here(  # bad input: exit 2
            opts.user_model, device=device, trace=stated_shape(None, None) if cuda else None,
            target=gpu_target("bf16") if cuda else None))
        stages.end()
    stages.begin("ranks: bench and validation")
    bench, vres, vopts, node_ranks = run_ranks(opts, stages)
    stages.end()

    job = external_job()
    if job is not None and job.rank != 0:
        if bench.status != "ok":
            raise RunFailed(f"{bench.error}")
        return None  # rank 0 writes the one report of the job
    # on a GPU: its what-if compute priced from this GPU's own rates; rank 0's alone, measured
    # after the ranks (a profile beside them would share their GPUs)
    stages.begin("device profile")
    profile_doc, profile_status = _device_profile(opts)
    opts = replace(opts, device_profile=profile_doc)
    stages.end()
    stages.begin("copies")
    copies, copies_status = _copies(opts)
    if copies is not None and copies.get("status") == "ok":  # CUDA's own word on which GPU cuda:i is

        topology = identified(topology, list(zip(copies.get("device_uuids") or (),
                                                 copies.get("device_bus_ids") or ())))
    stages.end()
    stages.begin("model")
    preds, model_status, levels = _predictions(opts, bench, vres, vopts, topology)
    stages.end()
    stages.begin("what-if for more GPUs")  # on one GPU: its compute timed there, its ops priced
    what_if, what_if_status = _what_ifs(opts, topology)
    stages.end()
    probes = [*topology.probes, *([profile_status] if profile_status else []), _ranks_status(bench, vres),
              copies_status, model_status, *([what_if_status] if what_if_status else [])]
    summary, banner = _banner(opts, topology)
    # exit 3 only when rank work failed part-way: a probe that failed, or ranks that never
    # started, leave a report that says so and the scan succeeds with what it could measure
    failed_part_way = bench.status != "ok" and bool(bench.rows)
    report = envelope("scan", {
        "status": "error" if failed_part_way else "ok", "error": bench.error,
        "mode": {"backend": opts.backend, "nproc": opts.nproc, "gpu": bool(topology.gpus), "summary": summary,
                 "banner": banner},
        "inputs": {k: v for k, v in opts.__dict__.items() if k not in ("user_record", "device_profile")},
                               "versions": versions(bench.metadata), "environment": environment(),
        "probes": probes,
        "topology": topology,
        "ring": _ring(topology, used_gpus(topology, opts.nproc, opts.backend, bench.metadata.get("ranks") or ())),
        "bench": bench_payload(bench), "copies": copies,
        "predictions": preds,
        "what_if": what_if,
        "validation": validation_payload(vres, vopts, opts),
        "cluster": cluster_payload(node_ranks, levels, bench.rows, opts.nproc),
    })
    report = to_jsonable(report)
    report["verdict"] = to_jsonable(judge(read_bench(report["bench"]), topology, read_ring(report["ring"])))
    stages.begin("recommendations and report")
    report["recommendations"] = to_jsonable(_recommendations(report, topology))
    report["timing"] = {}

    folder, moved_because = save_report(report, out_dir)
    stages.end()
    report["timing"] = stages.done()
    # again, with the total wall time in it, where the first one went, and the profile the
    # what-ifs were priced with beside it
    beside = {PROFILE_FILE: dumps(profile_doc) + "\n"} if profile_doc is not None else {}
    folder, moved_again = save_report(report, folder or out_dir, beside)
    return Written(report, folder, moved_because or moved_again)


def level_fits(rows) -> dict:
    """All-reduce fits per level of a multi-node job: each node ("intra", by host), the network
    ("inter") and the whole job."""
    out: dict = {}
    for level in ("intra", "inter", "job"):
        groups = sorted({r.group for r in rows if r.level == level and r.collective == "all_reduce"})
        for group in groups:  # a level of one rank (a node with one GPU) moves nothing: no fit
            chosen = [r for r in rows if r.level == level and r.group == group and r.busbw_gbps is not None]
            fit = fit_rows(chosen, "all_reduce")
            if fit is not None:
                peak = max((r for r in chosen if r.collective == "all_reduce" and not r.wrong),
                           key=lambda r: r.busbw_gbps)
                out.setdefault(level, {})[group or level] = {
                    "fit": fit, "ranks": list(peak.ranks), "peak_busbw_gbps": peak.busbw_gbps,
                    "peak_size_bytes": peak.size_bytes}
    return out if set(out) - {"job"} else {}


def cluster_payload(node_ranks: list, levels: dict, rows, world_size: int) -> dict | None:
    if not node_ranks:
        return None

    nodes = nodes_from_ranks(node_ranks)
    return {"summary": summarize(nodes), "nodes": nodes, "levels": levels,
            "composed_check": composed_check(levels, world_size, rows)}


def validation_payload(vres, vopts, opts) -> dict:
    if vopts is None:
        reason = ("--no-validate" if not opts.validate else
                  f"{opts.nproc} rank(s): a scan validates its predictions across 2 or more ranks "
                  "(`topoprof validate` on one GPU measures DDP's own costs there, for `model --calibration`)")
        return {"status": "skipped", "reason": reason}

    return {"status": vres.status, "error": vres.error, "label": vres.label, "modes": vres.modes(),
            "numerics": vres.numerics, "calibration": vres.calibration, "summary": summary([vres]),
            # every rank's raw timelines and samples, rotation by rotation (probes/ranks/validation.py)
            "rotations": vres.rotations}


def default_out_dir() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return os.path.join("reports", f"{platform.node() or 'host'}-{stamp}")
