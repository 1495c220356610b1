"""torch's CUDA choice of a `scaled_dot_product_attention` backend (torch 2.6 .. 2.15), restated in
pure Python for the trace (`topoprof.trace.target_lens`): on the meta device torch always takes
its math path, so the lens asks this module which kernel the GPU would run, and runs that one.

Standard library only. Each rule cites where it was read:
  [SRC-main]  pytorch/pytorch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
              @ 001f694aef6f922b4fdf6d27d59162d27bf3df58 (main after 2.14)
  [SRC-B]     the same file in the TORCH_CUDNN_SDPA_PREFERRED era (about 2.9)
  [SRC-C]     the same file in the TORCH_CUDNN_SDPA_DEPRIORITIZED era, before its CUDA_VERSION split
  [SRC-A]     the same file in the [sm80, sm90] era, with a constexpr priority order
  [HDR-2p]    sdp_utils_cpp.h (check_batch_size_and_num_heads_dense<gqa, same_heads>)
  [ATT]       aten/src/ATen/native/transformers/attention.cpp
  [CTX]       aten/src/ATen/Context.h, the default sdp_priority_order
  [WHEEL-x.y] the strings, mangled symbols and Python files of the official PyPI CUDA wheel
              torch==x.y.z (libtorch_cuda.so), and its METADATA pin of nvidia-cudnn-cu1x: which
              checks and messages each release has (not their control flow).
The copies of sdp_utils.cpp read are not tied to release tags: where a release's behaviour was
inferred from its wheel's strings rather than read, the rule says so. Not verified: 2.8's cuDNN
priority (no preference variable in its wheel: not preferred here), 2.9's compile-time cuDNN (taken
as its wheel's pinned 9.10.2), the cudnn-frontend version per wheel (head dim 256 over cuDNN's
limit on 2.14+ by default), the exact cuDNN head-dim rule in 2.10-2.13 (2.9's applied), and 2.15's
flash grid-size threshold (noted, not enforced).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import List, Optional, Tuple

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"

# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------

_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


@dataclass(frozen=True)
class SdpaCall:
    """What reaches F.scaled_dot_product_attention, in (B, H, L, E) layout."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int                      # qk head dim
    head_dim_v: Optional[int] = None   # defaults to head_dim
    dtype: str = "bf16"                # "bf16" | "fp16" | "fp32" | "fp64"
    mask: Optional[str] = None         # None | "bool" | "float"
    # shape of attn_mask as passed to SDPA (any rank); None -> (1, 1, q_len, kv_len)
    mask_shape: Optional[Tuple[int, ...]] = None
    mask_requires_grad: bool = False
    mask_last_dim_contiguous: bool = True
    is_causal: bool = False
    dropout_p: float = 0.0
    enable_gqa: bool = False
    requires_grad: bool = True         # any of q/k/v requires grad AND grad mode on
    last_dim_contiguous: bool = True   # q, k, v .stride(-1) == 1
    storage_offsets_aligned: bool = True  # (offset*elsize) % (align*elsize) == 0; 2.13+ mem-eff
    nested: bool = False               # NestedTensor inputs: NOT modelled (raises)
    ndim: int = 4

    @property
    def dv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def mshape(self) -> Optional[Tuple[int, ...]]:
        if self.mask is None:
            return None
        return self.mask_shape if self.mask_shape is not None else (1, 1, self.q_len, self.kv_len)


@dataclass(frozen=True)
class GpuArch:
    major: int
    minor: int = 0


@dataclass(frozen=True)
class SdpaConfig:
    """Runtime knobs that change the choice. Defaults = stock PyPI wheel, stock settings."""

    cudnn_version: Optional[int] = None   # runtime cuDNN (e.g. 91002); None -> wheel pin
    cuda_major: Optional[int] = None      # CUDA major of the wheel; None -> wheel default
    enable_flash: bool = True
    enable_mem_efficient: bool = True
    enable_math: bool = True
    enable_cudnn: bool = True
    deterministic: bool = False           # use_deterministic_algorithms(True), warn_only=False
    env_cudnn_preferred: Optional[bool] = None      # TORCH_CUDNN_SDPA_PREFERRED (2.9)
    env_cudnn_deprioritized: Optional[bool] = None  # TORCH_CUDNN_SDPA_DEPRIORITIZED (2.10+)
    # kCuDNNFrontendSupportsD256 (compile-time cudnn-frontend >= 1.24, [SRC-main]); the
    # frontend version bundled in each wheel was NOT verified -> default False.
    cudnn_frontend_d256: bool = False


