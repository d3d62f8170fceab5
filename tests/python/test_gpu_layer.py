"""comet.MoELayer and the ops on the GPU, with W virtual ranks (Team.local), against a plain PyTorch MoE:
EP, TP and EP x TP, both links, the ugly routings, torch.compile, CUDA graphs, bad inputs; the gradients
against autograd through the plain MoE."""
import dataclasses
import zlib

import pytest
import torch

import comet
from comet import weights as W
from moe_problem import (Grads, assert_grad_matches, assert_matches, make_problem, random_douts, reference_grads,
                         reference_moe, relative_error)

pytestmark = pytest.mark.skipif(not comet.cuda_ready(), reason="no CUDA GPU (sm_90a)")


def layer_for(p, link="device", **kw):
    # The tests compare comet's kernels with each other bit for bit: cuBLAS's backward GEMMs (the
    # default's pick with <= 2 local experts) only where a test asks (test_cublas_backward_*).
    kw.setdefault("cublas_backward", False)
    team = comet.Team.local(p.world, link, ep=p.ep, tp=p.tp)
    assert team.maps_peers  # one process reaches every virtual rank's buffers
    team.set_timeout(5.0)  # a stalled flag fails the test in seconds
    max_tokens = max(max(x.shape[0] for x in p.x), 1)
    layer = comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, p.act, team=team, max_tokens=max_tokens, **kw)
    layer.load_experts(p.gate_up.to(torch.bfloat16).cuda(), p.down.to(torch.bfloat16).cuda())
    return layer


def run_and_check(p, layer, what):
    out = layer(p.x, p.ids, p.gates)
    torch.cuda.synchronize()
    layer.engine.synchronize()
    for r in range(p.world):
        assert out[r].shape == p.x[r].shape and out[r].dtype == torch.bfloat16
        assert_matches(out[r], reference_moe(p, p.x[r], p.ids[r], p.gates[r]), f"{what} rank {r}")
    return out


CASES = [
    # name, problem kwargs, link
    ("EP2_device", dict(ep=2, tokens=(37, 200)), "device"),
    ("EP4_zero_token_rank_host", dict(ep=4, tokens=(100, 0, 257, 3)), "host"),
    ("EP8_top8_host", dict(hidden=512, ffn=256, experts=16, topk=8, ep=8, tokens=(100, 0, 33, 257, 1, 64, 128, 5)),
     "host"),
    ("EP4_one_hot_expert_top1_silu", dict(act="silu", ffn=640, experts=4, topk=1, ep=4, tokens=(90, 200, 0, 129),
                                         routing="one_hot"), "device"),
    ("EP4_empty_experts", dict(ep=4, tokens=(64, 65, 66, 67), routing="half"), "device"),
    ("TP4_gelu", dict(hidden=384, ffn=384, act="gelu", ep=1, tp=4, tokens=(50, 70, 0, 129)), "device"),
    ("EP2xTP2_top8", dict(hidden=512, ffn=256, experts=16, topk=8, ep=2, tp=2, tokens=(80, 0, 150, 41)), "device"),
    ("EP4xTP2_zipf_host", dict(ep=4, tp=2, tokens=(20, 40, 60, 80, 100, 0, 7, 130), routing="zipf"), "host"),
    ("W1_single_token", dict(ep=1, tokens=(1,)), "device"),
    ("EP8_one_token_each", dict(ep=8, tokens=(1,) * 8), "host"),
]


@pytest.mark.parametrize("name,kw,link", CASES, ids=[c[0] for c in CASES])
def test_forward_matches_plain_pytorch(name, kw, link):
    p = make_problem(seed=zlib.crc32(name.encode()) % 1000, **kw)
    run_and_check(p, layer_for(p, link), name)


def test_int32_and_int64_ids_give_the_same_bits():
    p = make_problem(ep=4, tokens=(100, 3, 0, 64), routing="zipf", seed=3)
    layer = layer_for(p)
    a = layer(p.x, p.ids, p.gates)
    b = layer(p.x, [i.to(torch.int32) for i in p.ids], p.gates)
    for r in range(p.world):
        assert torch.equal(a[r], b[r])


def test_repeated_calls_are_bitwise_identical():
    p = make_problem(hidden=512, ffn=256, experts=16, topk=8, ep=4, tokens=(200, 150, 0, 99), seed=4)
    layer = layer_for(p, "host")
    first = layer(p.x, p.ids, p.gates)
    for _ in range(5):
        again = layer(p.x, p.ids, p.gates)
        for r in range(p.world):
            assert torch.equal(first[r], again[r])


def test_split_layer_ops_equal_the_fused_op():
    p = make_problem(ep=2, tp=2, tokens=(80, 0, 150, 41), seed=5)
    layer = layer_for(p)
    fused = layer(p.x, p.ids, p.gates)
    hidden = comet.ops.moe_layer0(layer.engine, p.x, p.ids, p.gates, layer.w0)
    assert hidden[0].shape == (layer.engine.max_rows, layer.engine.ffn_shard)
    split = comet.ops.moe_layer1(layer.engine, hidden, p.ids, list(layer.w1))  # a list is stacked
    for r in range(p.world):
        assert torch.equal(fused[r], split[r])
    with pytest.raises(NotImplementedError, match="moe_forward"):  # the split ops serve inference
        sum(o.float().sum() for o in split).backward()


def test_loaders_agree_and_round_trip():
    p = make_problem(ep=2, tp=2, tokens=(30, 40, 50, 60), seed=6)
    a = layer_for(p)
    b = layer_for(p)
    gate_up, down = p.gate_up.to(torch.bfloat16).cuda(), p.down.to(torch.bfloat16).cuda()
    F = p.ffn
    b.load_linear_experts([gate_up[e, :F] for e in range(p.experts)], [gate_up[e, F:] for e in range(p.experts)],
                          [down[e] for e in range(p.experts)])
    assert torch.equal(a.w0, b.w0) and torch.equal(a.w1, b.w1)
    g2, d2 = a.experts()
    assert torch.equal(g2, gate_up) and torch.equal(d2, down)
    sd = a.state_dict()
    c = layer_for(p)
    c.w0.data.zero_()
    c.load_state_dict(sd)
    for r, (x, y) in enumerate(zip(a(p.x, p.ids, p.gates), c(p.x, p.ids, p.gates))):
        assert torch.equal(x, y), r


