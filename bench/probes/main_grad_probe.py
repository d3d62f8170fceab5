"""What gradient_accumulation_fusion saves a Megatron-style trainer: one training step (forward + backward)
of a Mixtral-8x7B-shaped comet.MoELayer, EP over W virtual ranks on this GPU, with fp32 main grads:
  unfused: the backward returns bf16 dW0 / dW1, then the trainer adds them (main_grad += grad);
  fused:   the backward adds dW0 / dW1 into main_grad itself (gradient_accumulation_fusion=True).
The two layers run alternately in the same rounds (paired: the card's clocks move with its power cap).

    python3 bench/probes/main_grad_probe.py [TOKENS_PER_RANK] [WORLD] [ROUNDS]
"""
import statistics
import sys

import torch

import comet


def make(world, tokens, fused):
    team = comet.Team.local(world, "device", ep=world)
    layer = comet.MoELayer(4096, 14336, 8, 2, team=team, max_tokens=tokens, load_factor=1.5,
                           gradient_accumulation_fusion=fused)
    for w in (layer.w0, layer.w1):
        w.main_grad = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        if fused:
            w.grad_added_to_main_grad = False
    return layer


def step(layer, xs, ids, gates, douts, fused):
    torch.autograd.backward(layer(xs, ids, gates), douts)
    for w in (layer.w0, layer.w1):
        if not fused:
            w.main_grad.add_(w.grad)
        w.grad = None


def main():
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(tokens, 4096, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
    ids = [torch.rand(tokens, 8, device="cuda", generator=gen).topk(2).indices for _ in range(world)]
    gates = [torch.rand(tokens, 2, device="cuda", generator=gen).softmax(-1) for _ in range(world)]
    douts = [torch.randn(tokens, 4096, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
    layers = {False: make(world, tokens, False), True: make(world, tokens, True)}
    with torch.no_grad():  # the same weights, so that the two main grads can be compared
        layers[True].w0.copy_(layers[False].w0)
        layers[True].w1.copy_(layers[False].w1)
    times = {False: [], True: []}
    for r in range(rounds + 2):
        for fused in ((False, True) if r % 2 == 0 else (True, False)):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step(layers[fused], xs, ids, gates, douts, fused)
            b.record()
            b.synchronize()
            if r >= 2:  # two rounds of warm-up
                times[fused].append(a.elapsed_time(b))
    for layer in layers.values():
        layer.engine.synchronize()
    # Same gradients either way: the fused main grads hold rounds + 2 steps' sums, as do the unfused ones.
    for name in ("w0", "w1"):
        u, f = getattr(layers[False], name).main_grad, getattr(layers[True], name).main_grad
        rel = float((u - f).norm() / u.norm())
        print(f"{name}.main_grad: fused vs unfused relative difference {rel:.2e}")
    mu, mf = statistics.median(times[False]), statistics.median(times[True])
    print(f"{torch.cuda.get_device_name()}, Mixtral-8x7B shape, EP {world} virtual ranks, {tokens} tokens per rank, "
          f"fp32 main grads, {rounds} paired rounds: step (forward + backward + grad add) unfused {mu:.3f} ms, "
          f"fused {mf:.3f} ms, unfused / fused {mu / mf:.3f}")


if __name__ == "__main__":
    main()
