"""comet's custom ops (torch.library, namespace ``comet``) and the functional API built on them.

Every op runs on the caller's current CUDA stream, makes no host synchronisation (CUDA-graph
capturable) and has a fake (meta) kernel, so ``torch.compile(fullgraph=True)`` traces it without a graph
break. Lists hold one tensor per rank this process drives (one under torchrun, W for a local team).

  comet::moe_forward(x[], ids[], gates[], w0, w1, handle) -> out[]    the whole layer (fused)
  comet::moe_forward_fp8(x[], ids[], gates[], w0, w0_scale, w1, handle) -> out[]
                                                                     the same with an fp8 layer 0
  comet::moe_layer0(x[], ids[], gates[], w0, handle) -> hidden[]      dispatch + GEMM0 + activation
  comet::moe_layer1(hidden[], ids[], w1, handle) -> out[]             GEMM1 + top-k combine
  comet::moe_backward(dout[], w0, w1, handle) -> (dx[], dgates[], dw0, dw1)
                                                                     moe_forward's gradients

w0 / w1 are the local ranks' weights stacked, [L, E_l, N0_s, H] and [L, E_l, H, F_s] (MoELayer's
parameters as they are: no per-call unbinding).

fp8 (a FusedMoE built with dtype="e4m3", issue 17): x stays bf16 and every rank quantises its tokens
inside the layer (e4m3 codes, one fp32 scale per token and 128 columns, s = amax / 448); w0 is
torch.float8_e4m3fn codes in the same local layout and w0_scale its fp32 scales of 128 x 128 blocks of
each local expert's [N0_s, H], [L, E_l, ceil(N0_s / 128), H / 128] (quantize_weights_e4m3 makes them
from a bf16 shard; quantise after sharding: the blocks are those of the local layout). w1, the hidden
rows and the output stay bf16. Forward only: moe_forward_fp8 has no backward (a backward through it
raises), and the split ops refuse fp8 layers.

A handle names a FusedMoE (the layer's buffers, team and tuner state). moe_layer1 consumes the routing
staged by the last moe_layer0 of the same handle; hidden holds the plan's rows ([max_rows, F/tp], rows
grouped by expert, padding rows unused).

Autograd: moe_forward's backward is moe_backward (layers built with training=True). It differentiates
the layer's LAST whole forward, whose activations the C++ layer saved, and consumes them: run each
forward's backward before the same layer's next forward (activation checkpointing, which recomputes
the forward just before its backward, fits). dout is contiguous bf16 [T, H] per rank (T: that forward's);
dgates is fp32 [T, k]; dw0 / dw1 are stacked like w0 / w1 and of their dtype (a FusedMoE built with
gradient_accumulation_fusion=True adds them to the weights' main_grad instead, in eager calls). The
split ops have no backward, nor has moe_forward_fp8 (compile an fp8 layer under torch.no_grad() or
torch.inference_mode(): with an input that requires grad, AOT autograd traces the backward and meets
the refusal at compile time).
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
# Layer 0's element type: the C++ layer's DType names, and the torch dtypes that mean them.
_DTYPES = {"bf16": "bf16", "e4m3": "e4m3", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3"}
FP8_BLOCK = 128  # the fp8 scale block: 1 x 128 for tokens, 128 x 128 for W0
_FP8_FORWARD_ONLY = ("comet: this MoE layer runs layer 0 in fp8 (e4m3), which is forward-only for now: there is "
                     "no backward through it. Run it under torch.no_grad() / torch.inference_mode(), or build "
                     "the layer with dtype=torch.bfloat16 (comet.MoELayer) / dtype=\"bf16\" (comet.FusedMoE) "
                     "and training=True to train")
_IDS_DTYPES = (torch.int32, torch.int64)


def check_fp8_layer(who: str, training: bool, hidden_size: int) -> None:
    """What an fp8 (e4m3) layer needs, checked before any GPU work (comet.FusedMoE, comet.MoELayer):
    forward only, and H in whole 128-wide scale blocks."""
    if training:
        raise ValueError(f"{who}: fp8 (e4m3) is forward-only for now: build it with training=False, or with a "
                         f"bf16 dtype to train")
    if hidden_size % FP8_BLOCK:
        raise ValueError(f"{who}: fp8 (e4m3) needs hidden_size a multiple of {FP8_BLOCK} (its 1 x 128 and 128 x 128 "
                         f"scale blocks), got {hidden_size}")
_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)  # the fast path; subclasses take the full check


@dataclass
class _Registered:
    """What the ops know of a layer by its handle (an int crosses the op boundary, not the object)."""
    native: object  # comet._C.FusedMoe
    ranks: list  # the local ranks, in the order of the ops' lists
    top_k: int
    training: bool
    fused_activation_grad: bool = False  # BackwardOptions::fused_activation for its backwards
    weight_grad_kernel: str = "auto"  # BackwardOptions::weight_grad_kernel for its backwards
    tokens: tuple = ()  # tokens per rank of the last whole forward (training): what a backward pairs with


_WEIGHT_GRAD_KERNELS = ("auto", "persistent", "grouped", "grouped_cooperative", "grouped_320")  # BackwardOptions::weight_grad_kernel
_TRANSPORTS = ("peer", "nvshmem")  # MoeOptions::transport


def check_transport(where: str, transport: str) -> None:
    """Refuses an unknown transport before a team or a GPU is touched (what a team can run with it,
    the layer checks when it is built)."""
    if transport not in _TRANSPORTS:
        raise ValueError(f"{where}: transport must be one of {_TRANSPORTS}, got {transport!r}")


_registry: dict[int, _Registered] = {}
_handles = itertools.count(1)


def layer_footprint(hidden_size: int, ffn_size: int, num_experts: int, top_k: int, activation: str = "swiglu", *,
                    ep: int = 1, tp: int = 1, max_tokens: int, max_rows: int = 0, load_factor: float = 0.0,
                    training: bool = False) -> dict:
    """Device bytes one rank of a FusedMoE with these arguments holds, by buffer, without building it
    (comet/footprint.hpp): gathered, expert_out (0 when it shares the gathered rows), hidden,
    self_partial, flags, plan, workspaces (CUTLASS's grouped GEMMs'), training, symmetric (exported; pinned host memory with link="host"), and
    compute, total, max_rows (resolved). A layer's device_bytes_per_rank is this total."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
    return _lib.C.layer_footprint(hidden_size, ffn_size, num_experts, top_k, activation, ep, tp, max_tokens,
                                  max_rows, load_factor, training)