def test_local_loaders_match_the_full_ones():
    """load_local_experts from each rank's plain shards (what a sharded checkpoint holds) gives the
    weights load_experts gives from the full ones, and local_experts() gives the shards back."""
    for kw in (dict(ep=2, tp=2, tokens=(5, 6, 7, 8)), dict(act="gelu", ep=2, tokens=(5, 6))):
        p = make_problem(seed=31, **kw)
        full = layer_for(p)
        local = layer_for(p)
        with torch.no_grad():
            local.w0.zero_()
            local.w1.zero_()
        gate_up, down = p.gate_up.to(torch.bfloat16), p.down.to(torch.bfloat16)
        F, el, fs = p.ffn, p.experts // p.ep, p.ffn // p.tp
        shards0, shards1 = [], []
        for r in range(p.world):
            g, i = r // p.tp, r % p.tp
            experts = slice(g * el, (g + 1) * el)
            rows = [gate_up[experts, i * fs:(i + 1) * fs]]
            if local.gated:
                rows.append(gate_up[experts, F + i * fs:F + (i + 1) * fs])
            shards0.append(torch.cat(rows, 1).cuda())
            shards1.append(down[experts, :, i * fs:(i + 1) * fs].cuda())
        local.load_local_experts(shards0, shards1)
        assert torch.equal(local.w0, full.w0) and torch.equal(local.w1, full.w1)
        back0, back1 = local.local_experts()
        assert all(torch.equal(b, s) for b, s in zip(back0, shards0))
        assert all(torch.equal(b, s) for b, s in zip(back1, shards1))
        run_and_check(p, local, f"{kw} after load_local_experts")


def test_router_and_shared_expert():
    torch.manual_seed(7)
    p = make_problem(ep=2, tokens=(33, 64), seed=7)
    layer = layer_for(p, router=True, shared_ffn=128, renormalize=True)
    out = layer(p.x)
    for r in range(p.world):
        logits = layer.router(p.x[r])
        ids, gates = comet.route(logits, p.topk)
        want = reference_moe(p, p.x[r], ids, gates) + layer.shared(p.x[r]).float().cpu()
        assert_matches(out[r], want, f"router+shared rank {r}")
    # router logits from the caller, [batch, seq, H] in and out
    x3 = p.x[0].reshape(3, 11, p.hidden)
    logits = torch.randn(3, 11, p.experts, device="cuda")
    y = layer([x3, p.x[1]], router_logits=[logits, torch.randn(64, p.experts, device="cuda")])
    assert y[0].shape == x3.shape


class Block(torch.nn.Module):
    """A residual block around the MoE layer, to compile as one graph (elementwise only around it, so
    that the compiled graph computes the same bits as eager)."""

    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def forward(self, x, ids, gates):
        return x + self.moe(x * 2, ids, gates)


def test_torch_compile_fullgraph_matches_eager():
    p = make_problem(ep=1, tokens=(100,), seed=8)
    layer = layer_for(p)
    block = Block(layer)
    with torch.no_grad():  # inference; training below
        eager = block(p.x[0], p.ids[0], p.gates[0])
        compiled = torch.compile(block, fullgraph=True)
        got = compiled(p.x[0], p.ids[0], p.gates[0])
    assert torch.equal(got, eager)


def test_torch_compile_fullgraph_trains_like_eager():
    p = make_problem(ep=1, tokens=(100,), seed=16)
    layer = layer_for(p)
    block = Block(layer)
    dout = random_douts(p, 16)[0]

    def grads(fn):
        x, gates = p.x[0].clone().requires_grad_(), p.gates[0].clone().requires_grad_()
        layer.zero_grad(set_to_none=True)
        fn(x, p.ids[0], gates).backward(dout)
        return [x.grad, gates.grad, layer.w0.grad, layer.w1.grad]

    eager = grads(block)
    compiled = grads(torch.compile(block, fullgraph=True))  # its backward graph traced by moe_backward's fake
    for name, a, b in zip(("x", "gates", "w0", "w1"), eager, compiled):
        assert torch.equal(a, b), name  # around the layer only x * 2 and x + y: exact in bf16


# ---- backward ----------------------------------------------------------------------------------------------
def backward_once(p, layer, dout):
    """One micro-batch: forward and backward of sum_r <dout_r, out_r>; the inputs' and gates' gradients."""
    xs = [x.clone().requires_grad_() for x in p.x]
    gates = [g.clone().requires_grad_() for g in p.gates]
    torch.autograd.backward(layer(xs, p.ids, gates), dout)
    return [x.grad for x in xs], [g.grad for g in gates]


def comet_grads(p, layer, dout) -> Grads:
    """comet's gradients of sum_r <dout_r, out_r> by autograd, the weights' in the full layout."""
    layer.zero_grad(set_to_none=True)
    dx, dgates = backward_once(p, layer, dout)
    t = layer.team
    return Grads(dx, dgates, W.unshard_w0(list(layer.w0.grad), gated=layer.gated, ep=t.ep, tp=t.tp),
                 W.unshard_w1(list(layer.w1.grad), ep=t.ep, tp=t.tp))


GRAD_CASES = [
    # name, problem kwargs, link: W = 1, 2, 4 as EP, TP and EP x TP; no token count a multiple of 128
    ("W1_top8_all_experts", dict(ep=1, topk=8, tokens=(200,)), "device"),
    ("EP2_device", dict(ep=2, tokens=(37, 200)), "device"),
    ("TP2_gelu", dict(hidden=384, ffn=384, act="gelu", ep=1, tp=2, tokens=(50, 129)), "device"),
    # top-1, every token on expert 0: three experts without tokens; rank 2 has no tokens
    ("EP4_one_hot_expert_top1_silu", dict(act="silu", ffn=640, experts=4, topk=1, ep=4, tokens=(90, 200, 0, 129),
                                         routing="one_hot"), "device"),
    # experts 4-7 get no tokens: ranks 2 and 3 have no rows at all
    ("EP4_empty_experts_host", dict(ep=4, tokens=(64, 65, 66, 67), routing="half"), "host"),
    ("TP4_zipf", dict(ep=1, tp=4, tokens=(33, 0, 70, 1), routing="zipf"), "device"),
    ("EP2xTP2_top8", dict(hidden=512, ffn=256, experts=16, topk=8, ep=2, tp=2, tokens=(80, 0, 150, 41)), "device"),
]


