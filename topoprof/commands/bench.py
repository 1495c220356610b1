"""`topoprof bench`: collective bandwidth the way nccl-tests measures it, plus copy bandwidth."""
from __future__ import annotations

import sys

import click

from topoprof.errors import EXIT_NOTHING_MEASURED, InputError, NothingMeasured, RunFailed


def _size(ctx, param, value):
    from topoprof.collectives import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except InputError as err:
        raise click.BadParameter(str(err)) from None


def _progress(step: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K  measuring {step} ...")
        sys.stderr.flush()


def _clear_progress() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")


def bench_payload(result, copies=None) -> dict:
    """The JSON body of a bench run (also embedded in scan reports)."""
    from topoprof.fit import bus_bandwidth_gbps
    from topoprof.spread import slow_ranks

    fits = result.fits()
    n = result.world_size()
    return {
        "status": result.status,
        "error": result.error,
        "metadata": result.metadata,
        "rows": result.rows,
        "fit": {name: {**_fit_dict(f), "busbw_gbps": bus_bandwidth_gbps(f, n) if n else None}
                for name, f in fits.items() if f is not None},
        "fit_by_level": {key: {name: _fit_dict(f) for name, f in fits.items() if f is not None}
                         for key, fits in result.level_fits().items()},
        "stopped": result.stopped,
        "slow_ranks": slow_ranks(result.rows),
        "nccl": {"logs": result.nccl, "explained": result.nccl_explained},
        "copies": copies,
        "wall_s": result.wall_s,
    }


def _fit_dict(fit) -> dict:
    from topoprof.jsonio import to_jsonable

    return to_jsonable(fit)


def _print_summary(result) -> None:
    from topoprof import bench_render as r
    from topoprof.spread import slow_ranks

    by_coll: dict[tuple, list] = {}
    for row in result.rows:
        by_coll.setdefault((row.collective, row.level, row.group), []).append(row)
    for (name, level, group), rows in by_coll.items():
        click.echo(f"# {name}" + ("" if level == "job" else f" ({level} {group})".replace(" )", ")")))
        for line in r.footer(rows):
            click.echo(line)
    for line in r.fit_lines(result.fits(), result.world_size()):
        click.echo(line)
    for line in r.spread_lines(slow_ranks(result.rows)):
        click.echo(line)
    for stop in result.stopped:
        click.echo(f"# {stop['collective']}: {stop['reason']}")
    for line in result.nccl_explained:
        click.echo(f"# NCCL: {line}")
    if result.world_size() == 1:
        click.echo("# One rank: bus bandwidth is 0 by definition (nothing crosses a link); "
                   "these rows time the collective's local overhead only.")


def _print_imported(result) -> None:
    from topoprof.bench_render import HEADER, format_row

    meta = result.metadata
    click.echo(f"# topoprof bench: {meta['source']}, {meta['world_size'] or '?'} rank(s)")
    current = None
    for row in result.rows:
        if row.collective != current:
            current = row.collective
            click.echo(f"#\n# {current}\n{HEADER}")
        click.echo(format_row(row))


def copies_payload(enabled: bool) -> dict | None:
    if not enabled:
        return None
    from probes.copies import measure_copies
    from topoprof.jsonio import to_jsonable

    try:
        return {"status": "ok", **to_jsonable(measure_copies())}
    except NothingMeasured as err:
        return {"status": "unsupported", "detail": str(err)}


def _run_live(opts_kwargs: dict, collectives: str, sizes, as_json: bool):
    from topoprof.bench import BenchOptions, collectives_option, default_sizes, run_bench
    from topoprof.bench_render import HEADER, format_row
    from topoprof.collectives import size_sweep
    from topoprof.runner import default_backend_and_nproc

    backend, nproc, note = default_backend_and_nproc(opts_kwargs.pop("backend"), opts_kwargs.pop("nproc"))
    lo, hi, factor = default_sizes(backend)
    min_b, max_b, fac = sizes
    from topoprof.scan import multi_node

    opts_kwargs["levels"] = ("intra", "inter", "job") if multi_node() else ("job",)
    opts = BenchOptions(backend=backend, nproc=nproc, collectives=collectives_option(collectives),
                        sizes=tuple(size_sweep(min_b if min_b is not None else lo,
                                               max_b if max_b is not None else hi, fac or factor)),
                        **opts_kwargs)
    current = {"coll": None}

    from topoprof.launch import is_reporting_rank

    quiet = as_json or not is_reporting_rank()

    def on_row(row):
        if quiet:
            return
        _clear_progress()
        key = (row.collective, row.level, row.group)
        if key != current["coll"]:
            current["coll"] = key
            where = "" if row.level == "job" else f", {row.level} {row.group}".rstrip()
            click.echo(f"#\n# {row.collective}: {len(row.ranks) or nproc} rank(s){where}, backend {backend}, "
                       f"dtype {opts.dtype}\n{HEADER}")
        click.echo(format_row(row))

    if not quiet:
        click.echo(f"# topoprof bench: {note}\n# {opts.protocol()}")
    result = run_bench(opts, on_row=on_row, on_progress=None if quiet else _progress)
    _clear_progress()
    return result


@click.command()
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None,
              help="Default: nccl when a GPU is visible, else gloo.")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Local ranks. Default: one per visible GPU (nccl) or 2 (gloo).")
