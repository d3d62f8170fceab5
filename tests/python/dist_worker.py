"""One rank of a torchrun job (test_torchrun.py starts it): a comet.MoELayer on a process-group team,
checked against the plain PyTorch MoE on this rank's tokens, forward and backward. Exits non-zero on a
mismatch.

    torchrun --nproc-per-node=N dist_worker.py EP TP            (CUDA IPC, forward and backward)
    torchrun --nproc-per-node=N dist_worker.py EP TP nvshmem    (NVSHMEM's heap; NVSHMEM's device transport
                                                                 against peer pointers, forward and backward)
    torchrun --nproc-per-node=N dist_worker.py EP TP nvshmem-unmapped
                                     (the same with no pointer to any peer on the NVSHMEM team, as across nodes)
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import comet  # noqa: E402
from comet import weights as W  # noqa: E402
from moe_problem import (assert_grad_matches, assert_matches, make_problem, random_douts,  # noqa: E402
                         reference_grads, reference_moe)


def check_backward(layer, p, rank: int):
    """One forward and backward; this rank's dx, dgates and weight shards against autograd through the
    plain MoE over every rank's tokens (every process builds the same problem, so the same reference)."""
    dout = random_douts(p, 78)
    x, gates = p.x[rank].clone().requires_grad_(), p.gates[rank].clone().requires_grad_()
    layer(x, p.ids[rank], gates).backward(dout[rank])
    layer.engine.synchronize()  # what the device reported first, before the numbers
    want, ep, tp = reference_grads(p, dout), p.ep, p.tp
    what = f"torchrun rank {rank}"
    assert_grad_matches(x.grad, want.dx[rank], f"{what} dx")
    assert_grad_matches(gates.grad, want.dgates[rank], f"{what} dgates", rows=False)
    assert_grad_matches(layer.w0.grad[0], W.shard_w0(want.gate_up, gated=True, ep=ep, tp=tp, rank=rank), f"{what} dW0")
    assert_grad_matches(layer.w1.grad[0], W.shard_w1(want.down, ep=ep, tp=tp, rank=rank), f"{what} dW1")
    return x.grad, gates.grad, layer.w0.grad, layer.w1.grad


def check_nvshmem_transport(p, tokens, rank: int, ep: int, tp: int, hide_peers: bool) -> None:
    """On NVSHMEM's heap: a layer whose comm blocks use NVSHMEM's gets and puts, and one with peer pointers.
    Forward and backward of both against the plain MoE, and bitwise equal to each other (same plan, same
    kernels, same order of the sums: only how the rows travel differs).

    hide_peers: the NVSHMEM team has no pointer to any peer (COMET_NVSHMEM_PEER_POINTERS=0), as across
    nodes: its barrier and signals are NVSHMEM signal operations, the layer reads the routing through
    NVSHMEM too, and a layer with transport "peer" is refused on it; the peer-pointer layer then runs on
    a CUDA IPC team of the same processes."""
    if hide_peers:
        os.environ["COMET_NVSHMEM_PEER_POINTERS"] = "0"
    team = comet.Team.from_process_group(ep=ep, tp=tp, heap="nvshmem")
    assert team.maps_peers != hide_peers, (team.maps_peers, hide_peers)
    peer_team = comet.Team.from_process_group(ep=ep, tp=tp) if hide_peers else team
    for t in {id(team): team, id(peer_team): peer_team}.values():
        t.set_timeout(20.0)
    if hide_peers:
        try:
            comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, team=team, max_tokens=max(tokens), transport="peer")
        except ValueError as e:
            assert "transport peer needs a pointer" in str(e), str(e)
        else:
            raise AssertionError(f"rank {rank}: transport peer on a team without peer pointers was not refused")
    outs, grads = {}, {}
    for transport, on in (("nvshmem", team), ("peer", peer_team)):
        layer = comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, team=on, max_tokens=max(tokens),
                               transport=transport)
        layer.load_experts(p.gate_up.to(torch.bfloat16).cuda(), p.down.to(torch.bfloat16).cuda())
        with torch.no_grad():
            outs[transport] = layer(p.x[rank], p.ids[rank], p.gates[rank])
        torch.cuda.synchronize()
        layer.engine.synchronize()
        assert_matches(outs[transport], reference_moe(p, p.x[rank], p.ids[rank], p.gates[rank]),
                       f"torchrun rank {rank}, transport {transport}")
        grads[transport] = check_backward(layer, p, rank)
    assert torch.equal(outs["nvshmem"], outs["peer"]), f"rank {rank}: NVSHMEM's transport differs from peer pointers"
    for name, a, b in zip(("dx", "dgates", "dW0", "dW1"), grads["nvshmem"], grads["peer"]):
        assert torch.equal(a, b), f"rank {rank}: {name} over NVSHMEM's transport differs from peer pointers"
    team.close()
    if peer_team is not team:
        peer_team.close()
    print(f"rank {rank}/{ep * tp}: ok ({outs['peer'].shape[0]} tokens, NVSHMEM transport == peer pointers, "
          f"gradients too{', no peer pointers on the NVSHMEM team' if hide_peers else ''})", flush=True)


def main() -> int:
    ep, tp = int(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    nvshmem = mode in ("nvshmem", "nvshmem-unmapped")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == ep * tp, (world, ep, tp)
    torch.cuda.set_device(0)  # every process on the one GPU (CUDA IPC between them)
    if nvshmem:
        tokens = [0 if r == 1 else 40 + 37 * r for r in range(world)]
        p = make_problem(hidden=256, ffn=512, experts=8, topk=2, ep=ep, tp=tp, tokens=tokens, routing="zipf", seed=79)
        check_nvshmem_transport(p, tokens, rank, ep, tp, hide_peers=mode == "nvshmem-unmapped")
        dist.destroy_process_group()
        return 0
    team = comet.Team.from_process_group(ep=ep, tp=tp)
    team.set_timeout(20.0)
    # Every rank builds the same problem (same seed) and takes its own tokens; rank 1 has none.
    tokens = [0 if r == 1 else 40 + 37 * r for r in range(world)]
    p = make_problem(hidden=256, ffn=512, experts=8, topk=2 if world == 2 else 4, ep=ep, tp=tp, tokens=tokens,
                     routing="zipf", seed=77)
    layer = comet.MoELayer(p.hidden, p.ffn, p.experts, p.topk, team=team, max_tokens=max(tokens))
    layer.load_experts(p.gate_up.to(torch.bfloat16).cuda(), p.down.to(torch.bfloat16).cuda())
    out = layer(p.x[rank], p.ids[rank], p.gates[rank])
    again = layer(p.x[rank], p.ids[rank].to(torch.int32), p.gates[rank])
    torch.cuda.synchronize()
    layer.engine.synchronize()
    assert_matches(out, reference_moe(p, p.x[rank], p.ids[rank], p.gates[rank]), f"torchrun rank {rank}")
    assert torch.equal(out, again), f"rank {rank}: second call differs"
    check_backward(layer, p, rank)  # every rank takes part, rank 1 without tokens
    team.close()  # collective: no process frees buffers a peer may still read
    try:
        layer(p.x[rank], p.ids[rank], p.gates[rank])
        raise AssertionError(f"rank {rank}: a forward on a closed team was accepted")
    except comet.InvalidArgument as e:
        assert "closed" in str(e), str(e)
    print(f"rank {rank}/{world}: ok ({out.shape[0]} tokens, gradients too, {layer.engine.last_decision(0)})",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
