"""emulate runs MoE layers as MoE: router, permutation, the local experts' GEMMs on a balanced router's tokens,
dispatch / combine as modelled waits (ep_comm); what it does not run is refused by name."""

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.emulate.build import build_stage
from echo_tune.emulate.run import emulate
from echo_tune.errors import ConfigError

from .conftest import CLUSTER, MODEL, tiny_layout

MOE = dict(num_layers=4, seq_length=64, hidden_size=64, ffn_hidden_size=128, num_experts=4, moe_router_topk=2,
           moe_ffn_hidden_size=96, moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall",
           moe_layer_freq="([0]+[1]*3)")
"""Layer 0 dense, layers 1-3 MoE; 4 experts, top-2, one grouped GEMM per fc for the local experts."""
LAYOUT = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=2, expert_model_parallel_size=2,
              global_batch_size=4)
"""4 GPUs: PP 2 x DP 2, EP 2 (2 local experts per rank); 4 samples / DP 2 = 2 micro-batches per stage."""


def _model(**changes):
    return dataclasses.replace(et.load_model(str(MODEL)), **{**MOE, **changes})


def _cluster():
    return et.load_cluster(str(CLUSTER))


class _CountBmm(TorchDispatchMode):
    """Counts the batched GEMMs that run (forward and backward) and keeps the forward ones' input shapes."""

    def __init__(self):
        super().__init__()
        self.count, self.shapes = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.bmm:
            self.count += 1
            self.shapes.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


def test_dense_first_layers_stay_dense():
    """moe_pattern over the stage's global layers: stage 0 holds layer 0 (dense) and 1 (MoE), stage 1 two MoE."""
    model, cluster = _model(), _cluster()
    layout = check_compatible(model, cluster, 4, tiny_layout(**LAYOUT))
    kinds = [[s.moe for s in build_stage(model, tiny_layout(**LAYOUT), layout, stage, "cpu").chunks[0].shards]
             for stage in (0, 1)]
    assert kinds == [[False, True], [True, True]]
    moe_layer = build_stage(model, tiny_layout(**LAYOUT), layout, 1, "cpu").chunks[0].layers[0]["moe"]
    assert moe_layer["experts"]["fc1"].shape == (2, 64, 2 * 96)  # 4 experts / EP 2, SwiGLU's doubled fc1


@pytest.mark.parametrize("recompute, stage, bmm_runs", [
    # per MoE layer and micro-batch: forward 2 grouped GEMMs (fc1, fc2), backward 4 (dgrad and wgrad of each);
    # 2 micro-batches. Stage 0 holds 1 MoE layer, stage 1 two.
    ({}, 0, 1 * 2 * 6),
    ({}, 1, 2 * 2 * 6),
    # full uniform recompute, 1 layer per group: every MoE layer's forward runs again in the backward (+2)
    (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1), 1, 2 * 2 * 8),
])
def test_expert_gemms_run_as_the_layout_implies(one_thread, recompute, stage, bmm_runs):
    """Counted, not timed. Each grouped GEMM holds the rank's 2 local experts, each on the 64 token copies a
    balanced router sends it: 64 tokens per rank x top-2 / 4 experts x EP 2 ranks sending."""
    # traced first, outside the count: on a trace-cache miss the tracer runs the MoE layer's GEMMs too
    et.simulate(_model(), _cluster(), 4, tiny_layout(**LAYOUT, **recompute))
    counter = _CountBmm()
    with counter:
        result = emulate(_model(), _cluster(), 4, tiny_layout(**LAYOUT, **recompute), stage=stage,
                         repeats=1, warmup=0)
    assert counter.count == bmm_runs
    assert (2, 64, 64) in [a for a, _ in counter.shapes]  # fc1 forward: [local experts, tokens each, hidden]
    assert {a[0] for a, _ in counter.shapes} == {2}
    assert result.emulated["experts"] > 0


@pytest.mark.parametrize("changes, parallel", [
    ({}, {}),
    (dict(moe_token_dispatcher_type="allgather", moe_shared_expert_intermediate_size=64), {}),
    (dict(moe_grouped_gemm=False), dict(tensor_model_parallel_size=2, expert_tensor_parallel_size=2,
                                        expert_model_parallel_size=1, sequence_parallel=True)),
])
@pytest.mark.parametrize("stage", [0, 1])
def test_ep_comm_waited_is_simulates_dispatch_and_combine(one_thread, changes, parallel, stage):
    """The dispatch / combine collectives (EP all-to-all; all-gather / reduce-scatter over ETP or the ETP x EP
    group) are waited for exactly the time simulate gives them; the table and JSON carry the expert lines."""
    model, cluster, layout = _model(**changes), _cluster(), tiny_layout(**{**LAYOUT, **parallel})
    result = emulate(model, cluster, 4, layout, stage=stage, repeats=1, warmup=0)
    assert result.simulated["ep_comm"] > 0
    assert result.emulated["ep_comm"] == pytest.approx(result.simulated["ep_comm"], rel=1e-9)
    assert result.emulated["tp_cp_comm"] == pytest.approx(result.simulated["tp_cp_comm"], rel=1e-9)
    assert 0 < result.emulated["experts"] < result.emulated["compute"]
    assert 0 < result.simulated["experts"] < result.simulated["compute"]
    data = result.to_dict()
    for side in ("emulated_s", "simulated_s"):
        assert {"ep_comm", "experts"} <= set(data[side])
    report = et.simulate(model, cluster, 4, layout)
    if report.critical_stage == stage:  # the simulated side is simulate's own breakdown
        assert result.simulated["ep_comm"] == pytest.approx(report.breakdown_s["ep_comm"])
        assert result.simulated["compute"] == pytest.approx(report.breakdown_s["compute"])


