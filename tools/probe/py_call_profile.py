"""Where the host time of one comet.MoELayer forward goes, by function (cProfile), against the extension's
own call on the same inputs: the breakdown behind `python -m comet.bench`'s Python-overhead figure.

Each call starts on an idle GPU (synchronised before it, outside the profile), as bench.host_times(calls=1)
times it; the profile then holds only host work.

    python3 tools/probe/py_call_profile.py [--tokens 128,4096] [--calls 300] [--model mixtral|small]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import comet
from comet.bench import MODELS, host_times


def profile(fn, calls: int) -> tuple[float, str]:
    prof = cProfile.Profile()
    total = 0.0
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prof.enable()
        fn()
        prof.disable()
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return total / calls * 1e6, out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--model", default="mixtral", choices=sorted(MODELS))
    a = ap.parse_args()
    H, F, E, k = MODELS[a.model]
    for tokens in (int(t) for t in a.tokens.split(",")):
        team = comet.Team.local(1, "device")
        layer = comet.MoELayer(H, F, E, k, team=team, max_tokens=tokens, training=False)
        x = torch.randn(tokens, H, device="cuda").to(torch.bfloat16)
        ids, gates = comet.route(torch.randn(tokens, E, device="cuda"), k)
        w0, w1 = layer.w0.detach(), layer.w1.detach()
        out = torch.empty_like(x)
        stream = torch.cuda.current_stream().cuda_stream
        batch = (tokens, x.data_ptr(), ids.data_ptr(), True, gates.data_ptr(), out.data_ptr(), 0)
        native = layer.engine.native
        with torch.no_grad():
            fns = {
                "ext": lambda: native.forward1(0, w0[0].data_ptr(), w1[0].data_ptr(), batch, stream),
                "module": lambda: layer(x, ids, gates),
                "empty_like": lambda: torch.empty_like(x),
            }
            for fn in fns.values():
                for _ in range(5):
                    fn()
            for name, fn in fns.items():
                us, table = profile(fn, a.calls)
                print(f"==== {a.model} tokens {tokens} {name}: {us:.1f} us of host time per call (profiled)")
                print(table)
            # Unprofiled: the benchmark's own interleaved timing (comet.bench.host_times).
            for name, times in host_times(fns, rounds=a.calls, calls=1).items():
                times.sort()
                print(f"tokens {tokens} {name}: median {times[len(times) // 2]:.1f} us, "
                      f"p10 {times[len(times) // 10]:.1f} us (unprofiled)")
        layer.close()


if __name__ == "__main__":
    main()
