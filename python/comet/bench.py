"""python -m comet.bench: what the Python front costs per call, against the extension's own call on the
same layer and inputs (the C++ FusedMoe::forward behind one nanobind call).

For each case, three ways into the same forward:
  module   comet.MoELayer(x, ids, gates): checks, the custom op, allocation of the output
  op       torch.ops.comet.moe_forward: the dispatcher and the op's Python kernel
  ext      comet._C.FusedMoe.forward1: one nanobind call into C++ (the C++ API's cost plus ~1 us)
host_us: wall time of one call on the host, each call started on an idle GPU, the entries interleaved
call by call (so drift of clocks and caches hits them alike); the median over the rounds.
host_us_busy: the same with 4 calls per round, so that calls 2-4 are made while the GPU runs the
earlier ones (as in a training loop; host-side CUDA calls get slower then). gpu_ms: CUDA-event time
per call over back-to-back calls. The Python overhead is over_ext_us of the module: the median over
rounds of module's time less ext's in the same round (the host's drift cancels in each pair).

    python -m comet.bench [--tokens 128,4096] [--model mixtral|small] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import comet

MODELS = {  # hidden, ffn, experts, top-k
    "mixtral": (4096, 14336, 8, 2),
    "small": (1024, 2048, 8, 2),
}


def host_times(fns: dict, rounds: int = 150, calls: int = 4) -> dict:
    """Host time per call (us) of each entry of fns, one value per round. The entries are interleaved
    round by round, and their order rotates from one round to the next, so that drift of clocks and
    caches and the position after the synchronisation hit them alike."""
    times = {name: [] for name in fns}
    items = list(fns.items())
    for r in range(rounds):
        for name, fn in items[r % len(items):] + items[:r % len(items)]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return times


def paired_overhead_us(times: dict, entry: str = "module", base: str = "ext") -> float:
    """Median over rounds of entry's time less base's in the same round: the Python overhead, robust to
    the host's slow drifts (a difference of medians is not)."""
    return statistics.median(a - b for a, b in zip(times[entry], times[base]))


def gpu_ms(fn, calls: int = 20) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def run_case(model: str, tokens: int, world: int, link: str) -> list[dict]:
    H, F, E, k = MODELS[model]
    team = comet.Team.local(world, link)
    layer = comet.MoELayer(H, F, E, k, team=team, max_tokens=tokens, training=False)  # the inference forward
    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(tokens, H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(world)]
    logits = [torch.randn(tokens, E, device="cuda", generator=gen) for _ in range(world)]
    routed = [comet.route(lg, k) for lg in logits]
    ids, gates = [r[0] for r in routed], [r[1] for r in routed]
    w0, w1 = layer.w0.detach(), layer.w1.detach()
    eng = layer.engine
    x1 = xs if world > 1 else xs[0]
    with torch.no_grad():
        module = lambda: layer(x1, ids if world > 1 else ids[0], gates if world > 1 else gates[0])  # noqa: E731
        op = lambda: torch.ops.comet.moe_forward.default(xs, ids, gates, w0, w1, eng.handle)  # noqa: E731
        out = torch.empty_like(xs[0])
        stream = torch.cuda.current_stream().cuda_stream
        if world == 1:
            batch = (tokens, xs[0].data_ptr(), ids[0].data_ptr(), True, gates[0].data_ptr(), out.data_ptr(), 0)
            ext = lambda: eng.native.forward1(0, w0[0].data_ptr(), w1[0].data_ptr(), batch, stream)  # noqa: E731
        else:
            outs = [torch.empty_like(x) for x in xs]
            batches = [(tokens, x.data_ptr(), i.data_ptr(), True, g.data_ptr(), o.data_ptr(), 0)
                       for x, i, g, o in zip(xs, ids, gates, outs)]
            weights = [(a.data_ptr(), b.data_ptr()) for a, b in zip(list(w0), list(w1))]
            ext = lambda: eng.native.forward(weights, batches, stream)  # noqa: E731
        fns = {"ext": ext, "op": op, "module": module}
        for fn in fns.values():  # warm-up: about a second each (the host's first calls ran slow)
            t_end = time.perf_counter() + 1.0
            while time.perf_counter() < t_end:
                fn()
                torch.cuda.synchronize()
        gpu = {name: gpu_ms(fn) for name, fn in fns.items()}
        # About 10 s of GPU time per case: many rounds for small layers, at least 20 for large ones.
        rounds = max(20, min(300, int(10e3 / sum(gpu.values()))))
        idle_times = host_times(fns, rounds=rounds, calls=1)
        busy_times = host_times(fns, rounds=max(20, rounds // 4), calls=4)
        host = {name: statistics.median(t) for name, t in idle_times.items()}
        busy = {name: statistics.median(t) for name, t in busy_times.items()}
        paired = {name: paired_overhead_us(idle_times, name) for name in fns}
        paired_busy = {name: paired_overhead_us(busy_times, name) for name in fns}
        records = []
        for name in fns:
            records.append({"model": model, "layer": "fwd", "system": f"comet-{name}", "world": world, "ep": world,
                            "tp": 1, "link": link, "tokens_per_rank": tokens, "routing": "uniform",
                            "host_us": host[name], "host_us_busy": busy[name], "median_ms": gpu[name],
                            "over_ext_us": paired[name], "over_ext_us_busy": paired_busy[name],
                            "rounds": rounds,
                            "gpu": torch.cuda.get_device_name(), "entry": name})
    eng.synchronize()
    return records


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mixtral", choices=sorted(MODELS))
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--worlds", default="1,8")
    ap.add_argument("--link", default="device", choices=("device", "host"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    comet._lib.require_cuda("comet.bench")
    records = []
    for world in (int(w) for w in a.worlds.split(",")):
        for tokens in (int(t) for t in a.tokens.split(",")):
            rs = run_case(a.model, tokens, world, a.link)
            by = {r["entry"]: r for r in rs}
            print(f"{a.model} W={world} link={a.link} tokens/rank={tokens}: host us per call "
                  f"ext {by['ext']['host_us']:.1f}, op {by['op']['host_us']:.1f}, module {by['module']['host_us']:.1f} "
                  f"-> Python overhead (median of per-round differences) {by['module']['over_ext_us']:.1f} us "
                  f"(GPU busy: ext {by['ext']['host_us_busy']:.1f}, module {by['module']['host_us_busy']:.1f} -> "
                  f"{by['module']['over_ext_us_busy']:.1f} us); GPU ms per call "
                  f"ext {by['ext']['median_ms']:.3f}, module {by['module']['median_ms']:.3f}", flush=True)
            records += rs
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
