"""The native extension comet._C, and the checks every entry point shares."""
from __future__ import annotations

import os

import torch

from . import _C as C  # noqa: N812  (the C++ core; torch-free)

# The tuner table shipped with the package (the wheel installs it as package data); in a source tree
# the library's compiled-in default (bench/results/h200_tune_table.json) stays.
_SHIPPED = os.path.join(os.path.dirname(__file__), "data", "tune_table.json")
if os.path.exists(_SHIPPED):
    C.set_shipped_tune_table(_SHIPPED)

InvalidArgument = C.InvalidArgument  # a ValueError: bad shapes, dtypes, ranges, capacities
DeviceTimeout = C.DeviceTimeout      # a TimeoutError: a bounded device wait expired (names rank, site, flag)
DeviceError = C.DeviceError          # a RuntimeError: the device found bad data (e.g. expert ids out of range)
CudaError = C.CudaError              # a RuntimeError: a CUDA call failed


def cuda_ready() -> bool:
    return torch.cuda.is_available() and C.cuda_device_count() > 0


def require_cuda(what: str) -> None:
    if not cuda_ready():
        raise RuntimeError(f"{what} needs a CUDA GPU (sm_90a: H100 / H200); torch sees none")
