"""Static (config-only) memory estimation for Megatron GPT training, per rank."""

from memscope.analysis.static.estimator import (
    SOURCE,
    RankEstimate,
    estimate_all_ranks,
    estimate_rank,
)

__all__ = ["SOURCE", "RankEstimate", "estimate_all_ranks", "estimate_rank"]