@pytest.mark.parametrize("name,kw,link", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_gradients_match_plain_pytorch_autograd(name, kw, link):
    seed = zlib.crc32(name.encode()) % 1000
    p = make_problem(seed=seed, **kw)
    layer = layer_for(p, link)
    dout = random_douts(p, seed + 1)
    got, want = comet_grads(p, layer, dout), reference_grads(p, dout)
    layer.engine.synchronize()
    for r in range(p.world):
        assert_grad_matches(got.dx[r], want.dx[r], f"{name} dx rank {r}")
        assert_grad_matches(got.dgates[r], want.dgates[r], f"{name} dgates rank {r}", rows=False)
    assert_grad_matches(got.gate_up, want.gate_up, f"{name} dW0")
    assert_grad_matches(got.down, want.down, f"{name} dW1")


@pytest.mark.parametrize("name,kw,link", [GRAD_CASES[1], GRAD_CASES[2], GRAD_CASES[3], GRAD_CASES[6]],
                         ids=[GRAD_CASES[i][0] for i in (1, 2, 3, 6)])
def test_fused_activation_grad_is_the_two_pass_result(name, kw, link):
    """fused_activation_grad=True (the activation's backward in the GEMM's epilogue): dx and the weights'
    gradients bit for bit those of the two-pass backward; the gate gradients are the same sums in another
    order."""
    seed = zlib.crc32(name.encode()) % 1000
    p = make_problem(seed=seed, **kw)
    dout = random_douts(p, seed + 1)
    two_pass = comet_grads(p, layer_for(p, link), dout)
    fused = comet_grads(p, layer_for(p, link, fused_activation_grad=True), dout)
    for r in range(p.world):
        assert torch.equal(fused.dx[r], two_pass.dx[r]), f"{name} dx rank {r}"
        torch.testing.assert_close(fused.dgates[r], two_pass.dgates[r], rtol=1e-4, atol=1e-4)
    assert torch.equal(fused.gate_up, two_pass.gate_up), f"{name} dW0"
    assert torch.equal(fused.down, two_pass.down), f"{name} dW1"


@pytest.mark.parametrize("name,kw,link", [GRAD_CASES[3], GRAD_CASES[6]], ids=[GRAD_CASES[i][0] for i in (3, 6)])
def test_grouped_weight_grad_matches_plain_pytorch_autograd(name, kw, link):
    """weight_grad_kernel="grouped" (CUTLASS's grouped ping-pong GEMM for dW0 / dW1): the same checks as the
    default kernel's, on experts without rows (one-hot routing) and on EP x TP with top-8."""
    seed = zlib.crc32(name.encode()) % 1000
    p = make_problem(seed=seed, **kw)
    layer = layer_for(p, link, weight_grad_kernel="grouped")
    dout = random_douts(p, seed + 1)
    got, want = comet_grads(p, layer, dout), reference_grads(p, dout)
    layer.engine.synchronize()
    assert_grad_matches(got.gate_up, want.gate_up, f"{name} dW0")
    assert_grad_matches(got.down, want.down, f"{name} dW1")
    for r in range(p.world):
        assert_grad_matches(got.dx[r], want.dx[r], f"{name} dx rank {r}")


def test_narrow_n_tiles_off_gives_the_same_gradients():
    """narrow_n_tiles=False (the 128 x 320 substitution off) on a shard whose F / tp is 320 (where it
    applies): the option reaches the layer, and both settings give the plain MoE's gradients, bit for bit
    each other's."""
    p = make_problem(seed=320, ffn=640, ep=1, tp=2, tokens=(70, 131))
    dout = random_douts(p, 321)
    on = layer_for(p, "device")
    off = layer_for(p, "device", narrow_n_tiles=False)
    assert on.engine.narrow_n_tiles and not off.engine.narrow_n_tiles
    got_on, got_off, want = comet_grads(p, on, dout), comet_grads(p, off, dout), reference_grads(p, dout)
    assert torch.equal(got_on.gate_up, got_off.gate_up) and torch.equal(got_on.down, got_off.down)
    assert_grad_matches(got_off.gate_up, want.gate_up, "dW0")
    assert_grad_matches(got_off.down, want.down, "dW1")
    for r in range(p.world):
        assert torch.equal(got_on.dx[r], got_off.dx[r]), f"dx rank {r}"
        assert_grad_matches(got_off.dx[r], want.dx[r], f"dx rank {r}")


@pytest.mark.parametrize("name,kw,link", [GRAD_CASES[3], GRAD_CASES[6]], ids=[GRAD_CASES[i][0] for i in (3, 6)])
def test_cublas_backward_matches_plain_pytorch_autograd(name, kw, link):
    """cublas_backward=True with the sequential schedule (n_comm 0: every backward GEMM is cuBLAS's, with
    the rows the forward read back), on experts without rows (one-hot routing) and on EP x TP with top-8:
    the plain MoE's gradients, and the same bits on a second step."""
    seed = zlib.crc32(name.encode()) % 1000
    p = make_problem(seed=seed, **kw)
    layer = layer_for(p, link, cublas_backward=True, n_comm=(0, 0))
    assert layer.engine.cublas_backward is True
    dout = random_douts(p, seed + 1)
    got, want = comet_grads(p, layer, dout), reference_grads(p, dout)
    again = comet_grads(p, layer, dout)
    layer.engine.synchronize()
    assert_grad_matches(got.gate_up, want.gate_up, f"{name} dW0")
    assert_grad_matches(got.down, want.down, f"{name} dW1")
    assert torch.equal(again.gate_up, got.gate_up) and torch.equal(again.down, got.down), f"{name} repeat"
    for r in range(p.world):
        assert_grad_matches(got.dx[r], want.dx[r], f"{name} dx rank {r}")
        assert torch.equal(again.dx[r], got.dx[r]), f"{name} dx rank {r} repeat"


def test_cublas_backward_default_on_few_local_experts():
    """The default (cublas_backward None) on a layout with one local expert per rank (the planner's rule
    takes cuBLAS there), tuned schedule: the plain MoE's gradients."""
    p = make_problem(seed=71, experts=4, ep=4, tokens=(90, 200, 0, 129))
    layer = layer_for(p, "device", cublas_backward=None)
    dout = random_douts(p, 72)
    got, want = comet_grads(p, layer, dout), reference_grads(p, dout)
    layer.engine.synchronize()
    assert_grad_matches(got.gate_up, want.gate_up, "dW0")
    assert_grad_matches(got.down, want.down, "dW1")
    for r in range(p.world):
        assert_grad_matches(got.dx[r], want.dx[r], f"dx rank {r}")


# ---- gradient_accumulation_fusion (Megatron's main_grad) ----------------------------------------------------
def give_main_grads(layer, dtype, megatron_flags=True):
    for w in (layer.w0, layer.w1):
        w.main_grad = torch.zeros(w.shape, dtype=dtype, device=w.device)
        if megatron_flags:
            w.grad_added_to_main_grad = False


@pytest.mark.parametrize("main_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name,kw,link", [GRAD_CASES[1], GRAD_CASES[3], GRAD_CASES[6]],
                         ids=[GRAD_CASES[i][0] for i in (1, 3, 6)])
def test_gradient_accumulation_fusion_adds_into_main_grad(name, kw, link, main_dtype):
    """Two micro-batches into zeroed main grads: after the first, main_grad holds the unfused layer's
    gradient (fp32: exactly its sums before their bf16 rounding, so rounded they are the unfused bits;
    bf16: those bits), dx and dgates are the unfused bits, and Megatron's flag is set with a placeholder
    .grad; after the second it holds the sum of both, against the plain MoE's fp32 autograd."""
    seed = zlib.crc32(name.encode()) % 1000
    p = make_problem(seed=seed, **kw)
    douts = random_douts(p, seed + 1), random_douts(p, seed + 2)
    plain = layer_for(p, link)
    plain_dx, plain_dgates = backward_once(p, plain, douts[0])
    fused = layer_for(p, link, gradient_accumulation_fusion=True)
    give_main_grads(fused, main_dtype)
    dx, dgates = backward_once(p, fused, douts[0])
    fused.engine.synchronize()
    for r in range(p.world):
        assert torch.equal(dx[r], plain_dx[r]), f"{name} dx rank {r}"
        assert torch.equal(dgates[r], plain_dgates[r]), f"{name} dgates rank {r}"
    for which, w, unfused in (("w0", fused.w0, plain.w0.grad), ("w1", fused.w1, plain.w1.grad)):
        assert w.main_grad.dtype == main_dtype
        assert torch.equal(w.main_grad.to(torch.bfloat16), unfused), f"{name} {which}: first micro-batch"
        assert w.grad_added_to_main_grad is True
        assert w.grad is not None and w.grad.shape == w.shape  # Megatron's placeholder, never read
    first0 = fused.w0.main_grad.clone()
    backward_once(p, fused, douts[1])
    fused.engine.synchronize()
    t = fused.team
    got0 = W.unshard_w0(list(fused.w0.main_grad.float()), gated=fused.gated, ep=t.ep, tp=t.tp)
    got1 = W.unshard_w1(list(fused.w1.main_grad.float()), ep=t.ep, tp=t.tp)
    want = [reference_grads(p, d) for d in douts]
    assert_grad_matches(got0, want[0].gate_up + want[1].gate_up, f"{name} dW0 summed")
    assert_grad_matches(got1, want[0].down + want[1].down, f"{name} dW1 summed")
    # The second micro-batch added to the first (not overwrote it): main_grad - first is its gradient.
    second0 = W.unshard_w0(list(fused.w0.main_grad.float() - first0.float()), gated=fused.gated, ep=t.ep,
                           tp=t.tp)
    assert_grad_matches(second0, want[1].gate_up, f"{name} dW0 second micro-batch")


def test_gradient_accumulation_fusion_without_megatron_flags_leaves_grad_none():
    p = make_problem(ep=2, tokens=(37, 200), seed=23)
    layer = layer_for(p, gradient_accumulation_fusion=True)
    give_main_grads(layer, torch.float32, megatron_flags=False)
    backward_once(p, layer, random_douts(p, 24))
    assert layer.w0.grad is None and layer.w1.grad is None
    assert layer.w0.main_grad.abs().sum() > 0 and layer.w1.main_grad.abs().sum() > 0
    layer.w0.grad_added_to_main_grad = layer.w1.grad_added_to_main_grad = False
    layer.w0.zero_out_wgrad = layer.w1.zero_out_wgrad = True
    backward_once(p, layer, random_douts(p, 25))
    assert torch.count_nonzero(layer.w0.grad) == 0 and torch.count_nonzero(layer.w1.grad) == 0


def test_gradient_accumulation_fusion_refuses_bad_main_grads_before_launching():
    """Each refusal comes at the forward, before a kernel runs: the layer then trains as if nothing
    happened (its last forward is the good one)."""
    p = make_problem(ep=2, tokens=(37, 200), seed=26)
    layer = layer_for(p, gradient_accumulation_fusion=True)
    with pytest.raises(RuntimeError, match="w0 has none"):
        backward_once(p, layer, random_douts(p, 27))
    give_main_grads(layer, torch.float32)
    layer.w1.main_grad = torch.zeros(layer.w1.shape, dtype=torch.float16, device="cuda")
    with pytest.raises(TypeError, match="w1.main_grad has dtype torch.float16"):
        backward_once(p, layer, random_douts(p, 27))
    layer.w1.main_grad = torch.zeros(layer.w1.shape, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(TypeError, match="both weight gradients accumulate in one type"):
        backward_once(p, layer, random_douts(p, 27))
    layer.w1.main_grad = torch.zeros(layer.w1.shape, dtype=torch.float32, device="cuda").transpose(-1, -2) \
        .contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="contiguous"):
        backward_once(p, layer, random_douts(p, 27))
    give_main_grads(layer, torch.float32)
    with torch.no_grad():  # inference needs no main_grad
        run_and_check(p, layer, "no_grad forward")
    dout = random_douts(p, 28)
    backward_once(p, layer, dout)
    layer.engine.synchronize()
    t = layer.team
    got = W.unshard_w1(list(layer.w1.main_grad), ep=t.ep, tp=t.tp)
    assert_grad_matches(got, reference_grads(p, dout).down, "dW1 after the refusals")


def test_expert_weights_carry_the_expert_marker():
    for kw, want in ((dict(ep=2, tokens=(3, 4)), False), (dict(ep=1, tp=2, tokens=(3, 4)), True)):
        layer = layer_for(make_problem(seed=30, **kw))
        assert layer.w0.allreduce is want and layer.w1.allreduce is want


def test_gradients_are_bitwise_identical_across_repeats():
    p = make_problem(hidden=512, ffn=256, experts=16, topk=8, ep=4, tokens=(200, 150, 0, 99), routing="zipf",
                     seed=17)
    layer = layer_for(p, "host")
    dout = random_douts(p, 17)
    first, again = comet_grads(p, layer, dout), comet_grads(p, layer, dout)
    for i, (a, b) in enumerate(zip(first.tensors(), again.tensors())):
        assert torch.equal(a, b), i


def test_router_trains_through_the_gates():
    torch.manual_seed(18)
    p = make_problem(ep=2, tokens=(33, 64), seed=18)
    layer = layer_for(p, router=True)
    dout = random_douts(p, 18)
    torch.autograd.backward(layer(p.x), dout)
    # The reference: the same routing (the router's GEMM on the same GPU gives the same ids), the plain
    # MoE's gate gradients, back through comet.route to the router's weight.
    routed = [comet.route(layer.router(x), p.topk) for x in p.x]
    q = dataclasses.replace(p, ids=[r[0] for r in routed], gates=[r[1].detach() for r in routed])
    dgates = [g.cuda() for g in reference_grads(q, dout).dgates]
    (want,) = torch.autograd.grad([r[1] for r in routed], [layer.router.weight], dgates)
    # 3e-2: the renormalisation's backward takes differences of a token's gate gradients, which can
    # double their relative error.
    assert relative_error(layer.router.weight.grad, want) < 3e-2


def test_a_backward_pairs_with_one_forward():
    p = make_problem(ep=2, tokens=(20, 30), seed=19)
    layer = layer_for(p)
    loss = sum(o.float().sum() for o in layer(p.x, p.ids, p.gates))
    loss.backward(retain_graph=True)
    with pytest.raises(comet.InvalidArgument):  # its saved activations are spent
        loss.backward()
    stale = layer(p.x, p.ids, p.gates)
    layer([x[:5] for x in p.x], [i[:5] for i in p.ids], [g[:5] for g in p.gates])
    with pytest.raises(RuntimeError, match="pairs with the layer's last forward"):
        sum(o.float().sum() for o in stale).backward()


def test_backward_without_training_says_how_to_build_the_layer():
    p = make_problem(ep=2, tokens=(20, 30), seed=13)
    layer = layer_for(p, training=False)
    out = layer(p.x, p.ids, p.gates)
    with pytest.raises(RuntimeError, match="build it with training=True"):
        sum(o.float().sum() for o in out).backward()


def test_cuda_graph_capture_and_replay():
    p = make_problem(ep=4, tokens=(64, 64, 64, 64), seed=9)
    layer = layer_for(p, "host")
    static_x = [x.clone() for x in p.x]
    static_ids = [i.clone() for i in p.ids]
    static_g = [g.clone() for g in p.gates]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm up: the planner's decisions and the kernels' attributes are made here
            layer(static_x, static_ids, static_g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_ids, static_g)
    for rep in range(10):
        q = make_problem(ep=4, tokens=(64, 64, 64, 64), seed=100 + rep)
        for dst, src in zip(static_x + static_ids + static_g, q.x + q.ids + q.gates):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        eager = layer(q.x, q.ids, q.gates)
        for r in range(4):
            assert torch.equal(static_out[r], eager[r]), f"replay {rep} rank {r}"


def test_bad_inputs_raise_and_the_layer_still_works():
    p = make_problem(ep=2, tokens=(20, 30), seed=10)
    layer = layer_for(p, checking=True)
    with pytest.raises(TypeError, match="hidden_states: dtype"):
        layer([x.float() for x in p.x], p.ids, p.gates)
    with pytest.raises(ValueError, match="hidden_states: on cpu"):
        layer([x.cpu() for x in p.x], p.ids, p.gates)
    with pytest.raises(ValueError, match="must be contiguous"):
        layer([torch.cat([x, x], 1)[:, ::2] for x in p.x], p.ids, p.gates)
    with pytest.raises(ValueError, match="more than max_tokens"):
        layer([torch.cat([x, x]) for x in p.x], [torch.cat([i, i]) for i in p.ids], [torch.cat([g, g]) for g in p.gates])
    with pytest.raises(ValueError, match="topk_ids: shape"):
        layer(p.x, [i[:, :1] for i in p.ids], p.gates)
    with pytest.raises(ValueError, match="1 tensors for the 2 rank"):
        layer(p.x[0], p.ids[0], p.gates[0])
    bad = [i.clone() for i in p.ids]
    bad[1][5, 1] = 99
    with pytest.raises(comet.DeviceError, match="99"):
        layer(p.x, bad, p.gates)
    run_and_check(p, layer, "after bad inputs")


def test_private_buffers_come_from_torchs_allocator():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    p = make_problem(ep=2, tokens=(64, 64), seed=11)
    layer = layer_for(p)
    held = torch.cuda.memory_allocated() - before
    params = sum(t.numel() * t.element_size() for t in layer.parameters())
    assert held - params > 0.5 * layer.engine.device_bytes_per_rank  # A, hidden, Y, flags of 2 ranks
    layer(p.x, p.ids, p.gates)
    d = layer.engine.last_decision(1)
    assert d["tile_n"] in (128, 192, 256, 320) and d["picked_by"] in ("table", "cost_model")


def test_a_tokens_output_does_not_depend_on_its_batch():
    p = make_problem(ep=2, tp=2, tokens=(300, 250, 0, 280), routing="zipf", seed=12)
    layer = layer_for(p, batch_invariant=True)
    full = layer(p.x, p.ids, p.gates)
    few = layer([x[:7] for x in p.x], [i[:7] for i in p.ids], [g[:7] for g in p.gates])
    for r in range(p.world):
        assert torch.equal(full[r][:7], few[r]), r


def test_load_factor_sizes_rows_and_a_batch_over_them_is_refused():
    p = make_problem(ep=4, tokens=(256, 256, 200, 256), seed=13)
    layer = layer_for(p, load_factor=1.5)
    # E 8, k 2, EP 4, 256 tokens: mean W T k E_l / E = 4 * 256 * 2 * 2 / 8 = 512 rows, 1.5x + 254 padding
    # = 1022 -> 1024.
    assert layer.engine.max_rows == 1024
    fp = comet.layer_footprint(p.hidden, p.ffn, p.experts, p.topk, p.act, ep=4, max_tokens=256, load_factor=1.5,
                               training=True)
    assert layer.engine.device_bytes_per_rank == fp["total"]
    run_and_check(p, layer, "within the load factor")
    # Every token's first slot on expert 0: 968 rows (1024 padded) on rank 0, and expert 1 has some too.
    hot = [torch.zeros_like(i) for i in p.ids]
    for h, i in zip(hot, p.ids):
        h[:, 1] = torch.where(i[:, 1] == 0, i[:, 0].clamp(min=1), i[:, 1])
    with pytest.raises(comet.DeviceError, match="max_rows = 1024"):
        layer(p.x, hot, p.gates)
        layer.engine.synchronize()
    run_and_check(p, layer, "after the refused batch")


def test_a_layer_too_large_for_the_gpu_raises_out_of_memory_and_the_process_goes_on():
    """A training layer whose private buffers exceed the free memory (two ranks; the exported buffers, a
    sixteenth of it, fit): torch's OutOfMemoryError with the layer's words, not a SystemError (seen once
    from two 16384-token layers), every byte it took given back (the team's exported buffers too), and a
    small layer can be built and run afterwards."""
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    footprint = lambda t: comet.layer_footprint(4096, 14336, 8, 2, ep=2, max_tokens=t, training=True)  # noqa: E731
    tokens = 4096
    while 2 * footprint(tokens)["total"] < 1.3 * free:
        tokens *= 2
    assert 2 * footprint(tokens)["symmetric"] < free / 4  # the refusal comes from a private buffer
    team = comet.Team.local(2, "device", ep=2)
    free = torch.cuda.mem_get_info()[0]
    with pytest.raises(torch.OutOfMemoryError, match="comet.FusedMoE: torch's caching allocator could not give"):
        comet.FusedMoE(team, 4096, 14336, 8, 2, max_tokens=tokens, training=True)
    torch.cuda.empty_cache()
    # What the refused layer took is back, its exported buffers on the team included.
    assert torch.cuda.mem_get_info()[0] > free - (256 << 20)
    p = make_problem(ep=2, tokens=(37, 200), seed=29)
    run_and_check(p, layer_for(p), "a small layer after the refusal")


def test_close_gives_the_buffers_back_and_refuses_calls():
    p = make_problem(ep=2, tokens=(64, 31), seed=14)
    layer = layer_for(p, training=False)
    run_and_check(p, layer, "before close")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    layer.close()
    assert torch.cuda.memory_allocated() < before  # the private buffers went back to torch's allocator
    with pytest.raises(comet.InvalidArgument, match="closed"):
        layer(p.x, p.ids, p.gates)
    layer.close()  # a second close does nothing


# ---- fp8 (e4m3) layer 0 -------------------------------------------------------------------------------------
FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def quantize_blocks(v: torch.Tensor, block_rows: int, block_cols: int):
    """comet/fp8.hpp's block quantisation written again in torch (run it on the CPU), in the C++'s fp32
    arithmetic: per block s = amax / 448 (1 for a block of zeros), codes e4m3(v / s) rounded to nearest even.
    Both divisions are tensor by tensor: torch turns a division by a Python scalar on the GPU into a
    multiplication by its reciprocal, which can differ in the last bit. torch's cast rounds to nearest even
    but does not saturate (from 464 up it gives NaN, where the C++ gives 448): the clamp makes it saturate,
    though |v / s| is 448 at most here up to one rounding. v [..., rows, cols], cols a multiple of
    block_cols -> (codes float8_e4m3fn [..., rows, cols], scales fp32 [..., ceil(rows / block_rows),
    cols / block_cols])."""
    v = v.float()
    *lead, rows, cols = v.shape
    rb, cb = -(-rows // block_rows), cols // block_cols
    padded = torch.nn.functional.pad(v, (0, 0, 0, rb * block_rows - rows))  # zero rows change no block's amax
    blocks = padded.reshape(*lead, rb, block_rows, cb, block_cols)
    amax = blocks.abs().amax(dim=(-3, -1))
    scales = torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))
    q = blocks / scales[..., :, None, :, None]
    codes = q.clamp(-E4M3_MAX, E4M3_MAX).to(FP8).reshape(*lead, rb * block_rows, cols)[..., :rows, :]
    return codes, scales


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """s * e4m3 value, fp32 (exact: a code has 4 significant bits)."""
    rows = codes.shape[-2]
    s = scales.repeat_interleave(block_rows, dim=-2)[..., :rows, :].repeat_interleave(block_cols, dim=-1)
    return codes.float() * s


