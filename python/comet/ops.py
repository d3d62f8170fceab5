"""comet's custom ops (torch.library, namespace ``comet``) and the functional API built on them.

Every op runs on the caller's current CUDA stream, makes no host synchronisation (CUDA-graph
capturable) and has a fake (meta) kernel, so ``torch.compile(fullgraph=True)`` traces it without a graph
break. Lists hold one tensor per rank this process drives (one under torchrun, W for a local team).

  comet::moe_forward(x[], ids[], gates[], w0, w1, handle) -> out[]    the whole layer (fused)
  comet::moe_layer0(x[], ids[], gates[], w0, handle) -> hidden[]      dispatch + GEMM0 + activation
  comet::moe_layer1(hidden[], ids[], w1, handle) -> out[]             GEMM1 + top-k combine

w0 / w1 are the local ranks' weights stacked, [L, E_l, N0_s, H] and [L, E_l, H, F_s] (MoELayer's
parameters as they are: no per-call unbinding).

A handle names a FusedMoE (the layer's buffers, team and tuner state). moe_layer1 consumes the routing
staged by the last moe_layer0 of the same handle; hidden holds the plan's rows ([max_rows, F/tp], rows
grouped by expert, padding rows unused).
"""
from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import _lib
from .team import Team

_ACTIVATIONS = ("swiglu", "gelu", "silu")
_IDS_DTYPES = (torch.int32, torch.int64)
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)  # the fast path; subclasses take the full check

# handle -> (native FusedMoe, its ranks' indices in the lists); an int crosses the op boundary.
_registry: dict[int, tuple] = {}
_handles = itertools.count(1)


class FusedMoE:
    """A distributed MoE layer's engine without parameters: buffers, team, tuner. Call it with the expert
    weights (see comet.weights for their layout), or use comet.MoELayer, which owns them.

    batch_invariant=True: a token's output bits do not depend on the batch it came in (the tile shape
    is then chosen from the layer's shape alone); checking=True: synchronise after every call and raise
    what the device reported (bad expert ids, timeouts) at once.

    Device memory per local rank (bf16, T = max_tokens, R = max_rows, W ranks):
      gathered tokens and expert outputs 2 R H, hidden R F/tp, own partials T H, and the exported
      buffers (tokens T H, receive slots W T H, routing T k 8 bytes), all x 2 bytes for bf16;
      R defaults to the worst case W T min(k, E/ep) + 127 E/ep (every token of every rank on this rank's
      experts); give max_rows to size it for the load you expect (a call that needs more rows is refused
      on the device and reported). ``device_bytes_per_rank`` gives the total.
    """

    def __init__(self, team: Team, hidden_size: int, ffn_size: int, num_experts: int, top_k: int,
                 activation: str = "swiglu", *, max_tokens: int, max_rows: int = 0,
                 tile_n: tuple[Optional[int], Optional[int]] = (None, None),
                 n_comm: tuple[Optional[int], Optional[int]] = (None, None),
                 adaptive_split: bool = True, batch_invariant: bool = False, checking: bool = False,
                 tune_table: str = "", use_torch_allocator: bool = True):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
        _lib.require_cuda("comet.FusedMoE")
        alloc = release = None
        if use_torch_allocator:
            device = team.device.index

            def alloc(nbytes: int) -> int:
                return torch.cuda.caching_allocator_alloc(nbytes, device)

            release = torch.cuda.caching_allocator_delete
        self.team = team
        self.hidden_size, self.ffn_size, self.num_experts, self.top_k = hidden_size, ffn_size, num_experts, top_k
        self.activation = activation
        self.native = _lib.C.FusedMoe(
            team._native, hidden_size, ffn_size, num_experts, top_k, activation, team.ep, team.tp, max_tokens,
            max_rows, layer0_tile_n=tile_n[0], layer0_n_comm=n_comm[0], layer1_tile_n=tile_n[1],
            layer1_n_comm=n_comm[1], adaptive_split=adaptive_split, batch_invariant=batch_invariant,
            checking=checking, tune_table=tune_table,
            allocate=alloc, release=release)
        # Plain attributes (not calls into the extension), so that torch.compile traces a call without a break.
        self.local_ranks = team.local_ranks
        self.local_experts = num_experts // team.ep
        self.ffn_shard = ffn_size // team.tp
        self.w0_rows = 2 * self.ffn_shard if activation == "swiglu" else self.ffn_shard
        self.max_tokens = self.native.max_tokens
        self.max_rows = self.native.max_rows
        self.device_bytes_per_rank = self.native.device_bytes_per_rank
        self.spec = LayerSpec(hidden_size, top_k, self.local_experts, self.w0_rows, self.ffn_shard, self.max_tokens,
                              len(self.local_ranks), team.device)
        self.handle = next(_handles)
        _registry[self.handle] = (self.native, self.local_ranks)
        weakref.finalize(self, _registry.pop, self.handle, None)

    def last_decision(self, layer: int, rank: Optional[int] = None) -> dict:
        """What the launch planner chose for the last launch of a layer (tile, comm blocks, schedule, source)."""
        return self.native.last_decision(self.local_ranks[0] if rank is None else rank, layer)

    def synchronize(self) -> None:
        """Waits for the local ranks and raises what the device reported (timeouts, bad expert ids)."""
        self.native.sync_and_check()

    def __call__(self, x, ids, gates, w0, w1):
        """The whole layer: one tensor each (one local rank) or lists (a local team); w0 / w1 are the local
        ranks' weights stacked, [L, E_l, N0_s, H] / [L, E_l, H, F_s] (or one rank's without the L)."""
        single = isinstance(x, torch.Tensor)
        if single:
            x, ids, gates = [x], [ids], [gates]
        else:
            x, ids, gates = list(x), list(ids), list(gates)
        gates = [g if g.dtype == torch.float32 else g.float() for g in gates]
        w0, w1 = stacked(w0, "w0", self.spec.ranks), stacked(w1, "w1", self.spec.ranks)
        check_inputs(self.spec, x, ids, gates, w0, w1)
        out = _moe_forward(x, ids, gates, w0, w1, self.handle)
        return out[0] if single else out


