"""comet.MoELayer under torchrun, forward and backward: 2 and 4 processes sharing the one GPU through CUDA
IPC (their kernels run concurrently under the MPS daemon, which scripts/gpu-test starts; without it they
time-slice)."""
import os
import subprocess
import sys

import pytest

import comet

pytestmark = pytest.mark.skipif(not comet.cuda_ready(), reason="no CUDA GPU (sm_90a)")


@pytest.mark.parametrize("ep,tp", [(2, 1), (4, 1), (2, 2)])
def test_torchrun_processes_match_the_reference(ep, tp):
    here = os.path.dirname(__file__)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ep * tp}", "--standalone",
           os.path.join(here, "dist_worker.py"), str(ep), str(tp)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count(": ok (") == ep * tp


@pytest.mark.skipif(not comet.cuda_ready() or not comet._C.nvshmem_available(),
                    reason="no CUDA GPU, or NVSHMEM's host library does not load (COMET_NVSHMEM_LIB)")
@pytest.mark.parametrize("ep,hide_peers", [(2, False), (4, False), (2, True), (4, True)])
def test_torchrun_nvshmem_transport_matches_peer_pointers(ep, hide_peers):
    """Forward and backward with NVSHMEM's device transport (transport="nvshmem") on NVSHMEM's heap,
    against the plain MoE and bitwise against the same layer with peer pointers, ep processes on the one
    GPU. hide_peers: the NVSHMEM team maps no peer (COMET_NVSHMEM_PEER_POINTERS=0, as across nodes), so
    the layer and the team's barrier use NVSHMEM only."""
    here = os.path.dirname(__file__)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ep}", "--standalone",
           os.path.join(here, "dist_worker.py"), str(ep), "1", "nvshmem-unmapped" if hide_peers else "nvshmem"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(done.stdout[-4000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count("NVSHMEM transport == peer pointers") == ep
    assert done.stdout.count("no peer pointers on the NVSHMEM team") == (ep if hide_peers else 0)