def same_codes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))


def fp8_operands(p, layer):
    """p over the operands the fp8 layer multiplies, dequantised (fp32, exact): each rank's x quantised per
    token in 1 x 128 blocks (as the layer does inside), and w0 from the layer's own codes and scales, back
    in the full layout. w1 stays p's (bf16)."""
    xs = [dequantize_blocks(*quantize_blocks(x.cpu(), 1, 128), 1, 128) for x in p.x]
    w0 = dequantize_blocks(layer.w0.detach().cpu(), layer.w0_scale.detach().cpu(), 128, 128)
    gate_up = W.unshard_w0(list(w0), gated=p.act == "swiglu", ep=p.ep, tp=p.tp)
    return dataclasses.replace(p, x=xs, gate_up=gate_up)


def check_fp8_output(p, layer, out, what):
    """Against the plain MoE over the dequantised fp8 operands with the bf16 test's bounds (the GPU's own
    rounding is the same: fp32 sums, bf16 hidden rows and output), and measurably closer to it than to the
    plain MoE over the unquantised operands: e4m3 moves the result by about 2^-4 of a value, the GPU's
    rounding by about 2^-8, so a layer that skipped a quantisation (or used wrong scales) lands near the
    second reference and fails."""
    q = fp8_operands(p, layer)
    got, ref8, ref16 = [], [], []
    for r in range(p.world):
        assert out[r].shape == p.x[r].shape and out[r].dtype == torch.bfloat16, f"{what} rank {r}"
        want = reference_moe(q, q.x[r], p.ids[r], p.gates[r])
        assert_matches(out[r], want, f"{what} rank {r}")
        got.append(out[r].float().cpu())
        ref8.append(want)
        ref16.append(reference_moe(p, p.x[r], p.ids[r], p.gates[r]))
    got, ref8, ref16 = torch.cat(got), torch.cat(ref8), torch.cat(ref16)
    to8, to16 = relative_error(got, ref8), relative_error(got, ref16)
    assert to8 < 0.5 * to16, f"{what}: relative error {to8:.3e} to the fp8 reference, {to16:.3e} to the bf16 one"