@dataclass(frozen=True)
class LayerSpec:
    """What the checks of a call need to know of a layer."""
    hidden_size: int
    top_k: int
    local_experts: int
    w0_rows: int
    ffn_shard: int
    max_tokens: int
    ranks: int  # local ranks: tensors per list
    device: torch.device


def stacked(w, name: str, ranks: int):
    """The local ranks' weights as one [L, ...] tensor: a view of one rank's [E_l, ...] tensor, the tensor
    itself when it is stacked already, or a stacked copy of a list (one tensor per rank)."""
    if isinstance(w, torch.Tensor):
        return w.unsqueeze(0) if w.dim() == 3 else w
    if len(w) != ranks:
        raise ValueError(f"{name}: {len(w)} tensors for the {ranks} rank(s) this process drives")
    return torch.stack(list(w))


def check_inputs(spec: LayerSpec, x, ids, gates, w0, w1) -> None:
    """Clear errors naming the argument, before anything reaches the op: x, ids, gates are lists of one
    tensor per rank; w0 / w1 stacked [L, ...] (or None). A fast test per tensor; the named check where it
    fails (a call costs a few microseconds of Python, not tens)."""
    for name, v in (("hidden_states", x), ("topk_ids", ids), ("topk_weights", gates)):
        if len(v) != spec.ranks:
            raise ValueError(f"{name}: {len(v)} tensors for the {spec.ranks} rank(s) this process drives")
    H, k, dev = spec.hidden_size, spec.top_k, spec.device
    for r in range(spec.ranks):
        xr, ir, gr = x[r], ids[r], gates[r]
        ok = (type(xr) in _TENSOR_TYPES and xr.dtype is torch.bfloat16 and xr.device == dev and xr.dim() == 2
              and xr.shape[1] == H and xr.is_contiguous())
        if not ok:
            _tensor(xr, "hidden_states", (None, H), (torch.bfloat16,), dev)
        t = xr.shape[0]
        if t > spec.max_tokens:
            raise ValueError(f"hidden_states: {t} tokens, more than max_tokens={spec.max_tokens} of this layer")
        ok = (type(ir) in _TENSOR_TYPES and ir.dtype in _IDS_DTYPES and type(gr) in _TENSOR_TYPES
              and gr.dtype is torch.float32 and ir.device == dev and gr.device == dev and ir.shape == (t, k)
              and gr.shape == (t, k) and ir.is_contiguous() and gr.is_contiguous())
        if not ok:
            _tensor(ir, "topk_ids", (t, k), _IDS_DTYPES, dev)
            _tensor(gr, "topk_weights", (t, k), (torch.float32,), dev)
    L = spec.ranks
    for name, w, shape in (("w0", w0, (L, spec.local_experts, spec.w0_rows, H)),
                           ("w1", w1, (L, spec.local_experts, H, spec.ffn_shard))):
        if w is not None and not (type(w) in _TENSOR_TYPES and w.dtype is torch.bfloat16 and w.device == dev
                                  and w.shape == shape and w.is_contiguous()):
            _tensor(w, name, shape, (torch.bfloat16,), dev)