@click.option("--collectives", default="all_reduce", show_default=True,
              help="Comma list of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv, reduce; or 'all'.")
@click.option("-b", "--min-bytes", callback=_size, help="Smallest size (8, 1K, 64M, 1G). Default 8.")
@click.option("-e", "--max-bytes", callback=_size, help="Largest size. Default 1G (nccl) or 64M (gloo).")
@click.option("-f", "--factor", type=click.IntRange(min=1), default=None, help="Size multiplier. Default 2.")
@click.option("-n", "--iters", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("-w", "--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--dtype", default="float32", show_default=True)
@click.option("--combine", type=click.Choice(["avg", "min", "max", "rank0"]), default="avg", show_default=True,
              help="How per-rank times become the row's time (nccl-tests -a).")
@click.option("--check/--no-check", default=True, show_default=True, help="Count wrong results on every size.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds a rank may go without progress before the run is stopped.")
@click.option("--copies/--no-copies", default=False, help="Also measure host<->GPU and GPU<->GPU copies (GPU only).")
@click.option("--from-nccl-tests", "from_log", type=click.Path(dir_okay=False),
              help="Read an nccl-tests *_perf log instead of measuring.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (rows, fit, metadata).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Also write the JSON to this file.")
def bench(backend, nproc, collectives, min_bytes, max_bytes, factor, iters, warmup, dtype, combine,
          check, timeout_s, copies, from_log, as_json, out_path):
    """Measure collectives (algbw, busbw, #wrong) and fit t(S) = latency + S / bandwidth.

    Same method and columns as nccl-tests' *_perf binaries, on local ranks or as ranks of an
    enclosing torchrun / SLURM job.
    """
    from topoprof.jsonio import check_writable

    check_writable(out_path, "--out")
    if from_log:
        from topoprof.bench import result_from_nccl_tests

        result = result_from_nccl_tests(from_log)
        if not as_json:
            _print_imported(result)
    else:
        kwargs = dict(backend=backend, nproc=nproc, iters=iters, warmup=warmup, dtype=dtype,
                      combine=combine, check=check, timeout_s=timeout_s)
        result = _run_live(kwargs, collectives, (min_bytes, max_bytes, factor), as_json)
    from topoprof.launch import is_reporting_rank

    if not is_reporting_rank():  # rank 0 of the job prints, writes and measures the copies alone
        if result.status != "ok":
            raise RunFailed(f"{result.error}")
        return
    copy_report = copies_payload(copies)
    _emit(result, copy_report, as_json, out_path)
    if result.status != "ok":
        raise RunFailed(f"{result.error}; {len(result.rows)} row(s) measured before the failure were kept")
    wrong = [r for r in result.rows if r.wrong]
    if wrong:
        raise RunFailed(f"{len(wrong)} row(s) had wrong results (first at {wrong[0].collective} {wrong[0].size_bytes} B)")
    if copies and copy_report and copy_report["status"] != "ok" and not result.rows:
        sys.exit(EXIT_NOTHING_MEASURED)


def _emit(result, copy_report, as_json: bool, out_path: str | None) -> None:
    from topoprof.jsonio import dumps, envelope, write_text

    doc = envelope("bench", bench_payload(result, copy_report))
    if out_path:
        write_text(out_path, dumps(doc) + "\n", "--out")
    if as_json:
        click.echo(dumps(doc))
        return
    _print_summary(result)
    if copy_report is not None:
        from topoprof.bench_render import copy_lines

        for line in copy_lines(copy_report):
            click.echo(line)