FP8_CASES = [
    # name, problem kwargs, link: W = 1, 2, 4 as EP and TP; H a multiple of 128 (the fp8 layer needs it)
    ("W1", dict(ep=1, tokens=(300,)), "device"),
    ("EP2_device", dict(ep=2, tokens=(37, 200)), "device"),
    ("EP4_zero_token_rank_host", dict(ep=4, tokens=(100, 0, 257, 3)), "host"),
    # ungated, top-1 with every token on expert 0 (three experts without tokens), rank 2 without tokens; a
    # rank's scales are 1 x 5 x 2 floats, so the ranks' slices are not 16-byte aligned (the op aligns a copy)
    ("EP4_one_hot_expert_top1_silu", dict(act="silu", ffn=640, experts=4, topk=1, ep=4, tokens=(90, 200, 0, 129),
                                         routing="one_hot"), "device"),
    # N0_s = 192: a partial row block of 64 rows in every expert's scales
    ("TP2_gelu_partial_row_block", dict(hidden=384, ffn=384, act="gelu", ep=1, tp=2, tokens=(50, 129)), "device"),
    ("TP4_gelu", dict(hidden=384, ffn=384, act="gelu", ep=1, tp=4, tokens=(50, 70, 0, 129)), "device"),
    ("EP2xTP2_top8", dict(hidden=512, ffn=256, experts=16, topk=8, ep=2, tp=2, tokens=(80, 0, 150, 41)), "device"),
]


