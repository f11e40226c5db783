"""Pipeline splits as Megatron-Core expresses them: the layout string
(`--pipeline-model-parallel-layout`), the embedding and loss counted as layers
(`--account-for-embedding/loss-in-pipeline-split`), their rules, the run table, and
what the split does to the pipeline's bubble."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.clusters import load_cluster
from paraplan.core import InputFileError, StrategyError
from paraplan.core.pipeline_layout import LayoutError, check_layout, parse_layout
from paraplan.core.pipeline_split import embedding_loss_split
from paraplan.core.run_settings import RunSettings
from paraplan.core.transformer import TransformerModel
from paraplan.predict.build import run_structure
from paraplan.predict.calibration import load_calibration
from paraplan.predict.models import PRESETS
from paraplan.predict.predictor import candidate_settings
from paraplan.predict.runtable import read_run_table
from paraplan.sim.engine import PipelineCosts, execute, execute_flushed
from paraplan.sim.schedules import cached_orders

LLAMA405 = PRESETS["llama3-405b"]
DSV3 = PRESETS["deepseek-v3"]
BRIDGE_DSV3 = "Et|(tt|)*30mL"


def small(layers: int, mtp: int = 0) -> TransformerModel:
    return TransformerModel("m", num_layers=layers, hidden_size=256, num_attention_heads=4, seq_length=128,
                            vocab_size=1000, mtp_num_layers=mtp)


# --- the layout string ---------------------------------------------------------------------------

def test_bridge_deepseek_v3_layout_expands_to_32_virtual_stages():
    layout = parse_layout(BRIDGE_DSV3)
    assert layout.stages == ("Et", *["tt"] * 30, "mL")
    assert layout.transformer_layers == (1, *[2] * 30, 0)
    assert check_layout(layout, 8, 61, 1) == 4  # 32 virtual stages on 8 ranks: v = 4


def test_megatron_docstring_example_with_commas_and_empty_counts():
    """Megatron-Core's own example 'E|(tt|)*2,(t|)*4,mL' on 4 ranks: v = 2."""
    layout = parse_layout("E|(tt|)*2,(t|)*4,mL")
    assert layout.stages == ("E", "tt", "tt", "t", "t", "t", "t", "mL")
    assert check_layout(layout, 4, 8, 1) == 2


def test_single_symbol_repeat_and_empty_stages():
    assert parse_layout("Et*3||t*2L").stages == ("Ettt", "", "ttL")
    assert parse_layout("E(t)*0|tL").stages == ("E", "tL")


@pytest.mark.parametrize(("text", "message"), [
    ("Etx|L", "character 3 'x': not a layout symbol (expected E embedding, t transformer layer, m MTP layer, "
              "L loss, | virtual-stage boundary, (...)*N or X*N)"),
    ("E(tt|)*", "at the end: expected the number of repetitions after '*'"),
    ("E((t)*2|)*2L", "character 3 '(': nested parentheses are not in Megatron's layout grammar"),
    ("E(tt)L", "character 6 'L': a parenthesised group must be followed by '*N'"),
    ("E|t*2*3L", "character 6 '*': '*N' must follow a symbol or a parenthesised group"),
    ("E|)tL", "character 3 ')': ')' without a matching '('"),
    ("E|(tL", "at the end: '(' without a matching ')'"),
    ("E|()*2L", "character 4 ')': an empty group '()'"),
    ("(t)*200000", "at the end: the layout expands to more than 100,000 symbols"),
    ("  ", "an empty layout (leave the cell empty for Megatron's default split)"),
])
def test_parse_errors_name_the_character(text, message):
    with pytest.raises(LayoutError) as err:
        parse_layout(text)
    assert str(err.value) == message


