#!/usr/bin/env python3
"""Batch-to-batch spread of the host link itself (H2D copies from pinned memory, the DMA engines),
to set beside the spread of comet's pulls over the same link (comet_layer_probe). Needs torch + a GPU.

    python3 bench/probes/host_link_spread.py [MB] [batches] [reps]
"""
import statistics
import sys

import torch

mb = int(sys.argv[1]) if len(sys.argv) > 1 else 110
batches = int(sys.argv[2]) if len(sys.argv) > 2 else 10
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
src = torch.empty(mb << 20, dtype=torch.uint8, pin_memory=True)
dst = torch.empty(mb << 20, dtype=torch.uint8, device="cuda")
for _ in range(3):
    dst.copy_(src, non_blocking=True)
torch.cuda.synchronize()
medians = []
for b in range(batches):
    times = []
    for _ in range(reps):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e))
    m = statistics.median(times)
    medians.append(m)
    print(f"batch {b}: median {m:.3f} ms ({mb / 1024 / m * 1e3:.1f} GB/s), min {min(times):.3f}, max {max(times):.3f}")
print(f"batch medians: {min(medians):.3f}-{max(medians):.3f} ms, spread {max(medians) / min(medians) - 1:.1%}")
