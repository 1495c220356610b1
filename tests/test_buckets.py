"""DDP bucket assignment: the pure-Python port against torch's own function and a real DDP."""
import random
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch import nn  # noqa: E402

from topoprof.errors import InputError  # noqa: E402
from topoprof.model.ddp.buckets import (  # noqa: E402
    DEFAULT_FIRST_BUCKET_BYTES,
    MIB,
    compute_bucket_assignment_by_size,
    ddp_bucket_limits,
    ddp_buckets,
)
from topoprof.model.strategies.dataparallel import take_tensors  # noqa: E402
from topoprof.workload.layout import Layout, TensorSpec, Use  # noqa: E402
from topoprof.workload.presets import bert_layout, get_preset, gpt2_layout  # noqa: E402

DDP_LIMITS = [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB]


def _ours(tensors, limits, sparse=None, indices=None):
    sizes = [t.numel() * t.element_size() for t in tensors]
    keys = [(t.dtype, t.device) for t in tensors]
    return compute_bucket_assignment_by_size(sizes, limits, sparse, indices, keys)


def _torch(tensors, limits, sparse=None, indices=None):
    sparse = sparse if sparse is not None else [False] * len(tensors)
    args = (tensors, limits, sparse) + ((indices,) if indices is not None else ())
    groups, caps = dist._compute_bucket_assignment_by_size(*args)
    return [list(g) for g in groups], list(caps)


def _mlp():
    return nn.Sequential(nn.Linear(300, 3000), nn.ReLU(), nn.Linear(3000, 50), nn.ReLU(),
                         nn.Linear(50, 2000), nn.ReLU(), nn.Linear(2000, 2000), nn.Linear(2000, 7))


class EmbedLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20000, 256)
        self.hidden = nn.Linear(256, 1024)
        self.out = nn.Linear(1024, 20000)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(self.emb(x))))


def _transformer():
    return nn.Transformer(d_model=256, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                          dim_feedforward=1024, batch_first=True)


def _meta_params(layout):
    return [torch.empty(t.shape, device="meta") for t in layout.tensors]


MODULES = {"transformer": _transformer, "mlp": _mlp, "embed_linear": EmbedLinear}


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("limits", [DDP_LIMITS, [sys.maxsize], [64 * 1024, 1 * MIB]])
def test_equals_torch_for_real_modules(name, limits):
    params = list(MODULES[name]().parameters())
    reversed_params = list(reversed(params))  # the order DDP's rebuilt buckets usually see
    assert _ours(params, limits) == _torch(params, limits)
    assert _ours(reversed_params, limits) == _torch(reversed_params, limits)
    indices = list(reversed(range(len(params))))  # rebuild path: tensor_indices, no sort
    assert _ours(reversed_params, limits, indices=indices) == _torch(
        reversed_params, limits, indices=indices)


@pytest.mark.parametrize("preset", ["gpt2", "gpt2-medium", "bert-base", "llama-7b", "resnet50"])
def test_equals_torch_for_preset_shapes(preset):
    layout = get_preset(preset)
    params = _meta_params(layout)  # shapes only: llama-7b would need 27 GB otherwise
    order = [r.index for r in layout.ready_schedule()]
    in_order = [params[i] for i in order]
    assert _ours(in_order, DDP_LIMITS, indices=order) == _torch(in_order, DDP_LIMITS,
                                                                 indices=order)
    assert _ours(params[::-1], DDP_LIMITS) == _torch(params[::-1], DDP_LIMITS)
    # and ddp_buckets gives the same groups with their byte sizes
    buckets = ddp_buckets(layout, grad_bytes=4)
    groups, _ = _torch(in_order, DDP_LIMITS, indices=order)
    assert [list(b.tensor_indices) for b in buckets] == groups
    assert [b.size_bytes for b in buckets] == [
        sum(params[i].numel() * 4 for i in g) for g in groups]
    assert sum(b.size_bytes for b in buckets) == layout.params * 4


def test_equals_torch_mixed_dtypes_and_sparse_random():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 25)
        tensors = [torch.empty(rng.choice([1, 100, 70_000, 300_000]), device="meta",
                               dtype=rng.choice([torch.float32, torch.float16])) for _ in range(n)]
        sparse = [rng.random() < 0.1 for _ in range(n)]
        limits = rng.choice([DDP_LIMITS, [400_000], [1000, 500_000, 2_000_000]])
        assert _ours(tensors, limits, sparse) == _torch(tensors, limits, sparse)
        # with tensor_indices and one dtype the order of leftover buckets is defined too
        same = [t.float() for t in tensors]
        indices = list(range(n))
        rng.shuffle(indices)
        assert _ours(same, limits, sparse, indices) == _torch(same, limits, sparse, indices)


