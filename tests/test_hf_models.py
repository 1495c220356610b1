"""`--model hf:PATH`: Hugging Face causal LMs built from a local config.json (topoprof.zoo.hf_models).

Run as a script (python3 test_hf_models.py) to print the SDPA-call table used in NOTES.md.
"""

import collections
import json
import os
import socket
import sys
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "hf")

pytest.importorskip("transformers")
from topoprof.zoo import hf_models as hm  # noqa: E402
from topoprof.zoo import hf_spec as hs  # noqa: E402
from topoprof.zoo.user_blocks import find_block_list  # noqa: E402

TINY = ["llama", "qwen2", "mistral", "gpt2", "bert"]
GQA = {"llama", "qwen2", "mistral"}
EXPECTED = {
    "llama": ("LlamaForCausalLM", "model.layers", "LlamaDecoderLayer"),
    "qwen2": ("Qwen2ForCausalLM", "model.layers", "Qwen2DecoderLayer"),
    "mistral": ("MistralForCausalLM", "model.layers", "MistralDecoderLayer"),
    "gpt2": ("GPT2LMHeadModel", "transformer.h", "GPT2Block"),
    "bert": ("BertLMHeadModel", "bert.encoder.layer", "BertLayer"),
    "llama31_8b": ("LlamaForCausalLM", "model.layers", "LlamaDecoderLayer"),
}
LLAMA31_8B_PARAMS = 8_030_261_248


def fx(name):
    return os.path.join(FIX, name)


def manual_causal_lm_loss(logits, labels):
    """Textbook causal-LM loss: position t predicts label t+1, fp32, ignore -100, mean."""
    v = logits.shape[-1]
    shift_logits = logits[:, :-1, :].float().reshape(-1, v)
    shift_labels = labels[:, 1:].reshape(-1)
    return F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="mean")


def with_ignored(batch):
    labels = batch["labels"].clone()
    labels[:, :3] = -100  # e.g. a masked prompt
    labels[0, 10] = -100
    return {"input_ids": batch["input_ids"], "labels": labels}


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