@pytest.mark.parametrize("name,kw,link", FP8_CASES, ids=[c[0] for c in FP8_CASES])
def test_fp8_forward_matches_plain_pytorch_on_the_dequantised_operands(name, kw, link):
    p = make_problem(seed=zlib.crc32(name.encode()) % 1000, **kw)
    layer = layer_for(p, link, dtype=FP8)
    assert not layer.engine.training and layer.engine.dtype == "e4m3"
    assert layer.w0.dtype == FP8 and not layer.w0.requires_grad and layer.w0_scale.dtype == torch.float32
    # load_experts quantised each rank's LOCAL shard (its 128 x 128 blocks are the GEMM's; with SwiGLU they
    # hold interleaved gate and up rows), bitwise as the torch re-implementation does
    gate_up = p.gate_up.to(torch.bfloat16)
    for r in range(p.world):
        codes, scales = quantize_blocks(W.shard_w0(gate_up, gated=layer.gated, ep=p.ep, tp=p.tp, rank=r), 128, 128)
        assert same_codes(layer.w0[r], codes), f"{name}: rank {r}'s codes"
        assert torch.equal(layer.w0_scale[r].cpu(), scales), f"{name}: rank {r}'s scales"
    out = layer(p.x, p.ids, p.gates)  # grad mode on: the eager node whose backward refuses
    torch.cuda.synchronize()
    layer.engine.synchronize()
    check_fp8_output(p, layer, out, name)
    with torch.no_grad():  # the op's kernel straight: the same bits
        again = layer(p.x, p.ids, p.gates)
    for r in range(p.world):
        assert torch.equal(out[r], again[r]), f"{name} rank {r}: no_grad"