class _TorchAllocator:
    """A layer's private buffers from torch's caching allocator (the extension's allocate / release
    callbacks). torch's OutOfMemoryError is not let through the engine's C++ frames, whose clean-up calls
    release (Python) again while they unwind (an overfull GPU once gave a SystemError where an
    OutOfMemoryError was expected, cause not pinned down: docs/design-changes.md): alloc records it and
    answers 0, which the engine refuses with its own C++ exception, and FusedMoE raises out_of_memory()
    from that."""

    release = staticmethod(torch.cuda.caching_allocator_delete)

    def __init__(self, device: int):
        self.device = device
        self.failure: Optional[torch.OutOfMemoryError] = None  # the first allocation torch refused

    def alloc(self, nbytes: int) -> int:
        try:
            return torch.cuda.caching_allocator_alloc(nbytes, self.device)
        except torch.OutOfMemoryError as e:
            self.failure = self.failure or e
            return 0

    def out_of_memory(self) -> torch.OutOfMemoryError:
        failure, self.failure = self.failure, None  # its traceback holds frames: not kept past this
        return torch.OutOfMemoryError(
            f"comet.FusedMoE: torch's caching allocator could not give the layer's buffers on cuda:{self.device} "
            f"({failure}). comet.layer_footprint gives one rank's bytes before a layer is built; max_tokens, "
            f"max_rows or load_factor size them")


