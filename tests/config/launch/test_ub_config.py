"""--tp-comm-overlap-cfg: TE's userbuffer settings per GEMM read from the file, named as TE names them, and priced
(config/launch/ub_config.py, cost/collectives/tp_overlap.py; issue 39)."""

from pathlib import Path

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.launch.ub_config import UBSetting, read_ub_config, ub_settings
from echo_tune.cost.profile import default_profile
from echo_tune.cost.collectives.tp_overlap import overlapped_cost, pair_settings
from echo_tune.errors import ConfigError
from echo_tune.workload import trace_layer

# the file of Megatron-LM d98e8a64ddf3's functional test gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap
CFG = next(Path(__file__).resolve().parents[3].glob("benchmarks/data/megatron_functional_tests/files/**/"
                                                     "tp_comm_overlap_cfg.yaml"))
LLAMA70 = et.load_model("llama3-70b")


def test_the_file_updates_tes_defaults():
    s = ub_settings(read_ub_config(str(CFG)), tp=2)
    # proj_fprop: pipeline on 4 SMs in 4 splits without the SM margin (TE default: 16 SMs, margin on)
    assert s["proj_fprop"] == UBSetting(method="pipeline", num_sm=4, num_splits=4, set_sm_margin=False)
    # fc2_fprop by ring exchange keeps the pipeline defaults it does not set (TE: ub_cfg.update(user entry))
    assert s["fc2_fprop"] == UBSetting(method="ring_exchange", num_sm=16, num_splits=4, set_sm_margin=True)
    assert s["qkv_fprop"] == UBSetting(method="ring_exchange", num_sm=1, num_splits=2, set_sm_margin=False,
                                       aggregate=True)
    assert s["qkv_dgrad"] == UBSetting(method="bulk", num_sm=2, num_splits=4, set_sm_margin=False)
    # a GEMM the file leaves out: TE's default (proj_wgrad: the external overlap, not a userbuffer pair here)
    assert s["proj_wgrad"].method == "external"


def test_each_pair_is_the_gemm_te_names():
    layer = trace_layer(LLAMA70, tensor_model_parallel_size=4, sequence_parallel=True)
    settings = {name: name for name in ub_settings((), 4)}  # each name stands for itself
    got = sorted(s for ops in (layer.forward, layer.backward) for _, _, s in pair_settings(ops, settings))
    # TE initialize_ub: the ring-exchange, pipeline and bulk GEMMs (the external wgrads are not userbuffer pairs)
    assert got == sorted(["qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop", "proj_dgrad", "fc2_dgrad",
                          "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"])


def test_pipeline_without_the_sm_margin_by_hand():
    import dataclasses

    profile = dataclasses.replace(default_profile(et.load_cluster("h100-sxm")), compute_slowdown=1.0,
                                  comm_slowdown=1.0, slowdown_curves={})
    op = next(o for o in trace_layer(LLAMA70, tensor_model_parallel_size=4, sequence_parallel=True).forward
              if o.kind == "gemm")
    # 132 SMs, 4 for communication; a 1 ms reduce-scatter beside a 10 ms GEMM in 4 chunks: the last chunk's quarter
    # (0.25 ms) exposed either way; with the margin the whole GEMM runs on 128 SMs (x 132/128), without it only
    # the 0.75 ms beside the communication loses 4 SMs' share (x 4/128)
    kw = dict(num_sm=4, num_splits=4)
    e1, x1 = overlapped_cost("pipeline", 1e-3, 10e-3, op, 0.0, 4, profile, 132, set_sm_margin=True, **kw)
    e0, x0 = overlapped_cost("pipeline", 1e-3, 10e-3, op, 0.0, 4, profile, 132, set_sm_margin=False, **kw)
    assert e1 == pytest.approx(0.25e-3) and e0 == pytest.approx(0.25e-3)
    chunked = x0 - 0.75e-3 * 4 / 128  # the smaller chunks' GEMM efficiency, the same both ways
    assert x1 == pytest.approx((10e-3 + chunked) * 132 / 128 - 10e-3)


def test_reading_the_flag_and_its_rules(tmp_path):
    _, parallel, _, _ = parse_megatron_line(f"--tp-comm-overlap --tp-comm-overlap-cfg {CFG}")
    assert dict(parallel["tp_comm_overlap_cfg"])["proj_fprop"] == (("method", "pipeline"), ("num_sm", 4),
                                                                    ("num_splits", 4), ("set_sm_margin", 0))
    bad = tmp_path / "ub.yaml"
    bad.write_text("qkv_fprop:\n  method: ring_exchange\n  atomic_gemm: 1\n")
    with pytest.raises(ConfigError, match="atomic_gemm not modelled"):
        parse_megatron_line(f"--tp-comm-overlap --tp-comm-overlap-cfg {bad}")
    with pytest.raises(ConfigError, match="no such file"):
        parse_megatron_line(f"--tp-comm-overlap-cfg {tmp_path / 'missing.yaml'}")
    model = et.load_model("llama3-8b")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, global_batch_size=8,
                                 tp_comm_overlap_cfg=read_ub_config(str(CFG)))
    with pytest.raises(ConfigError, match="applies with --tp-comm-overlap"):
        et.simulate(model, et.load_cluster("h100-sxm"), 8, parallel)
    plain = et.simulate(model, et.load_cluster("h100-sxm"), 8, parallel.replace(tp_comm_overlap=True,
                                                                                tp_comm_overlap_cfg=None))
    tuned = et.simulate(model, et.load_cluster("h100-sxm"), 8, parallel.replace(tp_comm_overlap=True))
    assert tuned.step_time_s != plain.step_time_s
