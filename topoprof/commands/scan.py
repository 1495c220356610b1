"""`topoprof scan`: the main job (`topoprof.scan`). Topology, bandwidth, predictions, validation,
advice, report."""
from __future__ import annotations

import click

from topoprof.errors import RunFailed, SavedElsewhere
from topoprof.jsonio import check_writable_folder, dumps
from topoprof.measure.launch import is_reporting_rank
from topoprof.measure.runner import default_backend_and_nproc
from topoprof.progress import LiveProgress
from topoprof.report.scan_report import read_scan_parts
from topoprof.report.text_scan import summary_lines
from topoprof.scan.options import ScanOptions
from topoprof.scan.pipeline import default_out_dir, run
from topoprof.scan.ranks import Stages


@click.command()
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None)
@click.option("--nproc", type=click.IntRange(min=1), default=None)
@click.option("--params", help="Your model's size (125M, 1.3B, 7B); default: those three.")
@click.option("--preset", help="Your model's architecture: gpt2, gpt2-medium, bert-base, gpt3-xl, llama-7b, llama3-8b, "
                                "llama3-70b, llama2-13b, llama2-70b; "
                                "image models resnet50, resnet101, resnext50_32x4d, resnext101_32x8d.")
@click.option("--image-size", type=click.IntRange(min=1),
              help="Square image side in pixels for an image --preset (default 224).")
@click.option("--model", "user_model", metavar="PATH.py:CALLABLE",
              help="Your own model: a function returning (module, example_batch[, loss_fn]); timed here, "
                   "its buckets read as DDP forms them, and trained in the validation.")
@click.option("--micro-batch-time", type=float, help="Measured forward+backward seconds per micro-batch of your model.")
@click.option("--tokens", type=click.IntRange(min=1),
              help="Tokens per GPU per micro-batch (default 2048; an image --preset counts --micro-batch-size images).")
@click.option("--micro-batch-size", type=click.IntRange(min=1),
              help="Samples per GPU per micro-batch (default 1; a --model is read at its example batch).")
@click.option("--accum", type=click.IntRange(min=1), default=8, show_default=True,
              help="Gradient accumulation steps K.")
@click.option("--activation-checkpointing", metavar="MODE",
              help="Activation checkpointing of the predicted model's blocks: none (default), full, layer:N or op "
                   "(torchtitan's modes); timed and traced so where the model is.")
@click.option("--validate/--no-validate", default=True, show_default=True, help="Run the short real training loops.")
@click.option("--quick", is_flag=True, help="Fewer sizes and steps, no numerics check.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Report folder (default reports/<host>-<UTC time>/).")
def scan(backend, nproc, params, preset, image_size, user_model, micro_batch_time, tokens, micro_batch_size, accum,
         activation_checkpointing, validate, quick, timeout_s, out_dir):
    """Profile this node and write a report: wiring, measured bandwidth, DP/DDP/accumulation
    predictions checked by real loops, and what to do, with charts."""
    backend, nproc, note = default_backend_and_nproc(backend, nproc)
    opts = ScanOptions(backend=backend, nproc=nproc, note=note, quick=quick, validate=validate, params=params,
                       preset=preset, image_size=image_size, micro_batch_time_s=micro_batch_time, tokens=tokens,
                       micro_batch_size=micro_batch_size or 1, micro_batch_stated=micro_batch_size is not None,
                       accum=accum, timeout_s=timeout_s, user_model=user_model,
                       activation_checkpointing=activation_checkpointing)

    out_dir = out_dir or default_out_dir()
    if is_reporting_rank():  # rank 0 writes the report: a folder it cannot write ends the scan now
        check_writable_folder(out_dir, "--out")
    with LiveProgress() as progress:  # on stderr, when it is a terminal
        written = run(opts, Stages(progress), out_dir)
    if written is None:  # a non-zero rank of a torchrun/SLURM job: rank 0 reports
        return
    _finish(written, out_dir)


def _finish(written, out_dir: str) -> None:
    """The summary, then the exit: 3 if rank work failed part-way or the report had to go to the
    temporary directory (both said in one line), else 0."""
    report, folder = written.report, written.folder
    if folder is None:  # neither out_dir nor the temporary directory: the report itself, on stdout
        click.echo(dumps(report))
    else:
        click.echo("\n".join(summary_lines(read_scan_parts(report), folder)))
    failed = None
    if report["status"] != "ok":
        where = f"in {folder}" if folder else "on stdout"
        failed = f"{report['error']}; the report {where} keeps what was measured before"
    if written.moved_because:
        raise SavedElsewhere("; ".join(m for m in (_moved(written, out_dir), failed) if m))
    if failed:
        raise RunFailed(failed)


def _moved(written, out_dir: str) -> str:
    """Where the report went when out_dir could not take it, and why."""
    why = f"--out {out_dir}: cannot write the report ({written.moved_because})"
    if written.folder is None:
        return f"{why}, nor in the temporary directory; report.json is printed on stdout instead"
    return f"{why}; written to {written.folder} instead"
