"""`topoprof bench`: collective bandwidth the way nccl-tests measures it, plus copy bandwidth."""
from __future__ import annotations

import sys

import click

from topoprof.errors import EXIT_NOTHING_MEASURED, InputError, RunFailed, SavedElsewhere
from topoprof.jsonio import check_writable, dumps, envelope, from_jsonable, write_text
from topoprof.measure.bench import (
    BenchOptions,
    CopiesReport,
    bench_payload,
    collectives_option,
    copies_payload,
    default_sizes,
    result_from_nccl_tests,
    run_bench,
)
from topoprof.measure.launch import is_reporting_rank, multi_node
from topoprof.measure.runner import default_backend_and_nproc
from topoprof.progress import LiveProgress
from topoprof.report.text_bench import HEADER, copy_lines, format_row, imported_lines, summary_lines
from topoprof.specs.collective_spec import parse_size, size_sweep


def _size(ctx, param, value):
    if value is None:
        return None
    try:
        return parse_size(value)
    except InputError as err:
        raise click.BadParameter(str(err)) from None


def _run_live(opts_kwargs: dict, collectives: str, sizes, as_json: bool):
    backend, nproc, note = default_backend_and_nproc(opts_kwargs.pop("backend"), opts_kwargs.pop("nproc"))
    lo, hi, factor = default_sizes(backend)
    min_b, max_b, fac = sizes

    opts_kwargs["levels"] = ("intra", "inter", "job") if multi_node() else ("job",)
    opts = BenchOptions(backend=backend, nproc=nproc, collectives=collectives_option(collectives),
                        sizes=tuple(size_sweep(min_b if min_b is not None else lo,
                                               max_b if max_b is not None else hi, fac or factor)),
                        **opts_kwargs)
    current: dict[str, tuple | None] = {"coll": None}


    quiet = as_json or not is_reporting_rank()

    def row_lines(row) -> None:
        key = (row.collective, row.level, row.group)
        if key != current["coll"]:
            current["coll"] = key
            where = "" if row.level == "job" else f", {row.level} {row.group}".rstrip()
            click.echo(f"#\n# {row.collective}: {len(row.ranks) or nproc} rank(s){where}, backend {backend}, "
                       f"dtype {opts.dtype}\n{HEADER}")
        click.echo(format_row(row))

    if not quiet:
        click.echo(f"# topoprof bench: {note}\n# {opts.protocol()}")
    with LiveProgress(show=False if quiet else None) as progress:  # on stderr, when it is a terminal
        return run_bench(opts, on_row=None if quiet else (lambda row: progress.above(lambda: row_lines(row))),
                         on_progress=None if quiet else (lambda step: progress(f"measuring {step} ...")))


@click.command()
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None,
              help="Default: nccl when a GPU is visible, else gloo.")
@click.option("--nproc", type=click.IntRange(min=1), default=None,
              help="Local ranks. Default: one per visible GPU (nccl) or 2 (gloo).")
@click.option("--collectives", default="all_reduce", show_default=True,
              help="Comma list of all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, sendrecv, reduce; or "
                   "'all'.")
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
    check_writable(out_path, "--out")
    if from_log:
        result = result_from_nccl_tests(from_log)
        if not as_json:
            click.echo("\n".join(imported_lines(result)))
    else:
        kwargs = dict(backend=backend, nproc=nproc, iters=iters, warmup=warmup, dtype=dtype,
                      combine=combine, check=check, timeout_s=timeout_s)
        result = _run_live(kwargs, collectives, (min_bytes, max_bytes, factor), as_json)

    if not is_reporting_rank():  # rank 0 of the job prints, writes and measures the copies alone
        if result.status != "ok":
            raise RunFailed(f"{result.error}")
        return

    copy_report = copies_payload(copies)
    moved = _emit(result, copy_report, as_json, out_path)
    failed = _failure(result)
    if moved:  # exit 3 as well, the one line saying both
        raise SavedElsewhere("; ".join(m for m in (moved.message(), failed) if m))
    if failed:
        raise RunFailed(failed)
    if copies and copy_report and copy_report["status"] != "ok" and not result.rows:
        sys.exit(EXIT_NOTHING_MEASURED)


def _failure(result) -> str | None:
    """Why the run counts as failed (exit 3): it stopped part-way, or results were wrong."""
    if result.status != "ok":
        return f"{result.error}; {len(result.rows)} row(s) measured before the failure were kept"
    wrong = [r for r in result.rows if r.wrong]
    if wrong:
        return f"{len(wrong)} row(s) had wrong results (first at {wrong[0].collective} {wrong[0].size_bytes} B)"
    return None


def _emit(result, copy_report, as_json: bool, out_path: str | None):
    """Print the result and write --out; the Moved when --out had to go elsewhere (see write_text)."""
    doc = envelope("bench", bench_payload(result, copy_report))
    moved = write_text(out_path, dumps(doc) + "\n", "--out") if out_path else None
    if as_json:
        click.echo(dumps(doc))
        return moved
    if moved and moved.written_to is None:  # the file could be written nowhere: its JSON on stdout
        click.echo(dumps(doc))

    for line in summary_lines(result):
        click.echo(line)
    if copy_report is not None:
        for line in copy_lines(from_jsonable(CopiesReport, copy_report, "copies")):
            click.echo(line)
    return moved
