"""The MoE layer's activation terms (``memscope/analysis/static/moe.py``) against what a real
megatron-core ``MoELayer`` keeps after its forward on CPU, measured with the exact storage
ledger on the installed megatron-core (the terms follow its version:
``memscope/analysis/static/megatron_versions.py``): the allgather and alltoall dispatchers,
bf16 and fp32, an fp32 router, the aux loss, the z-loss, a non-gated MLP, capacity padding,
and expert parallelism over two processes (gloo). The rows that reached the experts are read
from the run (under EP they depend on the routing); every other byte comes from the
estimator. CUDA-only calls are redirected in ``tests/harness/moe_cpu.py``.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from datetime import timedelta
from typing import Any

import pytest

from memscope.analysis.static.moe import (
    imbalance_bound,
    moe_global_buffer,
    moe_layer_saved,
    routed_rows,
)
from memscope.demo.launcher import free_port, spawn
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

S, B = 64, 2  # tokens on a rank: 128
BASE: dict[str, Any] = dict(h=64, f_e=40, E=8, k=2, ep=1, dtype="bfloat16")
CASES: dict[str, dict[str, Any]] = {}
for _disp in ("allgather", "alltoall"):
    CASES[f"{_disp}"] = {**BASE, "dispatcher": _disp}
    CASES[f"{_disp}_fp32"] = {**BASE, "dispatcher": _disp, "dtype": "float32"}
    CASES[f"{_disp}_router_fp32"] = {**BASE, "dispatcher": _disp, "router_dtype": "fp32"}
    CASES[f"{_disp}_gelu"] = {**BASE, "dispatcher": _disp, "gated": False}
    CASES[f"{_disp}_aux_loss"] = {**BASE, "dispatcher": _disp, "aux_loss": True}
    CASES[f"{_disp}_z_loss_router_fp32"] = {
        **BASE, "dispatcher": _disp, "z_loss": True, "router_dtype": "fp32"
    }  # fmt: skip
    CASES[f"{_disp}_capacity_padded"] = {**BASE, "dispatcher": _disp, "cf": 1.5, "pad": True}
    CASES[f"{_disp}_ep2"] = {**BASE, "dispatcher": _disp, "ep": 2}
    # every token's top-k on rank 0's experts: the imbalance bound (moe.imbalance_bound)
    CASES[f"{_disp}_ep2_skewed"] = {**BASE, "dispatcher": _disp, "ep": 2, "skewed": True}


def _settled(ledger: Any, timeout_s: float = 2.0) -> int:
    """Bytes allocated once gloo has let go of the forward's collectives: finished work
    objects (cyclic garbage) and buffers its worker thread frees after ``wait()`` returned
    (``memscope/demo/gloo_release.py``) are gone when two samples 20 ms apart agree."""
    import time

    deadline = time.monotonic() + timeout_s
    gc.collect()
    last = ledger.sample().allocated
    while time.monotonic() < deadline:
        time.sleep(0.02)
        gc.collect()
        now = ledger.sample().allocated
        if now == last:
            break
        last = now
    return int(last)


def _measure(rank: int, world: int, port: int, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per case: (rows reaching this rank's experts, bytes held after forward)."""
    import torch
    import torch.distributed as dist
    from harness.moe_cpu import build_moe_layer, install_moe_cpu_stand_ins
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from memscope.capture.backends.storage import StorageLedgerBackend
    from memscope.demo.tiny_gpt import destroy_process, quiet_megatron_cpu_warnings

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    quiet_megatron_cpu_warnings()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=5),
    )
    try:
        install_moe_cpu_stand_ins()
        parallel_state.initialize_model_parallel(expert_model_parallel_size=world)
        torch.manual_seed(1234 + rank)
        model_parallel_cuda_manual_seed(1234)
        out: dict[str, tuple[int, int]] = {}
        for name in names:
            cfg = CASES[name]
            layer = build_moe_layer(cfg)
            x = torch.randn(S, B, cfg["h"], dtype=getattr(torch, cfg["dtype"]), requires_grad=True)
            if cfg.get("skewed"):  # positive inputs, and only experts 0..k-1 score positive
                with torch.no_grad():
                    x.abs_()
                    weight = layer.router.weight
                    weight.fill_(-1.0)
                    weight[: cfg["k"]] = 1.0
            rows: list[int] = []
            layer.experts.register_forward_pre_hook(
                lambda m, a, rows=rows: rows.append(a[0].shape[0])
            )
            gc.collect()  # earlier cases' cyclic garbage must not be freed mid-measurement
            ledger = StorageLedgerBackend("cpu")
            ledger.start()
            try:
                base = ledger.sample().allocated
                y, _ = layer(x)
                held = _settled(ledger) - base - y.untyped_storage().nbytes()
            finally:
                ledger.stop()
            out[name] = (rows[0], held)
        return out
    finally:
        destroy_process()


