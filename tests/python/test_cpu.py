"""What the Python front can show without a GPU: the package imports, the ops and their fake kernels trace
under torch.compile (forward and backward), autograd's wiring of the backward, the weight layouts
round-trip and match the kernels' rule, routing, and the input checks name the bad argument."""
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import comet
from comet import ops
from comet import weights as W
from comet.ops import LayerSpec, check_inputs, stacked


def test_imports_and_registers_ops():
    assert comet.__version__
    for op in ("moe_forward", "moe_layer0", "moe_layer1", "moe_backward"):
        assert hasattr(torch.ops.comet, op)
    schema = str(torch.ops.comet.moe_backward.default._schema)
    assert schema.endswith("(Tensor[] dout, Tensor w0, Tensor w1, int handle) -> (Tensor[], Tensor[], Tensor, Tensor)")
    assert comet._C.shipped_tune_table().endswith(".json")
    assert issubclass(comet.InvalidArgument, ValueError)
    assert issubclass(comet.DeviceTimeout, TimeoutError)


@pytest.mark.skipif(comet.cuda_ready(), reason="checks the no-GPU message")
def test_gpu_entry_points_say_why_without_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        comet.Team.local(2)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        comet.MoELayer(64, 128, 4, 2)


def test_fake_kernel_traces_with_no_graph_break():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # never run: the op has no CPU kernel

    def block(x, ids, gates, w0, w1):
        y = torch.ops.comet.moe_forward([x], [ids], [gates], w0, w1, 1)[0]
        return y * 2 + x

    fn = torch.compile(block, backend=capture, fullgraph=True)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(5, 64, dtype=torch.bfloat16)
        ids = torch.empty(5, 2, dtype=torch.int64)
        gates = torch.empty(5, 2)
        w0 = torch.empty(1, 2, 256, 64, dtype=torch.bfloat16)
        w1 = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16)
        out = torch.ops.comet.moe_forward([x], [ids], [gates], w0, w1, 1)
        assert out[0].shape == (5, 64) and out[0].dtype == torch.bfloat16
    try:
        fn(torch.zeros(5, 64, dtype=torch.bfloat16), torch.zeros(5, 2, dtype=torch.int64), torch.zeros(5, 2),
           torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16))
    except NotImplementedError:
        pass  # the graph ran eagerly on CPU tensors: there is no CPU kernel, as intended
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert any("comet.moe_forward" in t for t in targets), targets


@pytest.fixture
def handle():
    """A layer handle the fake kernels can read (what FusedMoE registers), with no GPU behind it: 2 local
    ranks, H 64, k 2, F/tp 128, 256 rows. Yields a function (training, tokens) -> the handle."""
    h = 10 ** 9  # far from the handles of real layers

    def register(training=True, tokens=()):
        shape = SimpleNamespace(max_rows=256, ffn_shard=128, hidden=64)
        ops._registry[h] = ops._Registered(shape, [0, 1], top_k=2, training=training, tokens=tokens)
        return h

    yield register
    ops._registry.pop(h, None)


