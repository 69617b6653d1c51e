"""The ownership registry (``memscope.capture.ownership``): address ranges -> owner and
category, from a plain torch model and optimizer and from megatron-core's real
DistributedDataParallel buffers and Megatron optimizer (with and without the distributed
optimizer) on CPU."""

from __future__ import annotations

import pytest
import torch

from memscope.capture.ownership import OwnershipRegistry
from memscope.demo.launcher import free_port, spawn
from memscope.events.ownership import OwnerCategory


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _state_tensors(optimizers) -> list[torch.Tensor]:
    return [
        v for opt in optimizers for entry in opt.state.values() for v in entry.values()
        if isinstance(v, torch.Tensor)
    ]  # fmt: skip


def test_plain_torch_model_and_optimizer_totals_are_their_tensors_bytes():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters())
    registry = OwnershipRegistry([model], opt)
    assert registry.totals()["optimizer_state"] == 0
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    assert registry.refresh() is True  # Adam created its state at the first step
    assert registry.refresh() is False
    totals = registry.totals()
    assert totals["parameters"] == _nbytes(model.parameters())
    assert totals["gradients"] == _nbytes(p.grad for p in model.parameters())
    assert totals["optimizer_state"] == _nbytes(_state_tensors([opt]))
    weight = model[0].weight
    owned = registry.owner_at(weight.data_ptr() + 4)
    assert owned is not None and (owned.owner, owned.category) == (
        "0.weight",
        OwnerCategory.PARAMETERS,
    )
    exp_avg = opt.state[weight]["exp_avg"]
    assert registry.owner_at(exp_avg.data_ptr()).owner == "0.weight:exp_avg"
    # a block covering a parameter and bytes nobody owns is split, the rest unattributed
    unowned = torch.empty(64, dtype=torch.uint8)
    parts = registry.attribute(unowned.data_ptr(), 64)
    assert parts == [(None, 64)]
    parts = registry.attribute(weight.data_ptr(), weight.numel() * 4)
    assert [(p.owner if p else None, n) for p, n in parts] == [("0.weight", 512)]


def _megatron_registry(rank: int, world: int, port: int, distributed: bool) -> dict:
    from harness.megatron_ddp_cpu import install_ddp_cpu_stand_ins, megatron_ddp_and_optimizer

    from memscope.demo.tiny_gpt import TinyGPTConfig, build_model, destroy_process, init_process

    cfg = TinyGPTConfig(num_layers=2, hidden_size=32, num_attention_heads=4, grad_buffer=False)
    init_process(rank, world, port, cfg)
    try:
        install_ddp_cpu_stand_ins()
        model, optimizer = megatron_ddp_and_optimizer(build_model(cfg), distributed)
        registry = OwnershipRegistry(model, optimizer)
        tokens = torch.randint(0, cfg.vocab_size, (2, cfg.seq_length))
        positions = torch.arange(cfg.seq_length).expand(2, -1)
        for chunk in model:
            chunk.zero_grad_buffer()
        model[0](tokens, positions, None, labels=tokens).sum().backward()
        for chunk in model:
            chunk.finish_grad_sync()
        optimizer.step()
        refreshed = registry.refresh()
        buffers = [b for chunk in model for b in chunk.buffers]
        params = [p for chunk in model for p in chunk.parameters()]
        from megatron.core import parallel_state

        torch_optimizers = [
            o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])
        ]
        names = {id(p): n for n, p in model[0].module.named_parameters()}
        owners = {
            names[id(p)]: registry.owner_at(p.data_ptr()).owner for p in params if id(p) in names
        }
        return dict(
            refreshed=refreshed,
            totals=registry.totals(),
            param_data=_nbytes(b.param_data for b in buffers if b.param_data is not None),
            params=_nbytes(params),
            grad_data=sum(b.grad_data.numel() * b.grad_data.element_size() for b in buffers),
            state=_nbytes(_state_tensors(torch_optimizers)),
            global_buffer=_nbytes(parallel_state._GLOBAL_MEMORY_BUFFER.buffer.values()),
            owners=owners,
        )
    finally:
        destroy_process()


@pytest.mark.integration
@pytest.mark.multiprocess
@pytest.mark.parametrize("distributed", [False, True], ids=["ddp", "distributed_optimizer"])
def test_megatron_ddp_buffers_and_optimizer_state_are_owned_by_category(distributed):
    for result in spawn(2, _megatron_registry, free_port(), distributed):
        totals = result["totals"]
        assert result["refreshed"]  # the optimizer's state appeared at the first step
        # parameters: the DDP param buffer with its bucket padding (distributed optimizer)
        # or the parameters themselves
        expected = result["param_data"] or result["params"]
        assert totals["parameters"] == expected
        assert totals["gradients"] == result["grad_data"]
        assert totals["optimizer_state"] == result["state"] > 0
        assert totals["buffers"] == result["global_buffer"] > 0
        assert all(owner == name for name, owner in result["owners"].items())
        if distributed:  # each rank holds its shard of the optimizer state
            assert result["state"] < 2 * result["params"]
        else:
            assert result["state"] >= 2 * result["params"]


def test_the_registry_keeps_no_tensor_alive():
    import weakref

    model = torch.nn.Linear(4, 4)
    model(torch.randn(2, 4)).sum().backward()
    registry = OwnershipRegistry([model])
    grad = weakref.ref(model.weight.grad)
    model.weight.grad = None
    assert grad() is None  # freed although the registry had registered it
    assert registry.refresh() is True  # and the registry notices it is gone
    assert registry.totals()["gradients"] == 4 * 4  # only the bias gradient is left