@pytest.mark.parametrize(("text", "p", "layers", "mtp", "message"), [
    ("Et|tt|tL", 2, 4, 0, "pipeline_model_parallel_layout 'Et|tt|tL' has 3 virtual stages, not a multiple of "
                          "pipeline_model_parallel_size 2"),
    ("Ett|ttL", 2, 5, 0, "pipeline_model_parallel_layout 'Ett|ttL' holds 4 transformer layers ('t'); the model "
                         "has 5"),
    ("tE|ttL", 2, 3, 0, "pipeline_model_parallel_layout 'tE|ttL': the embedding 'E' must open the first virtual "
                        "stage (Megatron builds it on the first model chunk of the first pipeline rank)"),
    ("Ett|tLt", 2, 4, 0, "pipeline_model_parallel_layout 'Ett|tLt': the loss 'L' must close the last virtual "
                         "stage (Megatron builds the output layer and loss on the last model chunk of the last "
                         "pipeline rank)"),
    ("Ett|LtL", 2, 3, 0, "pipeline_model_parallel_layout 'Ett|LtL' names the loss ('L') 2 times; expected once"),
    ("Ett|ttL", 2, 4, 1, "pipeline_model_parallel_layout 'Ett|ttL' holds 0 MTP layers ('m'); the model has "
                         "mtp_num_layers 1"),
    ("Ett|mtL", 2, 3, 1, "pipeline_model_parallel_layout 'Ett|mtL': every transformer layer 't' must come before "
                         "the MTP layers 'm'"),
    ("Ettt|(tt|)*29,m|L", 32, 61, 1,
     "pipeline_model_parallel_layout 'Ettt|(tt|)*29,m|L': MTP layers on a virtual stage of their own (Megatron's "
     "standalone MTP) are not modelled; paraplan prices them beside the output layer and loss, on the last "
     "virtual stage"),
])
def test_layout_rules(text, p, layers, mtp, message):
    with pytest.raises(StrategyError) as err:
        check_layout(parse_layout(text), p, layers, mtp)
    assert str(err.value) == message


def test_layout_fixes_v_and_excludes_the_other_split_settings():
    model = small(4)
    base = RunSettings(pipeline_model_parallel_size=2, global_batch_size=4, pipeline_model_parallel_layout="Ett|ttL")
    base.check(model)
    assert base.layers_per_virtual_stage(4) == [2, 2]
    with pytest.raises(StrategyError, match=r"^pipeline_model_parallel_layout 'Et\|t\|t\|tL' has 4 virtual stages "
                       r"= pipeline_model_parallel_size 2 x 2, but virtual_pipeline_model_parallel_size is 1$"):
        replace(base, pipeline_model_parallel_layout="Et|t|t|tL").check(model)
    for key, value in (("decoder_first_pipeline_num_layers", 2), ("account_for_loss_in_pipeline_split", True)):
        with pytest.raises(StrategyError) as err:
            replace(base, **{key: value}).check(model)
        assert str(err.value) == (f"pipeline_model_parallel_layout cannot be combined with {key} (the layout "
                                  "places every layer itself; Megatron-Core refuses both)")


# --- the embedding and the loss counted as layers -------------------------------------------------

def test_llama3_405b_embedding_and_loss_as_layers():
    """126 layers + embedding + loss = 128 slots over 16 ranks: 8 each, the first and
    last rank one transformer layer fewer (Meta's statement)."""
    assert embedding_loss_split(126, 16, 1, True, True) == [7] + [8] * 14 + [7]
    assert embedding_loss_split(126, 16, 2, True, True) == [3] + [4] * 30 + [3]
    # v = 8: one slot per virtual stage; the first holds only the embedding, the last only the loss
    assert embedding_loss_split(126, 16, 8, True, True) == [0] + [1] * 126 + [0]
    assert embedding_loss_split(7, 2, 1, True, False) == [3, 4]
    settings = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=16,
                           virtual_pipeline_model_parallel_size=8, data_parallel_size=1, global_batch_size=16,
                           account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    settings.check(LLAMA405)  # 16 x 8 virtual stages > 126 layers: allowed, the ends hold the embedding / loss


@pytest.mark.parametrize(("changes", "message"), [
    ({"pipeline_model_parallel_size": 3},
     "126 layers + the embedding + the loss = 128 are not divisible by pipeline_model_parallel_size 3"),
    ({"virtual_pipeline_model_parallel_size": 3},
     "8 layers per pipeline rank (counting the embedding + the loss) are not divisible by "
     "virtual_pipeline_model_parallel_size 3"),
    ({"account_for_loss_in_pipeline_split": False},
     "126 layers + the embedding = 127 are not divisible by pipeline_model_parallel_size 16"),
    ({"decoder_first_pipeline_num_layers": 7},
     "account_for_embedding/loss_in_pipeline_split cannot be combined with decoder_first/last_pipeline_num_layers "
     "(Megatron-Core refuses both at once)"),
])
def test_embedding_loss_split_rules(changes, message):
    settings = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, data_parallel_size=1,
                           global_batch_size=48, account_for_embedding_in_pipeline_split=True,
                           account_for_loss_in_pipeline_split=True)
    with pytest.raises(StrategyError) as err:
        replace(settings, **changes).check(LLAMA405)
    assert str(err.value) == message


