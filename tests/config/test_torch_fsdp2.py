"""--use-torch-fsdp2: Megatron-LM's rules for it, and its simulation as Megatron-FSDP's per-layer ZeRO-3 (the same
all-gathers before each layer's forward and backward and reduce-scatters after its backward; issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError

LLAMA8 = et.load_model("llama3-8b")
H100 = et.load_cluster("h100-sxm")
FSDP2 = et.ParallelConfig(global_batch_size=16, use_torch_fsdp2=True, gradient_accumulation_fusion=False)


def test_flag_and_megatrons_rules():
    _, parallel, _, _ = parse_megatron_line("--use-torch-fsdp2 --no-gradient-accumulation-fusion")
    assert parallel == {"use_torch_fsdp2": True, "gradient_accumulation_fusion": False}
    for bad, words in ((FSDP2.replace(pipeline_model_parallel_size=2), "no pipeline parallelism"),
                       (FSDP2.replace(use_distributed_optimizer=True), "distributed optimizer"),
                       (FSDP2.replace(gradient_accumulation_fusion=True), "gradient accumulation fusion")):
        with pytest.raises(ConfigError, match=words):
            et.simulate(LLAMA8, H100, 8, bad)


def test_simulated_as_megatron_fsdp_zero3():
    torch2 = et.simulate(LLAMA8, H100, 8, FSDP2)
    megatron = et.simulate(LLAMA8, H100, 8, FSDP2.replace(use_torch_fsdp2=False, use_megatron_fsdp=True))
    assert torch2.step_time_s == pytest.approx(megatron.step_time_s)
    assert torch2.peak_memory_bytes == megatron.peak_memory_bytes
    assert any(n.startswith("Torch-FSDP2 (simulated as Megatron-FSDP's per-layer ZeRO-3)") for n in torch2.notes)
