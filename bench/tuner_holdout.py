"""Held-out evaluation of comet-tune's cost model on benchmark results (any machine, no GPU).

    python3 bench/tuner_holdout.py --fit mixtral,qwen2,phi35 [--calibrate-only TILE.json ...] RESULTS.json [...]

Calibrates the cost model (comet-tune --from-results) on the --fit models' records only, removes the
table's measured entries so that every pick comes from the model, then scores the model's pick for
every case of the other models (held out) and of the fit models (in sample) against the best n_comm of
the case's measured sweep (comet-tune --evaluate). --calibrate-only files (e.g. the tile 128 vs 256
runs) feed the calibration but are not scored. Prints the per-case lines and a breakdown by link,
layer and routing: how many picks fall within 3 % and 10 % of the best.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def breakdown(lines):
    counts = collections.defaultdict(lambda: [0, 0, 0, 0])
    for line in lines:
        p = line.split()
        if len(p) < 8 or p[0] in ("case", "comet-tune:"):
            continue
        _, _, link, routing, _, layer = p[:6]
        unscored = line.endswith("(not in the sweep)")  # e.g. n_comm 0 against a sweep without it
        for key in ((link, layer, routing), ("all",)):
            if unscored:
                counts[key][3] += 1
                continue
            ratio = float(p[-1])
            counts[key][0] += 1
            counts[key][1] += ratio <= 1.03
            counts[key][2] += ratio <= 1.10
    return [f"{' '.join(k):24s} {n:4d} picks, {a:4d} within 3 %, {b:4d} within 10 %" + (f"; {u} not in the sweep" if u else "")
            for k, (n, a, b, u) in sorted(counts.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--fit", required=True, help="comma-separated models to calibrate on")
    ap.add_argument("--calibrate-only", nargs="*", default=[], help="results used for calibration only")
    ap.add_argument("--tune", default="build/tools/comet-tune")
    ap.add_argument("--measured-work", action="store_true",
                    help="the model sees each record's measured rows (what the adaptive split does on the device)")
    args = ap.parse_args()
    fit_models = set(args.fit.split(","))
    records = [r for p in args.results for r in json.load(open(p))]
    extra = [r for p in args.calibrate_only for r in json.load(open(p)) if r["model"] in fit_models]
    with tempfile.TemporaryDirectory() as tmp:
        def dump(name, recs):
            path = os.path.join(tmp, name)
            json.dump(recs, open(path, "w"))
            return path
        fit = dump("fit.json", [r for r in records if r["model"] in fit_models] + extra)
        scored_fit = dump("scored_fit.json", [r for r in records if r["model"] in fit_models])
        held = dump("held.json", [r for r in records if r["model"] not in fit_models])
        table = os.path.join(tmp, "table.json")
        subprocess.run([args.tune, "--from-results", fit, "--table", table], check=True, stdout=subprocess.DEVNULL)
        t = json.load(open(table))
        t["entries"] = {}
        json.dump(t, open(table, "w"))
        for m in t["models"].items():
            print(f"# calibrated {m[0]}: {json.dumps(m[1])}")
        for title, path in (("held out", held), ("in sample", scored_fit)):
            cmd = [args.tune, "--evaluate", path, "--table", table] + (["--measured-work"] if args.measured_work else [])
            out = subprocess.run(cmd, check=True,
                                 capture_output=True, text=True).stdout.splitlines()
            print(f"\n## cost model picks, {title}")
            for line in breakdown(out):
                print(f"#   {line}")
            print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
