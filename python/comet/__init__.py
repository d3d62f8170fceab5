"""comet: distributed Mixture-of-Experts layers whose communication hides inside the expert GEMMs.

    import comet
    team = comet.Team.from_process_group(ep=8)          # under torchrun; or comet.Team.local(world=8)
    moe = comet.MoELayer(4096, 14336, 8, 2, team=team, max_tokens=4096, router=True)
    y = moe(x)                                          # x: [T, 4096] bf16 on this rank's GPU
    fp8 = comet.MoELayer(4096, 14336, 8, 2, team=team, dtype=torch.float8_e4m3fn)  # fp8 layer 0, forward only

The ops (torch.library, namespace comet) are in comet.ops; weight layouts in comet.weights.
"""
from ._lib import CudaError, DeviceError, DeviceTimeout, InvalidArgument, cuda_ready
from ._lib import C as _C
from .layer import MoELayer, SharedExpert, route
from .ops import FusedMoE, layer_footprint, quantize_weights_e4m3
from .team import Team
from . import ops, weights

__version__ = _C.version()

__all__ = ["MoELayer", "SharedExpert", "FusedMoE", "layer_footprint", "quantize_weights_e4m3", "Team", "route", "ops",
           "weights", "cuda_ready", "InvalidArgument", "DeviceError", "DeviceTimeout", "CudaError"]