class FusedMoE:
    """A distributed MoE layer's engine without parameters: buffers, team, tuner. Call it with the expert
    weights (see comet.weights for their layout), or use comet.MoELayer, which owns them.

    batch_invariant=True: a token's output bits do not depend on the batch it came in (the tile shape
    is then chosen from the layer's shape alone); checking=True: synchronise after every call and raise
    what the device reported (bad expert ids, timeouts) at once; training=True: forwards save what the
    backward needs, so that autograd differentiates the call (see comet.ops: a backward pairs with the
    layer's last forward).

    dtype="e4m3" (or torch.float8_e4m3fn): layer 0 in fp8, forward only (training must be False; H a
    multiple of 128). Call it with w0 as torch.float8_e4m3fn codes and w0_scale, the fp32 scales of its
    128 x 128 blocks (see comet.ops and quantize_weights_e4m3); the tokens stay bf16 and are quantised
    inside the layer (1 x 128 blocks per token); the output is bf16.

    Device memory per local rank (bf16, T = max_tokens, R = max_rows, W ranks):
      gathered tokens 2 R H (the expert outputs reuse them when training=False; training=True holds them
      apart, 2 R H more), hidden 2 R F/tp, own partials 2 T H, and the exported buffers (tokens 2 T H,
      receive slots 2 W T H, routing 8 T k).
      R defaults to the worst case W T min(k, E/ep) + 127 E/ep (every token of every rank on this rank's
      experts). max_rows sizes it for the load you expect, or load_factor does: R = load_factor times
      the mean load of uniform routing, W T k / ep, plus the padding (1.5-2 covers a typical imbalance).
      A call that needs more rows is refused on the device and reported (PlanError rows_over_capacity,
      naming the rows it needed; its outputs are NaN). ``device_bytes_per_rank`` gives the total, and
      comet.layer_footprint the parts before a layer is built.
    training=True adds [R, N0_s] bf16 (layer 0's pre-activations, N0_s = 2 F/tp for swiglu, else F/tp),
      [R, H] bf16 (the gathered output gradients), [R, ceil(F/tp / 128)] fp32 (gate-gradient partials)
      and, where F/tp > H, [R, F/tp] bf16 (the backward's D = G W1 rows; else they reuse the
      expert-output buffer): 2 N0_s + 2 H + 4 ceil(F/tp / 128) (+ 2 F/tp) bytes per row of R.
    fused_activation_grad=True: the backward of layer 1 makes the activation's backward in its GEMM's
      epilogue (BackwardOptions::fused_activation: no second pass over D; the same dx and weight
      gradients bit for bit, the gate gradients summed in another order). Off by default: on the H200 it
      was under 1 % faster in the median, inside the noise.
    transport: how the comm blocks reach the peers' buffers (MoeOptions::transport). "peer" (default):
      loads, stores and bulk copies through peer pointers, every layer and option. "nvshmem": NVSHMEM's
      device gets and puts, for peers no pointer reaches (across nodes); needs a team on NVSHMEM's heap
      (Team.from_process_group(heap="nvshmem")) and bf16, and runs 128 x 256 tiles only (forward and
      backward).
    weight_grad_kernel: the GEMM of the weight gradients (BackwardOptions::weight_grad_kernel; all give the
      same bits). "auto" (default): the tuner table's measured pick for the case where it has one, else
      the launch planner's rule by shape, measured on the H200: CUTLASS's grouped ping-pong GEMM
      ("grouped") at up to 2048 rows per expert, its cooperative 128 x 256 GEMM in 2 x 1 clusters
      ("grouped_cooperative") at 4096 rows and more with H >= 3072 (H = 3584 measured on an H100), else
      comet's persistent kernel ("persistent"). "grouped_320": the cooperative GEMM on 128 x 320 tiles
      (faster where F / tp is 320 or 800, Qwen2-57B and Phi-3.5 at TP 8).
    narrow_n_tiles (default True; MoeOptions::narrow_n_tiles): where N is narrow (F / tp = 320 or 800),
      "auto" runs the weight gradients' CUTLASS pick on 128 x 320 tiles, the same bits; False keeps the
      table's and the rule's picks as they are (A/B runs).
    cublas_backward (MoeOptions::cublas_backward): the backward's GEMMs that have no comm beside them
      (its data GEMMs in the sequential schedule, and the weight gradients under "auto") run cuBLAS, one
      call per expert with its exact rows, which a training forward copies to the host without waiting
      (the backward waits for that copy). None (default): where a rank has at most 2 local experts (the
      planner's rule: faster there, slower with many small experts); True / False: asked. Other bits
      than comet's kernels (the same every run); not under CUDA-graph capture (comet's kernels then).
    check_schedule=True (MoeOptions::check_schedule): the layer checks the tuner's fused picks on this
      machine. For each launch (forward and backward) and token bucket whose pick is a fused split, its
      first calls alternate that pick with the sequential schedule (6 launches each, the first untimed),
      timed with CUDA events read back at later calls without waiting; then it keeps whichever had the
      lower median (the sequential schedule only where it was 2 % faster). For a node the shipped table
      did not measure (real NVLink, another GPU). Nothing is timed under CUDA-graph capture;
      last_decision(layer)["schedule"] shows what a launch ran. Off by default: two runs may settle
      differently, and where the sequential schedule runs another GEMM (a table's CUTLASS pick) the bits
      then differ between them.
    gradient_accumulation_fusion=True (training; Megatron's option of that name): the backward adds the
      weight gradients straight into the weights' ``main_grad`` buffers (fp32 or bf16, of the weights'
      shapes; Megatron's DistributedDataParallel gives every parameter one) instead of returning bf16
      gradients, so that micro-batches accumulate in fp32 with no bf16 gradient and no add kernel in
      between. By Megatron's protocol a weight with a ``grad_added_to_main_grad`` attribute gets it set
      to True and a placeholder .grad (zeros if ``zero_out_wgrad``), one without gets .grad None. Eager
      calls only: under torch.compile the traced op returns the gradients as .grad (Megatron's grad hook
      then adds them to main_grad). The weights must be tensors (stacked, or one rank's), not lists.
    """

    def __init__(self, team: Team, hidden_size: int, ffn_size: int, num_experts: int, top_k: int,
                 activation: str = "swiglu", *, max_tokens: int, max_rows: int = 0, load_factor: float = 0.0,
                 tile_n: tuple[Optional[int], Optional[int]] = (None, None),
                 n_comm: tuple[Optional[int], Optional[int]] = (None, None),
                 adaptive_split: bool = True, batch_invariant: bool = False, checking: bool = False,
                 training: bool = False, tune_table: str = "", use_torch_allocator: bool = True,
                 dtype="bf16", fused_activation_grad: bool = False, weight_grad_kernel: str = "auto",
                 transport: str = "peer", gradient_accumulation_fusion: bool = False, narrow_n_tiles: bool = True,
                 cublas_backward: Optional[bool] = None, check_schedule: bool = False):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {activation!r}")
        if weight_grad_kernel not in _WEIGHT_GRAD_KERNELS:
            raise ValueError(f"comet.FusedMoE: weight_grad_kernel must be one of {_WEIGHT_GRAD_KERNELS}, got "
                             f"{weight_grad_kernel!r}")
        if not isinstance(narrow_n_tiles, bool):
            raise TypeError(f"comet.FusedMoE: narrow_n_tiles must be a bool, got {narrow_n_tiles!r}")
        if cublas_backward is not None and not isinstance(cublas_backward, bool):
            raise TypeError(f"comet.FusedMoE: cublas_backward must be None or a bool, got {cublas_backward!r}")
        if not isinstance(check_schedule, bool):
            raise TypeError(f"comet.FusedMoE: check_schedule must be a bool, got {check_schedule!r}")
        native_dtype = _DTYPES.get(dtype) if isinstance(dtype, (str, torch.dtype)) else None
        if native_dtype is None:
            raise ValueError(f"comet.FusedMoE: dtype must be 'bf16' or 'e4m3' (torch.bfloat16 or torch.float8_e4m3fn: "
                             f"an fp8 layer 0), got {dtype!r}")
        fp8 = native_dtype == "e4m3"
        if fp8:
            check_fp8_layer("comet.FusedMoE", training, hidden_size)
        check_transport("comet.FusedMoE", transport)
        check_gradient_accumulation_fusion("comet.FusedMoE", gradient_accumulation_fusion, training)
        _lib.require_cuda("comet.FusedMoE")
        allocator = _TorchAllocator(team.device.index) if use_torch_allocator else None
        self.team = team
        self.hidden_size, self.ffn_size, self.num_experts, self.top_k = hidden_size, ffn_size, num_experts, top_k
        self.activation, self.training = activation, training
        self.fused_activation_grad = fused_activation_grad
        self.weight_grad_kernel = weight_grad_kernel
        self.narrow_n_tiles, self.cublas_backward = narrow_n_tiles, cublas_backward
        self.gradient_accumulation_fusion = gradient_accumulation_fusion
        self.dtype, self.fp8 = native_dtype, fp8
        try:
            self.native = _lib.C.FusedMoe(
                team._native, hidden_size, ffn_size, num_experts, top_k, activation, team.ep, team.tp, max_tokens,
                max_rows, load_factor=load_factor, layer0_tile_n=tile_n[0], layer0_n_comm=n_comm[0],
                layer1_tile_n=tile_n[1], layer1_n_comm=n_comm[1], adaptive_split=adaptive_split,
                batch_invariant=batch_invariant, checking=checking, training=training, tune_table=tune_table,
                allocate=allocator.alloc if allocator else None, release=allocator.release if allocator else None,
                dtype=native_dtype, transport=transport, narrow_n_tiles=narrow_n_tiles,
                cublas_backward=cublas_backward, check_schedule=check_schedule)
        except Exception as e:
            if allocator is None or allocator.failure is None:
                raise
            raise allocator.out_of_memory() from e
        # Plain attributes (not calls into the extension), so that torch.compile traces a call without a break.
        self.local_ranks = team.local_ranks
        self.local_experts = num_experts // team.ep
        self.ffn_shard = ffn_size // team.tp
        self.w0_rows = 2 * self.ffn_shard if activation == "swiglu" else self.ffn_shard
        self.max_tokens = self.native.max_tokens
        self.max_rows = self.native.max_rows
        self.device_bytes_per_rank = self.native.device_bytes_per_rank
        self.spec = LayerSpec(hidden_size, top_k, self.local_experts, self.w0_rows, self.ffn_shard, self.max_tokens,
                              len(self.local_ranks), team.device, fp8)
        self.handle = next(_handles)
        _registry[self.handle] = _Registered(self.native, self.local_ranks, top_k, training, fused_activation_grad,
                                             weight_grad_kernel)
        weakref.finalize(self, _registry.pop, self.handle, None)

    def last_decision(self, layer: int, rank: Optional[int] = None) -> dict:
        """What the launch planner chose for the last launch of a layer (tile, comm blocks, schedule, source)."""
        return self.native.last_decision(self.local_ranks[0] if rank is None else rank, layer)

    def close(self) -> None:
        """Frees the layer's device buffers now; later calls raise. Collective on a team of several processes
        (Team.from_process_group): every process closes its layer, in the same order as the team's other
        collective calls. Without it a local team's layer frees them when it is collected, and a
        process-group team's layer gives its private buffers back then and its exported ones at
        Team.close()."""
        self.native.close()

    def synchronize(self) -> None:
        """Waits for the local ranks and raises what the device reported (timeouts, bad expert ids)."""
        self.native.sync_and_check()

    def __call__(self, x, ids, gates, w0, w1, w0_scale=None):
        """The whole layer: one tensor each (one local rank) or lists (a local team); w0 / w1 are the local
        ranks' weights stacked, [L, E_l, N0_s, H] / [L, E_l, H, F_s] (or one rank's without the L).
        fp8 layers (dtype="e4m3"): w0 is torch.float8_e4m3fn and w0_scale its fp32 block scales,
        [L, E_l, ceil(N0_s / 128), H / 128]; bf16 layers take no w0_scale."""
        single = isinstance(x, torch.Tensor)
        if single:
            x, ids, gates = [x], [ids], [gates]
        else:
            x, ids, gates = list(x), list(ids), list(gates)
        gates = [g if g.dtype == torch.float32 else g.float() for g in gates]
        params = (w0, w1)  # as given: their main_grad is what gradient_accumulation_fusion adds to
        w0, w1 = stacked(w0, "w0", self.spec.ranks), stacked(w1, "w1", self.spec.ranks)
        if w0_scale is not None:
            w0_scale = stacked(w0_scale, "w0_scale", self.spec.ranks)
        check_inputs(self.spec, x, ids, gates, w0, w1, w0_scale)
        if self.fp8:
            if torch.compiler.is_compiling():
                out = _moe_forward_fp8(x, ids, gates, w0, w0_scale, w1, self.handle)
            elif torch.is_grad_enabled():  # a node whose backward says why there is none
                out = list(_EagerMoeForwardFp8.apply(self.handle, len(x), w0, w0_scale, w1, *x, *ids, *gates))
            else:
                out = _moe_forward_fp8_cuda(x, ids, gates, w0, w0_scale, w1, self.handle)
        elif torch.compiler.is_compiling():
            out = _moe_forward(x, ids, gates, w0, w1, self.handle)  # traced: the op and its fake kernel
        elif torch.is_grad_enabled():
            fused_into = self._fused_into(params, w0, w1)
            out = list(_EagerMoeForward.apply(self.handle, len(x), fused_into, w0, w1, *x, *ids, *gates))
        else:  # inference: the op's kernel without the dispatcher (~10 us of host time less)
            out = _moe_forward_cuda(x, ids, gates, w0, w1, self.handle)
        return out[0] if single else out

    def _fused_into(self, params, w0, w1):
        """The weights whose main_grad the backward adds to (gradient_accumulation_fusion, weights that
        want a gradient), their main grads checked before the forward runs; else None."""
        if not self.gradient_accumulation_fusion or not (w0.requires_grad or w1.requires_grad):
            return None
        if not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("comet: gradient_accumulation_fusion=True needs w0 and w1 as tensors (stacked "
                             "[L, ...] or one rank's), not lists: their main_grad is where the gradients go")
        main_grads_of(*params, w0, w1)
        return params


