"""Each pipeline-stage role's dense and MoE layers in the transformer planner's estimate
(`paraplan.plan.transformer.stage_kinds`) are the engine's split (Megatron's)."""

from dataclasses import replace

import numpy as np

from paraplan.core.run_settings import RunSettings
from paraplan.plan.transformer.space import Candidates
from paraplan.plan.transformer.stage_kinds import stage_kinds
from paraplan.predict.models import PRESETS


def _cands(rows: list[tuple[int, int, int, int, int]]) -> Candidates:
    """(p, v, decoder_first, decoder_last, acc) rows; the other columns do not split layers."""
    p, v, first, last, acc = (np.array(x, dtype=np.int64) for x in zip(*rows, strict=True))
    one = np.ones_like(p)
    return Candidates(t=one, p=p, d=one, b=one, v=v, schedule=0 * one, recompute=0 * one, sp=0 * one, zero=0 * one,
                      first=first, last=last, cp=one, ep=one, etp=0 * one, acc=acc)


def test_deepseek_v3_first_k_dense_on_eight_stages():
    """61 layers (the first 3 dense) over 8 stages: 8 layers on the first five, 7 on the
    last three; the first holds (3 dense, 5 MoE), the middle ones 8 or 7 MoE layers (four
    and two of them), the last 7 MoE."""
    k = stage_kinds(PRESETS["deepseek-v3"], _cands([(8, 1, 0, 0, 0), (8, 1, 0, 0, 0)]), RunSettings())
    assert k.first.tolist() == [[3, 5]] * 2 and k.last.tolist() == [[0, 7]] * 2
    got = {tuple(pair): n for pair, n in zip(k.middle[0].tolist(), k.middle_count[0].tolist(), strict=True) if n}
    assert got == {(0.0, 7.0): 2, (0.0, 8.0): 4}


def test_interleaved_and_counted_embedding_splits():
    """A dense 32-layer model on 4 stages x 2 chunks: 4 layers a chunk everywhere; on 2
    stages with the embedding and the loss counted as layers (34 slots, 17 a stage): 16
    layers beside the embedding, 16 beside the loss, and no middle stage (count 0); on 4
    stages x 2 chunks with decoder_first/last 6 / 6: 3 a chunk on the end ranks, 5 on the
    middle ones."""
    model = replace(PRESETS["llama3-8b"], num_layers=32)
    k = stage_kinds(model, _cands([(4, 2, 0, 0, 0), (2, 1, 0, 0, 3), (4, 2, 6, 6, 0)]), RunSettings())
    assert k.first.tolist() == [[4, 0], [16, 0], [3, 0]]
    assert k.last.tolist() == [[4, 0], [16, 0], [3, 0]]
    assert k.chunk_first.tolist() == [[4, 0], [0, 0], [3, 0]]
    assert k.middle_count.sum(axis=1).tolist() == [4, 0, 4]
    assert k.middle[2][k.middle_count[2] > 0].tolist() == [[5, 0]]
