"""MemScope for a plain PyTorch training loop (an ``nn.Module`` and a torch optimizer)."""

from memscope.integrations.torch.runtime import MemScopeTorchRuntime

__all__ = ["MemScopeTorchRuntime"]