# Run a second time on the newest megatron-core (CI's `-m megatron_versions` run): the
# dispatchers' permute changed in 0.17 (megatron_versions.ARGSORT_PERMUTE); a few cases keep
# that run short: both dispatchers and an fp32 router, in one process (the EP cases spawn two).
NEWEST = {"allgather", "alltoall", "alltoall_router_fp32"}


def _cases(names: list[str]) -> list[Any]:
    return [
        pytest.param(n, marks=pytest.mark.megatron_versions) if n in NEWEST else n for n in names
    ]


def _selected(request: pytest.FixtureRequest) -> set[str]:
    """The cases this session's selected tests of this module use (a ``-m`` or ``-k`` run
    measures only those)."""
    out: set[str] = set()
    for item in request.session.items:
        params = getattr(item, "callspec", None)
        if item.module is not request.module or params is None:
            continue
        if "name" in params.params:
            out.add(params.params["name"])
        else:
            out.add(f"{params.params['dispatcher']}_ep2_skewed")
    return out


@pytest.fixture(scope="module")
def measured(request: pytest.FixtureRequest) -> dict[str, list[tuple[int, int]]]:
    """Per selected case, one (rows, held) per rank."""
    result: dict[str, list[tuple[int, int]]] = {}
    selected = _selected(request)
    for world in (1, 2):
        names = [n for n, c in CASES.items() if c["ep"] == world and n in selected]
        if not names:
            continue
        for per_rank in spawn(world, _measure, free_port(), names):
            for name, value in per_rank.items():
                result.setdefault(name, []).append(value)
    return result


def _spec(cfg: dict[str, Any]) -> Any:
    args: dict[str, Any] = dict(
        num_layers=1,
        hidden_size=cfg["h"],
        num_attention_heads=4,
        num_experts=cfg["E"],
        moe_ffn_hidden_size=cfg["f_e"],
        moe_router_topk=cfg["k"],
        expert_model_parallel_size=cfg["ep"],
        world_size=cfg["ep"],
        moe_token_dispatcher_type=cfg["dispatcher"],
        swiglu=cfg.get("gated", True),
        no_bias_swiglu_fusion=True,
        disable_bias_linear=True,
        padded_vocab_size=128,
        seq_length=S,
        micro_batch_size=B,
        global_batch_size=B * cfg["ep"],
        bf16=cfg["dtype"] == "bfloat16",
        transformer_impl="local",
    )
    if cfg.get("router_dtype"):
        args["moe_router_dtype"] = cfg["router_dtype"]
    if cfg.get("aux_loss"):
        args.update(moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-2)
    else:
        args["moe_router_load_balancing_type"] = "none"
    if cfg.get("z_loss"):
        args["moe_z_loss_coeff"] = 1e-3
    if cfg.get("cf"):
        args.update(moe_expert_capacity_factor=cfg["cf"], moe_pad_expert_input_to_capacity=True)
    return spec_from_megatron_args(args)


@pytest.mark.parametrize("name", _cases(list(CASES)))
def test_moe_layer_keeps_what_the_estimate_itemises(measured, name):
    cfg = CASES[name]
    s = _spec(cfg)
    e = 2 if cfg["dtype"] == "bfloat16" else 4
    for rows, held in measured[name]:
        modelled = sum(moe_layer_saved(s, S, B, 1, e, rows=rows).values())
        modelled += moe_global_buffer(s, S, B, 1, e)  # allgather over EP: gathered hidden
        assert held == modelled, (name, rows, held, modelled)
        if cfg["ep"] == 1:  # every routed row stays on the one rank: the balanced count
            assert rows == routed_rows(s, S * B)


@pytest.mark.parametrize("dispatcher", ["allgather", "alltoall"])
def test_skewed_routing_reaches_the_imbalance_bound_on_the_busiest_rank(measured, dispatcher):
    cfg = CASES[f"{dispatcher}_ep2_skewed"]
    balanced = _spec(cfg)
    bound = imbalance_bound(balanced)
    assert bound == 2.0  # ep 2, k 2 <= 4 local experts
    worst = dataclasses.replace(
        balanced, model=dataclasses.replace(balanced.model, moe_token_imbalance=bound)
    )
    (busy_rows, busy_held), (idle_rows, _) = measured[f"{dispatcher}_ep2_skewed"]
    assert idle_rows == 0
    # the busiest rank's rows and held bytes, from the assumption alone (no measured rows)
    assert busy_rows == routed_rows(worst, S * B) == 2 * routed_rows(balanced, S * B)
    modelled = sum(moe_layer_saved(worst, S, B, 1, 2).values()) + moe_global_buffer(
        worst, S, B, 1, 2
    )
    assert busy_held == modelled
    assert modelled > sum(moe_layer_saved(balanced, S, B, 1, 2).values())