def test_an_all_dense_stage_of_an_moe_model_has_zero_expert_lines(one_thread):
    """Layers 0-1 dense, 2-3 MoE: stage 0 runs no expert and waits on no dispatch, as simulate says."""
    model = _model(moe_layer_freq="([0]*2+[1]*2)")
    zero = emulate(model, _cluster(), 4, tiny_layout(**LAYOUT), stage=0, repeats=1, warmup=0)
    assert zero.emulated["ep_comm"] == zero.simulated["ep_comm"] == 0.0
    assert zero.emulated["experts"] == zero.simulated["experts"] == 0.0
    moe = emulate(model, _cluster(), 4, tiny_layout(**LAYOUT), stage=1, repeats=1, warmup=0)
    assert moe.emulated["experts"] > 0 and moe.simulated["ep_comm"] > 0


def test_a_dense_model_has_no_expert_lines(one_thread):
    model = _model(num_experts=None, moe_grouped_gemm=False, moe_token_dispatcher_type="allgather", moe_layer_freq=1)
    result = emulate(model, _cluster(), 4, tiny_layout(**{**LAYOUT, "expert_model_parallel_size": 1}),
                     repeats=1, warmup=0)
    assert "ep_comm" not in result.emulated and "experts" not in result.simulated


@pytest.mark.parametrize("changes, parallel, message", [
    (dict(moe_token_dispatcher_type="flex"), {},
     "emulate runs the alltoall and allgather dispatchers (NCCL collectives as modelled waits) and cannot run the "
     "flex dispatcher's fused deepep kernels, but got (moe_token_dispatcher_type=flex, "
     "moe_flex_dispatcher_backend=deepep); use --moe-token-dispatcher-type alltoall, or `echo-tune simulate` for "
     "deepep"),
    (dict(moe_router_fusion=True, moe_permute_fusion=True), {},
     "emulate runs the router and the permutation as separate PyTorch kernels and cannot run Transformer Engine's "
     "fused ones, but got (moe_router_fusion=True, moe_permute_fusion=True); drop --moe-router-fusion and "
     "--moe-permute-fusion to emulate, or use `echo-tune simulate`"),
    (dict(moe_shared_expert_intermediate_size=64, moe_shared_expert_overlap=True), {},
     "emulate runs the shared expert inline and cannot overlap it with the dispatch on a side stream, but got "
     "(moe_shared_expert_overlap=True); drop --moe-shared-expert-overlap to emulate, or use `echo-tune simulate`"),
    ({}, dict(overlap_moe_expert_parallel_comm=True),
     "emulate runs one micro-batch at a time and cannot overlap one's dispatch/combine with another's compute, but "
     "got (overlap_moe_expert_parallel_comm=True); drop --overlap-moe-expert-parallel-comm to emulate, or use "
     "`echo-tune simulate`"),
    ({}, dict(recompute_granularity="selective", recompute_modules=("core_attn", "moe_act")),
     "emulate's selective recompute replays core attention only and cannot recompute MoE modules, but got "
     "(recompute_modules=moe_act); drop them from --recompute-modules to emulate, or use `echo-tune simulate`"),
])
def test_what_emulate_does_not_run_is_refused_by_name(changes, parallel, message):
    with pytest.raises(ConfigError) as err:
        emulate(_model(**changes), _cluster(), 4, tiny_layout(**{**LAYOUT, **parallel}), repeats=1, warmup=0)
    assert str(err.value) == message


class _TickClock:
    """Each reading is one second later than the last: spans count readings, not time."""

    def __init__(self):
        self.t = 0.0

    def now(self):
        self.t += 1.0
        return self.t


def test_expert_timer_times_forward_and_backward_once_each():
    """The outermost "experts" sub-region is timed forward (entry to exit) and backward (gradient at its output
    to gradient at its input); nested "experts" calls and other sub-regions are not timed again."""
    from echo_tune.emulate.moe import ExpertTimer

    timer = ExpertTimer(_TickClock(), lambda: 0.0)
    x = torch.ones(3, requires_grad=True)
    h = timer.run_subregion("router", lambda t: t * 3, x)
    assert timer.expert_s == 0.0
    out = timer.run_subregion("experts", lambda t: timer.run_subregion("experts", torch.mul, t, 2.0) + 1, h)
    assert timer.expert_s == 1.0  # begin, end: one tick
    out.sum().backward()
    assert timer.expert_s == 2.0  # the backward span: one tick more
    assert x.grad.tolist() == [6.0, 6.0, 6.0]  # the hooks leave the gradient alone