def test_searched_v_takes_every_divisor_of_the_slots_per_rank():
    """With the embedding and loss counted, v runs over the divisors of 8 slots per rank
    (v = 8 included, beyond 126 // 16), with no first/last counts added."""
    settings = RunSettings(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, data_parallel_size=128,
                           global_batch_size=2048, account_for_embedding_in_pipeline_split=True,
                           account_for_loss_in_pipeline_split=True)
    cands = candidate_settings(LLAMA405, settings, False, True)
    assert sorted(c.virtual_pipeline_model_parallel_size for c in cands) == [1, 2, 4, 8]
    assert not any(c.uneven_pipeline_split for c in cands)


# --- what the split does ----------------------------------------------------------------------------

def test_hand_computed_bubble_of_two_splits():
    """4 layers on 2 stages, 1F1B, 4 micro-batches, a layer's forward 1 s and backward
    2 s, transfers free. Layout 'Ettt|tL' (3 + 1 layers): stage 0 (3 s + 6 s) paces the
    pipeline, 4 x 9 = 36 s, busy 36 + 12 s of 72: bubble 1/3. The embedding and loss
    counted as layers (2 + 2): (M + p - 1)(2 + 4) = 30 s, busy 48 of 60: bubble 1/5."""
    model = small(4)
    base = RunSettings(pipeline_model_parallel_size=2, global_batch_size=4)
    runs = {}
    for name, settings in (("layout", replace(base, pipeline_model_parallel_layout="Ettt|tL")),
                           ("counted", replace(base, account_for_embedding_in_pipeline_split=True,
                                               account_for_loss_in_pipeline_split=True))):
        settings.check(model)
        layers = np.array(settings.layers_per_virtual_stage(model.num_layers), dtype=float)
        runs[name] = execute_flushed(2, 4, PipelineCosts(layers * 1.0, layers * 2.0, np.zeros(2), np.zeros(1),
                                                         np.zeros(1)))
    assert runs["layout"].makespan_s == pytest.approx(36.0)
    assert runs["layout"].bubble_fraction() == pytest.approx(1 / 3)
    assert runs["counted"].makespan_s == pytest.approx(30.0)
    assert runs["counted"].bubble_fraction() == pytest.approx(1 / 5)


def test_hand_computed_interleaved_bubble():
    """6 layers, 2 ranks x 2 chunks, 2 micro-batches, the embedding and loss counted:
    8 slots, virtual stages [1, 2, 2, 1] (the layout 'Et|tt|tt|tL' says the same); a
    layer's forward 1 s, backward 2 s. Megatron's interleaved order: rank 0 runs its 4
    forwards then its 4 backwards, rank 1 two forwards, F B F B on chunk 1, then two
    backwards. By hand: rank 0 forwards end at 1, 2, 5, 7 (waiting on rank 1's chunk 0
    at 3 and 5); rank 1 ends F 3, 5, 6, B 8, F 9, B 11; rank 0's chunk-1 backwards end
    at 12 and 16, rank 1's chunk-0 backwards at 16 and 20, rank 0's chunk-0 backwards at
    18 and 22. Makespan 22 s; each rank busy 18 s: bubble 8 / 44 = 2 / 11."""
    counted = RunSettings(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                          global_batch_size=2, account_for_embedding_in_pipeline_split=True,
                          account_for_loss_in_pipeline_split=True)
    layout = replace(counted, account_for_embedding_in_pipeline_split=False,
                     account_for_loss_in_pipeline_split=False, pipeline_model_parallel_layout="Et|tt|tt|tL")
    for settings in (counted, layout):
        settings.check(small(6))
        layers = np.array(settings.layers_per_virtual_stage(6), dtype=float)
        assert list(layers) == [1, 2, 2, 1]
        run = execute(cached_orders("interleaved_1f1b", 2, 2, 1, 2),
                      PipelineCosts(layers, 2 * layers, np.zeros(4), np.zeros(3), np.zeros(3)), 2)
        assert run.makespan_s == pytest.approx(22.0)
        assert run.bubble_fraction() == pytest.approx(2 / 11)


