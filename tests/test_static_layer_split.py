"""Layer split over pipeline stages and virtual chunks, checked against megatron-core's own
``get_num_layers_to_build`` / ``get_transformer_layer_offset``; and ``--rank N``."""

from __future__ import annotations

import json
import os

import pytest

from memscope.analysis.static.config import chunk_layer_counts, chunk_layer_offset
from memscope.analysis.static.estimator import estimate_rank
from memscope.analysis.static.params import RankPosition, rank_params
from memscope.cli import main
from memscope.inputs.megatron_args import spec_from_megatron_args

pytestmark = pytest.mark.megatron_versions

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "configs", "static", "llama3_8b_tp4_pp2.json")

BASE = dict(num_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=256, seq_length=32,
            micro_batch_size=1, num_microbatches=4)  # fmt: skip
CASES = [
    dict(num_layers=7, pipeline_model_parallel_size=2,
         account_for_embedding_in_pipeline_split=True),
    dict(num_layers=7, pipeline_model_parallel_size=2, account_for_loss_in_pipeline_split=True),
    dict(num_layers=6, pipeline_model_parallel_size=2, account_for_embedding_in_pipeline_split=True,
         account_for_loss_in_pipeline_split=True),
    dict(num_layers=7, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
         account_for_embedding_in_pipeline_split=True),
    dict(num_layers=10, pipeline_model_parallel_size=3, decoder_first_pipeline_num_layers=2,
         decoder_last_pipeline_num_layers=2),
    dict(num_layers=12, pipeline_model_parallel_size=3, virtual_pipeline_model_parallel_size=2,
         decoder_first_pipeline_num_layers=2, decoder_last_pipeline_num_layers=6),
]  # fmt: skip
MEGATRON = {
    "decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage",
}


def _megatron_split(case):
    import torch
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    kw = {MEGATRON.get(k, k): v for k, v in case.items()}
    cfg = TransformerConfig(hidden_size=64, num_attention_heads=4, pipeline_dtype=torch.float32,
                            **kw)  # fmt: skip
    pp, vpp = cfg.pipeline_model_parallel_size, cfg.virtual_pipeline_model_parallel_size
    chunks = range(vpp) if vpp else [None]
    counts = [[get_num_layers_to_build(cfg, c, r) for c in chunks] for r in range(pp)]
    offsets = [[get_transformer_layer_offset(cfg, c, r) for c in chunks] for r in range(pp)]
    return counts, offsets


@pytest.mark.parametrize("case", CASES)
def test_layer_split_matches_megatron_core(case):
    spec = spec_from_megatron_args({**BASE, **case})
    m, p = spec.model, spec.parallel
    counts, offsets = _megatron_split(case)
    assert [chunk_layer_counts(m, p, r) for r in range(p.pp)] == counts
    ours = [[chunk_layer_offset(m, p, r, c) for c in range(len(counts[r]))] for r in range(p.pp)]
    assert ours == offsets
    layers = set()
    for r in range(p.pp):
        est = estimate_rank(spec, RankPosition(0, r))
        names = {t.name.split("decoder.layers.")[1].split(".")[0] for t in est.params
                 if "decoder.layers." in t.name}  # fmt: skip
        assert len(names) == sum(counts[r])
        layers |= {int(n) for n in names}
    assert layers == set(range(m.num_layers))  # every layer on exactly one stage


def test_account_for_embedding_moves_a_layer_off_the_first_stage():
    plain = spec_from_megatron_args({**BASE, "num_layers": 8, "pipeline_model_parallel_size": 2})
    emb = spec_from_megatron_args({**BASE, "num_layers": 7, "pipeline_model_parallel_size": 2,
                                   "account_for_embedding_in_pipeline_split": True})  # fmt: skip
    first = len(rank_params(emb, RankPosition(0, 0)))
    assert first < len(rank_params(plain, RankPosition(0, 0)))
    assert (
        estimate_rank(emb, RankPosition(0, 0)).peak_memory_bytes
        < estimate_rank(plain, RankPosition(0, 0)).peak_memory_bytes
    )


@pytest.mark.parametrize(
    "case, match",
    [
        (dict(num_layers=6, pipeline_model_parallel_size=2,
              account_for_embedding_in_pipeline_split=True), r"must divide model.num_layers \+ 1"),
        (dict(num_layers=6, pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=2,
              account_for_loss_in_pipeline_split=True), "cannot be combined"),
        (dict(num_layers=9, pipeline_model_parallel_size=3, virtual_pipeline_model_parallel_size=2,
              decoder_first_pipeline_num_layers=3), "divisible by parallel.vpp"),
        (dict(num_layers=4, pipeline_model_parallel_size=2, pipeline_model_parallel_layout="Et|tL",
              account_for_loss_in_pipeline_split=True), "cannot be combined"),
        (dict(num_layers=8, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
              microbatch_group_size_per_vp_stage=1), "microbatch_group_size_per_vp_stage"),
    ],
)  # fmt: skip
def test_invalid_splits_are_refused_with_the_reason(case, match):
    with pytest.raises(ValueError, match=match):
        spec_from_megatron_args({**BASE, **case})


def test_rank_option_reports_that_rank(tmp_path, capsys):
    rc = main(["analyze-static", "--config", EXAMPLE, "--outdir", str(tmp_path), "--rank", "7"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "on rank 7 (tp=3 pp=0" in out
    report = json.loads((tmp_path / "static_report.json").read_text())
    assert report["rank"] == 7 and report["summary"]["rank"] == 7
    assert 7 in report["summary"]["global_ranks"]
    assert "Detailed rank: 7" in (tmp_path / "static_report.md").read_text()
