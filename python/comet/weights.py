"""Expert weights: the common checkpoint layouts to and from the layout comet's kernels read.

Full layouts (what checkpoints hold):
  gate_up_proj [E, 2F, H]  rows 0..F-1 the gate projection, rows F..2F-1 the up projection (SwiGLU);
                           [E, F, H] for gelu / silu experts (no gate)
  down_proj    [E, H, F]
  Mixtral-style per-expert Linears: w1 (gate) [F, H], w3 (up) [F, H], w2 (down) [H, F].

A rank's shard (comet/weight_layout.hpp), rank = ep_index * tp + tp_index, E_l = E / ep, F_s = F / tp
(local_w0 / plain_w0 convert one rank's own plain shard, [E_l, 2 F_s, H] gate rows then up rows, to and
from it, for sharded checkpoints):
  w0 [E_l, N0_s, H]  experts [g E_l, (g+1) E_l) of EP group g, F columns [i F_s, (i+1) F_s) of TP index i;
                     SwiGLU: N0_s = 2 F_s with gate and up rows interleaved in blocks of 8 (rows 16b..16b+7
                     are gate rows 8b..8b+7 of the shard, rows 16b+8..16b+15 the matching up rows), so the
                     GEMM epilogue holds both halves of an output column; gelu / silu: N0_s = F_s.
  w1 [E_l, H, F_s]

An fp8 layer's w0 (comet.MoELayer(dtype=torch.float8_e4m3fn)) is the same local layout in e4m3 codes with
fp32 scales of 128 x 128 blocks of each local expert's [N0_s, H]: [E_l, ceil(N0_s / 128), H / 128]. The
blocks are those of the local layout (with SwiGLU a block holds gate and up rows), so quantise after
sharding (comet.ops.quantize_weights_e4m3); dequantize_weights_e4m3 gives the values back.
"""
from __future__ import annotations

from typing import Sequence

import torch

BLOCK = 8  # gate / up interleave of the SwiGLU shard
FP8_BLOCK = 128  # an fp8 w0's scale block: 128 x 128


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _shard_ranges(num_experts: int, ffn: int, ep: int, tp: int, rank: int):
    _check(ep >= 1 and tp >= 1 and 0 <= rank < ep * tp, f"rank {rank} out of range for ep={ep} x tp={tp}")
    _check(num_experts % ep == 0, f"num_experts ({num_experts}) must be divisible by ep ({ep})")
    _check(ffn % tp == 0, f"ffn ({ffn}) must be divisible by tp ({tp})")
    el, fs = num_experts // ep, ffn // tp
    g, i = rank // tp, rank % tp
    return slice(g * el, (g + 1) * el), slice(i * fs, (i + 1) * fs)


def shard_w0(gate_up_proj: torch.Tensor, *, gated: bool, ep: int, tp: int, rank: int) -> torch.Tensor:
    """A rank's w0 [E_l, N0_s, H] from gate_up_proj [E, 2F, H] (gated) or [E, F, H]."""
    _check(gate_up_proj.dim() == 3, f"gate_up_proj must be [E, {'2F' if gated else 'F'}, H], got {tuple(gate_up_proj.shape)}")
    E, rows, H = gate_up_proj.shape
    ffn = rows // 2 if gated else rows
    _check(not gated or rows % 2 == 0, f"gate_up_proj has {rows} rows: a gated expert needs 2F")
    experts, cols = _shard_ranges(E, ffn, ep, tp, rank)
    if not gated:
        return gate_up_proj[experts, cols].contiguous()
    fs = cols.stop - cols.start
    _check(fs % BLOCK == 0, f"F/tp ({fs}) must be a multiple of {BLOCK}")
    gate = gate_up_proj[experts, cols]
    up = gate_up_proj[experts, ffn + cols.start: ffn + cols.stop]
    return local_w0(torch.cat((gate, up), dim=1), gated=True)