def _fake_layer_inputs(tokens=(5, 0)):
    """Two ranks' inputs (rank 1 without tokens) and stacked weights, the differentiable ones requiring grad."""
    xs = [torch.empty(t, 64, dtype=torch.bfloat16, requires_grad=True) for t in tokens]
    ids = [torch.empty(t, 2, dtype=torch.int64) for t in tokens]
    gates = [torch.empty(t, 2, requires_grad=True) for t in tokens]
    w0 = torch.empty(2, 2, 256, 64, dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.empty(2, 2, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    return xs, ids, gates, w0, w1


def test_autograd_runs_moe_backward_and_returns_each_inputs_gradient(handle):
    h = handle()
    with FakeTensorMode():
        xs, ids, gates, w0, w1 = _fake_layer_inputs()
        out = torch.ops.comet.moe_forward(xs, ids, gates, w0, w1, h)
        sum(o.float().sum() for o in out).backward()
        for x, g in zip(xs, gates):
            assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
            assert g.grad.shape == g.shape and g.grad.dtype == torch.float32
        assert w0.grad.shape == w0.shape and w1.grad.shape == w1.shape and w0.grad.dtype == torch.bfloat16
        assert all(i.grad is None for i in ids)
        dx, dgates, dw0, dw1 = torch.ops.comet.moe_backward([torch.empty(3, 64, dtype=torch.bfloat16)], w0, w1, h)
        assert dx[0].shape == (3, 64) and dgates[0].shape == (3, 2) and dgates[0].dtype == torch.float32


def test_eager_autograd_path_wires_the_same_kernels(handle, monkeypatch):
    """FusedMoE's eager training path (ops._EagerMoeForward, no dispatcher) calls the op's forward and
    backward kernels with what the op's autograd formula passes, and hands each input its gradient."""
    h = handle()
    calls = {}

    def forward(x, ids, gates, w0, w1, hd):
        calls["forward"] = (len(x), hd)
        return ops._moe_forward_fake(x, ids, gates, w0, w1, hd)

    def backward(dout, w0, w1, hd):
        calls["backward"] = ([d.dtype for d in dout], w0, w1, hd)
        return tuple(ops._backward_outputs(dout, w0, w1, 2))

    monkeypatch.setattr(ops, "_moe_forward_cuda", forward)
    monkeypatch.setattr(ops, "_moe_backward_cuda", backward)
    xs, ids, gates, w0, w1 = _fake_layer_inputs()
    out = ops._EagerMoeForward.apply(h, 2, None, w0, w1, *xs, *ids, *gates)
    assert calls["forward"] == (2, h) and [o.shape for o in out] == [x.shape for x in xs]
    sum(o.float().sum() for o in out).backward()
    dtypes, bw0, bw1, bh = calls["backward"]
    assert dtypes == [torch.bfloat16, torch.bfloat16] and bw0 is w0 and bw1 is w1 and bh == h
    for x, g in zip(xs, gates):
        assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
        assert g.grad.shape == g.shape and g.grad.dtype == torch.float32
    assert w0.grad.shape == w0.shape and w1.grad.shape == w1.shape
    assert all(i.grad is None for i in ids)


def test_eager_autograd_path_fuses_weight_gradients_into_main_grad(handle, monkeypatch):
    """gradient_accumulation_fusion: the eager backward hands the C++ backward the parameters' main_grad
    (as stacked views of the same memory) to add into, not fresh gradients, and answers autograd by
    Megatron's protocol: a placeholder .grad and grad_added_to_main_grad set where the parameter has that
    flag, else no .grad."""
    h = handle()
    seen = {}

    def into(dout, mg0, mg1, hd):
        seen.update(mg0=mg0, mg1=mg1, hd=hd)
        return ops._data_grad_outputs(dout, 2)

    monkeypatch.setattr(ops, "_moe_forward_cuda", ops._moe_forward_fake)
    monkeypatch.setattr(ops, "_moe_backward_into_main_grads", into)
    monkeypatch.setattr(ops, "_moe_backward_cuda", lambda *a: pytest.fail("the unfused backward ran"))
    for flags in (True, False):
        xs, ids, gates, w0, w1 = _fake_layer_inputs()
        for w in (w0, w1):
            w.main_grad = torch.zeros(w.shape, dtype=torch.float32)
            if flags:
                w.grad_added_to_main_grad = False
        out = ops._EagerMoeForward.apply(h, 2, (w0, w1), w0, w1, *xs, *ids, *gates)
        sum(o.float().sum() for o in out).backward()
        assert seen["hd"] == h
        assert seen["mg0"].data_ptr() == w0.main_grad.data_ptr() and seen["mg0"].dtype == torch.float32
        assert seen["mg1"].data_ptr() == w1.main_grad.data_ptr() and seen["mg1"].shape == w1.shape
        for x, g in zip(xs, gates):
            assert x.grad.shape == x.shape and g.grad.shape == g.shape
        if flags:
            assert w0.grad_added_to_main_grad and w1.grad_added_to_main_grad
            assert w0.grad.shape == w0.shape and w1.grad.shape == w1.shape
        else:
            assert w0.grad is None and w1.grad is None


def test_main_grads_are_checked_and_viewed_stacked():
    w0 = torch.empty(2, 2, 256, 64, dtype=torch.bfloat16)
    w1 = torch.empty(2, 64, 128, dtype=torch.bfloat16)  # one rank's, unstacked
    s1 = stacked(w1, "w1", 1)
    w0.main_grad = torch.zeros(w0.shape)
    w1.main_grad = torch.zeros(w1.shape)
    mg0, mg1 = ops.main_grads_of(w0, w1, w0, s1)
    assert mg0.data_ptr() == w0.main_grad.data_ptr() and mg1.shape == (1, 2, 64, 128)
    assert mg1.data_ptr() == w1.main_grad.data_ptr()
    bad = [
        (dict(w0=None), RuntimeError, "w0 has none"),
        (dict(w1=torch.zeros(2, 64, 128, dtype=torch.float16)), TypeError, "w1.main_grad has dtype torch.float16"),
        (dict(w1=torch.zeros(2, 64, 127)), ValueError, r"shape \(2, 64, 127\), the weight \(2, 64, 128\)"),
        (dict(w1=torch.zeros(2, 128, 64).transpose(1, 2)), ValueError, "contiguous"),
        (dict(w1=torch.zeros(2, 64, 128, dtype=torch.bfloat16)), TypeError, "accumulate in one type"),
        (dict(w0="not a tensor"), TypeError, "must be a torch.Tensor"),
    ]
    for change, error, match in bad:
        a, b = torch.empty(w0.shape, dtype=torch.bfloat16), torch.empty(w1.shape, dtype=torch.bfloat16)
        a.main_grad, b.main_grad = torch.zeros(a.shape), torch.zeros(b.shape)
        for name, t in (("w0", a), ("w1", b)):
            if name in change:
                if change[name] is None:
                    del t.main_grad
                else:
                    t.main_grad = change[name]
        with pytest.raises(error, match=match):
            ops.main_grads_of(a, b, a, stacked(b, "w1", 1))


def test_grad_after_fusion_follows_megatrons_flags():
    w = torch.empty(2, 3)
    assert ops.grad_after_fusion(w, w) is None
    w.grad_added_to_main_grad = False
    assert ops.grad_after_fusion(w, w).shape == (2, 3) and w.grad_added_to_main_grad is True
    w.zero_out_wgrad = True
    assert torch.count_nonzero(ops.grad_after_fusion(w, w)) == 0


def test_gradient_accumulation_fusion_is_refused_without_training():
    with pytest.raises(ValueError, match="gradient_accumulation_fusion=True is for training"):
        comet.MoELayer(64, 128, 4, 2, training=False, gradient_accumulation_fusion=True)
    with pytest.raises(ValueError, match="gradient_accumulation_fusion=True is for training"):
        comet.MoELayer(128, 128, 4, 2, dtype=torch.float8_e4m3fn, gradient_accumulation_fusion=True)


def test_split_ops_backward_names_the_trainable_path(handle):
    h = handle()
    with FakeTensorMode():
        xs, ids, gates, w0, w1 = _fake_layer_inputs()
        hidden = torch.ops.comet.moe_layer0(xs, ids, gates, w0, h)
        with pytest.raises(NotImplementedError, match="moe_forward"):
            hidden[0].float().sum().backward()


def test_compiled_training_graph_runs_moe_backward_without_recomputing_the_forward(handle):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    h = handle()
    graphs = []

    def partition(joint, inputs, **kw):  # inductor's partitioner; the backward is compiled lazily, seen here
        fw, bw = min_cut_rematerialization_partition(joint, inputs, **kw)
        graphs.extend((fw, bw))
        return fw, bw

    def block(x, ids, gates, w0, w1):
        return torch.ops.comet.moe_forward([x * 2], [ids], [gates], w0, w1, h)[0] + x

    fn = torch.compile(block, backend=aot_autograd(fw_compiler=lambda gm, _: gm.forward, partition_fn=partition),
                       fullgraph=True)
    x = torch.zeros(5, 64, dtype=torch.bfloat16, requires_grad=True)
    ids, gates = torch.zeros(5, 2, dtype=torch.int64), torch.zeros(5, 2, requires_grad=True)
    w0 = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(NotImplementedError):  # the forward graph then runs on CPU tensors: no CPU kernel
        fn(x, ids, gates, w0, w1)
    fw, bw = ([str(n.target) for n in g.graph.nodes if n.op == "call_function"] for g in graphs)
    assert "comet.moe_forward.default" in fw and "comet.moe_backward.default" in bw, (fw, bw)
    assert "comet.moe_forward.default" not in bw  # the activations are the C++ layer's, never recomputed


def test_backward_refuses_a_layer_without_training_or_another_forward(handle):
    xs, _, _, w0, w1 = _fake_layer_inputs((5, 3))
    dout = [x.detach() for x in xs]
    with pytest.raises(RuntimeError, match="build it with training=True"):
        ops._moe_backward_cuda(dout, w0, w1, handle(training=False))
    with pytest.raises(RuntimeError, match="last forward none"):
        ops._moe_backward_cuda(dout, w0, w1, handle(tokens=()))
    with pytest.raises(RuntimeError, match=r"\(5, 3\) tokens per rank, the layer's last forward \(5, 4\)"):
        ops._moe_backward_cuda(dout, w0, w1, handle(tokens=(5, 4)))


def _interleave_rule(gate_up, rank, ep, tp):
    """The kernels' w0 rule (weight_layout.hpp), written out row by row."""
    E, rows, H = gate_up.shape
    F = rows // 2
    el, fs = E // ep, F // tp
    g, i = rank // tp, rank % tp
    out = torch.empty(el, 2 * fs, H, dtype=gate_up.dtype)
    for e in range(el):
        for b in range(fs // 8):
            for q in range(8):
                out[e, 16 * b + q] = gate_up[g * el + e, i * fs + 8 * b + q]
                out[e, 16 * b + 8 + q] = gate_up[g * el + e, F + i * fs + 8 * b + q]
    return out


@pytest.mark.parametrize("ep,tp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_weight_shards_follow_the_kernel_layout_and_round_trip(ep, tp):
    torch.manual_seed(0)
    E, F, H = 4, 32, 16
    gate_up, down = torch.randn(E, 2 * F, H), torch.randn(E, H, F)
    w0 = [W.shard_w0(gate_up, gated=True, ep=ep, tp=tp, rank=r) for r in range(ep * tp)]
    w1 = [W.shard_w1(down, ep=ep, tp=tp, rank=r) for r in range(ep * tp)]
    for r in range(ep * tp):
        assert torch.equal(w0[r], _interleave_rule(gate_up, r, ep, tp))
        assert w1[r].shape == (E // ep, H, F // tp)
    assert torch.equal(W.unshard_w0(w0, gated=True, ep=ep, tp=tp), gate_up)
    assert torch.equal(W.unshard_w1(w1, ep=ep, tp=tp), down)
    plain = torch.randn(E, F, H)
    shards = [W.shard_w0(plain, gated=False, ep=ep, tp=tp, rank=r) for r in range(ep * tp)]
    assert torch.equal(W.unshard_w0(shards, gated=False, ep=ep, tp=tp), plain)


@pytest.mark.parametrize("ep,tp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_local_shards_convert_without_the_full_weights(ep, tp):
    """local_w0 on a rank's own plain shard (its experts' gate rows of its F columns, then the up rows) gives
    what shard_w0 cuts from the full weights, and plain_w0 gives the plain shard back."""
    torch.manual_seed(1)
    E, F, H = 4, 32, 16
    el, fs = E // ep, F // tp
    gate_up = torch.randn(E, 2 * F, H)
    for r in range(ep * tp):
        g, i = r // tp, r % tp
        experts = slice(g * el, (g + 1) * el)
        plain = torch.cat((gate_up[experts, i * fs:(i + 1) * fs], gate_up[experts, F + i * fs:F + (i + 1) * fs]), 1)
        assert torch.equal(W.local_w0(plain, gated=True), _interleave_rule(gate_up, r, ep, tp))
        assert torch.equal(W.plain_w0(W.local_w0(plain, gated=True), gated=True), plain)
    ungated = torch.randn(el, fs, H)
    assert torch.equal(W.local_w0(ungated, gated=False), ungated)
    assert torch.equal(W.plain_w0(ungated, gated=False), ungated)
    with pytest.raises(ValueError, match="a gated shard needs 2 F_s"):
        W.local_w0(torch.randn(2, 24, H), gated=True)


def test_linear_experts_fuse_to_gate_then_up():
    w1 = [torch.randn(8, 4) for _ in range(3)]
    w3 = [torch.randn(8, 4) for _ in range(3)]
    w2 = [torch.randn(4, 8) for _ in range(3)]
    gate_up, down = W.fuse_linear_experts(w1, w3, w2)
    assert torch.equal(gate_up[1, :8], w1[1]) and torch.equal(gate_up[1, 8:], w3[1])
    assert torch.equal(down[2], w2[2])


def test_fused_moe_refuses_an_unknown_weight_grad_kernel():
    # Checked before anything touches the team or the GPU.
    with pytest.raises(ValueError, match="weight_grad_kernel must be one of"):
        comet.FusedMoE(None, 64, 128, 4, 2, max_tokens=8, weight_grad_kernel="fast")


def test_fused_moe_refuses_a_non_bool_narrow_n_tiles():
    with pytest.raises(TypeError, match="narrow_n_tiles must be a bool"):
        comet.FusedMoE(None, 64, 128, 4, 2, max_tokens=8, narrow_n_tiles="off")
    with pytest.raises(TypeError, match="cublas_backward must be None or a bool"):
        comet.FusedMoE(None, 64, 128, 4, 2, max_tokens=8, cublas_backward=1)
    with pytest.raises(TypeError, match="check_schedule must be a bool"):
        comet.FusedMoE(None, 64, 128, 4, 2, max_tokens=8, check_schedule="yes")


def test_weight_helpers_reject_bad_layouts():
    with pytest.raises(ValueError, match="divisible by ep"):
        W.shard_w1(torch.randn(3, 4, 8), ep=2, tp=1, rank=0)
    with pytest.raises(ValueError, match="rank 4 out of range"):
        W.shard_w1(torch.randn(4, 4, 8), ep=2, tp=2, rank=4)
    with pytest.raises(ValueError, match="2F"):
        W.shard_w0(torch.randn(4, 7, 8), gated=True, ep=1, tp=1, rank=0)


def test_route_is_softmax_topk_renormalised():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [3.0, 0.0, 0.0, 0.0]])
    ids, w = comet.route(logits, 2)
    assert ids.dtype == torch.int64 and w.dtype == torch.float32
    assert ids[0].tolist() == [3, 2]
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    p = torch.softmax(logits, -1)
    _, w_raw = comet.route(logits, 2, renormalize=False)
    torch.testing.assert_close(w_raw[0], p[0, [3, 2]])


SPEC = LayerSpec(hidden_size=64, top_k=2, local_experts=2, w0_rows=256, ffn_shard=128, max_tokens=16, ranks=1,
                 device=torch.device("cpu"))


def _good(t=5):
    return ([torch.zeros(t, 64, dtype=torch.bfloat16)], [torch.zeros(t, 2, dtype=torch.int32)], [torch.zeros(t, 2)],
            torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16), torch.zeros(1, 2, 64, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a: a[0].__setitem__(0, a[0][0].float()), TypeError, "hidden_states: dtype"),
    (lambda a: a[0].__setitem__(0, torch.zeros(5, 32, dtype=torch.bfloat16)), ValueError, r"hidden_states: shape .*\[T, 64\]"),
    (lambda a: a[0].__setitem__(0, torch.zeros(64, 5, dtype=torch.bfloat16).t()), ValueError, "hidden_states: must be contiguous"),
    (lambda a: a[0].__setitem__(0, torch.zeros(17, 64, dtype=torch.bfloat16)), ValueError, "more than max_tokens=16"),
    (lambda a: a[1].__setitem__(0, torch.zeros(5, 2, dtype=torch.float32)), TypeError, "topk_ids: dtype"),
    (lambda a: a[1].__setitem__(0, torch.zeros(5, 3, dtype=torch.int64)), ValueError, "topk_ids: shape"),
    (lambda a: a[2].__setitem__(0, torch.zeros(4, 2)), ValueError, "topk_weights: shape"),
    (lambda a: a.__setitem__(3, torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16)), ValueError, "w0: shape"),
    (lambda a: a.__setitem__(4, torch.zeros(1, 2, 64, 128)), TypeError, "w1: dtype"),
    (lambda a: a.__setitem__(3, torch.zeros(1, 2, 512, 64, dtype=torch.bfloat16)[:, :, ::2]), ValueError, "w0: must be contiguous"),
    (lambda a: a[0].append(a[0][0]), ValueError, "hidden_states: 2 tensors for the 1 rank"),
    (lambda a: a[1].__setitem__(0, [[0, 1]]), TypeError, "topk_ids: expected a torch.Tensor"),
])
def test_input_checks_name_the_argument(mutate, error, match):
    args = list(_good())
    check_inputs(SPEC, *args)  # the good call passes
    mutate(args)
    with pytest.raises(error, match=match):
        check_inputs(SPEC, *args)


def test_weights_stack_per_rank():
    w = torch.zeros(2, 256, 64)
    assert stacked(w, "w0", 1).shape == (1, 2, 256, 64) and stacked(w, "w0", 1).data_ptr() == w.data_ptr()
    assert stacked([w, w], "w0", 2).shape == (2, 2, 256, 64)
    with pytest.raises(ValueError, match="w0: 1 tensors for the 2 rank"):
        stacked([w], "w0", 2)


def test_input_checks_want_the_teams_device():
    spec = LayerSpec(64, 2, 2, 256, 128, 16, 1, torch.device("cuda", 0))
    with pytest.raises(ValueError, match="hidden_states: on cpu"):
        check_inputs(spec, *_good())


def test_layer_footprint_sizes_a_layer_before_it_is_built():
    # DeepSeek-V3 EP 8 at 4096 tokens: worst case 8 * 4096 * 8 + 32 * 127 = 266208 rows -> 266240; with
    # load_factor 1.5, 1.5 * 32768 + 4064 = 53216 -> 53248 rows (tests/cpu/footprint_test.cpp works them).
    worst = comet.layer_footprint(7168, 2048, 256, 8, ep=8, max_tokens=4096)
    assert worst["max_rows"] == 266240
    assert worst["expert_out"] == 0 and worst["gathered"] == 266240 * 7168 * 2  # Y lives in A's memory
    assert worst["total"] == worst["compute"] + worst["symmetric"]
    expected = comet.layer_footprint(7168, 2048, 256, 8, ep=8, max_tokens=4096, load_factor=1.5)
    assert expected["max_rows"] == 53248 and expected["total"] < worst["total"] / 3
    train = comet.layer_footprint(7168, 2048, 256, 8, ep=8, max_tokens=4096, training=True)
    assert train["expert_out"] == train["gathered"] and train["training"] > 0
    with pytest.raises(comet.InvalidArgument, match="not both"):
        comet.layer_footprint(7168, 2048, 256, 8, ep=8, max_tokens=4096, max_rows=1024, load_factor=1.5)
    with pytest.raises(ValueError, match="activation"):
        comet.layer_footprint(7168, 2048, 256, 8, "relu", ep=8, max_tokens=4096)


def test_symmetric_heap_is_checked_before_the_team_is_built():
    assert isinstance(comet._C.nvshmem_available(), bool)
    with pytest.raises(comet.InvalidArgument, match="unknown symmetric heap 'bogus'"):
        comet._C.IpcTeam(0, 2, lambda mine: mine * 2, 0, "bogus")


# ---- fp8 (e4m3) layer 0: what the front checks without a GPU --------------------------------------------
def _fp8_fake_inputs(tokens=(5, 0)):
    """Two ranks' inputs for comet::moe_forward_fp8 (H 128, E_l 2, N0_s 256): x and gates requiring grad,
    w0 e4m3 codes and its scales [L, E_l, 2, 1]."""
    xs = [torch.empty(t, 128, dtype=torch.bfloat16, requires_grad=True) for t in tokens]
    ids = [torch.empty(t, 2, dtype=torch.int64) for t in tokens]
    gates = [torch.empty(t, 2, requires_grad=True) for t in tokens]
    w0 = torch.empty(2, 2, 256, 128, dtype=torch.float8_e4m3fn)
    w0_scale = torch.empty(2, 2, 2, 1)
    w1 = torch.empty(2, 2, 128, 128, dtype=torch.bfloat16, requires_grad=True)
    return xs, ids, gates, w0, w0_scale, w1


def test_fp8_op_traces_and_its_backward_says_forward_only(handle):
    schema = str(torch.ops.comet.moe_forward_fp8.default._schema)
    assert schema.endswith("(Tensor[] x, Tensor[] ids, Tensor[] gates, Tensor w0, Tensor w0_scale, Tensor w1, "
                           "int handle) -> Tensor[]")
    h = handle(training=False)
    with FakeTensorMode():
        xs, ids, gates, w0, w0_scale, w1 = _fp8_fake_inputs()
        out = torch.ops.comet.moe_forward_fp8(xs, ids, gates, w0, w0_scale, w1, h)
        assert [o.shape for o in out] == [x.shape for x in xs] and out[0].dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="forward-only"):
            sum(o.float().sum() for o in out).backward()


