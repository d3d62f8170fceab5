"""Where a MoELayer call's host time goes (W=1, no grad): each piece of the Python path timed alone on
an idle GPU, at two token counts, so that a cost that grows with the tokens shows which piece it is.

    PYTHONPATH=<comet package> python3 bench/probes/py_call_cost.py
"""
import statistics
import time

import torch

import comet
from comet import ops


def median_us(fn, rounds=300):
    ts = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main():
    H, F, E, k = 4096, 14336, 8, 2
    team = comet.Team.local(1, "device")
    for T in (128, 4096):
        layer = comet.MoELayer(H, F, E, k, team=team, max_tokens=T, training=False)
        x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
        ids, gates = comet.route(torch.randn(T, E, device="cuda"), k)
        eng = layer.engine
        w0, w1 = layer.w0.detach(), layer.w1.detach()
        out = torch.empty_like(x)
        stream = torch.cuda.current_stream().cuda_stream
        batch = (T, x.data_ptr(), ids.data_ptr(), True, gates.data_ptr(), out.data_ptr(), 0)
        with torch.no_grad():
            pieces = {
                "empty_like(x)": lambda: torch.empty_like(x),
                "check_inputs": lambda: ops.check_inputs(eng.spec, [x], [ids], [gates], w0, w1),
                "ext forward1": lambda: eng.native.forward1(0, w0.data_ptr(), w1.data_ptr(), batch, stream),
                "_moe_forward_cuda": lambda: ops._moe_forward_cuda([x], [ids], [gates], w0, w1, eng.handle),
                "FusedMoE.__call__": lambda: eng(x, ids, gates, w0, w1),
                "MoELayer(x, ids, gates)": lambda: layer(x, ids, gates),
            }
            for fn in pieces.values():
                fn()
            for name, fn in pieces.items():
                print(f"T={T:5d} {name:26s} {median_us(fn):8.1f} us", flush=True)
        del layer
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
