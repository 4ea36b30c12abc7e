"""The host-bound regime (cost/host/host_bound.py): the GPU waits on the host only where a pass's kernels run
shorter than the host's time to issue one. After the MoE dispatcher's host synchronisation, worked by hand
from the queue (kernel j issued j * h after the first, started at the later of its issue and the end of the
kernel before it); elsewhere a pass waits for what its host time exceeds its GPU time. Entries are (kernels,
the host's time to issue them, their GPU time)."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.cost.host.host_bound import HOST_LAUNCH_S, host_wait_s, queue_wait_s, steady_wait_s
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import CostContext, phase_cost
from echo_tune.workload.graph import Op

US = 1e-6
H100 = et.load_cluster("h100-sxm")
PROFILE = profile_for(H100)
LAYOUT = check_compatible(et.ModelSpec(name="t", num_layers=2, hidden_size=256, num_attention_heads=4,
                                       seq_length=128, vocab_size=1024), H100, 1, et.ParallelConfig(global_batch_size=1))


def test_no_host_time_no_wait():
    assert host_wait_s([(10, 0.0, 50 * US)], None) == host_wait_s([(10, 0.0, 50 * US)], 0) == 0.0


def test_kernels_longer_than_the_host_time_never_wait():
    # ten 100 us kernels, issued every 20 us: the host runs ahead, the GPU runs back to back
    assert queue_wait_s([(1, 20 * US, 100 * US)] * 10) == 0.0


def test_short_kernels_run_at_the_host_pace():
    # ten 5 us kernels issued every 20 us: the last is issued at 180 us and ends at 185 us; the GPU worked 50 us
    assert queue_wait_s([(10, 200 * US, 50 * US)]) == pytest.approx(135 * US)
    assert queue_wait_s([(1, 20 * US, 5 * US)] * 10) == pytest.approx(135 * US)  # one op or ten: the same queue
    # with no synchronisation the host's lead carries over: the pass waits 10 x 20 - 50 = 150 us in all
    assert steady_wait_s([(10, 200 * US, 50 * US)]) == pytest.approx(150 * US)


def test_a_long_kernel_lets_the_host_catch_up():
    # a 1 ms GEMM first: the ten short kernels are all issued (by 200 us) before it ends, so none waits
    gemm, short = (1, 20 * US, 1000 * US), (10, 200 * US, 50 * US)
    assert queue_wait_s([gemm, short]) == 0.0
    # the short ones first: they wait 135 us, then the GEMM (issued at 200 us) starts at once after them
    assert queue_wait_s([short, gemm]) == pytest.approx(150 * US)
    # host_wait_s starts the queue at the synchronisation: the ops before it close the window
    assert host_wait_s([short, gemm], 1) == 0.0
    assert host_wait_s([gemm, short], 1) == pytest.approx(150 * US)
    assert steady_wait_s([short, gemm]) == 0.0  # 220 us of host under 1.05 ms


def test_each_synchronisation_starts_a_queue_from_empty():
    # two windows of ten 5 us kernels issued every 20 us, each after a synchronisation: 135 us each (as one window);
    # one synchronisation alone lets the host keep its lead across the second: the ops run as one queue
    ops = [(10, 200 * US, 50 * US), (10, 200 * US, 50 * US)]
    assert host_wait_s(ops, (0, 1)) == pytest.approx(2 * 135 * US)
    assert host_wait_s(ops, 0) == pytest.approx(queue_wait_s(ops))
    # a long GEMM in front of the second window: the host issued everything under it before, but the copy it waits
    # for (the quick-GeGLU offset) throws that lead away
    gemm = [(1, 20 * US, 1000 * US), (10, 200 * US, 50 * US)]
    assert host_wait_s(gemm, 0) == 0.0 and host_wait_s(gemm, (0, 1)) == pytest.approx(135 * US)


def test_a_host_to_device_copy_empties_the_queue_in_a_phase():
    from echo_tune.cost.host.host_bound import HOST_SYNC_OP
    fitted = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 20 * US}})
    ctx = CostContext(profile=fitted, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups)
    gemm = _fp8_free_ops(1, (8192, 8192, 8192))  # ~1.7 ms: the host is far ahead when it ends
    small = _fp8_free_ops(10, (256, 256, 256))
    copy = (Op(name=HOST_SYNC_OP, kind="memory", phase="fwd", region="mlp", bytes=4.0),)
    ahead, synced = phase_cost(gemm + small, ctx).compute_s, phase_cost(gemm + copy + small, ctx).compute_s
    plain = dataclasses.replace(ctx, profile=dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 0.0}}))
    gpu_only = phase_cost(gemm + copy + small, plain).compute_s
    # after the copy the queue is empty: the host issues the ten short kernels one per 20 us and the GPU runs each in
    # per_kernel, so they take 10 x 20 us where the GPU works 10 x per_kernel (the ops before the copy close the
    # window, as the next layer's would: host_wait_s)
    per_kernel = phase_cost(small[:1], plain).compute_s
    assert synced - gpu_only == pytest.approx(10 * 20 * US - 10 * per_kernel, rel=1e-6)
    assert ahead == pytest.approx(phase_cost(gemm + small, plain).compute_s, rel=1e-9)  # no copy: the GPU's pace


def test_a_bare_pytorch_call_costs_the_host_one_call():
    # GPT-OSS's fc2 bias loop (``t + b * p`` per local expert, sub-region "expert_bias"): one PyTorch call each, not
    # the host time of a traced module op
    from echo_tune.cost.host.host_bound import HOST_TORCH_CALL_S
    from echo_tune.sim.schedule.costing import host_issue_s
    fitted = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 80 * US}})
    ctx = CostContext(profile=fitted, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups)
    ops = tuple(Op(name="aten.add", kind="memory", phase="fwd", region="moe", subregion=sub, bytes=1e6)
                for sub in ("expert_bias", "combine"))
    assert host_issue_s(ops[:1], ctx) == pytest.approx(HOST_TORCH_CALL_S)
    assert host_issue_s(ops[1:], ctx) == pytest.approx(80 * US)


def test_kernels_replayed_from_a_cuda_graph_issue_nothing():
    assert queue_wait_s([(0, 0.0, 50 * US)] * 10) == 0.0


def _fp8_free_ops(n, gemm_mnk, kind="gemm"):
    m, nn, k = gemm_mnk
    return tuple(Op(name="mm", kind=kind, phase="fwd", region="mlp", flops=2.0 * m * nn * k,
                    bytes=2.0 * (m * k + k * nn + m * nn), gemm_mnk=gemm_mnk) for _ in range(n))


def test_phase_cost_adds_the_wait_to_short_kernels_only():
    fitted = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 60 * US}})
    off = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 0.0}})  # 0: the GPU never waits
    assert fitted.host_time_per_kernel_s == 60 * US and off.host_time_per_kernel_s == 0.0
    plain = CostContext(profile=off, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups)
    host = dataclasses.replace(plain, profile=fitted)
    small = _fp8_free_ops(20, (256, 256, 256))  # a few us each: the host's 60 us per kernel sets the pace
    per_kernel = phase_cost(small[:1], plain).compute_s
    assert per_kernel < 60 * US
    assert phase_cost(small, host).compute_s == pytest.approx(20 * 60 * US, rel=1e-9)  # no sync: host time
    # a MoE forward: the dispatcher's all-to-all (after the host waited on the token counts) starts an empty queue;
    # the all-to-all is one more launch, its time (0 here: one rank) the GPU busy
    a2a = Op(name="all_to_all", kind="collective", phase="fwd", region="moe", subregion="dispatch",
             collective="all_to_all", group="ep", size_bytes=1 << 20)
    moe = small[:5] + (a2a,) + small[5:]
    assert phase_cost(moe, host).compute_s == pytest.approx(20 * 60 * US + per_kernel, rel=1e-9)
    unsynced = dataclasses.replace(host, moe_dispatch_syncs=False)  # drop-and-pad: no synchronisation
    assert phase_cost(moe, unsynced).compute_s == pytest.approx(21 * 60 * US, rel=1e-9)
    big = _fp8_free_ops(20, (8192, 8192, 8192))  # ~1.7 ms each: the GPU sets the pace
    assert phase_cost(big, host).compute_s == pytest.approx(phase_cost(big, plain).compute_s, rel=1e-12)


def test_quantisation_kernels_launched_by_te_cost_the_host_a_launch():
    """An FP8 GEMM issued from Python costs the host its time per kernel; the quantisation kernels Transformer
    Engine's C++ launches inside the call (current scaling: amax, scale, cast) cost the launch path alone, so
    current scaling's three are no dearer on the host than MXFP8's one plus two launches."""
    fitted = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 60 * US}})
    ops = _fp8_free_ops(20, (256, 256, 256))
    waits = {}
    for recipe, cast_kernels in (("tensorwise", 3), ("mxfp8", 1)):
        ctx = CostContext(profile=fitted, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups, fp8_recipe=recipe)
        off = dataclasses.replace(ctx, host_bound=False)
        gpu_s = phase_cost(ops, off).compute_s
        waits[recipe] = phase_cost(ops, ctx).compute_s - gpu_s
        # no synchronisation: the wait is the host's time over the GPU's, 20 GEMMs at 60 us and their quantisations'
        # launches (one per GEMM's input operand here: is_fp8_gemm's forward GEMM quantises one new operand)
        host_s = phase_cost(ops, ctx).compute_s
        assert 20 * 60 * US < host_s <= 20 * (60 * US + 2 * cast_kernels * HOST_LAUNCH_S) + 1e-12
    assert waits["tensorwise"] - waits["mxfp8"] < 20 * 2 * 2 * HOST_LAUNCH_S  # a few launches, not 40 x 60 us


def test_a_bad_fitted_host_time_is_refused():
    with pytest.raises(ConfigError, match="host_time_per_kernel_s"):
        dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": float("nan")}})


def test_a_profile_without_a_host_time_uses_the_one_fitted_on_the_published_runs():
    """No datasheet gives the host's time per kernel; a profile that fits none takes the shipped fit's (the rows of
    the developers' sets run from x86 hosts, H100 and B200: cost/host/host_time.py), says so in its label, and 0 turns
    it off."""
    from echo_tune.cost.host.host_time import default_host_time_s, shipped_fit
    from echo_tune.validate.compare import fitted_rows

    fit = shipped_fit()
    assert fit["parameters"] == ["host"] and fit["label"].startswith("fitted on published runs: ")
    # 81 us per kernel issued from Python since 2026-12-05 (quantisations at the C++ launch; H100 and B200 rows);
    # 38 us per kernel of every kind on the H100 rows before; 79 us before runs_bridge_2025
    assert 20 * US < default_host_time_s() < 200 * US
    assert PROFILE.host_time_per_kernel_s == default_host_time_s() and PROFILE.uses_default_host_time
    assert f"host time per kernel {default_host_time_s() / US:.0f} us fitted on published runs" in PROFILE.label
    assert len(fitted_rows(PROFILE)) == fit["errors"]["rows"] >= 40  # PROFILE fits nothing itself
    assert all(row["name"].startswith(("row4", "dgxc", "nemo", "mb25", "mb26", "prs")) for row in fit["rows"])
    own = dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": 0.0}})
    assert own.host_time_per_kernel_s == 0.0 and not own.uses_default_host_time and "host time" not in own.label
    with pytest.raises(ConfigError, match="host_time_per_kernel_s"):
        dataclasses.replace(PROFILE, fitted={"params": {"host_time_per_kernel_s": -1e-6}})


def test_the_shipped_host_time_is_what_its_command_fits():
    """Rerunning the command in the shipped file's header finds its value again (regenerate it when the model
    changes: the header says how)."""
    from echo_tune.calibrate.fit.fit_runs import fit_runs
    from echo_tune.cost.host.host_time import default_host_time_s, shipped_fit, shipped_fit_path
    from echo_tune.validate.datasets import DATASETS, published_runs
    from echo_tune.validate.runs import read_runs

    assert "--gpu h100-sxm,b200 --params host" in shipped_fit_path().read_text().splitlines()[2]
    cases = [c for name in DATASETS for c in read_runs(published_runs(name))
             if c.error is None and c.cluster.gpu.name in ("h100-sxm", "b200")]
    bases = {gpu: profile_for(et.load_cluster(gpu)) for gpu in ("h100-sxm", "b200")}
    result = fit_runs(cases, bases["h100-sxm"], H100.gpu, params=("host",), bases=bases)
    assert result.params["host_time_per_kernel_s"] == pytest.approx(default_host_time_s(), rel=0.01)
    assert not shipped_fit()["at_range_edge"] and not shipped_fit()["unidentified"]


def test_a_fit_over_several_gpus_fits_the_host_alone():
    """The host's time per kernel is the host's: rows of GPUs on the same kind of host fit one value, each row run
    with its own GPU's profile; a clock, network factor or launch time belongs to one GPU and is refused."""
    from echo_tune.calibrate.fit.fit_runs import fit_runs
    from echo_tune.validate.datasets import DATASETS, published_runs
    from echo_tune.validate.runs import read_runs

    cases = [c for name in DATASETS for c in read_runs(published_runs(name))
             if c.error is None and c.cluster.gpu.name in ("h100-sxm", "b200")]
    bases = {gpu: profile_for(et.load_cluster(gpu)) for gpu in ("h100-sxm", "b200")}
    with pytest.raises(ConfigError, match=r"`--params host` must be the only parameter .*params=clock,host"):
        fit_runs(cases, bases["h100-sxm"], H100.gpu, params=("clock", "host"), bases=bases)
    with pytest.raises(ConfigError, match=r"need a base profile for each, but got none for \['b200'\]"):
        fit_runs(cases, bases["h100-sxm"], H100.gpu, params=("host",), bases={"h100-sxm": bases["h100-sxm"]})
