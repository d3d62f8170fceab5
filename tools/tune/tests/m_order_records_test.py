"""comet-tune --from-results skips the records of a fused layer 0 in m order (comet-bench --tile-order m)
and, under uniform routing, those of a layer built in wave chunks (--wave-chunk): no entry of load class 1
runs either (the host's picks keep the default order), so they must not pick an entry's n_comm. Skewed
records in chunks give their class's entries a chunk: wave_chunk_records_test.

Mixtral EP 8, device link, layer 0, a sweep at 1024, 2048 and 4096 tokens:
  1024: arrival order n_comm 2 1.00 ms, 8 0.90; m order n_comm 4 0.50: the entry is n_comm 8;
  2048: m order records only: no entry;
  4096: n_comm 2 1.00, 8 0.90; wave_chunk 4 n_comm 4 0.50: the entry is n_comm 8.

    python3 m_order_records_test.py PATH/TO/comet-tune
"""
import os
import subprocess
import sys
import tempfile

from tune_cases import entries_by_tokens, matches, write_records

BASE = {"model": "mixtral", "world": 8, "ep": 8, "tp": 1, "link": "device", "routing": "uniform",
        "gpu": "NVIDIA H100 80GB HBM3", "layer": "l0", "system": "comet", "mode": "fused", "tile_n": 256}


def fused(tokens, n_comm, ms, m_order=False, wave_chunk=0):
    r = dict(BASE, tokens_per_rank=tokens, n_comm=n_comm, median_ms=ms)
    if m_order:
        r["tile_order"] = "m"
    if wave_chunk:
        r["wave_chunk"] = wave_chunk
    return r


def main(tune):
    sweep = [fused(1024, 2, 1.0), fused(1024, 8, 0.9), fused(1024, 4, 0.5, True),
             fused(2048, 2, 0.5, True), fused(2048, 8, 0.4, True),
             fused(4096, 2, 1.0), fused(4096, 8, 0.9), fused(4096, 4, 0.5, wave_chunk=4)]
    with tempfile.TemporaryDirectory() as d:
        paths = write_records(d, {"sweep": sweep})
        table = os.path.join(d, "table.json")
        subprocess.run([tune, "--table", table, "--entries-only", "--from-results", paths["sweep"]], check=True,
                       stdout=subprocess.DEVNULL)
        got = entries_by_tokens(table, lambda e: e["n_comm"])
    ok = matches("T1024 n_comm", got.get("T1024"), 8)
    ok &= matches("T2048 entry", got.get("T2048"), None)
    ok &= matches("T4096 n_comm", got.get("T4096"), 8)
    print("m_order_records_test:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