@dataclass
class Choice:
    backend: str
    refused: dict = field(default_factory=dict)   # backend -> reason (first failing filter)
    order: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# Per-version facts (see NOTES.md for the evidence of each column)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _V:
    sm_upper: Tuple[int, int]     # upper bound of [sm80|sm50, smXX] for flash/mem-eff/cudnn
    grad_rule_sm120: bool         # sm120/121 added to the sm86/89 head_dim>192 training rule
    meff_gqa: bool                # mem-efficient accepts enable_gqa natively
    cudnn_heads_check: bool       # cuDNN calls check_batch_size_and_num_heads_dense<gqa, !same>
    cudnn_pref: str               # "none" | "B" (PREFERRED env, compile cudnn>=9.9) | "C" (DEPRIORITIZED, runtime>9.15)
    cudnn_seq1: str               # "any" (s_q==1 or s_k==1 refused) | "kv_or_q_dropout"
    cudnn_dropout_window: bool    # refuse dropout for 9.11 < cudnn < 9.14
    cudnn_dropout_16: bool        # dropout must be a multiple of 1/16
    cudnn_hd_rule: str            # "A" (<=128) | "B" (256 on sm90.0 if cudnn>=9.10) | "main"
    cudnn_bhmax: bool             # batch/heads <= 65535 (only seen in [SRC-main])
    meff_ptr_align: bool          # check_data_ptr_alignment_mem_efficient
    wheel_cudnn: int
    wheel_cuda: int
    flash_rng: str                # names of the rng outputs in native_functions.yaml
    cudnn_lse_4d: bool            # cudnn logsumexp (B,H,Lq,1) vs (B,H,Lq)


_VERSIONS = {
    (2, 6): _V((9, 0), False, False, False, "none", "any", False, False, "A", False, False, 90100, 12,
               "philox_seed/philox_offset", False),
    (2, 7): _V((12, 0), True, False, False, "none", "any", False, False, "A", False, False, 90501, 12,
               "rng_state/unused", False),
    (2, 8): _V((12, 1), True, False, True, "none", "any", False, False, "B", False, False, 91002, 12,
               "rng_state/unused", False),
    (2, 9): _V((12, 1), True, False, True, "B", "kv_or_q_dropout", True, False, "B", False, False, 91002, 12,
               "rng_state/unused", True),
    (2, 10): _V((12, 1), True, False, True, "C", "kv_or_q_dropout", True, False, "B", False, False, 91002, 12,
                "rng_state/unused", True),
    (2, 11): _V((12, 1), True, False, True, "C", "kv_or_q_dropout", True, False, "B", False, False, 91900, 13,
                "rng_state/unused", True),
    (2, 12): _V((12, 1), True, False, True, "C", "kv_or_q_dropout", True, True, "B", False, False, 92000, 13,
                "rng_state/unused", True),
    (2, 13): _V((12, 1), True, False, True, "C", "kv_or_q_dropout", True, True, "B", True, True, 92000, 13,
                "rng_state/unused", True),
    (2, 14): _V((12, 1), True, True, True, "C", "kv_or_q_dropout", True, True, "main", True, True, 92400, 13,
                "rng_state/unused", True),
    (2, 15): _V((12, 1), True, True, True, "C", "kv_or_q_dropout", True, True, "main", True, True, 92600, 13,
                "rng_state/unused", True),
}


def version_rules(torch_version: Tuple[int, int]) -> _V:
    tv = tuple(torch_version[:2])
    if tv not in _VERSIONS:
        raise ValueError(f"torch {tv} not modelled (2.6 .. 2.15 only)")
    return _VERSIONS[tv]


def _sm_in(gpu: GpuArch, lo: Tuple[int, int], hi: Tuple[int, int]) -> bool:
    # check_sm_version<lower, upper>: inclusive on (major, minor)  [SRC-main]
    return lo <= (gpu.major, gpu.minor) <= hi


# --------------------------------------------------------------------------------------
# Shared filters (sdp_utils_cpp.h)
# --------------------------------------------------------------------------------------


def _check_tensor_shapes(c: SdpaCall):
    if c.ndim != 4:
        return "All fused kernels requires query, key and value to be 4 dimensional"
    return None


def _check_nonzero_seq(c: SdpaCall):
    if c.q_len == 0 or c.kv_len == 0:
        return "All fused kernels do not support zero seq_len_q or seq_len_kv."
    return None


