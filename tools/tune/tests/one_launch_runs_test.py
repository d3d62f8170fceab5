"""comet-tune --one-launch-runs: layer 1's sequential entries take one launch where comet-bench's A/B
(--paired --one-launch-ab: the tuned run and the same decision with one_launch flipped, in one rotation)
measured it at least 3 % faster than two launches, and two launches otherwise.

A sweep gives five layer-1 keys (Mixtral EP 8, device link, by token count) their entries; then A/B runs:
  1024:  tuned with two launches 1.00 ms, one launch 0.90 (ab_one_launch_on): one launch;
  2048:  two 1.00, one 0.98: 2 %, noise: two launches stay;
  4096:  two runs disagree (one launch 0.90 and 1.10 against 1.00): their median ratio, 1.01, is noise, two
         stay;
  8192:  the entry is a fused split (n_comm 24): not a sequential entry, left alone;
  16384: an entry already with one launch, tuned in one launch 1.00, two launches 0.95
         (ab_one_launch_off): back to two launches.
Records of another layer, unpaired or under skewed routing do not count.

    python3 one_launch_runs_test.py PATH/TO/comet-tune
"""
import json
import os
import subprocess
import sys
import tempfile

from tune_cases import entries_by_tokens, matches, write_records

BASE = {"model": "mixtral", "world": 8, "ep": 8, "tp": 1, "link": "device", "routing": "uniform",
        "gpu": "NVIDIA H100 80GB HBM3", "layer": "l1", "system": "comet"}


def sweep():
    out = []
    for tokens, n in ((1024, 0), (2048, 0), (4096, 0), (8192, 24), (16384, 0)):
        out.append(dict(BASE, mode="fused", tokens_per_rank=tokens, tile_n=256, n_comm=n, median_ms=1.0))
    return out


def ab(tokens, tuned_ms, other_mode, other_ms, n_comm=0, **extra):
    tuned = dict(BASE, mode="fused", tuned=True, paired=True, tokens_per_rank=tokens, tile_n=256, n_comm=n_comm,
                 median_ms=tuned_ms, **extra)
    other = dict(tuned, tuned=False, mode=other_mode, median_ms=other_ms)
    return [tuned, other]


def main(tune):
    first = ab(1024, 1.0, "ab_one_launch_on", 0.90) + ab(2048, 1.0, "ab_one_launch_on", 0.98) + \
        ab(4096, 1.0, "ab_one_launch_on", 0.90) + ab(8192, 1.0, "ab_one_launch_on", 0.5, n_comm=24) + \
        ab(16384, 1.0, "ab_one_launch_off", 0.95)
    # Ignored: another layer, unpaired, skewed routing (each would flip an entry if it counted).
    first += ab(2048, 1.0, "ab_one_launch_on", 0.5, layer="l0")
    noise = ab(2048, 1.0, "ab_one_launch_on", 0.5)
    for r in noise:
        r["paired"] = False
    first += noise + ab(2048, 1.0, "ab_one_launch_on", 0.5, routing="zipf1.2")
    later = ab(4096, 1.0, "ab_one_launch_on", 1.10)
    with tempfile.TemporaryDirectory() as d:
        paths = write_records(d, {"sweep": sweep(), "first": first, "later": later})
        table = os.path.join(d, "table.json")
        subprocess.run([tune, "--table", table, "--entries-only", "--from-results", paths["sweep"]], check=True,
                       stdout=subprocess.DEVNULL)
        with open(table) as f:  # the 16384-token entry already runs one launch
            t = json.load(f)
        for key, e in t["entries"].items():
            if key.split("|")[-2] == "T16384":
                e["one_launch"] = True
        with open(table, "w") as f:
            json.dump(t, f)
        subprocess.run([tune, "--table", table, "--one-launch-runs", paths["first"], paths["later"]], check=True,
                       stdout=subprocess.DEVNULL)
        got = entries_by_tokens(table, lambda e: (e["n_comm"], e.get("one_launch", False)))
    expected = {"T1024": (0, True), "T2048": (0, False), "T4096": (0, False), "T8192": (24, False),
                "T16384": (0, False)}
    if not matches("entries", got, expected):
        return 1
    print("one launch where it measured 3 % faster, two elsewhere:", got)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
