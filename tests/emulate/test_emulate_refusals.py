"""emulate refuses by name what it does not run: sliding-window attention, FP8 GEMMs, another device (the MoE
features it does not run: test_emulate_moe.py)."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.emulate.run import emulate
from echo_tune.errors import ConfigError

from .conftest import CLUSTER, MODEL, tiny_layout


def _model(**changes):
    return dataclasses.replace(et.load_model(str(MODEL)), **changes)


def test_fp8_is_refused_not_run_in_plain_precision():
    layout = tiny_layout(precision="bf16", fp8_format="hybrid")
    with pytest.raises(ConfigError) as err:
        emulate(_model(), et.load_cluster(str(CLUSTER)), 4, layout, repeats=1, warmup=0)
    assert str(err.value) == ("emulate runs the GEMMs in bf16 only and cannot run FP8 GEMMs, but got "
                              "(fp8_format=hybrid); drop --fp8-format to emulate the bf16 layout, or use "
                              "`echo-tune simulate` for FP8")


def test_an_moe_feature_and_fp8_together_name_both():
    layout = tiny_layout(precision="bf16", fp8_format="e4m3")
    model = _model(num_experts=4, moe_router_topk=1, moe_token_dispatcher_type="flex")
    with pytest.raises(ConfigError) as err:
        emulate(model, et.load_cluster(str(CLUSTER)), 4, layout)
    text = str(err.value)
    assert text.startswith("2 problems in the emulated layout:") and "moe_token_dispatcher_type=flex" in text \
        and "fp8_format=e4m3" in text


def test_a_cpu_against_an_h100_cluster_is_refused_unless_allowed(one_thread):
    model, h100 = _model(num_layers=2, seq_length=64, hidden_size=64, ffn_hidden_size=128), et.load_cluster("h100-sxm")
    layout = tiny_layout(pipeline_model_parallel_size=1, global_batch_size=1)
    with pytest.raises(ConfigError) as err:
        emulate(model, h100, 2, layout, device="cpu", repeats=1, warmup=0)
    text = str(err.value)
    assert "\n" not in text and "gpu='h100-sxm'" in text and "device='cpu: " in text and "--allow-other-device" in text
    result = emulate(model, h100, 2, layout, device="cpu", repeats=1, warmup=0, allow_other_device=True)
    assert result.other_device and result.cluster_gpu == "h100-sxm" and result.device.startswith("cpu: ")
    assert result.notes[0].startswith(f"ran on {result.device}, not on the cluster's GPU h100-sxm (this is a CPU, "
                                      f"not a GPU)")
    data = result.to_dict()
    assert data["device_is_cluster_gpu"] is False and data["cluster_gpu"] == "h100-sxm"


def test_the_cpu_test_cluster_is_its_own_device(one_thread):
    model = _model(num_layers=2, seq_length=64, hidden_size=64, ffn_hidden_size=128)
    layout = tiny_layout(pipeline_model_parallel_size=1, global_batch_size=1)
    result = emulate(model, et.load_cluster(str(CLUSTER)), 2, layout, device="cpu", repeats=1, warmup=0)
    assert not result.other_device and result.to_dict()["device_is_cluster_gpu"] is True
    assert not any(n.startswith("ran on") for n in result.notes)


def test_a_sliding_window_model_is_refused_not_run_with_full_attention():
    """The emulated stage builds full-attention layers; a model whose layers run a sliding window shorter
    than the sequence (tiny-llama: seq 256) would be timed as something it is not."""
    windowed = _model(window_size=(64, 0))
    assert windowed.windowed_attention
    with pytest.raises(ConfigError) as err:
        emulate(windowed, et.load_cluster(str(CLUSTER)), 4, tiny_layout(), repeats=1, warmup=0)
    assert str(err.value) == ("emulate runs full attention only and cannot run this model's sliding-window layers, "
                              "but got (window_size=64,0); use `echo-tune simulate` for sliding-window models")
    # a window as long as the sequence is full attention: nothing to refuse
    emulate(_model(window_size=(1024, 0)), et.load_cluster(str(CLUSTER)), 4, tiny_layout(), repeats=1, warmup=0)
