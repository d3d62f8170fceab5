"""comet-tune --wgrad-runs: each case's weight-gradient entry (key layer l4) takes the GEMM whose time over the
persistent kernel's, in the same run, has the lowest median over the runs.

Three cases (Mixtral EP 8, device link, by token count), two runs each:
  1024:  ping-pong 0.90 and 0.92 of persistent, cooperative 0.95 and 0.85: medians 0.91 / 0.90: cooperative;
  4096:  the runs drift (persistent 1.0 then 2.0 ms) but the cooperative kernel is 0.80 of it in both;
  16384: every CUTLASS kernel slower than ours: persistent.
Ignored: Zipf routing, the sequential baseline's and cuBLAS's wgrad records, other layers (each would flip
an entry if it counted), a run without the persistent kernel's record (no bar in that run). Then the
same runs through --from-results (with a sweep) give the same entries beside the sweep's.

    python3 weight_grad_runs_test.py PATH/TO/comet-tune
"""
import json
import os
import subprocess
import sys
import tempfile

from tune_cases import matches, write_records

BASE = {"model": "mixtral", "world": 8, "ep": 8, "tp": 1, "link": "device", "routing": "uniform",
        "gpu": "NVIDIA H100 80GB HBM3", "layer": "wgrad", "system": "comet"}
MODES = ("gemm_only", "grouped", "grouped_cooperative")


def run(times, **extra):
    """times: {tokens: (persistent, ping-pong, cooperative) ms}."""
    return [dict(BASE, tokens_per_rank=t, mode=m, median_ms=ms, **extra)
            for t, row in times.items() for m, ms in zip(MODES, row)]


def wgrad_entries(table):
    with open(table) as f:
        entries = json.load(f)["entries"]
    return {k.split("|")[-2]: e.get("weight_grad_kernel") for k, e in entries.items() if "|l4|" in k}


def main(tune):
    first = run({1024: (1.0, 0.90, 0.95), 4096: (1.0, 1.1, 0.80), 16384: (1.0, 1.2, 1.05)})
    second = run({1024: (1.0, 0.92, 0.85), 4096: (2.0, 2.2, 1.60), 16384: (1.0, 1.3, 1.01)})
    noise = run({16384: (1.0, 0.5, 0.5)}, routing="zipf1.2")
    noise += [dict(BASE, tokens_per_rank=16384, system=s, mode=m, median_ms=0.1)
              for s, m in (("sequential", "grouped"), ("cublas", "grouped_cooperative"))]
    noise += [dict(BASE, tokens_per_rank=16384, layer="dgrad", mode="grouped", median_ms=0.1)]
    noise += [r for r in run({16384: (1.0, 0.1, 0.1)}) if r["mode"] != "gemm_only"]  # no bar: ignored
    sweep = [dict(BASE, layer="l1", mode="fused", tokens_per_rank=1024, tile_n=256, n_comm=n, median_ms=1.0 + n / 100)
             for n in (0, 4)]
    want = {"T1024": "grouped_cooperative", "T4096": "grouped_cooperative", "T16384": "persistent"}
    ok = True
    with tempfile.TemporaryDirectory() as d:
        paths = write_records(d, {"first": first + noise[:4], "second": second, "bare": noise[4:], "sweep": sweep})
        table = os.path.join(d, "table.json")
        subprocess.run([tune, "--table", table, "--wgrad-runs", paths["first"], paths["second"], paths["bare"]],
                       check=True, stdout=subprocess.DEVNULL)
        ok &= matches("--wgrad-runs", wgrad_entries(table), want)
        both = os.path.join(d, "both.json")
        subprocess.run([tune, "--table", both, "--entries-only", "--from-results", paths["sweep"], paths["first"],
                        paths["second"]], check=True, stdout=subprocess.DEVNULL)
        ok &= matches("--from-results", wgrad_entries(both), want)
        with open(both) as f:
            ok &= matches("the sweep's entries", sum("|l1|" in k for k in json.load(f)["entries"]), 1)
    print("weight_grad_runs: ok" if ok else "weight_grad_runs: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