def test_fp8_eager_path_runs_the_kernel_and_refuses_a_backward(handle, monkeypatch):
    h = handle(training=False)
    calls = {}

    def forward(x, ids, gates, w0, w0_scale, w1, hd):
        calls["forward"] = (len(x), w0.dtype, w0_scale.shape, hd)
        return ops._moe_forward_fp8_fake(x, ids, gates, w0, w0_scale, w1, hd)

    monkeypatch.setattr(ops, "_moe_forward_fp8_cuda", forward)
    xs, ids, gates, w0, w0_scale, w1 = _fp8_fake_inputs()
    out = ops._EagerMoeForwardFp8.apply(h, 2, w0, w0_scale, w1, *xs, *ids, *gates)
    assert calls["forward"] == (2, torch.float8_e4m3fn, (2, 2, 2, 1), h)
    assert [o.shape for o in out] == [x.shape for x in xs]
    with pytest.raises(RuntimeError, match="forward-only.*torch.no_grad"):
        sum(o.float().sum() for o in out).backward()


FP8_SPEC = LayerSpec(hidden_size=128, top_k=2, local_experts=2, w0_rows=200, ffn_shard=100, max_tokens=16, ranks=1,
                     device=torch.device("cpu"), fp8=True)


def _good_fp8(t=5):
    return ([torch.zeros(t, 128, dtype=torch.bfloat16)], [torch.zeros(t, 2, dtype=torch.int32)], [torch.zeros(t, 2)],
            torch.zeros(1, 2, 200, 128, dtype=torch.float8_e4m3fn), torch.zeros(1, 2, 128, 100, dtype=torch.bfloat16),
            torch.ones(1, 2, 2, 1))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a: a.__setitem__(3, torch.zeros(1, 2, 200, 128, dtype=torch.bfloat16)), TypeError, "w0: dtype"),
    (lambda a: a.__setitem__(5, None), ValueError, r"w0_scale: the fp8 layer's w0 needs .*\[1, 2, 2, 1\]"),
    (lambda a: a.__setitem__(5, torch.ones(1, 2, 1, 1)), ValueError, r"w0_scale: shape \(1, 2, 1, 1\)"),
    (lambda a: a.__setitem__(5, torch.ones(1, 2, 2, 1, dtype=torch.bfloat16)), TypeError, "w0_scale: dtype"),
    (lambda a: a.__setitem__(5, torch.ones(1, 2, 2, 2)[..., :1]), ValueError, "w0_scale: must be contiguous"),
])
def test_fp8_input_checks_name_the_argument(mutate, error, match):
    args = list(_good_fp8())
    check_inputs(FP8_SPEC, *args)  # the good call passes; the scales cover a partial row block (200 rows)
    mutate(args)
    with pytest.raises(error, match=match):
        check_inputs(FP8_SPEC, *args)