def _tensor(t, name: str, shape: tuple, dtypes: tuple, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: dtype {t.dtype}, expected {' or '.join(str(d) for d in dtypes)}")
    if t.device != device:
        raise ValueError(f"{name}: on {t.device}, the layer's team is on {device}")
    if t.dim() != len(shape) or any(w is not None and w != g for w, g in zip(shape, t.shape)):
        want = ", ".join("T" if w is None else str(w) for w in shape)
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected [{want}]")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


# ---- the ops ---------------------------------------------------------------------------------------------
_lib_def = torch.library.Library("comet", "DEF")
_lib_def.define("moe_forward(Tensor[] x, Tensor[] ids, Tensor[] gates, Tensor w0, Tensor w1, int handle) -> Tensor[]")
_lib_def.define("moe_layer0(Tensor[] x, Tensor[] ids, Tensor[] gates, Tensor w0, int handle) -> Tensor[]")
_lib_def.define("moe_layer1(Tensor[] hidden, Tensor[] ids, Tensor w1, int handle) -> Tensor[]")


def _batch(x, ids, gates, out, hidden=None):
    return (x.shape[0], x.data_ptr(), ids.data_ptr(), ids.dtype == torch.int64, gates.data_ptr(), out.data_ptr(),
            0 if hidden is None else hidden.data_ptr())


def _native(handle: int):
    try:
        return _registry[handle]
    except KeyError:
        raise ValueError(f"comet: no layer with handle {handle} (it was freed)") from None


try:  # the raw handle without a Stream object (what torch's own generated code uses)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover
    _raw_stream = None


def _current_stream(device: torch.device) -> int:
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _per_rank(w: torch.Tensor) -> list:
    """Device addresses of each rank's slice of a stacked [L, ...] weight."""
    base, step = w.data_ptr(), w.stride(0) * w.element_size()
    return [base + r * step for r in range(w.shape[0])]


def _moe_forward_cuda(x, ids, gates, w0, w1, handle):
    native, ranks = _native(handle)
    out = [torch.empty_like(t) for t in x]
    stream = _current_stream(x[0].device)
    if len(ranks) == 1:  # the torchrun path: one call, no lists on the C++ side
        native.forward1(ranks[0], w0.data_ptr(), w1.data_ptr(), _batch(x[0], ids[0], gates[0], out[0]), stream)
    else:
        native.forward(list(zip(_per_rank(w0), _per_rank(w1))), [_batch(*t) for t in zip(x, ids, gates, out)],
                       stream)
    return out


def _moe_layer0_cuda(x, ids, gates, w0, handle):
    native, _ = _native(handle)
    hidden = [torch.empty(native.max_rows, native.ffn_shard, dtype=torch.bfloat16, device=t.device) for t in x]
    # out is not written by layer 0: x stands in for it (same shape, aligned).
    native.forward([(a, 0) for a in _per_rank(w0)],
                   [_batch(xi, ii, gi, xi, hi) for xi, ii, gi, hi in zip(x, ids, gates, hidden)],
                   _current_stream(x[0].device), "layer0")
    return hidden


def _moe_layer1_cuda(hidden, ids, w1, handle):
    native, _ = _native(handle)
    out = [h.new_empty(i.shape[0], native.hidden) for h, i in zip(hidden, ids)]
    # x and gates were staged by layer 0: only the token count, ids (the final reduce) and out are read.
    native.forward([(0, a) for a in _per_rank(w1)],
                   [(i.shape[0], 0, i.data_ptr(), i.dtype == torch.int64, 0, o.data_ptr(), h.data_ptr())
                    for h, i, o in zip(hidden, ids, out)], _current_stream(hidden[0].device), "layer1")
    return out


_lib_def.impl("moe_forward", _moe_forward_cuda, "CUDA")
_lib_def.impl("moe_layer0", _moe_layer0_cuda, "CUDA")
_lib_def.impl("moe_layer1", _moe_layer1_cuda, "CUDA")


@torch.library.register_fake("comet::moe_forward")
def _moe_forward_fake(x, ids, gates, w0, w1, handle):
    return [torch.empty_like(t) for t in x]


@torch.library.register_fake("comet::moe_layer0")
def _moe_layer0_fake(x, ids, gates, w0, handle):
    native, _ = _native(handle)
    return [x[0].new_empty(native.max_rows, native.ffn_shard) for _ in x]


@torch.library.register_fake("comet::moe_layer1")
def _moe_layer1_fake(hidden, ids, w1, handle):
    native, _ = _native(handle)
    return [hidden[0].new_empty(i.shape[0], native.hidden) for i in ids]


def _no_backward(ctx, *grads):
    raise NotImplementedError("comet: the MoE layer's backward is not built yet (forward only in this version)")


for _op in ("comet::moe_forward", "comet::moe_layer0", "comet::moe_layer1"):
    torch.library.register_autograd(_op, _no_backward)


_moe_forward = torch.ops.comet.moe_forward.default


# ---- the functional API ----------------------------------------------------------------------------------
def moe_forward(layer: FusedMoE, x, ids, gates, w0, w1):
    """The whole MoE layer: tokens in (bf16 [T, H]), top-k expert ids ([T, k] int32/int64) and gate
    weights ([T, k]), the local expert weights (comet.weights layout; stacked [L, ...] or one rank's),
    output [T, H] in token order. Lists of one tensor per rank for a local team."""
    return layer(x, ids, gates, w0, w1)


def moe_layer0(layer: FusedMoE, x, ids, gates, w0):
    """Dispatch + GEMM0 + activation: hidden rows in the plan's layout ([max_rows, F/tp] per rank)."""
    single = isinstance(x, torch.Tensor)
    x, ids, gates = ([v] for v in (x, ids, gates)) if single else (list(v) for v in (x, ids, gates))
    gates = [g if g.dtype == torch.float32 else g.float() for g in gates]
    w0 = stacked(w0, "w0", layer.spec.ranks)
    check_inputs(layer.spec, x, ids, gates, w0, None)
    hidden = torch.ops.comet.moe_layer0(x, ids, gates, w0, layer.handle)
    return hidden[0] if single else hidden


def moe_layer1(layer: FusedMoE, hidden, ids, w1):
    """GEMM1 + the gate-weighted top-k combine of the routing staged by the last moe_layer0 of `layer`."""
    single = isinstance(hidden, torch.Tensor)
    hidden, ids = ([hidden], [ids]) if single else (list(hidden), list(ids))
    w1 = stacked(w1, "w1", layer.spec.ranks)
    for h in hidden:
        _tensor(h, "hidden", (layer.max_rows, layer.ffn_shard), (torch.bfloat16,), layer.team.device)
    _tensor(w1, "w1", (layer.spec.ranks, layer.local_experts, layer.hidden_size, layer.ffn_shard),
            (torch.bfloat16,), layer.team.device)
    out = torch.ops.comet.moe_layer1(hidden, ids, w1, layer.handle)
    return out[0] if single else out
