"""The engine's integer codes are named: event kinds and streams as `Timeline` stores them,
kernel kinds as the device model prices them, and the passes of a run's structure."""

import numpy as np

from paraplan.clusters import load_cluster
from paraplan.core import ConstantBandwidthModel
from paraplan.core.glossary import EVENT_KINDS, NO_MICROBATCH, STREAMS, EventKindCode, StreamCode
from paraplan.core.run_settings import RunSettings
from paraplan.predict.build import run_structure
from paraplan.predict.models import PRESETS
from paraplan.predict.pass_times import MOE_PASSES, PASSES, Pass
from paraplan.predict.work import KernelKind, _Builder
from paraplan.sim.engine import PipelineCosts
from paraplan.sim.execution import ExecutionModel, GradSync, RankMemory, run_iteration


def test_event_kind_and_stream_codes_are_their_labels_positions():
    assert tuple(k.label for k in EventKindCode) == EVENT_KINDS
    assert [int(k) for k in EventKindCode] == list(range(len(EVENT_KINDS)))
    assert tuple(s.label for s in StreamCode) == STREAMS


def test_pass_names_follow_the_structures_pass_order():
    assert tuple(p.name.lower() for p in Pass) == PASSES + MOE_PASSES
    comm = ConstantBandwidthModel(100e9, 25e9)
    dense = run_structure(PRESETS["gpt3-125m"], RunSettings(global_batch_size=8), load_cluster("dgx-a100"), comm)
    moe = run_structure(PRESETS["mixtral-8x7b"], RunSettings(global_batch_size=8), load_cluster("dgx-h100"), comm)
    assert (len(dense.passes), len(moe.passes)) == (len(PASSES), len(Pass))
    # the layer's backward has weight-gradient GEMMs, the head's forward none
    assert dense.passes[Pass.LAYER_BWD].kernels.weight_grad.any()
    assert not dense.passes[Pass.HEAD_FWD].kernels.weight_grad.any()


def test_a_builders_rows_carry_their_kernel_kind():
    w = _Builder(gemm_bytes=2)
    w.gemm(4, 8, 16)
    w.attention(10.0, 20.0, 128, backward=False)
    w.memory(64.0)
    kernels = w.build()
    assert kernels.kernels.kind.tolist() == [KernelKind.GEMM, KernelKind.ATTENTION, KernelKind.MEMORY]
    assert kernels.kernels.flops[0] == 2 * 4 * 8 * 16


def test_gradient_buckets_are_comm_stream_allreduces_of_no_microbatch():
    costs = PipelineCosts.uniform(2, 1.0, 2.0, send_s=0.0)
    model = ExecutionModel(
        schedule="1f1b", pipeline_stages=2, virtual_stages=1, microbatches=4, costs=costs,
        grad_sync=tuple(GradSync(np.array([0.5]), np.array([0]), np.array([1.0])) for _ in range(2)),
        overlap_grad_reduce=False, after_sync_s=np.zeros(2),
        memory=tuple(RankMemory(0.0, 0.0, 0.0, np.zeros(1)) for _ in range(2)),
        samples_per_iteration=4, num_devices=2)
    timeline = run_iteration(model).timeline
    assert timeline is not None
    buckets = timeline.kind == EventKindCode.ALLREDUCE
    assert buckets.sum() == 2
    assert (timeline.stream[buckets] == StreamCode.COMM).all()
    assert (timeline.microbatch[buckets] == NO_MICROBATCH).all()
    assert (timeline.end_s[buckets] - timeline.start_s[buckets]).tolist() == [0.5, 0.5]
