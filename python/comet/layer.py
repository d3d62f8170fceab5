"""comet.MoELayer: a drop-in MoE block (router, experts, optional shared expert) whose expert part runs
comet's fused kernels.

Parameters (state_dict), for the L ranks this process drives (L = 1 under torchrun, W for a local team):
  w0     [L, E_l, N0_s, H] bf16  each rank's gate/up shard in comet's layout (comet.weights: SwiGLU
                                 rows interleaved in blocks of 8; N0_s = 2 F/tp, or F/tp without a gate)
  w1     [L, E_l, H, F_s]  bf16  each rank's down shard
  router.weight [E, H]           (router=True) replicated; logits in fp32
  shared.* (shared_ffn > 0)      a dense SwiGLU MLP every token goes through, replicated
With dtype=torch.float8_e4m3fn (an fp8 layer 0, forward only):
  w0        [L, E_l, N0_s, H] float8_e4m3fn   the same shards as e4m3 codes (requires_grad=False)
  w0_scale  [L, E_l, ceil(N0_s / 128), H / 128] fp32   their scales, one per 128 x 128 block of each
                                 local expert's [N0_s, H] (requires_grad=False)
  w1, router, shared expert: bf16 as above.
load_experts() / load_linear_experts() fill w0 / w1 from the usual checkpoint layouts (an fp8 layer
quantises each rank's w0 shard on the GPU), load_fp8_w0() takes pre-quantised shards; experts() gives
them back (all ranks local only).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import weights as W
from .ops import (FusedMoE, check_fp8_layer, check_gradient_accumulation_fusion, check_transport,
                  quantize_weights_e4m3, stacked)
from .team import Team


class SharedExpert(nn.Module):
    """A dense SwiGLU MLP (Qwen2-MoE's and DeepSeek-V3's shared expert)."""

    def __init__(self, hidden_size: int, ffn_size: int, dtype, device):
        super().__init__()
        self.gate_up = nn.Linear(hidden_size, 2 * ffn_size, bias=False, dtype=dtype, device=device)
        self.down = nn.Linear(ffn_size, hidden_size, bias=False, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """fp32 softmax over the experts, top-k; renormalised so a token's k weights sum to 1 (Mixtral) or
    not (Qwen2-MoE). Returns (topk_ids int64 [T, k], topk_weights fp32 [T, k])."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def mark_expert_parameters(params, ep: int) -> None:
    """Megatron-core's (and DeepSpeed's) marker of expert parameters, ``param.allreduce``: False where the
    experts are split over EP ranks (each rank holds other experts, so a data-parallel wrapper must reduce
    their gradients over the ranks that hold the same experts: Megatron's expert-data-parallel group), True
    without EP (TP shards of every expert: reduced like dense shards), as Megatron sets it
    (``not (is_expert and expert_parallel)``)."""
    for p in params:
        p.allreduce = ep == 1


