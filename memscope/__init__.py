"""MemScope: who used the memory, when, on which rank, in Megatron training."""

from memscope._version import __version__

__all__ = ["__version__"]
