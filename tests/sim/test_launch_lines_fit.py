"""Megatron-LM's MoE example launch lines (copies in tests/config/launch_lines/) simulate and fit.

Mixtral 8x7B fits as the script lays it out (64 H100, EP 8). DeepSeek-V3's script trains on 256 GPUs with
Megatron-FSDP (ZeRO-3, sim/data_parallel/fsdp.py); without FSDP that layout cannot fit (TP 1 and EP 8 leave
~84B parameters per rank, 168 GB of bf16 weights alone), so the line without its FSDP block is simulated with
a distributed-optimizer layout from search_spaces/deepseek-v3-1024xh100.yaml: PP 16, EP 64, micro-batch 1."""

import json
from pathlib import Path

import pytest

from echo_tune.cli.main import main

LINES = Path(__file__).resolve().parents[1] / "config" / "launch_lines"


def launch_line(name: str) -> str:
    return " ".join(line for line in (LINES / f"{name}.txt").read_text().splitlines() if not line.startswith("#"))


FSDP_BLOCK = ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--megatron-fsdp-grad-comm-dtype",
              "--megatron-fsdp-main-grads-dtype", "--fsdp-double-buffer", "--use-nccl-ub")


def fsdp_flags() -> str:
    """The Megatron-FSDP block the script appends (quoted in the launch line's header)."""
    header = (LINES / "deepseek_v3.txt").read_text().splitlines()
    return next(line for line in header if line.startswith("# --use-megatron-fsdp"))[2:]


def without_fsdp(line: str) -> str:
    """The line without the Megatron-FSDP flags and their values."""
    out, skipping = [], False
    for token in line.split():
        skipping = token in FSDP_BLOCK if token.startswith("--") else skipping
        if not skipping:
            out.append(token)
    return " ".join(out)


def simulate(capsys, line: str, num_gpus: int) -> dict:
    assert main(["simulate", "--cluster", "h100-sxm", "--num-gpus", str(num_gpus), "--megatron-args", line,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_mixtral_example_fits_as_laid_out(capsys):
    data = simulate(capsys, launch_line("mixtral_8x7b") + " --vocab-size 32000", 64)
    assert data["fits_memory"] and data["config"]["expert_model_parallel_size"] == 8
    assert data["breakdown_s"]["ep_comm"] > 0


def test_deepseek_v3_example_without_fsdp_fits_on_a_distributed_optimizer_layout(capsys):
    line = without_fsdp(launch_line("deepseek_v3")) + " --vocab-size 129280"
    as_laid_out = simulate(capsys, line, 256)
    assert not as_laid_out["fits_memory"]  # the script relies on Megatron-FSDP to fit
    data = simulate(capsys, line + " --pipeline-model-parallel-size 16 --decoder-last-pipeline-num-layers 1"
                    " --expert-model-parallel-size 64 --micro-batch-size 1", 1024)
    assert data["fits_memory"] and data["config"]["model_spec"]["multi_latent_attention"]
    assert data["breakdown_s"]["ep_comm"] > 0


def test_deepseek_v3_example_with_megatron_fsdp_shards_its_state(capsys):
    data = simulate(capsys, launch_line("deepseek_v3") + " --vocab-size 129280 " + fsdp_flags(), 256)
    assert data["config"]["use_megatron_fsdp"] and data["breakdown_s"]["dp_comm"] > 0
    mem = data["stage_memory_bytes"][0]
    # by hand: a rank holds 32 of the 256 experts of each of the 58 MoE layers and the MTP layer, 59 x 32 x
    # 3 x 7168 x 2048 = 83.1e9 parameters, sharded over expert-DP 256 / 8 = 32; fp32 main weights + Adam (12 B):
    # 83.1e9 / 32 x 12 = 31.2e9 B = 29.0 GiB; the ~18e9 other parameters over 256 ranks add ~0.8 GiB
    assert 28.5 * 2**30 < mem["optimizer_bytes"] < 30.5 * 2**30
    # bf16 main grads (the script's --megatron-fsdp-main-grads-dtype bf16): 2 B per sharded parameter, 1/6 of
    # the 12 B above: ~5 GiB
    assert mem["gradients_bytes"] == pytest.approx(mem["optimizer_bytes"] / 6, rel=0.02)
    # the sharded state (weights, grads, optimizer, the two layers' unsharded buffers) fits well in 80 GB,
    # where without FSDP the bf16 weights alone (168 GB) do not
    state = sum(mem[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes", "fsdp_buffer_bytes"))
    assert state < 60 * 2**30
