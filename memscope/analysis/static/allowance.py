"""What a formula cannot see on a GPU, stated separately from the estimate (never added to it).

The estimate predicts what the CUDA caching allocator reports as *allocated* at the peak.
``nvidia-smi`` shows more: the CUDA context (outside the allocator), NCCL's communication
buffers (also outside it) and what the allocator *reserves* beyond what is allocated
(512-byte rounding, 2 MiB / 20 MiB segment granularity, fragmentation). The first two are
given here as typical sizes with their formula; the last depends on the allocation order and
is what the runtime report's reserved-minus-allocated measures.
"""

from __future__ import annotations

from dataclasses import dataclass

from memscope.analysis.static.config import TrainingSpec

MIB = 1024 * 1024
CUDA_CONTEXT_BYTES = 512 * MIB  # typical for torch + CUDA 12 with lazy module loading
NCCL_BUFFSIZE = 4 * MIB  # NCCL's default per-channel buffer (NCCL_BUFFSIZE)
NCCL_CHANNELS = 2  # a conservative per-peer channel count for a small communicator
ROUNDING_BYTES_PER_BLOCK = 256  # allocations round up to 512 bytes: half a block on average


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
            "not predictable from the config: allocations round up to 512 bytes "
            f"(~{ROUNDING_BYTES_PER_BLOCK} B per live block) and segments to 2 or 20 MiB; the "
            "runtime report's reserved - allocated at the peak measures it"
        ),
    )