def _check_last_dim_stride(c: SdpaCall, ignore_singleton_dim: bool):
    ok = c.last_dim_contiguous or (ignore_singleton_dim and c.head_dim == 1)
    mask_ok = c.mask is None or c.mask_last_dim_contiguous
    if not (ok and mask_ok):
        return "All fused kernels require the last dimension of the input to have stride 1."
    return None


def _check_batch_heads(c: SdpaCall, supports_gqa: bool, requires_same_num_heads: bool = True):
    # [HDR-2p] check_batch_size_and_num_heads_dense / check_grouped_query_attention.
    # batch sizes of q/k/v are always equal in this model.
    if c.enable_gqa and supports_gqa:
        # k and v heads are the same in this model (kv_heads), so only divisibility matters
        if c.q_heads % c.kv_heads != 0:
            return "The number of heads in key/value must divide number of heads in query."
        return None
    if c.q_heads != c.kv_heads:
        return ("For dense input, both fused kernels require query, key and value to have the "
                "same num_heads.")
    return None


def _check_dtype(c: SdpaCall, allowed):
    if c.dtype not in allowed:
        return f"Expected query, key and value to all be of dtype: {{{', '.join(allowed)}}}. Got Query dtype: {c.dtype}"
    return None


def _check_attn_mask_shape(c: SdpaCall):
    # sdp_utils_cpp.h check_attn_mask_shape (used by cuDNN only)  [HDR old id 6219912647]
    if c.mask is None:
        return None
    if c.mask_requires_grad:
        return "attn_mask requires grad (check_attn_mask_shape returns false, no message)"
    s = c.mshape
    assert s is not None  # a mask has a shape
    bad = ("Please use the following attn mask shapes: 2d - ({Q_seq_len, 1}  x {KV_seq_len, 1}); "
           "4d - ({Batch, 1} x {Num_heads, 1} x {Q_seq_len, 1}  x {KV_seq_len, 1})")
    if len(s) < 2:
        return bad
    if s[-2] not in (c.q_len, 1) or s[-1] not in (c.kv_len, 1):
        return bad
    if len(s) == 2:
        return None
    if len(s) == 4 and s[0] in (1, c.batch) and s[1] in (1, c.q_heads):
        return None
    return bad


# --------------------------------------------------------------------------------------
# Backend predicates
# --------------------------------------------------------------------------------------


def _low_precision_dtypes(gpu: GpuArch):
    # check_dtypes_low_precision: sm>=8 -> {fp16, bf16}; else {fp16}   [SRC-main]
    return ("fp16", "bf16") if gpu.major >= 8 else ("fp16",)


def can_use_flash(c: SdpaCall, gpu: GpuArch, v: _V, cfg: SdpaConfig) -> Optional[str]:
    """Return None if usable, else the first refusal reason (torch's own words)."""
    if not cfg.enable_flash:
        return "Flash attention has been runtime disabled."
    r = _check_tensor_shapes(c)
    if r:
        return r
    if c.mask is not None:  # check_for_attn_mask
        return "Flash Attention does not support non-null attn_mask."
    hd, dv = c.head_dim, c.dv
    if not (hd == dv and hd <= 256):  # check_head_dim_size_flash (CUDA: max 256)
        return ("Flash attention requires q,k,v to have the same last dimension and to be less "
                f"than or equal to 256. Got Query.size(-1): {hd}, Key.size(-1): {hd}, Value.size(-1): {dv} instead.")
    if not _sm_in(gpu, (8, 0), v.sm_upper):
        return (f"Flash attention only supports gpu architectures in the range [sm80, "
                f"sm{v.sm_upper[0]}{v.sm_upper[1]}]. Attempting to run on a sm {gpu.major}.{gpu.minor} gpu.")
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89[_or_120]
    on_86_89 = _sm_in(gpu, (8, 6), (8, 9))
    on_120 = v.grad_rule_sm120 and _sm_in(gpu, (12, 0), (12, 1))
    if c.requires_grad and (on_86_89 or on_120):
        supported = hd <= 192 or (c.dropout_p == 0.0 and hd > 224)
        if not supported:
            return ("Flash attention currently doesn't support training with head_dim ∈ (192, 224] or "
                    "(head_dim ∈ (224, 256] and dropout > 0.0) on gpu architectures in the range[sm86, sm89].")
    if c.is_causal and c.q_len != c.kv_len:  # check_flash_causal_non_square_seqlens
        return ("Flash attention does not support the is_causal flag when seqlen_q != seqlen_k. "
                f"Got seqlen_q: {c.q_len} seqlen_k: {c.kv_len}.")
    r = _check_dtype(c, _low_precision_dtypes(gpu))  # check_dtypes_flash_attention (FA3 off)
    if r:
        return r
    # dense constraints: flash supports GQA in every version seen ([SRC-A], [SRC-main];
    # mangled check_batch_size_and_num_heads_dense<true...> in every wheel)
    return (_check_batch_heads(c, supports_gqa=True) or _check_nonzero_seq(c)
            or _check_last_dim_stride(c, ignore_singleton_dim=True))


