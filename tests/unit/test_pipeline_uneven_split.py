"""Uneven first/last pipeline stages (Megatron-Core's
decoder_first/last_pipeline_num_layers): the split, its rules, the run table, and
interleaving where the stages x chunks do not divide the layers."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import InputFileError, StrategyError
from paraplan.core.run_settings import RunSettings, interleaved_uneven_split, pipeline_layer_split
from paraplan.core.transformer import TransformerModel
from paraplan.plan.transformer.estimate import estimate
from paraplan.plan.transformer.space import SCHEDULES, SearchSpace, enumerate_candidates
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.models import PRESETS
from paraplan.predict.predictor import candidate_settings, predict_settings
from paraplan.predict.runtable import read_run_table

CAL = load_calibration()
LLAMA405 = PRESETS["llama3-405b"]


def test_llama3_405b_meta_split_seven_layers_on_the_ends():
    """Llama 3 405B: 126 layers on 16 stages, one layer fewer on the first and last."""
    assert pipeline_layer_split(126, 16, 1, 7, 7) == [7] + [8] * 14 + [7]


def test_interleaved_chunks_split_each_rank_evenly():
    split = pipeline_layer_split(126, 16, 2, 8, 6)  # virtual stage c x 16 + r
    assert split == ([4] * 15 + [3]) * 2 and sum(split) == 126


def test_even_split_unchanged():
    assert pipeline_layer_split(10, 4) == [3, 3, 2, 2]
    assert pipeline_layer_split(16, 2, 4) == [2] * 8


@pytest.mark.parametrize(("layers", "p", "v", "expected"), [
    (128, 16, 2, (0, 0)),  # divides: Megatron's even split
    (126, 16, 2, (8, 6)),  # middle ranks 8, first/last share 14, the head's rank the smaller half
    (126, 16, 3, None),  # middle ranks 9 leave nothing for the ends
    (125, 16, 2, None),  # odd: no rank count divisible by 2 sums to it
    (14, 4, 2, (4, 2)),
])
def test_interleaved_uneven_split(layers, p, v, expected):
    assert interleaved_uneven_split(layers, p, v) == expected
    if expected not in (None, (0, 0)):
        first, last = expected
        model = TransformerModel("m", num_layers=layers, hidden_size=256, num_attention_heads=4, seq_length=128,
                                 vocab_size=1000)
        RunSettings(pipeline_model_parallel_size=p, virtual_pipeline_model_parallel_size=v, global_batch_size=p,
                    decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last).check(model)


M14 = TransformerModel("m14", num_layers=14, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                       vocab_size=32000)


@pytest.mark.parametrize(("first", "last", "v", "message"), [
    (3, 3, 2, "decoder_first_pipeline_num_layers 3 is not divisible by virtual_pipeline_model_parallel_size 2"),
    (4, 3, 1, "the 7 layers between the first and last pipeline stage do not split evenly over the 2 middle"),
    (4, 4, 3, "decoder_first_pipeline_num_layers 4 is not divisible by virtual_pipeline_model_parallel_size 3"),
    (2, 6, 2, "3 layers per middle pipeline stage are not divisible"),  # 6 over 2 stages
    (10, 10, 1, "leave -6 of the 14 layers for 2 middle pipeline stages"),
])
def test_megatron_rules_for_uneven_stages(first, last, v, message):
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=v, global_batch_size=4,
                    decoder_first_pipeline_num_layers=first, decoder_last_pipeline_num_layers=last)
    with pytest.raises(StrategyError, match=message.replace("(", r"\(")):
        s.check(M14)


def test_the_engine_runs_the_uneven_split():
    cluster = load_cluster("dgx-a100")
    s = RunSettings(pipeline_model_parallel_size=4, virtual_pipeline_model_parallel_size=2, global_batch_size=8,
                    decoder_first_pipeline_num_layers=4, decoder_last_pipeline_num_layers=2)
    st = run_structure(M14, s, cluster, CAL.comm_model(cluster))
    assert st.layers_per_vstage.tolist() == [2, 2, 2, 1, 2, 2, 2, 1]
    layer = M14.layer_params
    assert st.rank_params[1] == pytest.approx(4 * layer) and st.rank_params[2] == pytest.approx(4 * layer)


def test_predictor_searches_uneven_interleaving_for_llama3_405b_on_pp16():
    s = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, data_parallel_size=4,
                    global_batch_size=64, micro_batch_size=1)
    cands = candidate_settings(LLAMA405, s, search_micro_batch_size=False, search_virtual_stages=True)
    split = {(c.virtual_pipeline_model_parallel_size, c.decoder_first_pipeline_num_layers,
              c.decoder_last_pipeline_num_layers) for c in cands}
    assert split == {(1, 0, 0), (2, 8, 6)}


def test_planner_enumerates_uneven_interleaving_and_estimates_it_like_the_engine():
    cand = enumerate_candidates(LLAMA405, 16 * 8 * 2, 64, 8, SearchSpace(tensor_sizes=(8,)))
    mask = (cand.p == 16) & (cand.v == 2) & (cand.acc == 0)  # acc: the embedding / loss counted as layers
    assert mask.any() and set(cand.first[mask]) == {8} and set(cand.last[mask]) == {6}
    # small model: the closed-form estimate of an uneven interleaved run tracks the engine
    cluster = load_cluster("dgx-a100")
    comm = CAL.comm_model(cluster)
    space = SearchSpace(tensor_sizes=(1,), schedules=("interleaved_1f1b",), recompute=("none",), zero_stages=(0,),
                        sequence_parallel=(False,), max_micro_batch_size=1, max_virtual_stages=2)
    cand = enumerate_candidates(M14, 4, 64, 8, space)
    cand = cand.take(np.flatnonzero((cand.p == 4) & (cand.acc == 0)))
    assert cand.first.tolist() == [4] and cand.last.tolist() == [2]
    base = RunSettings(global_batch_size=64)
    est = estimate(M14, cand, base, cluster, comm, CAL.efficiency)
    (exact, _), = predict_settings(M14, [cand.settings(0, base)], cluster, comm, CAL.efficiency)
    # (64 micro-batches: 1.9% above; the estimate only ranks, the planner re-times its best exactly)
    assert est.iteration_s[0] == pytest.approx(exact.iteration_s, rel=0.025)
    assert SCHEDULES[int(cand.schedule[0])] == "interleaved_1f1b"


HEADER = ("name,num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size,"
          "virtual_pipeline_model_parallel_size,decoder_first_pipeline_num_layers,decoder_last_pipeline_num_layers")


def test_run_table_reads_the_uneven_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "\nx,14,1024,16,1024,32000,1,4,1,8,1,2,4,2\ny,14,1024,16,1024,32000,1,4,1,8,1,2,,\n")
    a, b = read_run_table(path)[1]
    assert (a.settings.decoder_first_pipeline_num_layers, a.settings.decoder_last_pipeline_num_layers) == (4, 2)
    assert not b.settings.uneven_pipeline_split
    path.write_text(HEADER + "\nx,14,1024,16,1024,32000,1,4,1,8,1,2,3,3\n")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert ("runs.csv:2: impossible run: decoder_first_pipeline_num_layers 3 is not divisible by "
            "virtual_pipeline_model_parallel_size 2") in str(err.value)
    assert replace(a.settings, decoder_first_pipeline_num_layers=0).uneven_pipeline_split