def test_hand_computed_bucketing():
    # sizes 600 KiB, 600 KiB, 30 MiB, 10 MiB, 10 MiB, 10 MiB with limits [1 MiB, 25 MiB]:
    # 600K+600K = 1.17 MiB >= 1 MiB closes bucket 0; 30 MiB >= 25 MiB alone closes bucket 1;
    # 10+10 = 20 < 25, +10 = 30 >= 25 closes bucket 2.
    kib = 1024
    sizes = [600 * kib, 600 * kib, 30 * MIB, 10 * MIB, 10 * MIB, 10 * MIB]
    groups, caps = compute_bucket_assignment_by_size(sizes, [MIB, 25 * MIB])
    assert groups == [[0, 1], [2], [3, 4, 5]]
    assert caps == [MIB, 25 * MIB, 25 * MIB]


def test_bucket_limits_follow_torch_config():
    assert ddp_bucket_limits(None) == (DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB)
    assert DEFAULT_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    with pytest.raises(InputError, match="bucket_cap_mb must be > 0, got 0"):
        ddp_bucket_limits(0)


@pytest.mark.skipif(not hasattr(torch.nn.parallel.distributed, "_BucketCapacityConfig"),
                    reason="torch before 2.12 keeps the rule inside DistributedDataParallel.__init__ "
                           "(bucket_bytes_cap_default); tests/test_training.py checks a real DDP's buckets")
def test_an_explicit_cap_sets_the_first_bucket_as_torch_config_does():
    # an explicit bucket_cap_mb sets the first bucket to the same cap (_BucketCapacityConfig)
    config = torch.nn.parallel.distributed._BucketCapacityConfig.create(25, None, False)
    assert ddp_bucket_limits(25) == (config.first_bucket_bytes_cap, config.bucket_bytes_cap)


def test_take_tensors_matches_torch():
    from torch._utils import _take_tensors
    rng = random.Random(1)
    tensors = [torch.empty(rng.choice([10, 1_000_000, 3_000_000, 5_000_000])) for _ in range(40)]
    limit = 10485760
    expected = [sum(t.numel() * 4 for t in chunk) for chunk in _take_tensors(tensors, limit)]
    assert take_tensors([t.numel() * 4 for t in tensors], limit) == expected


# ---- against a real DDP (gloo, one process) -------------------------------------------------

@pytest.fixture(scope="module")
def process_group():
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        created = True
    if dist.get_world_size() != 1:
        pytest.skip("a default process group with world size != 1 already exists")
    yield
    if created:
        dist.destroy_process_group()


class LayoutModule(nn.Module):
    """Parameters shaped and registered as a layout says, used in the layout's forward order,
    so autograd produces gradients in the order the model expects."""

    def __init__(self, layout: Layout):
        super().__init__()
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(t.shape)) for t in layout.tensors)
        self.uses = layout.uses

    def forward(self, x):
        for use in self.uses:
            for i in use.tensors:
                x = x + self.weights[i].sum()
        return x


def _rebuilt_groups(data):
    """`rebuilt_per_bucket_param_indices` reads like '6 5, 4 3 2 1 0'."""
    text = data["rebuilt_per_bucket_param_indices"]
    return [[int(i) for i in group.split()] for group in text.split(", ")]


def _rebuilt(ddp_model, make_input, steps=3):
    for _ in range(steps):  # buckets are rebuilt in the forward after the first backward
        ddp_model(make_input()).sum().backward()
    data = ddp_model._get_ddp_logging_data()
    assert data["has_rebuilt_buckets"] == 1
    sizes = [int(s) for s in data["rebuilt_bucket_sizes"].split(", ")]
    return sizes, _rebuilt_groups(data), data


@pytest.mark.parametrize("layout,cap_mb", [
    # default limits (1 MiB, then 25 MiB), and an explicit cap (both limits the same)
    (gpt2_layout(n_layer=2, n_embd=128, n_positions=128, vocab_size=8000, name="gpt2-narrow"),
     None),
    (bert_layout(n_layer=2, hidden=128, intermediate=512, name="bert-tiny"), 0.25),
])
def test_real_ddp_rebuilt_buckets_equal_prediction(process_group, layout, cap_mb):
    model = nn.parallel.DistributedDataParallel(LayoutModule(layout), bucket_cap_mb=cap_mb)
    sizes, groups, data = _rebuilt(model, lambda: torch.zeros(()))
    predicted = ddp_buckets(layout, grad_bytes=4, bucket_cap_mb=cap_mb)
    assert groups == [list(b.tensor_indices) for b in predicted]
    assert sizes == [b.size_bytes for b in predicted]
    # before the rebuild DDP (find_unused_parameters=False) used one bucket of everything
    assert data["bucket_sizes"] == str(layout.params * 4)