def _min_gemm_alignment(c: SdpaCall, gpu: GpuArch) -> int:
    # minimum_gemm_alignment / use_tensor_cores   [SRC-main]
    is_half = c.dtype in ("fp16", "bf16")
    use_tc = gpu.major >= 8 or (gpu.major >= 7 and is_half)
    mn = 4 if gpu.major >= 8 else 1
    if use_tc:
        mn = max(mn, 128 // (16 if is_half else 32))
    return mn


def can_use_efficient(c: SdpaCall, gpu: GpuArch, v: _V, cfg: SdpaConfig) -> Optional[str]:
    if not cfg.enable_mem_efficient:
        return "Memory Efficient attention has been runtime disabled."
    if not _sm_in(gpu, (5, 0), v.sm_upper):
        return (f"Mem Efficient Attention only supports gpu architectures in the range [sm50, "
                f"sm{v.sm_upper[0]}{v.sm_upper[1]}]. Attempting to run on a sm {gpu.major}.{gpu.minor} gpu.")
    r = _check_tensor_shapes(c)
    if r:
        return r
    a = _min_gemm_alignment(c, gpu)  # check_head_dim_size_mem_efficient (no upper bound on CUDA)
    if not (c.head_dim % a == 0 and c.head_dim > 0 and c.dv % a == 0 and c.dv > 0):
        return (f"Mem efficient attention requires last dimension of inputs to be divisible by {a}. "
                f"Got Query.size(-1): {c.head_dim}, Key.size(-1): {c.head_dim}, Value.size(-1): {c.dv} instead.")
    if v.meff_ptr_align and gpu.major >= 8 and not c.storage_offsets_aligned:
        return ("Mem efficient attention on sm80 or newer requires q, k, and v storage offsets * "
                f"element_size to be aligned to {a * _DTYPE_BYTES.get(c.dtype, 2)} bytes.")
    r = (_check_nonzero_seq(c) or _check_last_dim_stride(c, ignore_singleton_dim=False)
         or _check_batch_heads(c, supports_gqa=v.meff_gqa))
    if r:
        return r
    allowed = ("fp16", "fp32", "bf16") if gpu.major >= 8 else ("fp16", "fp32")
    return _check_dtype(c, allowed)


def _cudnn_version(v: _V, cfg: SdpaConfig) -> int:
    return cfg.cudnn_version if cfg.cudnn_version is not None else v.wheel_cudnn


def _cudnn_head_dim_reason(c: SdpaCall, gpu: GpuArch, v: _V, cfg: SdpaConfig) -> Optional[str]:
    cv = _cudnn_version(v, cfg)
    dqk, dv = c.head_dim, c.dv
    limit = 128
    if v.cudnn_hd_rule == "B":  # [SRC-B] check_cudnn_tensor_shapes
        if cv >= 91000 and gpu.major == 9 and gpu.minor == 0:
            limit = 256
    elif v.cudnn_hd_rule == "main":  # [SRC-main] check_cudnn_tensor_shapes
        sm90_10x = (gpu.major == 9 and gpu.minor == 0) or gpu.major == 10
        bad107 = gpu.major == 10 and gpu.minor == 7 and cv <= 92500
        if sm90_10x and not bad107 and cv > 92200 and cfg.cudnn_frontend_d256:
            limit = 256
        elif sm90_10x and cv >= 91100 and dqk == 192 and dv == 128:
            limit = 192
    if not (dqk <= limit and dv <= limit):
        return f"head_dim should be no more than {limit}"
    if dqk % 8 or dv % 8:
        return "head_dim should be a multiple of 8"
    return None


def can_use_cudnn(c: SdpaCall, gpu: GpuArch, v: _V, cfg: SdpaConfig) -> Optional[str]:
    cv = _cudnn_version(v, cfg)
    if v.cudnn_dropout_window and c.dropout_p > 0.0 and 91100 < cv < 91400:
        return "cuDNN version does not support droppout in SDPA (9.11 - 9.13)."
    if not cfg.enable_cudnn:
        return "cuDNN attention has been runtime disabled."
    r = _check_tensor_shapes(c)
    if r:
        return r
    if cfg.deterministic:
        return "cuDNN SDPA is not deterministic."
    r = _check_dtype(c, _low_precision_dtypes(gpu))
    if r:
        return r
    r = _check_attn_mask_shape(c)
    if r:
        return r
    if not _sm_in(gpu, (8, 0), v.sm_upper):
        return (f"cuDNN MHA only supports gpu architectures in the range [sm80, "
                f"sm{v.sm_upper[0]}{v.sm_upper[1]}]. Attempting to run on a sm {gpu.major}.{gpu.minor} gpu.")
    if v.cudnn_dropout_16 and c.dropout_p * 16.0 != int(c.dropout_p * 16.0):
        return "cuDNN dropout probability resolution is limited to 1/16."
    r = _check_nonzero_seq(c) or _check_last_dim_stride(c, ignore_singleton_dim=True)
    if r:
        return r
    if v.cudnn_heads_check:
        r = _check_batch_heads(c, supports_gqa=True, requires_same_num_heads=False)
        if r:
            return r
    if v.cudnn_bhmax and (c.batch > 65535 or c.q_heads > 65535):
        return "cuDNN SDPA does not support batch size or num_heads greater than 65535."
    r = _cudnn_head_dim_reason(c, gpu, v, cfg)
    if r:
        return r
    if v.cudnn_seq1 == "any":
        if c.q_len == 1 or c.kv_len == 1:  # [SRC-A]
            return "cudnn SDPA does not support sequence length 1."
    else:
        if c.kv_len == 1:
            return "cudnn SDPA does not support key/value sequence length 1."
        if c.dropout_p != 0.0 and c.q_len == 1:
            return "cudnn SDPA does not support query sequence length 1 with dropout."
    if v.cudnn_hd_rule == "main" and c.requires_grad:  # check_cudnn_d256_bprop_head_dim
        sm90_10x = (gpu.major == 9 and gpu.minor == 0) or gpu.major == 10
        bad107 = gpu.major == 10 and gpu.minor == 7 and cv <= 92500
        if cv > 92200 and cfg.cudnn_frontend_d256 and sm90_10x and not bad107:
            dqk, dv = c.head_dim, c.dv
            if not ((dqk <= 128 and dv <= 128) or (dqk == 192 and dv == 128) or (dqk == 256 and dv == 256)):
                return ("cuDNN SDPA on SM 9.0/10.x does not support backward with these head dimensions. "
                        f"Got d_qk: {dqk}, d_v: {dv}")
    return None


# --------------------------------------------------------------------------------------
# Priority order and selection
# --------------------------------------------------------------------------------------

_DEFAULT_ORDER = [FLASH, EFFICIENT, MATH, CUDNN]  # [CTX] (overrideable last, CUDA never uses it)
_CUDNN_FIRST = [CUDNN, FLASH, EFFICIENT, MATH]    # priority_order() cudnn_order [SRC-B]/[SRC-main]


def prefers_cudnn(gpu: GpuArch, torch_version, cfg: SdpaConfig = SdpaConfig()) -> bool:
    """check_prefer_cudnn_attention() for the given version / wheel."""
    v = version_rules(torch_version)
    cv = _cudnn_version(v, cfg)
    if v.cudnn_pref == "none":
        return False
    if v.cudnn_pref == "B":
        # [SRC-B]: check_env("TORCH_CUDNN_SDPA_PREFERRED") != false; compile-time
        # CUDNN_VERSION >= 90900 (we use the wheel's cuDNN as a proxy); (9|10) and minor 0
        if cfg.env_cudnn_preferred is False:
            return False
        return cv >= 90900 and gpu.major in (9, 10) and gpu.minor == 0
    # "C": [SRC-C]/[SRC-main]: DEPRIORITIZED env; runtime cudnn > 91500;
    # CUDA < 13 (and [SRC-C] unconditionally): minor 0 or 3; CUDA >= 13 ([SRC-main]): any minor
    if cfg.env_cudnn_deprioritized:
        return False
    cuda = cfg.cuda_major if cfg.cuda_major is not None else v.wheel_cuda
    if not (cv > 91500 and gpu.major in (9, 10)):
        return False
    if cuda < 13:
        return gpu.minor in (0, 3)
    return True


def priority_order(gpu: GpuArch, torch_version, cfg: SdpaConfig = SdpaConfig()) -> List[str]:
    return list(_CUDNN_FIRST if prefers_cudnn(gpu, torch_version, cfg) else _DEFAULT_ORDER)


def choose_backend(call: SdpaCall, gpu: GpuArch, torch_version: Tuple[int, int],
                   cfg: SdpaConfig = SdpaConfig()) -> Choice:
    """select_sdp_backend(): first backend in priority order whose can_use_* passes."""
    if call.nested:
        raise NotImplementedError("NestedTensor inputs are not modelled")
    v = version_rules(torch_version)
    order = priority_order(gpu, torch_version, cfg)
    ch = Choice(backend="error", order=order)
    preds = {FLASH: can_use_flash, EFFICIENT: can_use_efficient, CUDNN: can_use_cudnn}
    for b in order:
        if b == MATH:
            if cfg.enable_math:
                ch.backend = MATH
                break
            ch.refused[MATH] = "math disabled by user"
            continue
        r = preds[b](call, gpu, v, cfg)
        if r is None:
            ch.backend = b
            break
        ch.refused[b] = r
    # reasons for backends after the chosen one are not evaluated by torch; fill them in
    # for information (same predicates), marked as not reached.
    for b in (FLASH, EFFICIENT, CUDNN):
        if b not in ch.refused and b != ch.backend:
            r = preds[b](call, gpu, v, cfg)
            ch.refused[b] = ("(not reached) " + r) if r else "(not reached; would be usable)"
    _annotate(ch, call, v)
    return ch


def _annotate(ch: Choice, c: SdpaCall, v: _V):
    if v is _VERSIONS[(2, 15)] and ch.backend == FLASH and max(c.batch, c.q_heads) > 65535:
        ch.notes.append("2.15 wheel has check_flash_attention_grid_size ('Flash attention does not support "
                        "batch size or num_heads greater than ...'); threshold NOT read -> not modelled")
    if c.is_causal and c.mask is not None and ch.backend == MATH:
        ch.notes.append("math: TORCH_CHECK fails: 'Explicit attn_mask should not be set when is_causal=True'")
    if ch.backend == MATH and c.q_heads != c.kv_heads:
        if c.enable_gqa:
            ch.notes.append("math: pre_process_group_query_attention_input repeat_interleave()s k and v "
                            f"to {c.q_heads} heads (materialized copies)")
        elif c.kv_heads != 1:
            ch.notes.append("math: q/k heads differ without enable_gqa -> matmul broadcast error")
    if ch.backend == MATH and c.dtype in ("fp16", "bf16"):
        ch.notes.append("math: q/k/v upcast to fp32 unless allow_fp16_bf16_reduction_math_sdp(True) [ATT]")
    if ch.backend == FLASH and c.head_dim % 8:
        ch.notes.append(f"flash: q/k/v padded to head_dim {ceil(c.head_dim / 8) * 8} (pad_last_dim<8>) [ATT]")
    if ch.backend == EFFICIENT and c.mask is not None:
        if c.kv_len % 16:
            ch.notes.append("efficient: mask expanded to (B,H,Lq,Lk) and padded to a multiple of 16 "
                            "-> materialized (preprocess_mask/pad_bias) [ATT]")
    if ch.backend == CUDNN and not v.cudnn_heads_check:
        ch.notes.append("cudnn in 2.6/2.7: constraint list taken from [SRC-A]; not verified per tag")


# --------------------------------------------------------------------------------------
# What each backend's forward returns / keeps for backward
# --------------------------------------------------------------------------------------

_TORCH_DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def saved_for_backward(choice, call: SdpaCall, torch_version: Tuple[int, int] = (2, 13),
                       allow_fp16_bf16_reduction_math: bool = False) -> List[Tuple[str, tuple, str]]:
    """(name, shape, dtype) the forward op returns and autograd keeps for backward.

    Shapes follow torch/_meta_registrations.py of the same wheel; op signatures follow
    native_functions.yaml (see NOTES.md).  Inputs q/k/v are listed because every fused
    backward signature takes them (query, key, value, out, logsumexp, ...).
    """
    backend = choice.backend if isinstance(choice, Choice) else choice
    v = version_rules(torch_version)
    c = call
    B, H, Hkv, Lq, Lk, D, Dv = c.batch, c.q_heads, c.kv_heads, c.q_len, c.kv_len, c.head_dim, c.dv
    dt = _TORCH_DT[c.dtype]
    out: List[Tuple[str, tuple, str]] = []
    if backend == FLASH:
        Dp = ceil(D / 8) * 8  # pad_last_dim<8> in attention.cpp
        out += [("query", (B, H, Lq, Dp), dt), ("key", (B, Hkv, Lk, Dp), dt), ("value", (B, Hkv, Lk, Dp), dt),
                ("output", (B, H, Lq, Dp), dt), ("logsumexp", (B, H, Lq), "float32")]
        if v.flash_rng == "philox_seed/philox_offset":
            out += [("philox_seed", (), "int64"), ("philox_offset", (), "int64")]
        else:
            out += [("rng_state", (2,), "uint64"), ("unused", (), "uint64")]
        # cum_seq_q / cum_seq_k: undefined for dense inputs; debug_attn_mask: empty (return_debug_mask=False)
    elif backend == EFFICIENT:
        lse = ceil(Lq / 32) * 32 if c.requires_grad else 0
        out += [("query", (B, H, Lq, D), dt), ("key", (B, Hkv, Lk, D), dt), ("value", (B, Hkv, Lk, Dv), dt)]
        if c.mask is not None:
            if Lk % 16:
                out.append(("attn_bias", (B, H, Lq, ceil(Lk / 16) * 16), dt))  # padded, materialized, sliced view
            else:
                out.append(("attn_bias", (B, H, Lq, Lk), dt + " (expanded view of mask; storage = mask)"))
        out += [("output", (B, H, Lq, Dv), dt), ("logsumexp", (B, H, lse), "float32"),
                ("philox_seed", (), "int64"), ("philox_offset", (), "int64")]
    elif backend == CUDNN:
        out += [("query", (B, H, Lq, D), dt), ("key", (B, Hkv, Lk, D), dt), ("value", (B, Hkv, Lk, Dv), dt),
                ("output", (B, H, Lq, Dv), dt),
                ("logsumexp", (B, H, Lq, 1) if v.cudnn_lse_4d else (B, H, Lq), "float32"),
                ("philox_seed", (), "int64"), ("philox_offset", (), "int64")]
        if c.mshape is not None:  # a mask
            out.append(("attn_bias", tuple(c.mshape), dt if c.mask == "float" else dt + " (from bool)"))
    elif backend == MATH:
        acc = "float32" if (c.dtype in ("fp16", "bf16") and not allow_fp16_bf16_reduction_math) else dt
        Hk = H if (c.enable_gqa and Hkv != H) else Hkv
        # matmul(q*s, k^T*s) saves both operands; softmax saves its output; dropout saves its
        # mask; matmul(attn, v) saves attn and v.  (autograd of the composite, [ATT])
        out += [("q_scaled", (B, H, Lq, D), acc), ("k_t_scaled", (B, Hk, D, Lk), acc),
                ("softmax_out", (B, H, Lq, Lk), acc)]
        if c.dropout_p > 0.0:
            out += [("dropout_mask", (B, H, Lq, Lk), "bool"), ("attn_after_dropout", (B, H, Lq, Lk), acc)]
        out += [("value" + ("_repeated" if Hk != Hkv else ""), (B, Hk, Lk, Dv), acc)]
    else:
        raise ValueError(backend)
    return out


# --------------------------------------------------------------------------------------
# nn.MultiheadAttention (training, need_weights=False) -> SDPA call
# --------------------------------------------------------------------------------------


@dataclass
class MhaSdpa:
    uses_sdpa: bool
    call: Optional[SdpaCall]
    note: str = ""


def mha_training_sdpa_call(batch: int, seq_len: int, embed_dim: int, num_heads: int, *,
                           dtype: str = "bf16", dropout: float = 0.0, batch_first: bool = True,
                           attn_mask: Optional[str] = None, attn_mask_dim: int = 2,
                           key_padding_mask: bool = False, is_causal: bool = False,
                           need_weights: bool = False, src_len: Optional[int] = None) -> MhaSdpa:
    """What F.multi_head_attention_forward hands to SDPA (torch 2.6 .. 2.15; same code).

    attn_mask: None | "bool" | "float" (as passed to the module; bool is converted to a float
    -inf mask of query dtype by _canonical_mask).  attn_mask_dim: 2 -> (L,S), 3 -> (B*H,L,S).
    batch_first only transposes (N,L,E)->(L,N,E) before the same code path.
    """
    S = seq_len if src_len is None else src_len
    L = seq_len
    hd = embed_dim // num_heads
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. ")
    if need_weights:
        return MhaSdpa(False, None, "need_weights=True: bmm/baddbmm + softmax + dropout + bmm path, no SDPA")
    mask_kind = None
    mask_shape = None
    sdpa_causal = False
    if is_causal and not key_padding_mask:
        # `if is_causal and key_padding_mask is None and not need_weights: attn_mask = None`
        sdpa_causal = True
    else:
        if attn_mask is not None:
            mask_kind = "float"  # _canonical_mask: bool -> zeros.masked_fill_(mask, -inf)
            mask_shape = (1, 1, L, S) if attn_mask_dim == 2 else (batch, num_heads, L, S)
        if key_padding_mask:
            # kpm -> float, view(bsz,1,1,S).expand(-1,H,-1,-1).reshape(bsz*H,1,S); merged by add
            mask_kind = "float"
            mask_shape = (batch, num_heads, 1, S) if attn_mask is None else (batch, num_heads, L, S)
    call = SdpaCall(batch=batch, q_heads=num_heads, kv_heads=num_heads, q_len=L, kv_len=S,
                    head_dim=hd, dtype=dtype, mask=mask_kind, mask_shape=mask_shape,
                    is_causal=sdpa_causal, dropout_p=dropout, requires_grad=True)
    return MhaSdpa(True, call, "q/k/v are views of the packed in-projection: stride(-1)==1")


# --------------------------------------------------------------------------------------
# Hugging Face transformers 5.x sdpa_attention_forward (integrations/sdpa_attention.py)
# --------------------------------------------------------------------------------------


def hf_sdpa_call(batch: int, seq_len: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 dtype: str = "bf16", padding: bool = False, dropout: float = 0.0,
                 sliding_window: Optional[int] = None, packed_position_ids: bool = False,
                 q_len: Optional[int] = None, kv_len: Optional[int] = None,
                 requires_grad: bool = True) -> SdpaCall:
    """Causal LM, eager (not compiled/exported), CUDA, no cache unless q_len/kv_len given.

    masking_utils.create_causal_mask -> sdpa_mask -> _ignore_causal_mask_sdpa returns None
    (no materialized mask) when (q_len == 1 or kv_len == q_len) and no padding, or when
    q_offset == 0 and padding only covers "future" kv slots; sliding window with
    kv_len >= window, packed sequences (position_ids resets), or or/and mask functions force a
    4D bool mask of shape (B, 1, q_len, kv_len).
    sdpa_attention_forward: is_causal = q_len > 1 and attention_mask is None and module.is_causal;
    enable_gqa=True only if num_kv_groups > 1, mask is None and head dims equal and <= 256
    (use_gqa_in_sdpa, CUDA branch); otherwise repeat_kv() materializes k/v to num_heads.
    """
    ql = seq_len if q_len is None else q_len
    kl = seq_len if kv_len is None else kv_len
    skip = not padding and (ql == 1 or kl == ql)
    if sliding_window is not None and kl >= sliding_window:
        skip = False
    if packed_position_ids:
        skip = False
    mask = None if skip else "bool"
    is_causal = ql > 1 and mask is None
    enable_gqa = False
    kvh = num_kv_heads
    if num_heads != num_kv_heads:
        if mask is None and head_dim <= 256:
            enable_gqa = True
        elif ql == 1:
            # pack_gqa: (B, H, 1, D) -> (B, Hkv, n_rep, D); no repeat of k/v
            return SdpaCall(batch, num_kv_heads, num_kv_heads, num_heads // num_kv_heads, kl, head_dim,
                            dtype=dtype, mask=mask, mask_shape=(batch, 1, 1, kl) if mask else None,
                            is_causal=False, dropout_p=dropout, requires_grad=requires_grad)
        else:
            kvh = num_heads  # repeat_kv
    return SdpaCall(batch, num_heads, kvh, ql, kl, head_dim, dtype=dtype, mask=mask,
                    mask_shape=(batch, 1, ql, kl) if mask else None, is_causal=is_causal,
                    dropout_p=dropout, enable_gqa=enable_gqa, requires_grad=requires_grad)