class SDPACapture(TorchFunctionMode):
    """Records the arguments of every F.scaled_dot_product_attention call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
            bound = dict(zip(names, args))
            bound.update(kwargs)
            mask = bound.get("attn_mask")
            self.calls.append(
                {
                    "q": tuple(bound["query"].shape),
                    "k": tuple(bound["key"].shape),
                    "v": tuple(bound["value"].shape),
                    "dtype": str(bound["query"].dtype).replace("torch.", ""),
                    "attn_mask": None if mask is None else tuple(mask.shape),
                    "is_causal": bound.get("is_causal", False),
                    "enable_gqa": bound.get("enable_gqa", False),
                    "dropout_p": bound.get("dropout_p", 0.0),
                    "scale": bound.get("scale"),
                    "kwargs": sorted(kwargs),
                }
            )
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- spec parsing


def test_parse_spec_folder_file_and_prefix():
    p = hm.parse_hf_spec(hs.HF_PREFIX + fx("llama"))
    assert p == os.path.join(fx("llama"), "config.json")
    assert hm.parse_hf_spec(os.path.join(fx("llama"), "config.json")) == p
    assert hs.is_hf_spec("hf:x") and not hs.is_hf_spec("model.py:make")


def _one_line_error(exc_info, *needles):
    msg = str(exc_info.value)
    assert "\n" not in msg and msg.strip() == msg and msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_error_missing_path(tmp_path):
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec("hf:" + str(tmp_path / "nope"))
    _one_line_error(e, "no such file")


def test_error_folder_without_config(tmp_path):
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec("hf:" + str(tmp_path))
    _one_line_error(e, "no config.json")


def test_error_invalid_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n  "hidden_size": 64,,\n}\n')
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec("hf:" + str(tmp_path))
    _one_line_error(e, "invalid JSON", "line 2")


def test_error_not_an_object_and_no_model_type(tmp_path):
    (tmp_path / "a.json").write_text("[1, 2]")
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec(str(tmp_path / "a.json"))
    _one_line_error(e, "JSON object")
    (tmp_path / "b.json").write_text('{"hidden_size": 64}')
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec(str(tmp_path / "b.json"))
    _one_line_error(e, "model_type")


def test_error_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "my_secret_arch", "auto_map": {}}))
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec("hf:" + str(tmp_path))
    _one_line_error(e, "unknown model_type", "my_secret_arch", "auto_map")


def test_error_no_causal_lm_class(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(hs.HFModelError) as e:
        hm.parse_hf_spec("hf:" + str(tmp_path))
    _one_line_error(e, "no causal-LM class", "vit")


def test_error_bad_attn_and_sizes():
    with pytest.raises(hs.HFModelError) as e:
        hm.build_hf(fx("llama"), attn="flex", device="meta")
    _one_line_error(e, "sdpa", "eager", "flash_attention_2")
    with pytest.raises(hs.HFModelError) as e:
        hm.build_hf(fx("llama"), micro_batch=0, device="meta")
    _one_line_error(e, "micro_batch")
    with pytest.raises(hs.HFModelError) as e:
        # 64 learned positions: would IndexError on CPU, silent on meta
        hm.build_hf(fx("gpt2"), seq_len=65, device="meta")
    _one_line_error(e, "exceeds", "64")
    hm.build_hf(fx("llama"), seq_len=128, device="meta")  # RoPE: allowed


def test_error_bad_config_value(tmp_path):
    d = json.load(open(os.path.join(fx("llama"), "config.json")))
    d["num_attention_heads"] = 5  # 64 not divisible by 5
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(hs.HFModelError) as e:
        hm.build_hf(str(tmp_path), device="meta")
    _one_line_error(e)


def test_error_transformers_missing(monkeypatch):
    hm._tf.cache_clear()
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    try:
        with pytest.raises(ImportError) as e:
            hm.parse_hf_spec(fx("llama"))
        assert isinstance(e.value, hs.HFModelError)
        _one_line_error(e, 'pip install "topoprof[hf]"')
    finally:
        monkeypatch.undo()
        hm._tf.cache_clear()


def test_no_network(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", boom)
    monkeypatch.setattr(socket, "create_connection", boom)
    m, b, _ = hm.build_hf(fx("qwen2"), device="meta")
    m(**b).loss.backward()


# --------------------------------------------------------------------------- loss / fwd+bwd


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", TINY)
def test_cpu_loss_matches_manual(name, attn):
    model, batch, loss_fn = hm.build_hf(fx(name), attn=attn, micro_batch=2, seq_len=32, device="cpu")
    assert loss_fn is None
    assert model.training
    assert type(model).__name__ == EXPECTED[name][0]
    assert model.config._attn_implementation == attn
    assert batch["input_ids"].shape == (2, 32) and batch["input_ids"].dtype == torch.long
    assert torch.equal(batch["input_ids"], batch["labels"])
    batch = with_ignored(batch)
    out = model(**batch)
    ref = manual_causal_lm_loss(out.logits, batch["labels"])
    assert out.loss.dtype == torch.float32 and out.loss.shape == ()
    assert abs(out.loss.item() - ref.item()) < 1e-6
    out.loss.backward()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    missing = [n for n, p in params if p.grad is None]
    assert not missing, missing
    assert all(torch.isfinite(p.grad).all() for _, p in params)


def test_labels_default_equal_ignores_last_position():
    # HF pads labels with -100 then shifts: identical to slicing logits[:, :-1]
    model, batch, _ = hm.build_hf(fx("llama"), micro_batch=3, seq_len=16, device="cpu")
    out = model(**batch)
    assert abs(out.loss.item() - manual_causal_lm_loss(out.logits, batch["labels"]).item()) < 1e-6


@pytest.mark.parametrize("name", TINY)
def test_meta_forward_backward(name):
    with torch.device("meta"):  # the default device, as the trace sets it
        model, batch, _ = hm.build_hf(fx(name), micro_batch=2, seq_len=32)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "meta" for b in model.buffers())
    for t in batch.values():
        assert t.device.type == "meta" and t.dtype == torch.long and t.shape == (2, 32)
    out = model(**batch)
    assert out.loss.device.type == "meta" and out.loss.shape == () and out.loss.dtype == torch.float32
    assert out.logits.shape == (2, 32, 128)
    out.loss.backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape and p.grad.device.type == "meta", n


def test_meta_default_seq_len_and_dtype():
    model, batch, _ = hm.build_hf(fx("gpt2"), device="meta")
    assert batch["input_ids"].shape == (1, 64)  # min(n_positions=64, 2048)
    model, batch, _ = hm.build_hf(fx("llama"), dtype="bfloat16", micro_batch=2, device="meta")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.topoprof_hf.dtype == torch.bfloat16
    with pytest.raises(hs.HFModelError):
        hm.build_hf(fx("llama"), dtype="int8", device="meta")


def test_tied_weights_on_meta():
    m, _, _ = hm.build_hf(fx("qwen2"), device="meta")
    assert m.lm_head.weight is m.get_input_embeddings().weight
    m, _, _ = hm.build_hf(fx("llama"), device="meta")
    assert m.lm_head.weight is not m.get_input_embeddings().weight


def test_llama31_8b_on_meta():
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    hm.build_hf(fx("llama"), device="meta")  # warm up imports
    r0, t0 = rss_mb(), time.perf_counter()
    model, batch, _ = hm.build_hf(fx("llama31_8b"), micro_batch=1, seq_len=2048, device="meta", dtype=None)
    build_s = time.perf_counter() - t0
    n = sum(p.numel() for p in model.parameters())
    assert n == LLAMA31_8B_PARAMS
    assert build_s < 120, build_s  # seconds, not the minutes of materialised weights
    assert rss_mb() - r0 < 500  # meta: no storage
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # config torch_dtype
    assert model.config.rope_parameters["rope_type"] == "llama3"
    assert model.config.rope_parameters["factor"] == 8.0
    path = find_block_list(model)
    assert path == "model.layers" and len(model.get_submodule(path)) == 32
    out = model(**batch)
    assert out.logits.shape == (1, 2048, 128256) and out.loss.dtype == torch.float32
    out.loss.backward()
    assert model.lm_head.weight.grad.shape == (128256, 4096)
    print(f"\n8B build on meta: {build_s:.2f}s, params {n:,}")


def test_describe_8b():
    d = describe_hf("hf:" + fx("llama31_8b"))
    assert d["architecture"] == "LlamaForCausalLM"
    assert (d["num_layers"], d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"]) == (32, 4096, 32, 8)
    assert d["head_dim"] == 128 and d["intermediate_size"] == 14336 and d["vocab_size"] == 128256
    assert d["num_params"] == LLAMA31_8B_PARAMS
    assert d["block_list"] == "model.layers" and d["num_blocks"] == 32
    assert d["max_positions"] == 131072 and d["default_seq_len"] == 2048
    assert d["tie_word_embeddings"] is False and d["dtype"] == "float32"  # fp32 weights, as autocast trains


# What the tests read of a built architecture (its block list by the tool's one finder).
def _count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() dedups tied weights


def describe_hf(config_path: str) -> dict:
    """Summary of the architecture (built on meta; takes about a second even for 8B)."""
    model, _, _ = hm.build_hf(config_path, device="meta", seq_len=1)
    config = model.config
    tc = config.get_text_config() if hasattr(config, "get_text_config") else config
    path = find_block_list(model)  # the one finder the tool wraps a user's blocks by
    blocks = model.get_submodule(path) if path is not None else None
    heads = getattr(tc, "num_attention_heads", None)
    hidden = getattr(tc, "hidden_size", None)
    kv = getattr(tc, "num_key_value_heads", None) or heads
    head_dim = getattr(tc, "head_dim", None) or (hidden // heads if hidden and heads else None)
    n_params = _count_params(model)
    return {
        "architecture": type(model).__name__,
        "model_type": config.model_type,
        "num_layers": getattr(tc, "num_hidden_layers", None),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "intermediate_size": getattr(tc, "intermediate_size", None) or getattr(tc, "n_inner", None),
        "vocab_size": getattr(tc, "vocab_size", None),
        "max_positions": hm._max_positions(config),
        "default_seq_len": hm.default_seq_len(config),
        "tie_word_embeddings": bool(getattr(tc, "tie_word_embeddings", False)),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "num_params": n_params,
        "block_list": path,
        "block_class": type(blocks[0]).__name__ if blocks is not None else None,
        "num_blocks": len(blocks) if blocks is not None else 0,
        "params_per_block": _count_params(blocks[0]) if blocks is not None else 0,
    }


# --------------------------------------------------------------------------- block list


@pytest.mark.parametrize("name", TINY + ["llama31_8b"])
def test_find_block_list(name):
    model, _, _ = hm.build_hf(fx(name), device="meta")
    path = find_block_list(model)
    assert path == EXPECTED[name][1]
    blocks = model.get_submodule(path)
    assert type(blocks[0]).__name__ == EXPECTED[name][2]
    assert len(blocks) == model.config.num_hidden_layers
    d = describe_hf(fx(name))
    assert d["block_list"] == path and d["block_class"] == EXPECTED[name][2]


def test_find_block_list_generic():
    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Linear(8, 8)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.Linear(8, 8)
            self.experts = nn.ModuleList(Expert() for _ in range(16))  # more children than layers

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixed = nn.ModuleList([nn.Linear(1000, 1000), nn.ReLU()])  # big but heterogeneous
            self.body = nn.Sequential()
            self.body.blocks = nn.ModuleList(Layer() for _ in range(3))

    net = Net()
    path = find_block_list(net)
    assert path == "body.blocks" and len(net.get_submodule(path)) == 3
    with torch.device("meta"):
        assert find_block_list(Net()) == "body.blocks"
    assert find_block_list(nn.Linear(2, 2)) is None


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("name", TINY)
def test_sdpa_vs_eager_same_loss(name):
    losses, grads = {}, {}
    for attn in ("sdpa", "eager"):
        model, batch, _ = hm.build_hf(fx(name), attn=attn, micro_batch=2, seq_len=24, device="cpu", seed=3)
        out, g = loss_and_grads(model, with_ignored(batch))
        losses[attn], grads[attn] = out.loss.item(), g
    assert abs(losses["sdpa"] - losses["eager"]) < 1e-5
    for n in grads["sdpa"]:
        torch.testing.assert_close(grads["sdpa"][n], grads["eager"][n], rtol=1e-4, atol=1e-5)


def test_flash_attention_2_built_as_sdpa():
    model, batch, _ = hm.build_hf(fx("llama"), attn="flash_attention_2", device="meta")
    info = model.topoprof_hf
    assert info.attn_requested == "flash_attention_2" and info.attn_built == "sdpa" and info.price_as_flash
    assert model.config._attn_implementation == "sdpa"
    model(**batch).loss.backward()
    model, _, _ = hm.build_hf(fx("llama"), attn="sdpa", device="meta")
    assert model.topoprof_hf.price_as_flash is False


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", TINY)
def test_sdpa_call_signature(name, device):
    """What the tracer sees: one SDPA per layer, no mask, is_causal=True, GQA not expanded."""
    model, batch, _ = hm.build_hf(fx(name), attn="sdpa", micro_batch=2, seq_len=16, device=device)
    with SDPACapture() as cap:
        loss = model(**batch).loss
    loss.backward()
    cfg = model.config
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    hd = cfg.hidden_size // heads
    assert len(cap.calls) == cfg.num_hidden_layers
    for c in cap.calls:
        assert c["attn_mask"] is None and c["is_causal"] is True
        assert c["q"] == (2, heads, 16, hd)
        assert c["k"] == c["v"] == (2, kv, 16, hd)
        assert c["enable_gqa"] is (name in GQA)
        assert c["dropout_p"] == 0.0 and c["scale"] == pytest.approx(hd**-0.5)


def test_eager_has_no_sdpa_call():
    model, batch, _ = hm.build_hf(fx("llama"), attn="eager", micro_batch=1, seq_len=8, device="cpu")
    with SDPACapture() as cap:
        model(**batch)
    assert cap.calls == []


# --------------------------------------------------------------------------- checkpointing


def _gc_enabled(model):
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


@pytest.mark.parametrize("name", TINY)
def test_gradient_checkpointing_same_loss_and_grads(name):
    res = {}
    for gc in (False, True):
        model, batch, _ = hm.build_hf(fx(name), micro_batch=2, seq_len=24, device="cpu", gradient_checkpointing=gc,
                                      seed=5)
        assert model.training and _gc_enabled(model) is gc and model.topoprof_hf.gradient_checkpointing is gc
        out, g = loss_and_grads(model, batch)
        res[gc] = (out.loss.item(), g)
    assert abs(res[False][0] - res[True][0]) < 1e-6
    assert res[False][1].keys() == res[True][1].keys()
    for n in res[False][1]:
        torch.testing.assert_close(res[False][1][n], res[True][1][n], rtol=1e-5, atol=1e-6)


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()
        self.phase = "fwd"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[(self.phase, str(func))] += 1
        return func(*args, **(kwargs or {}))


def test_gradient_checkpointing_on_meta_reruns_blocks():
    """Recompute under non-reentrant checkpointing is visible to a TorchDispatchMode only.

    On meta, SDPA decomposes to the math path (2 aten.bmm per layer).  With checkpointing,
    backward re-runs each block's forward: +2 bmm per layer in the backward phase.  A
    TorchFunctionMode sees nothing during backward (the engine does not propagate it).
    """
    bmm = {}
    for gc in (False, True):
        model, batch, _ = hm.build_hf(fx("llama"), micro_batch=1, seq_len=16, gradient_checkpointing=gc, device="meta")
        with OpCounter() as ops, SDPACapture() as cap:
            loss = model(**batch).loss
            n_fwd = len(cap.calls)
            ops.phase = "bwd"
            loss.backward()
        assert n_fwd == 2 and len(cap.calls) == 2  # nothing seen at torch-function level in backward
        bmm[gc] = (ops.counts[("fwd", "aten.bmm.default")], ops.counts[("bwd", "aten.bmm.default")])
    assert bmm[False] == (4, 8)
    assert bmm[True] == (4, 12)


# --------------------------------------------------------------------------- script: NOTES table


def _sdpa_table():
    rows = []
    for name in TINY + ["llama31_8b"]:
        for device in ("cpu", "meta"):
            if name == "llama31_8b" and device == "cpu":
                continue
            seq = 2048 if name == "llama31_8b" else 16
            model, batch, _ = hm.build_hf(fx(name), micro_batch=2, seq_len=seq, device=device)
            with SDPACapture() as cap:
                model(**batch).loss.backward()
            c = cap.calls[0]
            rows.append(
                f"| {name} | {device} | {len(cap.calls)} | {c['q']} | {c['k']} | {c['v']} | {c['dtype']} | "
                f"{c['attn_mask']} | {c['is_causal']} | {c['enable_gqa']} | {c['dropout_p']} | {c['scale']:.4g} | "
                f"{', '.join(c['kwargs'])} |"
            )
    print("| model | device | calls (fwd) | q | k | v | dtype | attn_mask | is_causal | enable_gqa | dropout_p | scale "
          "| passed as kwargs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    _sdpa_table()
