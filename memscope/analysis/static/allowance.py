"""What a formula cannot see on a GPU, stated separately from the estimate (never added to it).

The estimate predicts the bytes the training code asks the CUDA caching allocator for at the
peak. The allocator's *allocated* counter (``torch.cuda.max_memory_allocated``) is a little
higher: it counts each block at its rounded size (c10/cuda/CUDACachingAllocator.cpp
``round_size``: a multiple of 512 bytes; the ``allocated_bytes`` stat grows by the block's
size, ``requested_bytes`` by the request): under 512 bytes per live allocation, which only
models with many small tensors notice. ``nvidia-smi`` shows more still: the CUDA context
(outside the allocator), NCCL's communication buffers (also outside it) and what the
allocator *reserves* beyond what is allocated (2 MiB / 20 MiB segment granularity,
fragmentation). The first two are given here as typical sizes with their formula; the last
depends on the allocation order and is what the runtime report's reserved-minus-allocated
measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec

MIB = 1024 * 1024
CUDA_CONTEXT_BYTES = 512 * MIB  # typical for torch + CUDA 12 with lazy module loading
NCCL_BUFFSIZE = 4 * MIB  # NCCL's default per-channel buffer (NCCL_BUFFSIZE)
NCCL_CHANNELS = 2  # a conservative per-peer channel count for a small communicator
#: The CUDA caching allocator's block granularity: each allocation is counted rounded up to it.
ALLOCATION_ROUNDING = 512


@dataclass(frozen=True)
class Allowance:
    """Device memory outside the estimate, with how each number was obtained."""

    cuda_context_bytes: int
    nccl_buffer_bytes: int
    communicators: int
    fragmentation: str

    def to_dict(self) -> dict[str, object]:
        """Plain dict for the reports (with the formulas)."""
        return {
            "cuda_context_bytes": self.cuda_context_bytes,
            "nccl_buffer_bytes": self.nccl_buffer_bytes,
            "total_bytes": self.cuda_context_bytes + self.nccl_buffer_bytes,
            "formulas": {
                "cuda_context_bytes": "typical torch + CUDA 12 context (lazy loading), "
                "outside the caching allocator; measure: device used - reserved",
                "nccl_buffer_bytes": f"{self.communicators} communicators of size > 1 x "
                f"NCCL_BUFFSIZE (4 MiB) x {NCCL_CHANNELS} channels x 2 (send + receive)",
            },
            "fragmentation": self.fragmentation,
        }


def allowance(spec: TrainingSpec) -> Allowance:
    """The allowance of one rank of ``spec`` (all zero on CPU)."""
    if spec.device == "cpu":
        return Allowance(0, 0, 0, "not applicable: CPU tensors are not pooled")
    p = spec.parallel
    groups = sum(1 for size in (p.tp, p.pp, p.dp, p.cp, p.ep) if size > 1)
    return Allowance(
        cuda_context_bytes=CUDA_CONTEXT_BYTES,
        nccl_buffer_bytes=groups * NCCL_BUFFSIZE * NCCL_CHANNELS * 2,
        communicators=groups,
        fragmentation=(
            "not predictable from the config: segments round up to 2 or 20 MiB; the runtime "
            "report's reserved - allocated at the peak measures it. Allocations round up to "
            f"{ALLOCATION_ROUNDING} bytes (under {ALLOCATION_ROUNDING} B per live block), which "
            "the allocated counter includes and the estimate does not"
        ),
    )
