"""`topoprof model`: predicted optimizer-step time for DP, DDP and accumulation strategies."""
from __future__ import annotations

import click

from topoprof.jsonio import dumps, envelope
from topoprof.model.inputs.gather import gather, gather_candidates, whole_pass
from topoprof.model.inputs.request import ModelRequest
from topoprof.model.inputs.resolve import resolve
from topoprof.model.inputs.search import candidate_shape, fits_priced
from topoprof.model.strategies.model_plan import plan_model
from topoprof.model.strategies.model_report import model_payload, read_model_report
from topoprof.model.strategies.search import plan_search, searched_strategies
from topoprof.progress import LiveProgress
from topoprof.report.text_model import render_model
from topoprof.workload.presets import RMSNORMS
from topoprof.zoo.hf_spec import ATTN_CHOICES


@click.command()
@click.option("--params", help="Model size: 124439808, 125M, 1.3B, 7B (a synthetic even layout).")
@click.option("--preset", help="A real architecture's layout: bert-base, gpt2, gpt2-medium, gpt3-xl, llama-7b, "
                                "llama3-8b, llama3-70b, llama2-13b, llama2-70b; image models resnet50, resnet101, "
                                "resnext50_32x4d, resnext101_32x8d.")
@click.option("--image-size", type=click.IntRange(min=1),
              help="Square image side in pixels for an image --preset (default 224); its FLOPs count "
                   "--micro-batch-size images per micro-batch.")
@click.option("--model", "user_model", metavar="PATH.py:CALLABLE",
              help="Your own model: a function returning (module, example_batch[, loss_fn]); its parameters, "
                   "gradient-ready order and compute are measured here, or for a --gpu what-if read from its pass "
                   "on the meta device without running it (also as package.module:CALLABLE). hf:PATH builds a "
                   "Hugging Face causal LM from a local config.json (or its folder); needs topoprof[hf].")
@click.option("--hf-attn", type=click.Choice(ATTN_CHOICES),
              help="With --model hf:PATH: the attention implementation the model is built with (default sdpa; "
                   "flash_attention_2 is built as sdpa and priced as flash attention).")
@click.option("--time-here", is_flag=True,
              help="Also time your --model on this machine for a --gpu what-if of another GPU (a what-if otherwise "
                   "only traces it on the meta device); the time is shown, never used as that GPU's.")
@click.option("--grad-bytes", type=click.Choice(["2", "4"]), default="4", show_default=True,
              help="Bytes per gradient element: 4 under autocast (fp32 params), 2 for pure bf16/fp16.")
@click.option("--micro-batch-size", type=click.IntRange(min=1),
              help="Samples per GPU per micro-batch (default 1; a --model's: the samples its example batch holds).")
@click.option("--tokens", type=click.IntRange(min=1),
              help="Tokens per GPU per micro-batch (for the FLOPs estimate; not for an image --preset). A --model "
                   "with no --micro-batch-size takes them as each sample's seq_len.")
@click.option("--bucket-cap-mb", type=float, help="DDP bucket_cap_mb (default: torch's 25 with a 1 MiB first bucket).")
@click.option("--fsdp-param-dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="bf16", show_default=True,
              help="FSDP MixedPrecisionPolicy.param_dtype: what each all-gather moves per parameter "
                   "(torchtitan's default).")
@click.option("--fsdp-reduce-dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True,
              help="FSDP MixedPrecisionPolicy.reduce_dtype: what each reduce-scatter moves per gradient "
                   "(torchtitan's default; torch's docs: reduce in full precision, compute in low).")
@click.option("--fsdp-unit", metavar="MODULE",
              help="FSDP groups: each child of this module, e.g. model.layers (default: one group per block of "
                   "a preset, 4 chunks per group of --params; the root holds the rest); for a --model, also the "
                   "blocks --activation-checkpointing wraps.")
@click.option("--rmsnorm", type=click.Choice(RMSNORMS), default="eager", show_default=True,
              help="A Llama preset's RMSNorm: eager (Hugging Face's LlamaRMSNorm, torchtitan's rmsnorm: its fp32 "
                   "upcast kept for backward) or fused (one kernel keeping its input and the reciprocal RMS: "
                   "torchtitan's fused_rmsnorm, torch's fused rms_norm).")
@click.option("--activation-checkpointing", metavar="MODE",
              help="Activation checkpointing of the blocks (a --model's: the children of --fsdp-unit, else its "
                   "list of repeated blocks), in torchtitan's modes: none (default), full, layer:N "
                   "(every N-th block) or op (torchtitan's selective op policy); what each keeps and recomputes is "
                   "counted from the model's own ops.")
