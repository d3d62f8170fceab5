"""Trains a small MoE model with comet's backward and, side by side, the same model with a plain PyTorch
MoE from the same initial weights on the same data: two residual pre-norm blocks whose MoE
(comet.MoELayer, EP over W virtual ranks on this GPU) routes with its own nn.Linear router, trained
through the gate weights; AdamW on bf16 parameters, a synthetic regression (targets tanh(x A) for a fixed
random A). Prints both losses per step and writes both curves, with their largest relative difference,
to --out (bench/plot_training.py draws them).

    python examples/train_moe.py [--world 4] [--steps 200] [--out bench/results/h200_training_curves.json]
"""
import argparse
import copy
import json
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import comet


class RMSNorm(nn.Module):
    def __init__(self, dim, device):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16, device=device))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


class PlainMoE(nn.Module):
    """What a model without comet runs: every expert on this GPU, a loop over experts; weights and router
    copied from a comet.MoELayer."""

    def __init__(self, moe: comet.MoELayer):
        super().__init__()
        gate_up, down = moe.experts()  # [E, 2F, H], [E, H, F]: fresh tensors
        self.gate_up, self.down = nn.Parameter(gate_up), nn.Parameter(down)
        self.router, self.top_k = copy.deepcopy(moe.router), moe.top_k

    def forward(self, xs):
        return [self.run_experts(x, *comet.route(self.router(x), self.top_k)) for x in xs]

    def run_experts(self, x, ids, gates):
        y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        ffn = self.down.shape[2]
        for e in range(self.gate_up.shape[0]):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                h = x[tok] @ self.gate_up[e].t()
                h = F.silu(h[:, :ffn]) * h[:, ffn:]
                y = y.index_add(0, tok, (h @ self.down[e].t()).float() * gates[tok, slot, None])
        return y.to(x.dtype)


class Net(nn.Module):
    """Residual pre-norm MoE blocks on a list of token batches, one per rank of the team."""

    def __init__(self, moes, hidden, device):
        super().__init__()
        self.moes = nn.ModuleList(moes)
        self.norms = nn.ModuleList(RMSNorm(hidden, device) for _ in moes)

    def forward(self, xs):
        for norm, moe in zip(self.norms, self.moes):
            xs = [x + y for x, y in zip(xs, moe([norm(x) for x in xs]))]
        return xs


def batch(step, a, teacher):
    """The step's tokens per rank (bf16) and their fp32 targets; the same for both models."""
    gen = torch.Generator(device=teacher.device).manual_seed(a.seed + 1 + step)
    xs = [torch.randn(a.tokens, a.hidden, device=teacher.device, generator=gen) for _ in range(a.world)]
    return [x.to(torch.bfloat16) for x in xs], [torch.tanh(x @ teacher) for x in xs]


def train_step(net, opt, xs, targets):
    """One AdamW step on the mean squared error over every rank's tokens; returns the loss."""
    ys = net(xs)
    loss = sum(F.mse_loss(y.float(), t, reduction="sum") for y, t in zip(ys, targets))
    loss = loss / sum(t.numel() for t in targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4, help="virtual ranks (EP) of the comet layers")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per rank and step")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/h200_training_curves.json")
    a = ap.parse_args()

    torch.manual_seed(a.seed)  # the comet layers' initial weights and routers; the plain model copies them
    team = comet.Team.local(a.world)
    dev = team.device
    moes = [comet.MoELayer(a.hidden, a.ffn, a.experts, a.top_k, team=team, max_tokens=a.tokens, router=True)
            for _ in range(a.layers)]
    nets = {"comet": Net(moes, a.hidden, dev), "plain": Net([PlainMoE(m) for m in moes], a.hidden, dev)}
    opts = {name: torch.optim.AdamW(net.parameters(), lr=a.lr) for name, net in nets.items()}
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    teacher = torch.randn(a.hidden, a.hidden, device=dev, generator=gen) / a.hidden ** 0.5

    losses, secs = {name: [] for name in nets}, dict.fromkeys(nets, 0.0)
    for step in range(a.steps):
        xs, targets = batch(step, a, teacher)
        for name, net in nets.items():
            t0 = time.perf_counter()
            losses[name].append(train_step(net, opts[name], xs, targets))  # .item() waits for the GPU
            secs[name] += time.perf_counter() - t0
        print(f"step {step + 1:4d}  loss comet {losses['comet'][-1]:.5f}  plain {losses['plain'][-1]:.5f}", flush=True)

    rel = max(abs(c - p) / abs(p) for c, p in zip(losses["comet"], losses["plain"]))
    ms = {name: 1e3 * s / a.steps for name, s in secs.items()}
    print(f"largest relative difference of the losses: {rel:.3e}; ms per step comet {ms['comet']:.1f}, "
          f"plain {ms['plain']:.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"config": {k: v for k, v in vars(a).items() if k != "out"}, "gpu": torch.cuda.get_device_name(dev),
                   "comet": losses["comet"], "plain": losses["plain"], "max_rel_diff": rel, "ms_per_step": ms},
                  f, indent=1)
    team.synchronize()


if __name__ == "__main__":
    main()
