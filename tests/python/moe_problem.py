"""A random MoE problem for the Python tests and its oracle: a plain PyTorch MoE (a loop over experts in
fp32, written here from the layer's definition, sharing no code with comet), whose gradients autograd
gives."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def bf16_exact(t: torch.Tensor) -> torch.Tensor:
    """fp32 values that bf16 holds exactly, so the oracle sees what the GPU sees."""
    return t.to(torch.bfloat16).float()


def route_ids(tokens: int, experts: int, k: int, kind: str, gen: torch.Generator, hot: int = 0) -> torch.Tensor:
    """[tokens, k] distinct expert ids per token.
    uniform: k distinct experts at random; zipf: weights 1/(e+1)^1.2; one_hot: every token's first
    expert is `hot`; half: only experts [0, E/2) are used (the rest get no tokens)."""
    if kind == "half":
        experts_used = max(k, experts // 2)
        weights = torch.ones(tokens, experts_used)
    elif kind == "zipf":
        experts_used = experts
        weights = (1.0 / torch.arange(1, experts + 1).float() ** 1.2).expand(tokens, experts).clone()
    else:
        experts_used = experts
        weights = torch.ones(tokens, experts)
    if tokens == 0:
        return torch.empty(0, k, dtype=torch.int64)
    ids = torch.multinomial(weights, k, replacement=False, generator=gen)
    if kind == "one_hot":
        has = (ids == hot).any(dim=1)
        first = ids[:, 0].clone()
        ids[:, 0] = hot
        # keep the ids distinct: where `hot` sat elsewhere, it takes the displaced first id
        for j in range(1, k):
            swap = ids[:, j] == hot
            ids[swap & has, j] = first[swap & has]
    return ids


@dataclass
class Problem:
    hidden: int
    ffn: int
    experts: int
    topk: int
    act: str
    ep: int
    tp: int
    x: list            # per rank [T_r, H] bf16 (cuda)
    ids: list          # per rank [T_r, k] int64 (cuda)
    gates: list        # per rank [T_r, k] fp32 (cuda)
    gate_up: torch.Tensor  # [E, 2F or F, H] fp32, bf16-exact (cpu)
    down: torch.Tensor     # [E, H, F] fp32, bf16-exact (cpu)

    @property
    def world(self) -> int:
        return self.ep * self.tp


def make_problem(*, hidden=256, ffn=512, experts=8, topk=2, act="swiglu", ep=2, tp=1, tokens=(37, 200),
                 routing="uniform", seed=0, device="cuda") -> Problem:
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * ffn if act == "swiglu" else ffn
    gate_up = bf16_exact(torch.randn(experts, rows, hidden, generator=gen) / hidden ** 0.5)
    down = bf16_exact(torch.randn(experts, hidden, ffn, generator=gen) / ffn ** 0.5)
    xs, ids, gates = [], [], []
    for t in tokens:
        xs.append(bf16_exact(torch.randn(t, hidden, generator=gen)).to(torch.bfloat16).to(device))
        ids.append(route_ids(t, experts, topk, routing, gen).to(device))
        g = torch.rand(t, topk, generator=gen) + 0.1
        gates.append((g / g.sum(-1, keepdim=True)).to(device))
    return Problem(hidden, ffn, experts, topk, act, ep, tp, xs, ids, gates, gate_up, down)


def activation(act: str, h: torch.Tensor, ffn: int) -> torch.Tensor:
    if act == "swiglu":
        return F.silu(h[:, :ffn]) * h[:, ffn:]
    if act == "gelu":
        return F.gelu(h, approximate="tanh")
    return F.silu(h)


class _ActivationSavedInBf16(torch.autograd.Function):
    """act(z), whose backward evaluates act' at z rounded to bf16: what a bf16 layer saves (comet, like
    any bf16 autograd graph, keeps the pre-activations in bf16). The derivative is ill-conditioned near
    its zeros (SiLU's at z = -1.28): there one rounding of z moves act'(z) by tens of percent, so a weight
    row fed by one or two tokens can differ by that much from an fp32 reference. Modelling the saved
    precision keeps the row-wise check a test of the math, not of that conditioning."""

    @staticmethod
    def forward(ctx, z, act, ffn):
        ctx.save_for_backward(z.to(torch.bfloat16).float())
        ctx.act, ctx.ffn = act, ffn
        return activation(act, z, ffn)

    @staticmethod
    def backward(ctx, dh):
        (saved,) = ctx.saved_tensors
        with torch.enable_grad():
            z = saved.detach().requires_grad_()
            (dz,) = torch.autograd.grad(activation(ctx.act, z, ctx.ffn), z, dh)
        return dz, None, None


def expert_mix(p: Problem, x, ids, gates, gate_up, down, saved_bf16: bool = False) -> torch.Tensor:
    """y_t = sum_j gate_tj * down_e(act(gate_up_e x_t)), e = ids_tj, in x's dtype; differentiable.
    saved_bf16: the activation's backward sees the pre-activations rounded to bf16 (_ActivationSavedInBf16)."""
    y = torch.zeros_like(x)
    for e in range(p.experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        z = x[tok] @ gate_up[e].t()
        h = _ActivationSavedInBf16.apply(z, p.act, p.ffn) if saved_bf16 else activation(p.act, z, p.ffn)
        y = y.index_add(0, tok, (h @ down[e].t()) * gates[tok, slot, None])
    return y


def reference_moe(p: Problem, x: torch.Tensor, ids: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """One rank's output in fp32."""
    return expert_mix(p, x.float().cpu(), ids.cpu(), gates.float().cpu(), p.gate_up, p.down)


@dataclass
class Grads:
    dx: list      # per rank [T_r, H]
    dgates: list  # per rank [T_r, k]
    gate_up: torch.Tensor  # d gate_up_proj, [E, 2F or F, H] (the full layout)
    down: torch.Tensor     # d down_proj, [E, H, F]

    def tensors(self) -> list:
        return [*self.dx, *self.dgates, self.gate_up, self.down]


def random_douts(p: Problem, seed: int) -> list:
    """An output gradient per rank, [T_r, H] bf16 on the tokens' device."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape[0], p.hidden, generator=gen).to(torch.bfloat16).to(x.device) for x in p.x]


def reference_grads(p: Problem, dout: list) -> Grads:
    """Gradients of sum_r <dout_r, out_r> over every rank's tokens, by autograd through the plain MoE in
    fp32 on the problem's bf16 values, with the pre-activations saved in bf16 as the layer saves them."""
    gate_up, down = p.gate_up.clone().requires_grad_(), p.down.clone().requires_grad_()
    xs = [x.float().cpu().requires_grad_() for x in p.x]
    gates = [g.float().cpu().requires_grad_() for g in p.gates]
    loss = sum((expert_mix(p, x, i.cpu(), g, gate_up, down, saved_bf16=True) * d.float().cpu()).sum()
               for x, i, g, d in zip(xs, p.ids, gates, dout))
    loss.backward()
    grad = lambda t: torch.zeros_like(t) if t.grad is None else t.grad  # noqa: E731  (a rank without tokens)
    return Grads([grad(x) for x in xs], [grad(g) for g in gates], grad(gate_up), grad(down))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if want.numel() == 0:
        return 0.0
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def worst_row_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if want.numel() == 0:
        return 0.0
    return float(((got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-6)).max())


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """The C++ suite's bounds: whole output 1.5e-2, worst row 5e-2 (bf16 inputs, bf16 hidden rows)."""
    assert torch.isfinite(got.float()).all(), f"{what}: non-finite values"
    err, row = relative_error(got, want), worst_row_error(got, want)
    assert err < 1.5e-2, f"{what}: relative error {err:.3e}"
    assert row < 5e-2, f"{what}: worst row error {row:.3e}"


def assert_grad_matches(got: torch.Tensor, want: torch.Tensor, what: str, rows: bool = True) -> None:
    """The forward's bounds widened by a third (2e-2 whole, 6.5e-2 worst row of the last dimension) for
    the backward's longer bf16 chain: besides bf16 inputs, it reads the saved bf16 pre-activations and
    hidden rows, rounds dPre and gate * hidden to bf16 before their GEMMs and writes every gradient in
    bf16: about five roundings (each <= 2^-8 relative, ~2e-3 RMS, independent) against the forward's
    three, ~5e-3 together. rows=False for the gate gradients: a row is k dot products that may cancel, so
    only the whole tensor has a meaningful relative error."""
    assert torch.isfinite(got.float()).all(), f"{what}: non-finite values"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = relative_error(got, want)
    assert err < 2e-2, f"{what}: relative error {err:.3e}"
    if rows:
        row = worst_row_error(got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1]))
        assert row < 6.5e-2, f"{what}: worst row error {row:.3e}"