def test_bf16_layer_takes_no_block_scales():
    with pytest.raises(ValueError, match="w0_scale: given, but the layer is bf16"):
        check_inputs(SPEC, *_good(), torch.ones(1, 2, 2, 1))


def test_dtype_and_training_are_checked_before_the_gpu():
    """Refused before a team or a GPU is touched, so the messages are the same on any machine."""
    with pytest.raises(TypeError, match="torch.bfloat16 or torch.float8_e4m3fn"):
        comet.MoELayer(256, 512, 8, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="forward-only for now: build it with training=False"):
        comet.MoELayer(256, 512, 8, 2, dtype=torch.float8_e4m3fn, training=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        comet.MoELayer(320, 512, 8, 2, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="dtype must be 'bf16' or 'e4m3'"):
        comet.FusedMoE(None, 256, 512, 8, 2, max_tokens=16, dtype="fp16")
    with pytest.raises(ValueError, match="forward-only"):
        comet.FusedMoE(None, 256, 512, 8, 2, max_tokens=16, dtype=torch.float8_e4m3fn, training=True)


def test_transport_is_checked_before_the_gpu():
    """An unknown transport is refused before a team exists (what a team runs with a known one, the
    layer checks when it is built on it)."""
    with pytest.raises(ValueError, match="transport must be one of"):
        comet.FusedMoE(None, 256, 512, 8, 2, max_tokens=16, transport="ib")
    with pytest.raises(ValueError, match="transport must be one of"):
        comet.MoELayer(256, 512, 8, 2, transport="")
    with pytest.raises(ValueError, match="transport must be one of"):
        comet.MoELayer(256, 512, 8, 2, dtype=torch.float8_e4m3fn, transport="NVSHMEM")


def test_quantizer_checks_its_arguments_before_any_launch():
    with pytest.raises(TypeError, match="dtype torch.float32, expected torch.bfloat16"):
        comet.quantize_weights_e4m3(torch.zeros(2, 128))
    with pytest.raises(ValueError, match="positive multiple of 128"):
        comet.quantize_weights_e4m3(torch.zeros(2, 100, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="runs on a CUDA GPU"):
        comet.quantize_weights_e4m3(torch.zeros(2, 128, dtype=torch.bfloat16))
    # The binding itself (device addresses): the kernel's checks, comet.InvalidArgument before a launch.
    with pytest.raises(comet.InvalidArgument, match="cols must be a positive multiple of 128"):
        comet._C.quantize_weights_e4m3(0, 1, 1, 100, 0, 0, 0)
    with pytest.raises(comet.InvalidArgument, match="16-byte aligned"):
        comet._C.quantize_weights_e4m3(16, 1, 128, 128, 8, 16, 0)


def test_dequantize_weights_e4m3_scales_each_128x128_block():
    codes = torch.full((2, 130, 256), 1.5).to(torch.float8_e4m3fn)
    codes[1, 129, 255] = -448.0
    scales = torch.tensor([[[1.0, 2.0], [0.25, 4.0]], [[8.0, 0.5], [3.0, 1 / 448]]])
    w = W.dequantize_weights_e4m3(codes, scales)
    assert w.dtype == torch.float32 and w.shape == (2, 130, 256)
    assert w[0, 0, 0] == 1.5 and w[0, 127, 128] == 3.0 and w[0, 128, 0] == 0.375 and w[0, 129, 255] == 6.0
    assert w[1, 5, 130] == 0.75 and w[1, 128, 3] == 4.5
    assert w[1, 129, 255] == torch.tensor(-448.0) * torch.tensor(1 / 448)  # one fp32 rounding of the product
    with pytest.raises(ValueError, match=r"scales: shape \(2, 1, 2\), expected \(2, 2, 2\)"):
        W.dequantize_weights_e4m3(codes, scales[:, :1])
    with pytest.raises(ValueError, match="codes: dtype"):
        W.dequantize_weights_e4m3(codes.float(), scales)


def test_torch_allocator_turns_a_refusal_into_a_null_and_one_clear_error(monkeypatch):
    """torch's OutOfMemoryError is not let through the engine's C++ frames: alloc records the first one and
    answers 0 (which the engine refuses); out_of_memory() is what FusedMoE raises, once. Other errors pass."""
    calls = []

    def refuse(nbytes, device):
        calls.append((nbytes, device))
        if nbytes == 7:
            raise ValueError("not an OOM")
        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes} bytes")

    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", refuse)
    a = ops._TorchAllocator(3)
    assert a.alloc(1 << 30) == 0 and a.alloc(16) == 0 and calls == [(1 << 30, 3), (16, 3)]
    with pytest.raises(ValueError, match="not an OOM"):
        a.alloc(7)
    e = a.out_of_memory()
    assert isinstance(e, torch.OutOfMemoryError)
    assert "cuda:3" in str(e) and f"Tried to allocate {1 << 30} bytes" in str(e) and "layer_footprint" in str(e)
    assert a.failure is None
    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", lambda nbytes, device: 4096)
    assert ops._TorchAllocator(0).alloc(64) == 4096


def test_expert_parameters_carry_megatrons_allreduce_marker():
    from comet.layer import mark_expert_parameters

    for ep, want in ((8, False), (2, False), (1, True)):
        ws = [torch.nn.Parameter(torch.empty(2)), torch.nn.Parameter(torch.empty(3))]
        mark_expert_parameters(ws, ep)
        assert [w.allreduce for w in ws] == [want, want]
