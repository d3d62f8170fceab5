"""comet-tune --gemm-runs: the tile width of sequential-mode picks from GEMM-alone runs, one run per width,
compared through cuBLAS timed in rotation in each run (the runs' clocks differ; cuBLAS cancels that).

Four layer-1 keys (Mixtral EP 8 on the device link, by token count), each with a sweep at tile 256:
  1024:  sequential mode wins; 192's GEMM is slower in its own run (1.10 against 1.00 ms) but its run was
         slower too (cuBLAS 1.00 against 0.80): against cuBLAS 1.10 < 1.25, so 192, at 1.0 x 1.10 / 1.25 ms;
  4096:  a fused split (n_comm 24, 0.95 ms) wins the sweep; sequential mode at 192 comes to 0.88 ms by the
         ratios, more than 3 % faster: n_comm 0 at 192;
  16384: 192 is 2 % better against cuBLAS: noise, 256 stays;
  256:   no 256-wide GEMM run: nothing to compare against, the sweep's pick stays.
A run of its own timed CUTLASS's grouped GEMM beside ours at 256 (comet-bench --standalone-gemms, given as
--standalone-runs: only its gemm_<name> records count, not the fused point it also holds): 0.92 against 1.00
ms at 1024 tokens, where ours at 192 comes to 0.88 (so ours stays), and 0.90 against 1.00 at 16384, where
256 stays (so the grouped GEMM is taken). Two keys where a fused split wins the sweep (n_comm 24, 0.90 ms;
sequential 1.00 ms with our GEMM at 0.60):
  8192:  CUTLASS's 128 x 160 GEMM at 0.40 makes the sequential schedule 1.00 - 0.60 + 0.40 = 0.80 ms, more
         than 3 % faster: n_comm 0 with grouped_160;
  2048:  its grouped GEMM at 0.53 comes to 0.93 ms, slower than the split: the split stays.
And at 512 tokens (sequential mode wins the sweep) cuBLAS's GEMM (StandaloneGemm::cublas) at 0.80 leads
ours (1.00) and CUTLASS's (0.99): cublas; at 32768 tokens cuBLAS at 0.98 leads by less than 3 % but more than
its own 1 % (kCublasGain: the baseline's GEMM): cublas. At 65536 tokens the sweep ran on the host link
(sequential wins) and the GEMM runs on the device link, cuBLAS fastest: from the sweep the host entry keeps
ours (the runs are another key's), refining the table it takes cuBLAS (a GEMM alone serves either link).

Then the same runs refine a table that already holds the sweep's picks (--gemm-runs and --standalone-runs
without --from-results): the same outcome, except that the fused pick at 4096 tokens stays (the table holds
no sequential-mode time to scale), and so do those at 8192 and 2048.

    python3 gemm_runs_test.py PATH/TO/comet-tune
"""
import os
import subprocess
import sys
import tempfile

from tune_cases import entries_by_tokens, matches, write_records

BASE = {"model": "mixtral", "world": 8, "ep": 8, "tp": 1, "link": "device", "routing": "uniform",
        "gpu": "NVIDIA H100 80GB HBM3", "layer": "l1"}


def sweep():
    out = []
    for tokens, points in ((1024, {0: 1.0, 24: 1.2}), (4096, {0: 1.0, 24: 0.95}), (16384, {0: 1.0, 24: 1.3}),
                           (256, {0: 1.0, 24: 1.3}), (8192, {0: 1.0, 24: 0.9}), (2048, {0: 1.0, 24: 0.9}),
                           (512, {0: 1.0, 24: 1.3}), (32768, {0: 1.0, 24: 1.3}), (65536, {0: 1.0, 24: 1.3})):
        for n, ms in points.items():
            out.append(dict(BASE, system="comet", mode="fused", tokens_per_rank=tokens, tile_n=256, n_comm=n,
                            median_ms=ms, link="host" if tokens == 65536 else "device"))
    return out