class MoELayer(nn.Module):
    """A Mixture-of-Experts block on a comet Team.

    forward(hidden_states, topk_ids=None, topk_weights=None, router_logits=None):
      * with topk_ids / topk_weights: the experts only (the caller routed);
      * else with router_logits, or with the layer's own router (router=True): softmax, top-k, optional
        renormalisation, then the experts; plus the shared expert if there is one.
    hidden_states is [T, H] (or [..., H], flattened) bf16 on this process's GPU; a local team takes one
    tensor per rank (lists). The output is in the caller's token order and shape.

    The tuner picks each launch's variant; tile_n / n_comm (pairs for layer 0 and layer 1) force one.
    Device memory: see comet.FusedMoE (``self.engine.device_bytes_per_rank``; max_rows / load_factor size
    the gathered buffers for the load you expect). ``close()`` gives the memory back before the layer goes.

    Training (training=True, the default for bf16): autograd fills w0.grad and w1.grad, the inputs'
    gradients and the gate weights' (so the router, or the caller's routing, trains through them). A backward pairs
    with the layer's last forward: run it before the layer's next forward (comet.ops).
    Saved bytes: the training buffers are sized by max_rows (rows of each rank's gathered buffer; a token
    takes k of them, on the ranks of its experts): per row, 2 N0_s bytes of layer-0 pre-activations
    (N0_s = 2 F/tp for swiglu, else F/tp) and the backward's 2 H + 4 ceil(F/tp / 128), plus 2 F/tp where
    F/tp > H (the backward's D rows; else they live in a forward buffer). Per token under EP with swiglu:
    about k (6 F + 2 H) bytes, 2 x 92.4 KiB for Mixtral-8x7B (H 4096, F 14336).
    training=False (inference) does without them; its backward raises.
    fused_activation_grad=True: the activation's backward in the backward GEMM's epilogue (comet.FusedMoE).
    weight_grad_kernel: which GEMM makes the weight gradients (comet.FusedMoE): "auto" (default, the
    planner's rule by shape), "persistent", "grouped", "grouped_cooperative" or "grouped_320"; all give the same bits.
    narrow_n_tiles=False: keep "auto"'s weight-gradient pick off the 128 x 320 tiles it takes where F / tp
    is 320 or 800 (comet.FusedMoE; the same bits, for A/B runs).
    cublas_backward: whether the backward's GEMMs with no comm beside them run cuBLAS (comet.FusedMoE; None,
    the default: where a rank has at most 2 local experts).
    check_schedule=True: time the tuner's fused picks against the sequential schedule on the first calls
    and keep the faster per launch and token bucket (comet.FusedMoE; off by default: runs may settle differently).
    transport: "peer" (default) or "nvshmem" (NVSHMEM device gets and puts; a team on NVSHMEM's heap,
    bf16: comet.FusedMoE).
    w0 and w1 carry Megatron's expert marker, ``allreduce`` (False under EP: their gradients are reduced over
    the expert-data-parallel ranks only; see mark_expert_parameters and README, "Inside a trainer").
    gradient_accumulation_fusion=True (Megatron's option): the backward adds dW0 / dW1 into w0.main_grad
    and w1.main_grad (fp32 or bf16, as Megatron's DistributedDataParallel allocates them) instead of
    filling w0.grad / w1.grad; .grad gets Megatron's placeholder where the weight has
    grad_added_to_main_grad, else stays None (comet.FusedMoE; eager calls).

    fp8 (dtype=torch.float8_e4m3fn; issue 17): layer 0's GEMM runs in e4m3 with fp32 accumulation. The
    tokens stay bf16 in and out: each rank quantises its own tokens inside the layer, once per forward,
    with one fp32 scale per token and 128 columns (1 x 128 blocks, s = amax / 448, e4m3 round to nearest
    even), and the comm blocks move those fp8 rows. W0 is held as e4m3 codes (w0) with one fp32 scale per
    128 x 128 block of each local expert's [N0_s, H] (w0_scale), blocks of the local layout (with SwiGLU
    they hold interleaved gate and up rows), so the weights are quantised after sharding: load_experts()
    and reset_parameters() quantise bf16 shards on the GPU, load_fp8_w0() takes codes and scales made
    that way. Layer 1 (w1), the hidden rows and the output stay bf16, as do the router and the shared
    expert. H must be a multiple of 128. Forward only: training defaults to False and training=True is
    refused; a backward through the layer raises (run it under torch.no_grad() or
    torch.inference_mode(), which torch.compile needs too). Do not cast the layer (.to(dtype), .half()):
    that would turn the codes into values; .to(device) is the team's business.
    """

    def __init__(self, hidden_size: int, ffn_size: int, num_experts: int, top_k: int,
                 activation: str = "swiglu", *, team: Optional[Team] = None, max_tokens: int = 4096,
                 max_rows: int = 0, load_factor: float = 0.0, router: bool = False, renormalize: bool = True,
                 shared_ffn: int = 0,
                 dtype: torch.dtype = torch.bfloat16, tile_n=(None, None), n_comm=(None, None),
                 adaptive_split: bool = True, batch_invariant: bool = False, checking: bool = False,
                 training: Optional[bool] = None, fused_activation_grad: bool = False,
                 weight_grad_kernel: str = "auto", transport: str = "peer",
                 gradient_accumulation_fusion: bool = False, narrow_n_tiles: bool = True,
                 cublas_backward: Optional[bool] = None, check_schedule: bool = False):
        super().__init__()
        if dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            raise TypeError(f"MoELayer: dtype must be torch.bfloat16 or torch.float8_e4m3fn (an fp8 layer 0, forward "
                            f"only), got {dtype}")
        fp8 = dtype == torch.float8_e4m3fn
        if training is None:  # bf16 layers train by default; fp8 ones cannot
            training = not fp8
        if fp8:  # before a team is made: the refusal needs no GPU
            check_fp8_layer("MoELayer", training, hidden_size)
        check_transport("MoELayer", transport)
        check_gradient_accumulation_fusion("MoELayer", gradient_accumulation_fusion, training)
        self.team = team or Team.local(1)
        device = self.team.device
        self.engine = FusedMoE(self.team, hidden_size, ffn_size, num_experts, top_k, activation,
                               max_tokens=max_tokens, max_rows=max_rows, load_factor=load_factor,
                               tile_n=tile_n, n_comm=n_comm,
                               adaptive_split=adaptive_split, batch_invariant=batch_invariant,
                               checking=checking, training=training, dtype="e4m3" if fp8 else "bf16",
                               fused_activation_grad=fused_activation_grad,
                               weight_grad_kernel=weight_grad_kernel, transport=transport,
                               gradient_accumulation_fusion=gradient_accumulation_fusion,
                               narrow_n_tiles=narrow_n_tiles, cublas_backward=cublas_backward,
                               check_schedule=check_schedule)
        self.hidden_size, self.ffn_size, self.num_experts, self.top_k = hidden_size, ffn_size, num_experts, top_k
        self.activation, self.renormalize = activation, renormalize
        self.expert_dtype, self.fp8 = dtype, fp8
        e = self.engine
        L = len(e.local_ranks)
        bf16 = torch.bfloat16
        # fp8: codes and scales are Parameters without grad (as vLLM / transformers hold fp8 weights): the
        # state_dict keys stay w0 / w1 (+ w0_scale), layer.w0 is a Parameter whatever the dtype, .to(device)
        # moves the scales with the codes, and optimizers skip them (no grad).
        self.w0 = nn.Parameter(torch.empty(L, e.local_experts, e.w0_rows, hidden_size, dtype=dtype, device=device),
                               requires_grad=not fp8)
        if fp8:
            self.w0_scale = nn.Parameter(torch.empty(e.spec.w0_scale_shape, dtype=torch.float32, device=device),
                                         requires_grad=False)
        else:
            self.register_parameter("w0_scale", None)
        self.w1 = nn.Parameter(torch.empty(L, e.local_experts, hidden_size, e.ffn_shard, dtype=bf16, device=device))
        mark_expert_parameters((self.w0, self.w1), self.team.ep)
        self.router = nn.Linear(hidden_size, num_experts, bias=False, dtype=bf16, device=device) if router else None
        self.shared = SharedExpert(hidden_size, shared_ffn, bf16, device) if shared_ffn > 0 else None
        self.reset_parameters()

    def close(self) -> None:
        """Frees the layer's device buffers now (collective on a torchrun team: every process closes its
        layer, in the same order); later calls raise. See comet.FusedMoE.close."""
        self.engine.close()

    def reset_parameters(self) -> None:
        # nn.Linear's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        # fp8: the same bf16 draw (the same values as a bf16 layer's from the same seed), quantised.
        with torch.no_grad():
            bound = 1 / math.sqrt(self.hidden_size)
            if self.fp8:
                w0 = torch.empty(self.w0.shape, dtype=torch.bfloat16, device=self.w0.device).uniform_(-bound, bound)
                for i in range(w0.shape[0]):
                    self._quantize_w0(i, w0[i])
            else:
                self.w0.uniform_(-bound, bound)
            self.w1.uniform_(-1 / math.sqrt(self.ffn_size), 1 / math.sqrt(self.ffn_size))

    def _quantize_w0(self, i: int, w0: torch.Tensor) -> None:
        """Local rank i's w0 from its bf16 shard [E_l, N0_s, H]: e4m3 codes and 128 x 128 block scales, made on
        the GPU on the current stream (comet.ops.quantize_weights_e4m3)."""
        codes, scales = quantize_weights_e4m3(w0.to(device=self.w0.device, dtype=torch.bfloat16))
        self.w0[i].copy_(codes)
        self.w0_scale[i].copy_(scales)

    # ---- weights from and to checkpoint layouts ---------------------------------------------------------
    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"

    def load_experts(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor) -> None:
        """From the fused layout: gate_up_proj [E, 2F, H] (gate rows, then up rows; [E, F, H] ungated) and
        down_proj [E, H, F]. Each local rank keeps its shard. An fp8 layer quantises each rank's w0 shard
        (as bf16: give bf16 weights, fp32 ones are rounded to bf16 first) on the GPU into w0 / w0_scale."""
        want0 = (self.num_experts, (2 if self.gated else 1) * self.ffn_size, self.hidden_size)
        want1 = (self.num_experts, self.hidden_size, self.ffn_size)
        if tuple(gate_up_proj.shape) != want0:
            raise ValueError(f"gate_up_proj: shape {tuple(gate_up_proj.shape)}, expected {want0}")
        if tuple(down_proj.shape) != want1:
            raise ValueError(f"down_proj: shape {tuple(down_proj.shape)}, expected {want1}")
        t = self.team
        with torch.no_grad():
            for i, rank in enumerate(self.engine.local_ranks):
                w0 = W.shard_w0(gate_up_proj, gated=self.gated, ep=t.ep, tp=t.tp, rank=rank)
                if self.fp8:
                    self._quantize_w0(i, w0)
                else:
                    self.w0[i].copy_(w0)
                self.w1[i].copy_(W.shard_w1(down_proj, ep=t.ep, tp=t.tp, rank=rank))

    def load_fp8_w0(self, codes, scales) -> None:
        """An fp8 layer's w0 as given, pre-quantised: codes torch.float8_e4m3fn [L, E_l, N0_s, H] and scales
        fp32 [L, E_l, ceil(N0_s / 128), H / 128] (one rank's without the L, or lists of one per local rank),
        in each rank's LOCAL layout (comet.weights.shard_w0; the blocks are 128 x 128 blocks of each local
        expert's [N0_s, H], e.g. comet.ops.quantize_weights_e4m3 of the shard). Copied into w0 / w0_scale."""
        if not self.fp8:
            raise TypeError("MoELayer.load_fp8_w0: this layer is bf16; build it with dtype=torch.float8_e4m3fn "
                            "for fp8 weights (load_experts takes bf16 ones)")
        L = self.w0.shape[0]
        for name, t, dtype in (("codes", codes, torch.float8_e4m3fn), ("scales", scales, torch.float32)):
            if not isinstance(t, torch.Tensor) and not (isinstance(t, (list, tuple))
                                                        and all(isinstance(v, torch.Tensor) for v in t)):
                raise TypeError(f"MoELayer.load_fp8_w0: {name}: expected a torch.Tensor (or one per local rank), got "
                                f"{type(t).__name__}")
            dtypes = {v.dtype for v in ([t] if isinstance(t, torch.Tensor) else t)}
            if dtypes != {dtype}:
                raise TypeError(f"MoELayer.load_fp8_w0: {name}: dtype {', '.join(sorted(map(str, dtypes)))}, "
                                f"expected {dtype}")
        codes, scales = stacked(codes, "codes", L), stacked(scales, "scales", L)
        for name, t, want in (("codes", codes, self.w0.shape), ("scales", scales, self.w0_scale.shape)):
            if t.shape != want:
                raise ValueError(f"MoELayer.load_fp8_w0: {name}: shape {tuple(t.shape)}, expected {tuple(want)} "
                                 "([L, E_l, N0_s, H] codes and [L, E_l, ceil(N0_s / 128), H / 128] scales, each "
                                 "rank's w0 in comet's local layout)")
        with torch.no_grad():
            self.w0.copy_(codes)
            self.w0_scale.copy_(scales)

    def load_linear_experts(self, w1: Sequence[torch.Tensor], w3: Optional[Sequence[torch.Tensor]],
                            w2: Sequence[torch.Tensor]) -> None:
        """From per-expert Linear weights (Mixtral's block_sparse_moe.experts[e].w1 / w3 / w2 .weight):
        w1 gate [F, H], w3 up [F, H] (None for ungated experts), w2 down [H, F]."""
        gate_up, down = W.fuse_linear_experts(w1, w3, w2)
        self.load_experts(gate_up, down)

    def load_local_experts(self, gate_up, down) -> None:
        """From this process's own shards, as a sharded checkpoint holds them (no rank needs the full
        weights): gate_up [E_l, 2 F_s, H], the rank's experts' gate rows of its F columns then the matching
        up rows ([E_l, F_s, H] ungated), and down [E_l, H, F_s]; one rank's, or stacked [L, ...] (lists) for
        a local team. comet.weights.local_w0 gives the kernels' layout; an fp8 layer quantises w0 on the GPU
        as load_experts does. local_experts() gives them back."""
        L = self.w0.shape[0]
        el, fs, H = self.engine.local_experts, self.engine.ffn_shard, self.hidden_size
        gate_up, down = stacked(gate_up, "gate_up", L), stacked(down, "down", L)
        for name, t, want in (("gate_up", gate_up, (L, el, (2 if self.gated else 1) * fs, H)),
                              ("down", down, (L, el, H, fs))):
            if tuple(t.shape) != want:
                raise ValueError(f"MoELayer.load_local_experts: {name}: shape {tuple(t.shape)}, expected {want} "
                                 f"([L, E_l, {'2 F_s' if self.gated else 'F_s'}, H] and [L, E_l, H, F_s], or one "
                                 f"rank's without the L)")
        with torch.no_grad():
            for i in range(L):
                w0 = W.local_w0(gate_up[i], gated=self.gated)
                if self.fp8:
                    self._quantize_w0(i, w0)
                else:
                    self.w0[i].copy_(w0)
                self.w1[i].copy_(down[i])

    def local_experts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up [L, E_l, 2 F_s, H], down [L, E_l, H, F_s]): this process's shards in the plain layout
        load_local_experts takes, for a sharded checkpoint (works under torchrun, where experts() needs
        every rank). An fp8 layer's gate_up is its w0 dequantised and rounded to bf16."""
        w0 = self.w0.detach()
        if self.fp8:
            w0 = W.dequantize_weights_e4m3(w0, self.w0_scale.detach()).to(torch.bfloat16)
        return torch.stack([W.plain_w0(w, gated=self.gated) for w in w0]), self.w1.detach().clone()

    def experts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up_proj, down_proj) in the full layout; needs every rank local (a local team). An fp8
        layer's gate_up_proj is its w0 dequantised (codes times block scales, exact in fp32) and rounded to
        bf16."""
        t = self.team
        if len(self.engine.local_ranks) != t.world:
            raise RuntimeError("MoELayer.experts: this process holds only its own shard; gather the shards "
                               "(comet.weights.unshard_w0 / unshard_w1) across ranks")
        w0 = self.w0.detach()
        if self.fp8:
            w0 = W.dequantize_weights_e4m3(w0, self.w0_scale.detach()).to(torch.bfloat16)
        return (W.unshard_w0(list(w0), gated=self.gated, ep=t.ep, tp=t.tp),
                W.unshard_w1(list(self.w1.detach()), ep=t.ep, tp=t.tp))

    # ---- forward -------------------------------------------------------------------------------------------
    def forward(self, hidden_states, topk_ids=None, topk_weights=None, router_logits=None):
        single = isinstance(hidden_states, torch.Tensor)
        xs = [hidden_states] if single else list(hidden_states)
        shapes = [x.shape for x in xs]
        H = self.hidden_size
        xs = [x if x.dim() == 2 else x.reshape(-1, H) for x in xs]
        if topk_ids is None:
            if topk_weights is not None:
                raise ValueError("topk_weights given without topk_ids")
            if router_logits is None:
                if self.router is None:
                    raise ValueError("MoELayer: pass topk_ids/topk_weights or router_logits, or build it with router=True")
                logits = [self.router(x) for x in xs]
            else:
                logits = [router_logits] if single else list(router_logits)
            routed = [route(lg.reshape(-1, self.num_experts), self.top_k, self.renormalize) for lg in logits]
            ids, gates = [r[0] for r in routed], [r[1] for r in routed]
        else:
            if topk_weights is None:
                raise ValueError("topk_ids given without topk_weights")
            ids = [topk_ids] if single else list(topk_ids)
            gates = [topk_weights] if single else list(topk_weights)
            k = self.top_k
            ids = [i if i.dim() == 2 else i.reshape(-1, k) for i in ids]
            gates = [g if g.dim() == 2 else g.reshape(-1, k) for g in gates]
        out = self.engine(xs, ids, gates, self.w0, self.w1, self.w0_scale)
        if self.shared is not None:
            out = [o + self.shared(x) for o, x in zip(out, xs)]
        out = [o if o.shape == s else o.reshape(s) for o, s in zip(out, shapes)]
        return out[0] if single else out

    def extra_repr(self) -> str:
        t = self.team
        fp8 = "dtype=e4m3 (fp8 layer 0), " if self.fp8 else ""
        return (f"hidden={self.hidden_size}, ffn={self.ffn_size}, experts={self.num_experts}, top_k={self.top_k}, "
                f"activation={self.activation}, {fp8}world={t.world} (ep={t.ep}, tp={t.tp}), link={t.link}, "
                f"max_tokens={self.engine.max_tokens}")