def test_fp8_weight_quantizer_matches_torch_bitwise():
    """comet.quantize_weights_e4m3 (the binding of kernels/fp8_quantize.hpp) against the torch
    re-implementation, on 3 matrices of 200 x 384: a partial row block (72 rows), a block of zeros (scale
    1), blocks 1000x apart in magnitude, and values small enough for subnormal codes."""
    gen = torch.Generator().manual_seed(25)
    w = torch.randn(3, 200, 384, generator=gen)
    w[0, :, 128:256] *= 1000
    w[0, 3, :64] = torch.linspace(-2e-4, 2e-4, 64)  # block amax ~4: e4m3 subnormals and zeros
    w[1, :128, 256:] = 0
    w[2, 128:, :128] *= 1e-3
    w = w.to(torch.bfloat16)
    codes, scales = comet.quantize_weights_e4m3(w.cuda())
    torch.cuda.synchronize()
    assert codes.dtype == FP8 and codes.shape == (3, 200, 384)
    assert scales.dtype == torch.float32 and scales.shape == (3, 2, 3)
    want_codes, want_scales = quantize_blocks(w, 128, 128)
    assert same_codes(codes, want_codes)
    assert torch.equal(scales.cpu(), want_scales)
    assert scales[1, 0, 2].item() == 1.0
    small = dequantize_blocks(codes.cpu(), scales.cpu(), 128, 128)[0, 3, :64]
    assert (small == 0).any() and (small != 0).any()
    # one matrix without the leading dimensions, from a view that is not contiguous
    c1, s1 = comet.quantize_weights_e4m3(w.cuda().transpose(1, 2)[0].t())
    assert same_codes(c1, want_codes[0]) and torch.equal(s1.cpu(), want_scales[0])


