"""A small Mixtral-like decoder block (RMSNorm, attention, RMSNorm, top-2 MoE) whose MoE is comet's,
under torchrun with expert parallelism over the processes; checked against the same block with a plain
PyTorch MoE (written here: router, then a loop over experts), and timed side by side.

    torchrun --nproc-per-node=4 examples/moe_block.py [--tokens 2048] [--hidden 1024] [--ffn 3584]
    (several processes may share one GPU: start the MPS daemon first to let them run concurrently)
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import comet


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16, device="cuda"))

    def forward(self, x):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight


class PlainMoE(nn.Module):
    """What a model without comet runs: every expert's weights on this GPU, a loop over experts."""

    def __init__(self, router, gate_up, down, top_k):
        super().__init__()
        self.router, self.gate_up, self.down, self.top_k = router, gate_up, down, top_k

    def forward(self, x):
        ids, w = comet.route(self.router(x), self.top_k)
        y = torch.zeros_like(x, dtype=torch.float32)
        F_ = self.down.shape[2]
        for e in range(self.gate_up.shape[0]):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel():
                h = x[tok] @ self.gate_up[e].t()
                h = F.silu(h[:, :F_]) * h[:, F_:]
                y.index_add_(0, tok, (h @ self.down[e].t()).float() * w[tok, slot, None])
        return y.to(x.dtype)


class Block(nn.Module):
    def __init__(self, hidden, heads, moe):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False, dtype=torch.bfloat16, device="cuda")
        self.proj = nn.Linear(hidden, hidden, bias=False, dtype=torch.bfloat16, device="cuda")
        self.heads, self.moe = heads, moe

    def forward(self, x):  # x: [seq, hidden], one sequence per rank
        q, k, v = self.qkv(self.norm1(x)).view(x.shape[0], 3, self.heads, -1).unbind(1)
        a = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        x = x + self.proj(a.transpose(0, 1).reshape(x.shape))
        return x + self.moe(self.norm2(x))


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per rank (one sequence)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=3584)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.manual_seed(0)  # the same weights on every rank
    team = comet.Team.from_process_group(ep=world)
    moe = comet.MoELayer(a.hidden, a.ffn, a.experts, 2, team=team, max_tokens=a.tokens, router=True,
                         training=False)  # inference only: no buffers for a backward
    gate_up = (torch.randn(a.experts, 2 * a.ffn, a.hidden, device="cuda") / a.hidden ** 0.5).to(torch.bfloat16)
    down = (torch.randn(a.experts, a.hidden, a.ffn, device="cuda") / a.ffn ** 0.5).to(torch.bfloat16)
    moe.load_experts(gate_up, down)
    with torch.no_grad():
        moe.router.weight.normal_(0, a.hidden ** -0.5)
    block = Block(a.hidden, a.heads, moe)
    plain = Block(a.hidden, a.heads, PlainMoE(moe.router, gate_up, down, 2))
    plain.load_state_dict({k: v for k, v in block.state_dict().items() if not k.startswith("moe.")}, strict=False)

    torch.manual_seed(1 + rank)  # each rank its own tokens
    x = torch.randn(a.tokens, a.hidden, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y, y_ref = block(x), plain(x)
        err = float((y.float() - y_ref.float()).norm() / y_ref.float().norm())
        t_comet, t_plain = timed(lambda: block(x)), timed(lambda: plain(x))
    moe.engine.synchronize()
    print(f"rank {rank}/{world}: relative error vs plain PyTorch MoE {err:.2e}; block forward "
          f"comet {t_comet:.2f} ms, plain {t_plain:.2f} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if err > 2e-2:
        raise SystemExit(f"rank {rank}: comet's block differs from the plain one ({err:.2e})")


if __name__ == "__main__":
    main()