@pytest.mark.parametrize("factory,make_input", [
    (_mlp, lambda: torch.randn(2, 300)),
    (EmbedLinear, lambda: torch.randint(0, 20000, (2, 5))),
])
def test_real_ddp_sequential_modules_reverse_registration(process_group, factory, make_input):
    module = factory()
    model = nn.parallel.DistributedDataParallel(module)
    sizes, groups, _ = _rebuilt(model, make_input)
    params = list(module.parameters())
    # ready order of a front-to-back model: reverse registration (bias before weight)
    order = list(reversed(range(len(params))))
    ours, _ = compute_bucket_assignment_by_size(
        [params[i].numel() * 4 for i in order], DDP_LIMITS, tensor_indices=order)
    assert groups == ours
    assert sizes == [sum(params[i].numel() * 4 for i in g) for g in ours]


def test_real_ddp_transformer_buckets_from_observed_ready_order(process_group):
    module = _transformer()
    model = nn.parallel.DistributedDataParallel(module)
    src = torch.randn(2, 6, 256)
    for _ in range(3):  # nn.Transformer takes (src, tgt)
        model(src, src[:, :4]).sum().backward()
    groups = _rebuilt_groups(model._get_ddp_logging_data())
    observed_order = [i for g in groups for i in g]
    params = list(module.parameters())
    ours, _ = compute_bucket_assignment_by_size(
        [params[i].numel() * 4 for i in observed_order], DDP_LIMITS, tensor_indices=observed_order)
    assert groups == ours


def test_empty_inputs_rejected():
    with pytest.raises(InputError):
        compute_bucket_assignment_by_size([], [MIB])
    with pytest.raises(InputError):
        compute_bucket_assignment_by_size([4], [])


def test_tiny_layout_buckets_ready_fraction():
    # three chunks: a (ready last), b, c (ready first); cap 1 MiB explicit -> both limits 1 MiB
    layout = Layout("t", (TensorSpec("a", (200_000,)), TensorSpec("b", (200_000,)),
                          TensorSpec("c", (100_000,))),
                    (Use((0,), 1.0), Use((1,), 1.0), Use((2,), 2.0)), "test")
    buckets = ddp_buckets(layout, grad_bytes=4, bucket_cap_mb=1)
    # ready order c (after 2/4 of backward), b (3/4), a (4/4); bytes 400K, 800K, 800K:
    # 400K+800K = 1.2M >= 1 MiB closes [c, b]; a is left over.
    assert [b.tensor_indices for b in buckets] == [(2, 1), (0,)]
    assert [b.ready_fraction for b in buckets] == [0.75, 1.0]
    assert [b.size_bytes for b in buckets] == [1_200_000, 800_000]


def test_real_ddp_no_sync_around_backward_only_still_reduces(process_group):
    # The model's ddp_no_sync_backward_only == ddp_synced rests on this: _post_forward arms the
    # reducer (prepare_for_backward) when forward runs outside no_sync().
    calls = []

    def counting_hook(state, bucket):
        calls.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    model = nn.parallel.DistributedDataParallel(_mlp())
    model.register_comm_hook(None, counting_hook)
    x = torch.randn(2, 300)
    with model.no_sync():  # forward and backward inside: nothing reduced
        model(x).sum().backward()
    assert calls == []
    out = model(x)
    with model.no_sync():  # only backward inside: reduced anyway
        out.sum().backward()
    assert calls


def test_overlap_with_both_sides_slowed_hand_computed():
    from topoprof.model.ddp.timeline import overlap_floor_s, simulate_overlap

    # One bucket ready at once, 4 s of all-reduce alone, 10 s of backward alone.
    # Compute at 1/2 speed beside it and the all-reduce at 1/2 speed: the all-reduce takes 8 s of
    # wall time, during which backward does 4 s of its work; the other 6 s follow alone: 14 s.
    both = simulate_overlap([0.0], [4.0], 10.0, slowdown=2.0, comm_slowdown=2.0)
    assert both.exposed_s == 4.0 and both.backward_end_s == 14.0 and both.comm_end_s == 8.0
    # Only compute slowed: 4 s beside backward, which does 2 s of work: 2 s exposed.
    assert simulate_overlap([0.0], [4.0], 10.0, slowdown=2.0).exposed_s == 2.0
    # Floor: d * comm_slowdown * (1 - 1/slowdown) = 4 * 2 * 0.5
    assert overlap_floor_s([0.5], [4.0], 2.0, 2.0) == 4.0