@click.option("--micro-batch-time", type=float, help="Measured forward+backward seconds per micro-batch.")
@click.option("--backward-fraction", type=float, help="Share of the micro-batch time spent in backward (default 2/3).")
@click.option("--calibration", type=click.Path(dir_okay=False), help="Calibration JSON written by `topoprof validate`.")
@click.option("--gpu", help="GPU name for datasheet peak FLOP/s and memory bandwidth (e.g. 'H100 SXM'); "
                           "with --topology it also pins the NVLink generation (NCCL's per-link rate).")
@click.option("--precision", default="bf16", show_default=True)
@click.option("--utilization", type=float, help="Share of peak FLOP/s reached, if you know it; without it a --gpu "
                                                "what-if is priced from the model's own ops (op trace and roofline).")
@click.option("--compiled", is_flag=True, help="The modelled compute under torch.compile: chains of elementwise and "
                                               "norm ops fused into one memory pass each, a host cost per graph and "
                                               "per kernel instead of eager PyTorch's per op.")
@click.option("--gpu-profile", type=click.Path(dir_okay=False), metavar="FILE",
              help="A device profile (`topoprof profile`) to price the modelled compute with: as measured when it is "
                   "of the --gpu named (or without --gpu), scaled by datasheet ratios to another GPU (default: the "
                   "nearest profile shipped with topoprof).")
@click.option("--optimizer", default="adamw", show_default=True)
@click.option("--optimizer-time", type=float, help="Measured optimizer step seconds (>= 0). If neither this, "
                                                   "--calibration nor --gpu gives it, 0 is assumed and the output says "
                                                   "so.")
@click.option("--bench", type=click.Path(dir_okay=False),
              help="Use the all_reduce fit of a `bench --json` or scan report.")
@click.option("--topology", type=click.Path(dir_okay=False), help="Saved `nvidia-smi topo -m` text or `topo --json`.")
@click.option("--gpus", help="GPU indices of the job within the topology, e.g. 0,1,2,3.")
@click.option("--link-bandwidth", type=float, help="Explicit per-direction link bandwidth, GB/s.")
@click.option("--link-latency", type=float, help="Explicit per-hop latency, microseconds.")
@click.option("--world-size", type=click.IntRange(min=1),
              help="Total GPUs (checked against --nodes x GPUs per node); 1 needs no link.")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--gpus-per-node", type=click.IntRange(min=1),
              help="With --nodes; 1 GPU per node needs only --network-bandwidth.")
@click.option("--network-bandwidth", type=float, help="Each node's NICs together, GB/s per direction (multi-node).")
@click.option("--network-latency", type=float, help="Per network hop, microseconds (default NCCL's 14).")
@click.option("--accum", type=int, default=1, show_default=True,
              help="Gradient accumulation steps K (micro-batches per optimizer step).")
@click.option("--sweep/--no-sweep", default=True, show_default=True, help="Also print the sweep over K and world size.")
@click.option("--activation-memory", type=click.FloatRange(min=0),
              help="Activations per GPU per micro-batch, GB, if you know them (counted for the transformer presets, "
                   "else unknown).")
@click.option("--gpu-memory", type=click.FloatRange(min=0, min_open=True),
              help="The GPU's memory, GB (default: from --gpu's name or datasheet).")
@click.option("--json", "as_json", is_flag=True)
def model(**opts):
    """Predict one optimizer step for single, dp, ddp_synced, ddp_no_sync, ddp_no_sync_backward_only,
    ddp_fp16_compress and FSDP2's fsdp_full_shard, fsdp_shard_grad_op and hsdp (each also _no_sync),
    with the exposed communication and what changing K or world size gains."""
    request = ModelRequest.from_options(opts)
    # Gather (processes, files, hardware), then predict from what was gathered alone; the search
    # for what fits gathers once more, the passes of the candidates the memory named.
    with LiveProgress() as progress:  # on stderr, when it is a terminal (topoprof.progress)
        evidence = gather(request, progress)
        inputs, described = resolve(evidence)
        progress("predicting every strategy" + (", and the sweep over K and GPU counts" if request.sweep else ""))
        planned = plan_model(inputs, described, sweep=request.sweep)
        progress("finding the largest micro-batch that fits for each strategy and checkpointing mode")
        names = searched_strategies(planned)
        plan = plan_search(inputs, names, planned.prediction)
        # the request as gathered: a user's model's micro-batch is its example batch's where none was given
        shape = candidate_shape(inputs, evidence.request, plan, evidence.shape)
        passes = gather_candidates(shape, plan.wanted, evidence.pricing, progress,
                                   whole_pass(evidence.user, evidence.request.workload), evidence.sampled)
        fits = fits_priced(inputs, plan, passes, evidence.pricing)
    payload = model_payload(planned, fits)
    doc = envelope("model", payload)
    # the text reads what the JSON holds, through the one reader a scan's report reads it with
    click.echo(dumps(doc) if opts["as_json"] else render_model(read_model_report(doc)))
