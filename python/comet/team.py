"""Teams: the ranks a MoE layer spans and how they reach each other's buffers.

* ``Team.local(world, link)``: W virtual ranks in this process on one GPU (tests, benchmarks, and the
  plain single-GPU layer with world=1). ``link="host"`` puts every rank's exported buffers in mapped
  pinned host memory, so every remote access crosses PCIe: the one-GPU stand-in for an interconnect.
* ``Team.from_process_group(group)``: one process per rank (``torchrun``), buffers shared with CUDA IPC;
  several processes may share one GPU (start the MPS daemon to let their kernels run concurrently).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _lib


class Team:
    """W = ep x tp ranks; rank r = ep_index * tp + tp_index (TP ranks of one EP group adjacent)."""

    def __init__(self, native, *, ep: int, tp: int, rank: Optional[int] = None):
        world = native.world
        if ep * tp != world:
            raise ValueError(f"Team: ep ({ep}) x tp ({tp}) must equal the team's {world} ranks")
        self._native = native
        self.ep, self.tp = ep, tp
        self.rank = rank  # this process's rank (process-group teams); None for a local team
        self.device = torch.device("cuda", native.device)

    @staticmethod
    def local(world: int = 1, link: str = "device", *, ep: Optional[int] = None, tp: int = 1,
              device: Optional[int] = None) -> "Team":
        """W virtual ranks on one GPU (default: the current CUDA device). ep defaults to world / tp."""
        _lib.require_cuda("Team.local")
        if world < 1 or tp < 1 or world % tp:
            raise ValueError(f"Team.local: world ({world}) must be a positive multiple of tp ({tp})")
        dev = torch.cuda.current_device() if device is None else int(device)
        return Team(_lib.C.LocalTeam(world, link, dev), ep=ep or world // tp, tp=tp)

    @staticmethod
    def from_process_group(group=None, *, ep: Optional[int] = None, tp: int = 1,
                           device: Optional[int] = None, heap: str = "cuda_ipc") -> "Team":
        """One rank per process of `group` (default: the world group). Collective: every process of the
        group calls it. The CUDA IPC handles travel through a gloo group over the same ranks (made here
        when `group` is not gloo: NCCL refuses two ranks on one GPU, which this team allows).
        heap="nvshmem": the symmetric buffers come from NVSHMEM's heap instead (its unique id travels the
        same way; comet._C.nvshmem_available() says whether its host library loads). Where some peer's
        buffers have no pointer (another node), `maps_peers` is False: the team signals through NVSHMEM
        and its layers need transport="nvshmem"."""
        import torch.distributed as dist

        _lib.require_cuda("Team.from_process_group")
        if not dist.is_initialized():
            raise RuntimeError("Team.from_process_group: torch.distributed is not initialised "
                               "(dist.init_process_group first, e.g. under torchrun)")
        group = group or dist.group.WORLD
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if world % tp:
            raise ValueError(f"Team.from_process_group: {world} ranks are not a multiple of tp ({tp})")
        exchange = group
        if dist.get_backend(group) != "gloo":
            exchange = dist.new_group(ranks=dist.get_process_group_ranks(group), backend="gloo")

        def all_gather(mine: bytes) -> bytes:
            t = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t, group=exchange)
            return b"".join(p.numpy().tobytes() for p in parts)

        dev = torch.cuda.current_device() if device is None else int(device)
        native = _lib.C.IpcTeam(rank, world, all_gather, dev, heap)
        team = Team(native, ep=ep or world // tp, tp=tp, rank=rank)
        team._exchange = exchange  # kept alive with the team
        return team

    @property
    def world(self) -> int:
        return self._native.world

    @property
    def link(self) -> str:
        return self._native.link

    @property
    def maps_peers(self) -> bool:
        """Whether this process reaches every peer's buffers with loads and stores (False for NVSHMEM's
        heap across nodes, or with COMET_NVSHMEM_PEER_POINTERS=0: layers then need transport="nvshmem")."""
        return self._native.maps_peers

    @property
    def local_ranks(self) -> list[int]:
        """Ranks this process drives: all W for a local team, its own for a process-group team."""
        return self._native.local_ranks()

    def set_timeout(self, seconds: float) -> None:
        """Bound of every device-side wait; a stalled flag raises comet.DeviceTimeout naming it."""
        self._native.set_timeout(seconds)

    def synchronize(self) -> None:
        """Waits for every local rank and raises what the device reported (timeouts)."""
        self._native.synchronize()

    def close(self) -> None:
        """Collective teardown of a process-group team: every process calls it once its layers are done.
        It waits for this rank's kernels, meets every peer through the process group (so no process
        frees memory a peer still reads), then frees this rank's buffers. If a peer never arrives (it
        died), the buffers are freed anyway and comet.DeviceTimeout names this rank, after the process
        group's own timeout. No layer may run on the team afterwards. A local team needs no close."""
        if self.rank is not None:
            self._native.close()

    def __repr__(self) -> str:
        kind = "local" if self.rank is None else f"process rank {self.rank}"
        return f"comet.Team({kind}, world={self.world}, ep={self.ep}, tp={self.tp}, link={self.link})"