def test_fp8_weights_round_trip():
    """load_fp8_w0 (stacked codes, scales as a list per rank), state_dict and experts(); and
    reset_parameters quantises the bf16 layer's draw."""
    p = make_problem(ep=2, tp=2, tokens=(30, 40, 50, 60), seed=23)
    a = layer_for(p, dtype=FP8)
    b = layer_for(p, dtype=FP8)
    b.reset_parameters()
    b.load_fp8_w0(a.w0.detach().clone(), [s.clone() for s in a.w0_scale.detach()])
    with torch.no_grad():
        b.w1.copy_(a.w1)
        for x, y in zip(a(p.x, p.ids, p.gates), b(p.x, p.ids, p.gates)):
            assert torch.equal(x, y)
    sd = a.state_dict()
    assert set(sd) == {"w0", "w0_scale", "w1"} and sd["w0"].dtype == FP8 and sd["w0_scale"].dtype == torch.float32
    c = layer_for(p, dtype=FP8)
    c.w0_scale.data.fill_(1.0)
    c.load_state_dict(sd)
    with torch.no_grad():
        for x, y in zip(a(p.x, p.ids, p.gates), c(p.x, p.ids, p.gates)):
            assert torch.equal(x, y)
    gate_up, down = a.experts()
    assert gate_up.dtype == torch.bfloat16 and torch.equal(down.cpu().float(), p.down)
    deq = dequantize_blocks(a.w0.detach().cpu(), a.w0_scale.detach().cpu(), 128, 128).to(torch.bfloat16)
    assert torch.equal(gate_up.cpu(), W.unshard_w0(list(deq), gated=True, ep=2, tp=2))
    assert relative_error(gate_up, p.gate_up) < 0.05  # e4m3's precision: about 2^-4 of a value, at most
    # reset_parameters: the same draw as a bf16 layer's from the same seed, quantised
    teams = [comet.Team.local(4, ep=2, tp=2) for _ in range(2)]
    torch.manual_seed(26)
    bf16 = comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, team=teams[0], max_tokens=64)
    torch.manual_seed(26)
    fp8 = comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, team=teams[1], max_tokens=64, dtype=FP8)
    codes, scales = quantize_blocks(bf16.w0.detach().cpu(), 128, 128)
    assert same_codes(fp8.w0, codes) and torch.equal(fp8.w0_scale.cpu(), scales)
    assert torch.equal(fp8.w1, bf16.w1)


def test_fp8_compiles_under_no_grad_with_the_same_bits():
    p = make_problem(ep=1, tokens=(100,), seed=27)
    layer = layer_for(p, dtype=FP8)
    block = Block(layer)
    with torch.no_grad():
        eager = block(p.x[0], p.ids[0], p.gates[0])
        got = torch.compile(block, fullgraph=True)(p.x[0], p.ids[0], p.gates[0])
    assert torch.equal(got, eager)


def test_fp8_refusals():
    p = make_problem(ep=2, tokens=(20, 30), seed=28)
    with pytest.raises(ValueError, match="forward-only for now: build it with training=False"):
        layer_for(p, dtype=FP8, training=True)
    with pytest.raises(TypeError, match="torch.bfloat16 or torch.float8_e4m3fn"):
        layer_for(p, dtype=torch.float16)
    layer = layer_for(p, dtype=FP8)
    codes, scales = layer.w0.detach().clone(), layer.w0_scale.detach().clone()
    with pytest.raises(ValueError, match=r"load_fp8_w0: codes: shape \(2, 4, 128, 256\), expected \(2, 4, 1024, 256\)"):
        layer.load_fp8_w0(codes[:, :, :128], scales)
    with pytest.raises(ValueError, match=r"load_fp8_w0: scales: shape \(2, 4, 1, 2\), expected \(2, 4, 8, 2\)"):
        layer.load_fp8_w0(codes, scales[:, :, :1])
    with pytest.raises(ValueError, match="codes: 1 tensors for the 2 rank"):
        layer.load_fp8_w0([codes[0]], scales)
    with pytest.raises(TypeError, match="load_fp8_w0: codes: dtype torch.bfloat16"):
        layer.load_fp8_w0(codes.to(torch.bfloat16), scales)
    with pytest.raises(TypeError, match="load_fp8_w0: scales: dtype torch.bfloat16"):
        layer.load_fp8_w0(codes, scales.to(torch.bfloat16))
    with pytest.raises(TypeError, match="this layer is bf16"):
        layer_for(p, training=False).load_fp8_w0(codes, scales)
    with pytest.raises(TypeError, match="w0: dtype torch.bfloat16"):
        layer.engine(p.x, p.ids, p.gates, codes.to(torch.bfloat16), layer.w1, scales)
    with pytest.raises(ValueError, match="w0_scale: the fp8 layer's w0 needs"):
        layer.engine(p.x, p.ids, p.gates, codes, layer.w1)
    with pytest.raises(NotImplementedError, match="split ops run bf16 layers only"):
        comet.ops.moe_layer0(layer.engine, p.x, p.ids, p.gates, layer.w0)
    # A backward through the layer says why there is none, as a layer built with training=False does.
    xs = [x.clone().requires_grad_() for x in p.x]
    out = layer(xs, p.ids, p.gates)
    with pytest.raises(RuntimeError, match="forward-only.*torch.no_grad"):
        sum(o.float().sum() for o in out).backward()
    # Nothing above reached the weights: the layer still matches its reference.
    assert same_codes(layer.w0, codes) and torch.equal(layer.w0_scale, scales)
    with torch.no_grad():
        out = layer(p.x, p.ids, p.gates)
    torch.cuda.synchronize()
    check_fp8_output(p, layer, out, "after the refusals")
