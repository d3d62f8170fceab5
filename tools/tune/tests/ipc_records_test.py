"""comet-tune --from-results on comet-bench-ipc's records from a node of its own (one process per GPU):
their "nvlink" link keys the device link (an IpcTeam's), their "sms" the key's SM count, a model spelled
as a shape (h<H>f<F>e<E>k<k>) resolves, and only the rows of --transport (default cuda_ipc) decide.

    python3 ipc_records_test.py PATH/TO/comet-tune
"""
import json
import os
import subprocess
import sys
import tempfile


def records():
    base = {"system": "comet", "mode": "fused", "model": "h1024f2048e8k2", "world": 8, "ep": 8, "tp": 1,
            "link": "nvlink", "routing": "uniform", "gpu": "NVIDIA H100 PCIe", "sms": 114, "tokens_per_rank": 4096,
            "tile_n": 256, "tuned": False}
    # Per transport and layer, the n_comm sweep's times: cuda_ipc's best is n 4 (l0) and the sequential
    # schedule, n 0 (l1); the nvshmem transport's best is n 16 in both.
    sweeps = {"cuda_ipc": {"l0": {0: 1.3, 4: 1.0, 16: 1.2}, "l1": {0: 0.9, 4: 1.0, 16: 1.1}},
              "nvshmem": {"l0": {0: 1.3, 4: 1.2, 16: 1.0}, "l1": {0: 1.3, 4: 1.2, 16: 1.0}}}
    out = []
    for transport, layers in sweeps.items():
        for layer, sweep in layers.items():
            for n, ms in sweep.items():
                out.append(dict(base, transport=transport, layer=layer, n_comm=n, median_ms=ms))
    # A whole-layer record and a tuned one: neither is a point of a sweep.
    out.append(dict(base, transport="cuda_ipc", layer="fwd", n_comm=4, median_ms=0.1))
    out.append(dict(base, transport="cuda_ipc", layer="l0", n_comm=8, tuned=True, median_ms=0.1))
    return out


def picks(tune, results, d, *extra):
    table = os.path.join(d, "table_%d.json" % len(extra))
    subprocess.run([tune, "--table", table, "--entries-only", "--from-results", results, *extra], check=True,
                   stdout=subprocess.DEVNULL)
    with open(table) as f:
        return json.load(f)["entries"]


def main(tune):
    failures = []
    with tempfile.TemporaryDirectory() as d:
        results = os.path.join(d, "ipc.json")
        with open(results, "w") as f:
            json.dump(records(), f)
        for extra, expected in (((), {"l0": 4, "l1": 0}), (("--transport", "nvshmem"), {"l0": 16, "l1": 16})):
            entries = picks(tune, results, d, *extra)
            got = {}
            for key, e in entries.items():
                fields = key.split("|")
                want = ["NVIDIA H100 PCIe", "114", fields[2], "1024x2048", "E8", "k2", "W8", "ep8", "tp1", "device",
                        "T4096", "bf16"]
                if fields != want:
                    failures.append(f"{extra}: key {key}, expected the fields {want}")
                got[fields[2]] = e["n_comm"]
            if got != expected:
                failures.append(f"{extra}: picks {got}, expected {expected}")
    for f in failures:
        print(f)
    if not failures:
        print("comet-bench-ipc records give the expected keys and picks")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
