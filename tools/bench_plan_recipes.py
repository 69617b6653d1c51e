"""Where ``memscope plan`` ranks published training recipes' own layouts.

Each recipe below is a published model + parallel layout + GPU count (sources named per
recipe: NVIDIA-NeMo/Megatron-Bridge ``src/megatron/bridge/recipes/`` and NVIDIA/NeMo's
``nemo/collections/llm/recipes/``). The recipe is given to the planner as the user's config,
planned for its own GPU count on 80 GiB H100s with the default 10% headroom, and this prints
the recipe's rank among the layouts that fit (by the cost model's step time), its cost terms,
and when it is not in the top 3, by which term plan 1 beats it. A recipe with a custom
``pipeline_model_parallel_layout`` (DeepSeek-V3) is estimated and costed with it, and ranked
against the splits the planner searches (it searches no custom layout itself).
Last line: ``recipes: N of M in the top 3; K beaten with the term named; J not searched``.

Usage::

    python tools/bench_plan_recipes.py [--only NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from memscope.analysis.static.config import TrainingSpec
from memscope.analysis.static.planner import COST_TERMS, CostModel, plan
from memscope.analysis.static.spec_checks import validate_spec
from memscope.inputs.megatron_args import spec_from_megatron_args
from memscope.units import format_bytes

BRIDGE = "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/"
BUDGET = 80 * 2**30  # an H100 80GB: the recipes run there, so their peaks are judged on all of it
TOP = 3

_LLAMA3 = {"normalization": "RMSNorm", "swiglu": True, "group_query_attention": True,
           "num_query_groups": 8, "position_embedding_type": "rope",
           "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
           "vocab_size": 128256, "bf16": True, "transformer_impl": "transformer_engine",
           "use_flash_attn": True, "micro_batch_size": 1, "attention_dropout": 0.0,
           "hidden_dropout": 0.0}  # fmt: skip
_70B = {"num_layers": 80, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64}
_8B = {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32}


@dataclass(frozen=True)
class Recipe:
    """A published recipe: its Megatron args (layout included) and GPU count."""

    name: str
    source: str
    gpus: int
    args: dict[str, Any] = field(default_factory=dict)
    not_searched: str = ""  # why the planner cannot express it, when it cannot
    tp_comm_overlap: bool = False  # the recipe's CommOverlapConfig(tp_comm_overlap=True)
    bf16_state: bool = False  # the recipe keeps bf16 moments and main gradients: so may plans


RECIPES = (
    Recipe("Llama-3 8B 16k", BRIDGE + "llama/h100/llama3.py "
           "llama3_8b_pretrain_16gpu_h100_bf16_16k_config", 16,
           {**_LLAMA3, **_8B, "seq_length": 16384, "global_batch_size": 512,
            "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
            "context_parallel_size": 2, "sequence_parallel": True,
            "use_distributed_optimizer": True}),
    Recipe("Llama-3 70B", BRIDGE + "llama/h100/llama3.py "
           "llama3_70b_pretrain_32gpu_h100_bf16_config", 32,
           {**_LLAMA3, **_70B, "seq_length": 8192, "global_batch_size": 512,
            "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4,
            "num_layers_per_virtual_pipeline_stage": 4, "context_parallel_size": 2,
            "sequence_parallel": True, "use_distributed_optimizer": True},
           tp_comm_overlap=True),
    Recipe("Llama-3.1 405B SFT", BRIDGE + "llama/h100/llama3.py "
           "llama31_405b_sft_128gpu_h100_bf16_config (embedding and loss counted in the "
           "pipeline split: 7 decoder layers on the first and last stages)", 128,
           {**_LLAMA3, "num_layers": 126, "hidden_size": 16384, "ffn_hidden_size": 53248,
            "num_attention_heads": 128, "seq_length": 2048, "global_batch_size": 16,
            "tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 16,
            "decoder_first_pipeline_num_layers": 7, "decoder_last_pipeline_num_layers": 7,
            "sequence_parallel": True, "use_distributed_optimizer": False,
            "accumulate_allreduce_grads_in_fp32": False}, tp_comm_overlap=True),
    Recipe("Mixtral 8x7B", "NVIDIA/NeMo nemo/collections/llm/recipes/mixtral_8x7b.py "
           "(trainer: 8 nodes x 8; the pretrain_recipe's 2 x 8 cannot hold EP 8 beside "
           "TP 1 PP 4: EP must divide DP 4)", 64,
           {**_LLAMA3, "num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336,
            "num_attention_heads": 32, "vocab_size": 32000, "seq_length": 4096,
            "global_batch_size": 512, "num_experts": 8, "moe_router_topk": 2,
            "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall",
            "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4,
            "num_layers_per_virtual_pipeline_stage": 1, "expert_model_parallel_size": 8,
            "sequence_parallel": False, "use_distributed_optimizer": True}),
    Recipe("Qwen3-30B-A3B", BRIDGE + "qwen/h100/qwen3_moe.py "
           "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", 16,
           {**_LLAMA3, "num_layers": 48, "hidden_size": 2048, "ffn_hidden_size": 6144,
            "num_attention_heads": 32, "num_query_groups": 4, "kv_channels": 128,
            "qk_layernorm": True, "vocab_size": 151936, "seq_length": 4096,
            "global_batch_size": 1024, "num_experts": 128, "moe_router_topk": 8,
            "moe_ffn_hidden_size": 768, "moe_grouped_gemm": True,
            "moe_token_dispatcher_type": "alltoall", "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 16,
            "expert_tensor_parallel_size": 1, "use_distributed_optimizer": True}),
    Recipe("DeepSeek-V3", BRIDGE + "deepseek/h100/deepseek_v3.py "
           "deepseek_v3_pretrain_1024gpu_h100_bf16_config (model: models/deepseek/"
           "deepseek_v3_bridge.py and deepseek-ai/DeepSeek-V3's config.json; layout from "
           "set_deepseek_v3_pipeline_model_parallel_layout for PP 16; the all-to-all "
           "dispatcher, HybridEP not priced)", 1024,
           {**_LLAMA3, "num_layers": 61, "hidden_size": 7168, "ffn_hidden_size": 18432,
            "num_attention_heads": 128, "group_query_attention": False,
            "num_query_groups": None, "vocab_size": 129280,
            "make_vocab_size_divisible_by": 1280, "seq_length": 4096,
            "global_batch_size": 4096, "multi_latent_attention": True, "q_lora_rank": 1536,
            "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
            "v_head_dim": 128, "qk_layernorm": True, "num_experts": 256,
            "moe_router_topk": 8, "moe_ffn_hidden_size": 2048,
            "moe_shared_expert_intermediate_size": 2048,
            "moe_layer_freq": [0] * 3 + [1] * 58, "moe_grouped_gemm": True,
            "moe_token_dispatcher_type": "alltoall", "moe_router_score_function": "sigmoid",
            "moe_router_enable_expert_bias": True, "moe_router_dtype": "fp32",
            "moe_permute_fusion": True, "moe_shared_expert_overlap": True,
            "moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 1e-4,
            "mtp_num_layers": 1, "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 16,
            "pipeline_model_parallel_layout": [["embedding"] + ["decoder"] * 4]
            + [["decoder"] * 4] * 14 + [["decoder", "mtp", "loss"]],
            "expert_model_parallel_size": 64, "expert_tensor_parallel_size": 1,
            "sequence_parallel": True, "use_distributed_optimizer": True,
            "use_precision_aware_optimizer": True, "main_grads_dtype": "bf16",
            "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16",
            "accumulate_allreduce_grads_in_fp32": False}, bf16_state=True),
)  # fmt: skip


def recipe_spec(recipe: Recipe) -> TrainingSpec:
    """The recipe as the estimator's spec, on H100s at its own GPU count."""
    return validate_spec(
        dataclasses.replace(
            spec_from_megatron_args({**recipe.args, "world_size": recipe.gpus}), gpu="h100"
        )
    )


