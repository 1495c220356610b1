"""`topoprof validate`: real training loops per strategy, predicted vs measured, and numerics."""
from __future__ import annotations

import click

from topoprof.errors import InputError, RunFailed, SavedElsewhere
from topoprof.jsonio import check_writable, dumps, envelope, write_text
from topoprof.measure.launch import is_reporting_rank
from topoprof.measure.runner import default_backend_and_nproc
from topoprof.measure.torch_support import FSDP2_VALIDATE, missing
from topoprof.model.inputs.user_model import measure_here
from topoprof.model.inputs.user_record import trained_micro_batch, user_layout
from topoprof.model.validate.report import read_validate_report
from topoprof.model.validate.run import (
    FSDP_BACKENDS,
    ValidateOptions,
    cpu_threads_per_rank,
    parse_modes,
    run_validate,
    save_calibration,
    spec_from_options,
    validate_payload,
)
from topoprof.progress import LiveProgress
from topoprof.report.text_validate import render_validate


@click.command()
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None)
@click.option("--nproc", type=click.IntRange(min=1), default=None)
@click.option("--params", help="Synthetic model size (default 2M): 500K, 10M, 125M.")
@click.option("--preset", help="A text preset's shape, scaled by --scale: gpt2, gpt2-medium, bert-base, gpt3-xl, "
                               "llama-7b.")
@click.option("--model", "user_model", metavar="PATH.py:CALLABLE",
              help="Train your own model instead: a function returning (module, example_batch[, loss_fn]).")
@click.option("--scale", type=float, default=0.05, show_default=True, help="Parameter scale for --preset.")
@click.option("--seq-len", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--micro-batch", type=click.IntRange(min=1), default=None,
              help="Samples per rank per micro-batch (default 4; a --model trains its example batch, at the samples "
                   "it holds).")
@click.option("--accum", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=8, show_default=True,
              help="Timed rotations: each measures every input and one step of every mode.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=2, show_default=True,
              help="Rotations run first, untimed.")
@click.option("--modes", default="ddp_synced,ddp_no_sync,ddp_no_sync_backward_only", show_default=True,
              help="Comma list of ddp_synced, ddp_no_sync, ddp_no_sync_backward_only, fsdp_full_shard, "
                   "fsdp_full_shard_no_sync, fsdp_shard_grad_op, fsdp_shard_grad_op_no_sync (torch >= 2.9), or all "
                   "(every one of them this torch runs); add dp where >= 2 GPUs exist.")
@click.option("--activation-checkpointing", "ac", metavar="MODE", default="none", show_default=True,
              help="Train the synthetic model with its blocks checkpointed: none, full, layer:N or op (torchtitan's "
                   "modes); every mode's step and numerics are checked under it.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads per CPU rank (default: the cores it may use divided among the ranks, at most "
                   "OMP_NUM_THREADS where it is set).")
@click.option("--numerics/--no-numerics", default=True, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True)
@click.option("--save-calibration", "save_calibration_to", type=click.Path(dir_okay=False),
              help="Write the calibration for `topoprof model --calibration`.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="Also write the JSON here.")
def validate(backend, nproc, params, preset, user_model, scale, seq_len, micro_batch, accum, steps, warmup_steps, modes,
             ac, threads, numerics, timeout_s, save_calibration_to, as_json, out_path):
    """Run short real training loops for each strategy and compare with the model's prediction."""
    check_writable(out_path, "--out")
    check_writable(save_calibration_to, "--save-calibration")
    backend, nproc, note = default_backend_and_nproc(backend, nproc)
    fsdp_missing = missing(FSDP2_VALIDATE)
    mode_list = parse_modes(modes, backend, fsdp_missing)
    asked_all = "all" in (m.strip() for m in modes.split(","))
    if fsdp_missing and backend in FSDP_BACKENDS and asked_all and is_reporting_rank():
        click.echo(f"topoprof: note: --modes all runs the DDP modes only: {fsdp_missing}", err=True)
    spec, label = spec_from_options(params, preset, scale, seq_len)
    layout = None
    if user_model:
        if params or preset:
            raise InputError("give at most one of --params, --preset or --model")

        if micro_batch is not None:
            raise InputError("--micro-batch: validate trains your --model on the example batch its callable returns, "
                             "at the samples it holds; build that batch at the micro-batch you want")
        record = measure_here(user_model)
        layout = user_layout(record)
        label = layout.name
        micro_batch = trained_micro_batch(record)
    if threads is None and backend == "gloo":
        threads = cpu_threads_per_rank(nproc)
    opts = ValidateOptions(backend=backend, nproc=nproc, spec=spec, label=label, micro_batch=micro_batch or 4,
                           accum=accum, steps=steps, warmup_steps=warmup_steps,
                           modes=mode_list, threads=threads,
                           numerics=numerics, timeout_s=timeout_s, user_model=user_model, user_layout=layout, ac=ac)
    with LiveProgress(show=False if as_json else None) as progress:  # on stderr, when it is a terminal
        result = run_validate(opts, on_progress=progress)
    if not is_reporting_rank():
        if result.status != "ok":
            raise RunFailed(f"{result.error}")
        return  # rank 0 of the job prints and writes
    payload = validate_payload(result, opts)
    doc = envelope("validate", payload)
    moved = []  # files that could not be written where asked (see jsonio.write_text)
    if out_path:
        moved.append(write_text(out_path, dumps(doc) + "\n", "--out"))
    if save_calibration_to and result.calibration:
        moved.append(save_calibration(save_calibration_to, payload))
    moved = [m for m in moved if m]
    # the text reads what the JSON holds, through the one reader a scan's report reads it with
    click.echo(dumps(doc) if as_json else render_validate(read_validate_report(doc)))
    if not as_json and any(m.written_to is None for m in moved):  # a file written nowhere: the JSON on stdout
        click.echo(dumps(doc))
    failed = f"{result.error}; results measured before the failure were kept" if result.status != "ok" else None
    if moved:  # exit 3 as well, one line saying all
        raise SavedElsewhere("; ".join([m.message() for m in moved] + ([failed] if failed else [])))
    if failed:
        raise RunFailed(failed)