def standalone_run():
    out = []
    for tokens, gemms in ((1024, {"comet": 1.0, "grouped": 0.92}), (16384, {"comet": 1.0, "grouped": 0.90}),
                          (8192, {"comet": 0.6, "grouped": 0.7, "grouped_160": 0.4}),
                          (2048, {"comet": 0.6, "grouped": 0.53}),
                          (512, {"comet": 1.0, "grouped": 0.99, "cublas": 0.8}),
                          (32768, {"comet": 1.0, "grouped": 0.99, "cublas": 0.98}),
                          (65536, {"comet": 1.0, "cublas": 0.9})):
        for name, ms in gemms.items():
            out.append(dict(BASE, system="comet", mode="gemm_" + name, tokens_per_rank=tokens, tile_n=256, n_comm=0,
                            median_ms=ms))
    # The run's own sequential-mode point: --standalone-runs must not let it replace the sweep's.
    out.append(dict(BASE, system="comet", mode="fused", tokens_per_rank=16384, tile_n=256, n_comm=0, median_ms=0.5))
    return out


def gemm_run(tile, cases):
    out = []
    for tokens, (ours, cublas) in cases.items():
        out.append(dict(BASE, system="comet", mode="gemm_only", paired=True, tokens_per_rank=tokens, tile_n=tile,
                        n_comm=0, median_ms=ours))
        out.append(dict(BASE, system="cublas", paired=True, tokens_per_rank=tokens, tile_n=tile, median_ms=cublas))
        # Unpaired records of the same run (timed apart from cuBLAS) do not count, nor do gemm_only records
        # that timed a standalone GEMM the table picked instead of ours (picked_by names it).
        out.append(dict(BASE, system="comet", mode="gemm_only", tokens_per_rank=tokens, tile_n=tile, n_comm=0,
                        median_ms=0.01))
        out.append(dict(BASE, system="comet", mode="gemm_only", paired=True, picked_by="grouped",
                        tokens_per_rank=tokens, tile_n=tile, n_comm=0, median_ms=0.01))
    return out


def picks(table):
    return entries_by_tokens(table, lambda e: (e["n_comm"], e["tile_n"], round(e["ms"], 3),
                                               e.get("standalone_gemm", "comet")))


def main(tune):
    runs = {"t256": gemm_run(256, {1024: (1.0, 0.8), 4096: (1.0, 1.0), 16384: (1.0, 1.0)}),
            "t192": gemm_run(192, {1024: (1.1, 1.0), 4096: (0.88, 1.0), 16384: (0.98, 1.0), 256: (0.5, 1.0)})}
    with tempfile.TemporaryDirectory() as d:
        paths = write_records(d, dict(runs, sweep=sweep(), standalone=standalone_run()))
        runs_args = ["--gemm-runs", paths["t256"], paths["t192"], "--standalone-runs", paths["standalone"]]
        table = os.path.join(d, "table.json")
        subprocess.run([tune, "--table", table, "--entries-only", "--from-results", paths["sweep"], *runs_args],
                       check=True, stdout=subprocess.DEVNULL)
        refined = os.path.join(d, "refined.json")
        subprocess.run([tune, "--table", refined, "--entries-only", "--from-results", paths["sweep"]], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([tune, "--table", refined, *runs_args], check=True, stdout=subprocess.DEVNULL)
        got, got_refined = picks(table), picks(refined)
    expected = {"T1024": (0, 192, 0.88, "comet"), "T4096": (0, 192, 0.88, "comet"),
                "T16384": (0, 256, 1.0, "grouped"), "T256": (0, 256, 1.0, "comet"),
                "T8192": (0, 256, 0.8, "grouped_160"), "T2048": (24, 256, 0.9, "comet"),
                "T512": (0, 256, 1.0, "cublas"), "T32768": (0, 256, 1.0, "cublas"), "T65536": (0, 256, 1.0, "comet")}
    expected_refined = dict(expected, T4096=(24, 256, 0.95, "comet"), T8192=(24, 256, 0.9, "comet"),
                            T65536=(0, 256, 1.0, "cublas"))
    ok = [matches(what, g, e) for what, g, e in (("from the sweep: picks", got, expected),
                                                 ("refining the table: picks", got_refined, expected_refined))]
    if not all(ok):
        return 1
    print("widths and standalone GEMMs as expected, from the sweep and refining a table:", got)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