def test_execution_model_places_the_bridge_layout():
    """DeepSeek-V3 with Megatron-Bridge's layout on 8 ranks x 4 chunks: the layer counts
    per virtual stage are the layout's; the MTP layer and the head's weights sit on the
    last rank, the embedding's on the first."""
    settings = RunSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=8, data_parallel_size=64,
                           virtual_pipeline_model_parallel_size=4, expert_model_parallel_size=64,
                           expert_tensor_parallel_size=1, sequence_parallel=True, use_distributed_optimizer=True,
                           global_batch_size=8192, dtype="fp8", pipeline_model_parallel_layout=BRIDGE_DSV3)
    cluster = load_cluster("dgx-h100")
    st = run_structure(DSV3, settings, cluster, load_calibration().comm_model(cluster))
    assert list(st.layers_per_vstage) == [1, *[2] * 30, 0]
    # rank r holds chunks r, r + 8, r + 16, r + 24: the last rank 2 + 2 + 2 + 0 = 6 layers, the first 1 + 6 = 7
    assert list(st.layers_per_vstage.reshape(4, 8).sum(axis=0)) == [7, 8, 8, 8, 8, 8, 8, 6]
    assert st.expert_rank_params is not None and st.expert_rank_params[-1] > st.expert_rank_params[1]


# --- the run table ----------------------------------------------------------------------------------

HEADER = ("num_layers,hidden_size,num_attention_heads,seq_length,vocab_size,tensor_model_parallel_size,"
          "pipeline_model_parallel_size,data_parallel_size,global_batch_size,micro_batch_size,"
          "virtual_pipeline_model_parallel_size,account_for_embedding_in_pipeline_split,"
          "account_for_loss_in_pipeline_split,pipeline_model_parallel_layout\n")


def test_run_table_reads_the_split_columns(tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + "6,256,4,128,1000,1,2,1,4,1,,,,Et|tt|tt|tL\n"
                    "6,256,4,128,1000,1,2,1,4,1,,true,true,\n", encoding="utf-8")
    _, (a, b) = read_run_table(path)
    assert a.settings.virtual_pipeline_model_parallel_size == 2 and not a.search_virtual_stages
    assert a.settings.layers_per_virtual_stage(6) == [1, 2, 2, 1]
    assert b.search_virtual_stages and b.settings.account_for_loss_in_pipeline_split
    assert b.settings.layers_per_virtual_stage(6) == [3, 3]


@pytest.mark.parametrize(("cells", "message"), [
    ("1,,,Et|tx|ttL", "runs.csv:2: column 'pipeline_model_parallel_layout': character 5 'x': not a layout symbol "
                      "(expected E embedding, t transformer layer, m MTP layer, L loss, | virtual-stage boundary, "
                      "(...)*N or X*N)"),
    ("1,,,Et|ttt|ttL", "runs.csv:2: impossible run: pipeline_model_parallel_layout 'Et|ttt|ttL' has 3 virtual "
                       "stages, not a multiple of pipeline_model_parallel_size 2"),
    ("1,,,Et|tt|tt|tL", "runs.csv:2: impossible run: pipeline_model_parallel_layout 'Et|tt|tt|tL' has 4 "
                        "virtual stages = pipeline_model_parallel_size 2 x 2, but virtual_pipeline_model_parallel_size "
                        "is 1"),
    (",,,Et|t|tt|tL", "runs.csv:2: impossible run: pipeline_model_parallel_layout 'Et|t|tt|tL' holds 5 "
                       "transformer layers ('t'); the model has 6"),
    ("4,true,,", "runs.csv:2: impossible run: 6 layers + the embedding = 7 are not divisible by "
                 "pipeline_model_parallel_size 2"),
    ("1,maybe,,", "runs.csv:2: column 'account_for_embedding_in_pipeline_split': expected true or false, "
                  "got 'maybe'"),
])
def test_run_table_split_errors(tmp_path, cells, message):
    path = tmp_path / "runs.csv"
    path.write_text(HEADER + f"6,256,4,128,1000,1,2,1,4,1,{cells}\n", encoding="utf-8")
    with pytest.raises(InputFileError) as err:
        read_run_table(path)
    assert str(err.value).replace(str(tmp_path) + "/", "") == message