def judge(recipe: Recipe) -> dict[str, Any]:
    """The planner's verdict on ``recipe``: rank, cost, and plan 1's winning term."""
    spec = recipe_spec(recipe)
    model = CostModel(tp_comm_overlap=recipe.tp_comm_overlap)
    result = plan(
        spec, recipe.gpus, BUDGET, cost_model=model, top=TOP, bf16_state=recipe.bf16_state
    )
    cur = result["current"]
    out: dict[str, Any] = {"rank": cur["rank"], "fits": cur["fits"], "cost": cur["cost"],
                           "peak_bytes": cur["peak_bytes"], "fitting": result["fitting"],
                           "beaten_by": None}  # fmt: skip
    if result["plans"] and (not cur["fits"] or cur["rank"] > TOP):  # rank: ties within resolution
        best = result["plans"][0]
        term = min(COST_TERMS, key=lambda k: best["vs_current"][k])
        out["beaten_by"] = {"flags": best["flags"], "term": term,
                            "change": best["vs_current"][term],
                            "total": best["vs_current"]["total"]}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None, help="one recipe, by name")
    ns = parser.parse_args(argv)
    top = named = skipped = 0
    chosen = [r for r in RECIPES if ns.only in (None, r.name)]
    for recipe in chosen:
        print(f"{recipe.name} on {recipe.gpus} GPUs ({recipe.source})")
        if recipe.not_searched:
            skipped += 1
            print(f"  not searched: {recipe.not_searched}")
            continue
        t0 = time.perf_counter()
        v = judge(recipe)
        terms = ", ".join(f"{k} {v['cost'][k]:.1%}" for k in COST_TERMS if v["cost"][k])
        fits = "fits" if v["fits"] else "does NOT fit"
        print(f"  recipe: peak {format_bytes(v['peak_bytes'])} ({fits}); step time "
              f"x{v['cost']['total']:.3f} ({terms or 'no overhead'})")  # fmt: skip
        if v["fits"] and v["rank"] <= TOP:
            top += 1
            print(f"  rank {v['rank']} of {v['fitting']} ({time.perf_counter() - t0:.1f} s)")
        else:
            b = v["beaten_by"]
            named += b is not None
            where = f"rank {v['rank']} of {v['fitting']}" if v["fits"] else "not ranked"
            print(f"  {where}; plan 1 is {b['total']:+.1%} in step time, most by "
                  f"{b['term']} {b['change']:+.1%}: {b['flags']}")  # fmt: skip
    print(f"recipes: {top} of {len(chosen) - skipped} in the top {TOP}; {named} beaten with the "
          f"term named; {skipped} not searched")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
