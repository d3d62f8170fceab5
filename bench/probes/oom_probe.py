"""What a layer too large for the GPU raises (docs/design-changes.md, "Megatron's main grads from Python":
a SystemError was seen once where torch's OutOfMemoryError was expected). Builds a training FusedMoE of 2
virtual ranks whose buffers (comet.layer_footprint) exceed the free memory, prints the exception and its
traceback, the free memory after it, and whether a small layer can still be built. Not yet run.

    python3 bench/probes/oom_probe.py
"""
import traceback

import torch

import comet


def footprint(tokens: int) -> int:
    return comet.layer_footprint(4096, 14336, 8, 2, ep=2, max_tokens=tokens, training=True)["total"]


def main():
    team = comet.Team.local(2, "device", ep=2)
    free = torch.cuda.mem_get_info()[0]
    tokens = 4096
    while 2 * footprint(tokens) < 1.3 * free:
        tokens *= 2
    print(f"free {free / 2**30:.1f} GiB; max_tokens {tokens}: {footprint(tokens) / 2**30:.1f} GiB per rank, 2 ranks")
    try:
        comet.FusedMoE(team, 4096, 14336, 8, 2, max_tokens=tokens, training=True)
        print("built (no error)")
    except BaseException as e:  # noqa: B036  (what is raised is the question)
        print(f"raised {type(e).__module__}.{type(e).__name__}: {str(e)[:300]}")
        traceback.print_exc(limit=8)
    print(f"free after it: {torch.cuda.mem_get_info()[0] / 2**30:.1f} GiB")
    comet.FusedMoE(comet.Team.local(2, "device", ep=2), 256, 512, 8, 2, max_tokens=64, training=True)
    print("a small layer after it: built")


if __name__ == "__main__":
    main()
