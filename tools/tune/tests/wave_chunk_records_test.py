"""comet-tune --from-results gives a skewed key (load class > 1) the wave chunk of its fastest layer-0
point (comet-bench --wave-chunk, or a table's chunk the records name), only where it beats the default
order's best point by 3 % (kMeasuredGain); other launches' records ignore the chunk (the plan's order is
layer 0's); uniform records in chunks are skipped (m_order_records_test).

Mixtral EP 8, device link, Zipf records whose rank 0 counted 4x its uniform rows (load class 4):
  T1024 layer 0: chunk 1 n_comm 4 1.00, 8 0.90; chunk 2 n_comm 4 0.80, 8 0.95: n_comm 4, chunk 2;
  T2048 layer 0: chunk 1 n_comm 8 0.90; chunk 2 n_comm 4 0.88 (2 % only): n_comm 8, the default order;
  T4096 layer 1: n_comm 8 0.90; chunk 2 n_comm 4 0.50: n_comm 4, no chunk.

    python3 wave_chunk_records_test.py PATH/TO/comet-tune
"""
import json
import os
import subprocess
import sys
import tempfile

from tune_cases import matches, write_records

BASE = {"model": "mixtral", "world": 8, "ep": 8, "tp": 1, "link": "device", "routing": "zipf1.2",
        "gpu": "NVIDIA H100 80GB HBM3", "system": "comet", "mode": "fused", "tile_n": 256}


def fused(layer, tokens, n_comm, ms, wave_chunk=0):
    # Mixtral (8 experts, top-2) EP 8: 2 * tokens rows per rank under uniform routing; 4x that is class 4.
    r = dict(BASE, layer=layer, tokens_per_rank=tokens, n_comm=n_comm, median_ms=ms, rows=8 * tokens)
    if wave_chunk:
        r["wave_chunk"] = wave_chunk
    return r


def entries(table):
    """{(layer, "T<tokens>", load): (n_comm, wave_chunk or 0)} of the table file."""
    with open(table) as f:
        got = {}
        for key, e in json.load(f)["entries"].items():
            parts = key.split("|")
            load = parts[-1] if parts[-1].startswith("load") else "load1"
            tokens = next(p for p in parts if p.startswith("T"))
            got[(parts[2], tokens, load)] = (e["n_comm"], e.get("wave_chunk", 0))
        return got


def main(tune):
    sweep = [fused("l0", 1024, 4, 1.00, 1), fused("l0", 1024, 8, 0.90, 1), fused("l0", 1024, 4, 0.80, 2),
             fused("l0", 1024, 8, 0.95, 2),
             fused("l0", 2048, 8, 0.90), fused("l0", 2048, 4, 0.88, 2),
             fused("l1", 4096, 8, 0.90), fused("l1", 4096, 4, 0.50, 2)]
    with tempfile.TemporaryDirectory() as d:
        paths = write_records(d, {"sweep": sweep})
        table = os.path.join(d, "table.json")
        subprocess.run([tune, "--table", table, "--entries-only", "--from-results", paths["sweep"]], check=True,
                       stdout=subprocess.DEVNULL)
        got = entries(table)
    ok = matches("l0 T1024 load4", got.get(("l0", "T1024", "load4")), (4, 2))
    ok &= matches("l0 T2048 load4", got.get(("l0", "T2048", "load4")), (8, 0))
    ok &= matches("l1 T4096 load4", got.get(("l1", "T4096", "load4")), (4, 0))
    ok &= matches("entries", len(got), 3)
    print("wave_chunk_records_test:", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