def check_gradient_accumulation_fusion(where: str, fusion: bool, training: bool) -> None:
    """gradient_accumulation_fusion is a training option: refused on an inference (or fp8) layer before any
    GPU work."""
    if fusion and not training:
        raise ValueError(f"{where}: gradient_accumulation_fusion=True is for training: build the layer with "
                         f"training=True (a bf16 layer)")


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
    fp8: bool = False  # layer 0 in e4m3: w0 float8_e4m3fn codes with fp32 128 x 128 block scales (w0_scale)

    @property
    def w0_scale_shape(self) -> tuple:
        """[L, E_l, ceil(N0_s / 128), H / 128]: the fp32 scales of an fp8 w0's 128 x 128 blocks."""
        return (self.ranks, self.local_experts, -(-self.w0_rows // FP8_BLOCK), self.hidden_size // FP8_BLOCK)


def stacked(w, name: str, ranks: int):
    """The local ranks' weights as one [L, ...] tensor: a view of one rank's [E_l, ...] tensor, the tensor
    itself when it is stacked already, or a stacked copy of a list (one tensor per rank)."""
    if isinstance(w, torch.Tensor):
        return w.unsqueeze(0) if w.dim() == 3 else w
    if len(w) != ranks:
        raise ValueError(f"{name}: {len(w)} tensors for the {ranks} rank(s) this process drives")
    return torch.stack(list(w))


def check_inputs(spec: LayerSpec, x, ids, gates, w0, w1, w0_scale=None) -> None:
    """Clear errors naming the argument, before anything reaches the op: x, ids, gates are lists of one
    tensor per rank; w0 / w1 stacked [L, ...] (or None); w0_scale stacked, with an fp8 w0 only. A fast
    test per tensor; the named check where it fails (a call costs a few microseconds of Python, not tens)."""
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
    w0_dtype = torch.float8_e4m3fn if spec.fp8 else torch.bfloat16
    for name, w, shape, dtype in (("w0", w0, (L, spec.local_experts, spec.w0_rows, H), w0_dtype),
                                  ("w1", w1, (L, spec.local_experts, H, spec.ffn_shard), torch.bfloat16)):
        if w is not None and not (type(w) in _TENSOR_TYPES and w.dtype is dtype and w.device == dev
                                  and w.shape == shape and w.is_contiguous()):
            _tensor(w, name, shape, (dtype,), dev)
    if not spec.fp8:
        if w0_scale is not None:
            raise ValueError("w0_scale: given, but the layer is bf16 (block scales go with an fp8 w0: dtype='e4m3')")
    elif w0 is not None:
        if w0_scale is None:
            raise ValueError("w0_scale: the fp8 layer's w0 needs its fp32 scales of 128 x 128 blocks, "
                             f"[{', '.join(map(str, spec.w0_scale_shape))}] (comet.ops.quantize_weights_e4m3)")
        if not (type(w0_scale) in _TENSOR_TYPES and w0_scale.dtype is torch.float32 and w0_scale.device == dev
                and w0_scale.shape == spec.w0_scale_shape and w0_scale.is_contiguous()):
            _tensor(w0_scale, "w0_scale", spec.w0_scale_shape, (torch.float32,), dev)


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
_lib_def.define("moe_forward_fp8(Tensor[] x, Tensor[] ids, Tensor[] gates, Tensor w0, Tensor w0_scale, Tensor w1, "
                "int handle) -> Tensor[]")
_lib_def.define("moe_layer0(Tensor[] x, Tensor[] ids, Tensor[] gates, Tensor w0, int handle) -> Tensor[]")
_lib_def.define("moe_layer1(Tensor[] hidden, Tensor[] ids, Tensor w1, int handle) -> Tensor[]")
_lib_def.define("moe_backward(Tensor[] dout, Tensor w0, Tensor w1, int handle) -> (Tensor[], Tensor[], Tensor, Tensor)")


def _batch(x, ids, gates, out, hidden=None):
    return (x.shape[0], x.data_ptr(), ids.data_ptr(), ids.dtype == torch.int64, gates.data_ptr(), out.data_ptr(),
            0 if hidden is None else hidden.data_ptr())


def _native(handle: int) -> _Registered:
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
    layer = _native(handle)
    native, ranks = layer.native, layer.ranks
    out = [torch.empty_like(t) for t in x]
    stream = _current_stream(x[0].device)
    if len(ranks) == 1:  # the torchrun path: one call, no lists on the C++ side
        native.forward1(ranks[0], w0.data_ptr(), w1.data_ptr(), _batch(x[0], ids[0], gates[0], out[0]), stream)
    else:
        native.forward(list(zip(_per_rank(w0), _per_rank(w1))), [_batch(*t) for t in zip(x, ids, gates, out)],
                       stream)
    if layer.training:  # after the call: a refused forward saved nothing
        layer.tokens = tuple(t.shape[0] for t in x)
    return out


def _scale_addresses(s: torch.Tensor):
    """Each rank's address in the stacked fp8 w0 scales [L, E_l, rb, kb], 16-byte aligned as the C++ layer
    wants them: the tensor's own slices where they are (E_l rb kb a multiple of 4, e.g. H a multiple of
    512), else those of an aligned copy whose rank slices are padded to 16 bytes. Returns the tensor the
    addresses point into (kept alive by the caller through the launch; the copy is stream-ordered) and
    the addresses."""
    addresses = _per_rank(s)
    if all(a % 16 == 0 for a in addresses):
        return s, addresses
    L, n = s.shape[0], s[0].numel()
    padded = s.new_empty(L, (n + 3) // 4 * 4)
    padded[:, :n].copy_(s.reshape(L, n))
    return padded, _per_rank(padded)


def _moe_forward_fp8_cuda(x, ids, gates, w0, w0_scale, w1, handle):
    layer = _native(handle)
    native, ranks = layer.native, layer.ranks
    out = [torch.empty_like(t) for t in x]
    stream = _current_stream(x[0].device)
    scales, s_addr = _scale_addresses(w0_scale)  # noqa: F841  (held through the launch below)
    if len(ranks) == 1:
        native.forward1(ranks[0], w0.data_ptr(), w1.data_ptr(), _batch(x[0], ids[0], gates[0], out[0]), stream,
                        s_addr[0])
    else:
        native.forward(list(zip(_per_rank(w0), _per_rank(w1))), [_batch(*t) for t in zip(x, ids, gates, out)],
                       stream, "whole", s_addr)
    return out


def _moe_layer0_cuda(x, ids, gates, w0, handle):
    native = _native(handle).native
    hidden = [torch.empty(native.max_rows, native.ffn_shard, dtype=torch.bfloat16, device=t.device) for t in x]
    # out is not written by layer 0: x stands in for it (same shape, aligned).
    native.forward([(a, 0) for a in _per_rank(w0)],
                   [_batch(xi, ii, gi, xi, hi) for xi, ii, gi, hi in zip(x, ids, gates, hidden)],
                   _current_stream(x[0].device), "layer0")
    return hidden


def _moe_layer1_cuda(hidden, ids, w1, handle):
    native = _native(handle).native
    out = [h.new_empty(i.shape[0], native.hidden) for h, i in zip(hidden, ids)]
    # x and gates were staged by layer 0: only the token count, ids (the final reduce) and out are read.
    native.forward([(0, a) for a in _per_rank(w1)],
                   [(i.shape[0], 0, i.data_ptr(), i.dtype == torch.int64, 0, o.data_ptr(), h.data_ptr())
                    for h, i, o in zip(hidden, ids, out)], _current_stream(hidden[0].device), "layer1")
    return out


def _data_grad_outputs(dout, top_k: int):
    """Fresh (dx[], dgates[]), contiguous."""
    dx = [d.new_empty(d.shape, dtype=torch.bfloat16) for d in dout]
    dgates = [d.new_empty((d.shape[0], top_k), dtype=torch.float32) for d in dout]
    return dx, dgates


def _backward_outputs(dout, w0, w1, top_k: int):
    """Fresh (dx[], dgates[], dw0, dw1), contiguous, for the real and the fake kernel alike."""
    return (*_data_grad_outputs(dout, top_k), w0.new_empty(w0.shape), w1.new_empty(w1.shape))


_GRAD_TYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}


def _check_backward(layer: _Registered, dout) -> None:
    """Clear errors where the C++ layer would have no forward to differentiate, or another one."""
    if not layer.training:
        raise RuntimeError("comet: this MoE layer was built without training=True, so its forward saved "
                           "nothing to differentiate; build it with training=True (comet.MoELayer's default, "
                           "comet.FusedMoE(..., training=True))")
    tokens = tuple(d.shape[0] for d in dout)
    if tokens != layer.tokens:
        raise RuntimeError(f"comet: the output gradients have {tokens} tokens per rank, the layer's last forward "
                           f"{layer.tokens or 'none'}: a backward pairs with the layer's last forward (run each "
                           "forward's backward before the layer's next forward)")


def _aligned(d: torch.Tensor) -> torch.Tensor:
    """The kernels read 16-byte aligned rows; a gradient autograd hands over may be a view that starts
    inside another tensor's allocation."""
    return d if d.data_ptr() % 16 == 0 else d.clone()


def _run_backward(dout, dw0, dw1, handle, accumulate: bool):
    """The C++ backward of the layer's last forward: fresh dx[] and dgates[]; the weight gradients written
    into dw0 / dw1 (stacked, bf16 or fp32), or added to them with accumulate."""
    layer = _native(handle)
    _check_backward(layer, dout)
    dout = [_aligned(d) for d in dout]
    dx, dgates = _data_grad_outputs(dout, layer.top_k)
    stream, grad_type = _current_stream(dout[0].device), _GRAD_TYPES[dw0.dtype]
    grads = [(d.data_ptr(), a.data_ptr(), g.data_ptr(), b0, b1)
             for d, a, g, b0, b1 in zip(dout, dx, dgates, _per_rank(dw0), _per_rank(dw1))]
    fused, wgrad = layer.fused_activation_grad, layer.weight_grad_kernel
    if len(layer.ranks) == 1:
        layer.native.backward1(layer.ranks[0], grads[0], stream, grad_type, accumulate, fused_activation=fused,
                               weight_grad_kernel=wgrad)
    else:
        layer.native.backward(grads, stream, grad_type, accumulate, fused_activation=fused,
                              weight_grad_kernel=wgrad)
    return dx, dgates


def _moe_backward_cuda(dout, w0, w1, handle):
    dw0, dw1 = w0.new_empty(w0.shape), w1.new_empty(w1.shape)
    dx, dgates = _run_backward(dout, dw0, dw1, handle, accumulate=False)
    return dx, dgates, dw0, dw1


def _moe_backward_into_main_grads(dout, main_grad0, main_grad1, handle):
    """gradient_accumulation_fusion: the weight gradients added to the stacked main_grad views in their
    dtype (fp32 or bf16; BackwardOptions{grad_type, accumulate=true}), no bf16 gradient in between."""
    return _run_backward(dout, main_grad0, main_grad1, handle, accumulate=True)


_lib_def.impl("moe_forward", _moe_forward_cuda, "CUDA")
_lib_def.impl("moe_forward_fp8", _moe_forward_fp8_cuda, "CUDA")
_lib_def.impl("moe_layer0", _moe_layer0_cuda, "CUDA")
_lib_def.impl("moe_layer1", _moe_layer1_cuda, "CUDA")
_lib_def.impl("moe_backward", _moe_backward_cuda, "CUDA")


@torch.library.register_fake("comet::moe_forward")
def _moe_forward_fake(x, ids, gates, w0, w1, handle):
    return [torch.empty_like(t) for t in x]


@torch.library.register_fake("comet::moe_forward_fp8")
def _moe_forward_fp8_fake(x, ids, gates, w0, w0_scale, w1, handle):
    return [torch.empty_like(t) for t in x]


@torch.library.register_fake("comet::moe_layer0")
def _moe_layer0_fake(x, ids, gates, w0, handle):
    native = _native(handle).native
    return [x[0].new_empty(native.max_rows, native.ffn_shard) for _ in x]


@torch.library.register_fake("comet::moe_layer1")
def _moe_layer1_fake(hidden, ids, w1, handle):
    native = _native(handle).native
    return [hidden[0].new_empty(i.shape[0], native.hidden) for i in ids]


@torch.library.register_fake("comet::moe_backward")
def _moe_backward_fake(dout, w0, w1, handle):
    return _backward_outputs(dout, w0, w1, _native(handle).top_k)


# ---- autograd --------------------------------------------------------------------------------------------
def _moe_forward_setup_context(ctx, inputs, output):
    *_, w0, w1, handle = inputs
    ctx.handle = handle
    # The C++ backward reads the forward's weights (by the pointers the forward passed): saved, autograd
    # keeps them alive and refuses a backward after an in-place change. x, ids and gates are the C++
    # layer's to keep.
    ctx.save_for_backward(w0, w1)


def _moe_forward_backward(ctx, dout):
    w0, w1 = ctx.saved_tensors
    dout = [d.to(torch.bfloat16).contiguous() for d in dout]
    dx, dgates, dw0, dw1 = torch.ops.comet.moe_backward(dout, w0, w1, ctx.handle)
    # In the op's input order; a list input takes a list of Nones (ids are not differentiable).
    return dx, [None] * len(dx), dgates, dw0, dw1, None


def _split_op_backward(ctx, *grads):
    raise NotImplementedError("comet: moe_layer0 / moe_layer1 have no backward (the split ops serve inference); "
                              "train through the whole layer, comet::moe_forward (comet.MoELayer, or "
                              "comet.FusedMoE(..., training=True))")


def _fp8_backward(ctx, *grads):
    raise RuntimeError(_FP8_FORWARD_ONLY)


torch.library.register_autograd("comet::moe_forward", _moe_forward_backward,
                                setup_context=_moe_forward_setup_context)
torch.library.register_autograd("comet::moe_forward_fp8", _fp8_backward)
for _op in ("comet::moe_layer0", "comet::moe_layer1"):
    torch.library.register_autograd(_op, _split_op_backward)


# ---- gradient_accumulation_fusion (Megatron's main_grad protocol) -----------------------------------------
_MAIN_GRAD_TYPES = (torch.float32, torch.bfloat16)


def main_grads_of(p0, p1, w0, w1) -> tuple[torch.Tensor, torch.Tensor]:
    """The buffers that gradient_accumulation_fusion adds the weight gradients to: p0.main_grad and
    p1.main_grad, where p0 / p1 are the weights as the caller passed them (Megatron's DistributedDataParallel
    gives every parameter an fp32 main_grad, or a bf16 one, of its shape) and w0 / w1 the stacked [L, ...]
    views the kernels read. Returns the main grads as stacked views; raises, naming the weight and what is
    wrong, before anything runs."""
    views = []
    for name, p, w in (("w0", p0, w0), ("w1", p1, w1)):
        g = getattr(p, "main_grad", None)
        if g is None:
            raise RuntimeError(f"comet: gradient_accumulation_fusion=True adds the weight gradients into "
                               f"{name}.main_grad, and {name} has none: give every expert weight a main_grad of "
                               f"its shape (fp32 or bf16; Megatron's DistributedDataParallel does), or build the "
                               f"layer with gradient_accumulation_fusion=False")
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"comet: {name}.main_grad must be a torch.Tensor, got {type(g).__name__}")
        if g.dtype not in _MAIN_GRAD_TYPES:
            raise TypeError(f"comet: {name}.main_grad has dtype {g.dtype}; the weight gradients accumulate in "
                            f"torch.float32 or torch.bfloat16")
        if g.shape != p.shape:
            raise ValueError(f"comet: {name}.main_grad has shape {tuple(g.shape)}, the weight {tuple(p.shape)}")
        if g.device != w.device:
            raise ValueError(f"comet: {name}.main_grad is on {g.device}, the weight on {w.device}")
        if not g.is_contiguous() or g.data_ptr() % 16:
            raise ValueError(f"comet: {name}.main_grad must be contiguous and 16-byte aligned (the kernels "
                             f"write 16-byte row segments)")
        views.append(g.unsqueeze(0) if g.dim() == w.dim() - 1 else g)
    if views[0].dtype != views[1].dtype:
        raise TypeError(f"comet: w0.main_grad is {views[0].dtype} and w1.main_grad {views[1].dtype}; both "
                        f"weight gradients accumulate in one type")
    return views[0], views[1]


def grad_after_fusion(p, w) -> Optional[torch.Tensor]:
    """What autograd gets as a fused weight's .grad (the gradient itself went into p.main_grad), by
    Megatron's protocol: where p has grad_added_to_main_grad, that flag is set and a placeholder of w's
    shape comes back (zeros if p.zero_out_wgrad, else uninitialised: the grad hooks that read the flag
    discard it), so that the parameter's post-accumulate hooks still run on the backward's thread; else
    None."""
    if not hasattr(p, "grad_added_to_main_grad"):
        return None
    p.grad_added_to_main_grad = True
    make = torch.zeros if getattr(p, "zero_out_wgrad", False) else torch.empty
    return make(w.shape, dtype=w.dtype, device=w.device)


_moe_forward = torch.ops.comet.moe_forward.default
_moe_forward_fp8 = torch.ops.comet.moe_forward_fp8.default


class _EagerMoeForward(torch.autograd.Function):
    """comet::moe_forward and its autograd formula for eager calls, without the dispatcher: a custom op's
    autograd costs about 50 us of host time per call with grad enabled (a stub op on the CPU: 59.6 us
    against 9.5 us through a Function), a tenth of a small layer's GPU time. The same kernels
    (_moe_forward_cuda, _moe_backward_cuda) and the same saved tensors as the op; torch.compile traces
    the op. Arguments: the handle, the ranks' count, fused_into (None, or the weight parameters whose
    main_grad the backward adds the weight gradients to: gradient_accumulation_fusion), w0, w1, then x,
    ids and gates of every rank."""

    @staticmethod
    def forward(ctx, handle, ranks, fused_into, w0, w1, *per_rank):
        x, ids, gates = per_rank[:ranks], per_rank[ranks:2 * ranks], per_rank[2 * ranks:]
        ctx.handle, ctx.ranks, ctx.fused_into = handle, ranks, fused_into
        ctx.save_for_backward(w0, w1)
        return tuple(_moe_forward_cuda(list(x), list(ids), list(gates), w0, w1, handle))

    @staticmethod
    def backward(ctx, *dout):
        w0, w1 = ctx.saved_tensors
        dout = [d.to(torch.bfloat16).contiguous() for d in dout]
        if ctx.fused_into is None:
            dx, dgates, dw0, dw1 = _moe_backward_cuda(dout, w0, w1, ctx.handle)
        else:  # gradient_accumulation_fusion: into the parameters' main_grad, as they are now
            p0, p1 = ctx.fused_into
            mg0, mg1 = main_grads_of(p0, p1, w0, w1)
            dx, dgates = _moe_backward_into_main_grads(dout, mg0, mg1, ctx.handle)
            dw0, dw1 = grad_after_fusion(p0, w0), grad_after_fusion(p1, w1)
        return (None, None, None, dw0, dw1, *dx, *([None] * ctx.ranks), *dgates)


class _EagerMoeForwardFp8(torch.autograd.Function):
    """comet::moe_forward_fp8 for eager calls with grad enabled: the op's kernel, and a backward that says
    the fp8 layer has none (a layer built with training=False says the same way why it has none).
    Arguments: the handle, the ranks' count, w0, w0_scale, w1, then x, ids and gates of every rank."""

    @staticmethod
    def forward(ctx, handle, ranks, w0, w0_scale, w1, *per_rank):
        x, ids, gates = per_rank[:ranks], per_rank[ranks:2 * ranks], per_rank[2 * ranks:]
        return tuple(_moe_forward_fp8_cuda(list(x), list(ids), list(gates), w0, w0_scale, w1, handle))

    @staticmethod
    def backward(ctx, *dout):
        raise RuntimeError(_FP8_FORWARD_ONLY)


# ---- the functional API ----------------------------------------------------------------------------------
def quantize_weights_e4m3(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes and fp32 scales of each [rows, cols] matrix of w (bf16 [..., rows, cols] on a GPU, cols a
    multiple of 128) in 128 x 128 blocks: scales [..., ceil(rows / 128), cols / 128], s = amax / 448 (1 for a
    block of zeros), codes torch.float8_e4m3fn [..., rows, cols] = e4m3(w / s) (round to nearest even,
    saturating). Ordered on the current stream; bitwise what the C++ oracle (comet::fp8::quantize_weights)
    gives. For a layer's w0, quantise each rank's local shard (comet.weights.shard_w0, [E_l, N0_s, H]): its
    blocks are the GEMM's, and with SwiGLU they mix gate and up rows (blocks of 8 interleaved)."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"quantize_weights_e4m3: expected a torch.Tensor, got {type(w).__name__}")
    if w.dtype is not torch.bfloat16:
        raise TypeError(f"quantize_weights_e4m3: dtype {w.dtype}, expected torch.bfloat16")
    if w.dim() < 2 or w.shape[-1] % FP8_BLOCK or w.shape[-1] == 0:
        raise ValueError(f"quantize_weights_e4m3: shape {tuple(w.shape)}, expected [..., rows, cols] with cols a "
                         f"positive multiple of {FP8_BLOCK}")
    if w.device.type != "cuda":
        raise ValueError(f"quantize_weights_e4m3: on {w.device}, the quantiser runs on a CUDA GPU")
    _lib.require_cuda("comet.ops.quantize_weights_e4m3")
    *lead, rows, cols = w.shape
    mats = 1
    for d in lead:
        mats *= d
    w = w.contiguous()
    if w.data_ptr() % 16:
        w = w.clone()
    codes = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty(*lead, -(-rows // FP8_BLOCK), cols // FP8_BLOCK, dtype=torch.float32, device=w.device)
    with torch.cuda.device(w.device):
        _lib.C.quantize_weights_e4m3(w.data_ptr(), mats, rows, cols, codes.data_ptr(), scales.data_ptr(),
                                     _current_stream(w.device))
    return codes, scales


def moe_forward(layer: FusedMoE, x, ids, gates, w0, w1, w0_scale=None):
    """The whole MoE layer: tokens in (bf16 [T, H]), top-k expert ids ([T, k] int32/int64) and gate
    weights ([T, k]), the local expert weights (comet.weights layout; stacked [L, ...] or one rank's),
    output [T, H] in token order. Lists of one tensor per rank for a local team. An fp8 layer takes w0 as
    e4m3 codes and w0_scale, their 128 x 128 block scales (FusedMoE.__call__)."""
    return layer(x, ids, gates, w0, w1, w0_scale)


def moe_layer0(layer: FusedMoE, x, ids, gates, w0):
    """Dispatch + GEMM0 + activation: hidden rows in the plan's layout ([max_rows, F/tp] per rank)."""
    if layer.spec.fp8:
        raise NotImplementedError("comet.ops.moe_layer0: the split ops run bf16 layers only; an fp8 (e4m3) layer "
                                  "runs whole (FusedMoE.__call__, comet::moe_forward_fp8)")
    single = isinstance(x, torch.Tensor)
    x, ids, gates = ([v] for v in (x, ids, gates)) if single else (list(v) for v in (x, ids, gates))
    gates = [g if g.dtype == torch.float32 else g.float() for g in gates]
    w0 = stacked(w0, "w0", layer.spec.ranks)
    check_inputs(layer.spec, x, ids, gates, w0, None)
    hidden = torch.ops.comet.moe_layer0(x, ids, gates, w0, layer.handle)
    return hidden[0] if single else hidden


def moe_layer1(layer: FusedMoE, hidden, ids, w1):
    """GEMM1 + the gate-weighted top-k combine of the routing staged by the last moe_layer0 of `layer`."""
    if layer.spec.fp8:
        raise NotImplementedError("comet.ops.moe_layer1: the split ops run bf16 layers only; an fp8 (e4m3) layer "
                                  "runs whole (FusedMoE.__call__, comet::moe_forward_fp8)")
    single = isinstance(hidden, torch.Tensor)
    hidden, ids = ([hidden], [ids]) if single else (list(hidden), list(ids))
    w1 = stacked(w1, "w1", layer.spec.ranks)
    for h in hidden:
        _tensor(h, "hidden", (layer.max_rows, layer.ffn_shard), (torch.bfloat16,), layer.team.device)
    _tensor(w1, "w1", (layer.spec.ranks, layer.local_experts, layer.hidden_size, layer.ffn_shard),
            (torch.bfloat16,), layer.team.device)
    out = torch.ops.comet.moe_layer1(hidden, ids, w1, layer.handle)
    return out[0] if single else out