def local_w0(gate_up: torch.Tensor, *, gated: bool) -> torch.Tensor:
    """A rank's w0 [E_l, N0_s, H] from its own shard in the plain layout, gate_up [E_l, 2 F_s, H]: its
    experts' gate rows of its F columns, then the matching up rows (the layout a column-parallel GLU
    weight has on its TP rank); [E_l, F_s, H] ungated, which is w0 as it is. For sharded checkpoints:
    no rank needs the full weights."""
    _check(gate_up.dim() == 3, f"gate_up must be [E_l, {'2 F_s' if gated else 'F_s'}, H], got {tuple(gate_up.shape)}")
    if not gated:
        return gate_up.contiguous()
    el, rows, H = gate_up.shape
    _check(rows % (2 * BLOCK) == 0, f"gate_up has {rows} rows: a gated shard needs 2 F_s with F_s a multiple of "
                                    f"{BLOCK}")
    fs = rows // 2
    gate, up = gate_up[:, :fs], gate_up[:, fs:]
    blocks = torch.stack((gate.reshape(el, fs // BLOCK, BLOCK, H), up.reshape(el, fs // BLOCK, BLOCK, H)), dim=2)
    return blocks.reshape(el, 2 * fs, H).contiguous()


def plain_w0(w0: torch.Tensor, *, gated: bool) -> torch.Tensor:
    """local_w0's inverse: a rank's [E_l, 2 F_s, H] gate rows then up rows (or [E_l, F_s, H]) from its w0."""
    _check(w0.dim() == 3, f"w0 must be [E_l, N0_s, H], got {tuple(w0.shape)}")
    if not gated:
        return w0.contiguous()
    el, n0s, H = w0.shape
    _check(n0s % (2 * BLOCK) == 0, f"w0 has {n0s} rows: a gated shard has 2 F_s, F_s a multiple of {BLOCK}")
    blocks = w0.reshape(el, n0s // (2 * BLOCK), 2, BLOCK, H)
    return torch.cat((blocks[:, :, 0].reshape(el, n0s // 2, H), blocks[:, :, 1].reshape(el, n0s // 2, H)), dim=1)


def shard_w1(down_proj: torch.Tensor, *, ep: int, tp: int, rank: int) -> torch.Tensor:
    """A rank's w1 [E_l, H, F_s] from down_proj [E, H, F]."""
    _check(down_proj.dim() == 3, f"down_proj must be [E, H, F], got {tuple(down_proj.shape)}")
    E, _, F = down_proj.shape
    experts, cols = _shard_ranges(E, F, ep, tp, rank)
    return down_proj[experts, :, cols].contiguous()


def unshard_w0(shards: Sequence[torch.Tensor], *, gated: bool, ep: int, tp: int) -> torch.Tensor:
    """gate_up_proj [E, 2F, H] (or [E, F, H]) from every rank's w0, in rank order."""
    _check(len(shards) == ep * tp, f"{len(shards)} shards for ep={ep} x tp={tp}")
    el, n0s, H = shards[0].shape
    fs = n0s // 2 if gated else n0s
    E, F = el * ep, fs * tp
    full = shards[0].new_empty(E, 2 * F if gated else F, H)
    for rank, w in enumerate(shards):
        experts, cols = _shard_ranges(E, F, ep, tp, rank)
        if gated:
            plain = plain_w0(w, gated=True)
            full[experts, cols] = plain[:, :fs]
            full[experts, F + cols.start: F + cols.stop] = plain[:, fs:]
        else:
            full[experts, cols] = w
    return full


def unshard_w1(shards: Sequence[torch.Tensor], *, ep: int, tp: int) -> torch.Tensor:
    """down_proj [E, H, F] from every rank's w1, in rank order."""
    _check(len(shards) == ep * tp, f"{len(shards)} shards for ep={ep} x tp={tp}")
    el, H, fs = shards[0].shape
    E, F = el * ep, fs * tp
    full = shards[0].new_empty(E, H, F)
    for rank, w in enumerate(shards):
        experts, cols = _shard_ranges(E, F, ep, tp, rank)
        full[experts, :, cols] = w
    return full


def fuse_linear_experts(w1: Sequence[torch.Tensor], w3: Sequence[torch.Tensor] | None,
                        w2: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up_proj, down_proj) from per-expert Linear weights: w1 (gate) [F, H], w3 (up) [F, H] or None
    for ungated experts, w2 (down) [H, F] (Mixtral's naming)."""
    _check(len(w1) == len(w2) and (w3 is None or len(w3) == len(w1)), "w1, w3 and w2 must list the same experts")
    rows = [torch.cat((a, b), dim=0) for a, b in zip(w1, w3)] if w3 is not None else list(w1)
    return torch.stack(rows), torch.stack(list(w2))


def dequantize_weights_e4m3(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 values an fp8 weight stands for: codes (torch.float8_e4m3fn [..., rows, cols]) times the
    fp32 scale of their 128 x 128 block (scales [..., ceil(rows / 128), cols / 128]). Exact: an e4m3 value
    has 4 significant bits, so each product rounds once, as the C++ oracle's does."""
    _check(codes.dtype == torch.float8_e4m3fn, f"codes: dtype {codes.dtype}, expected torch.float8_e4m3fn")
    _check(scales.dtype == torch.float32, f"scales: dtype {scales.dtype}, expected torch.float32")
    _check(codes.dim() >= 2, f"codes must be [..., rows, cols], got {tuple(codes.shape)}")
    *lead, rows, cols = codes.shape
    want = (*lead, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    _check(tuple(scales.shape) == want, f"scales: shape {tuple(scales.shape)}, expected {want} for codes of "
                                        f"{tuple(codes.shape)} (one per 128 x 128 block)")
    s = scales.repeat_interleave(FP8_BLOCK, dim=-2)[..., :rows, :].repeat_interleave(FP8_BLOCK, dim=-1)[..., :cols]
    return codes.float() * s.to(codes.device)
