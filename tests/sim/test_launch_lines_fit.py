"""Megatron-LM's MoE example launch lines (copies in tests/config/launch_lines/) simulate and fit.

Mixtral 8x7B fits as the script lays it out (64 H100, EP 8). DeepSeek-V3's script trains on 256 GPUs with
Megatron-FSDP (refused by name: not modelled); without FSDP that layout cannot fit (TP 1 and EP 8 leave
~84B parameters per rank, 168 GB of bf16 weights alone), so the same line is simulated with a
distributed-optimizer layout from search_spaces/deepseek-v3-1024xh100.yaml: PP 16, EP 64, micro-batch 1."""

import json
from pathlib import Path

from echo_tune.cli.main import main
from echo_tune.config.unmodelled import STEP_SHAPING

LINES = Path(__file__).resolve().parents[1] / "config" / "launch_lines"


def launch_line(name: str) -> str:
    return " ".join(line for line in (LINES / f"{name}.txt").read_text().splitlines() if not line.startswith("#"))


def without_fsdp(line: str) -> str:
    """The line without its Megatron-FSDP flags (refused by name) and their values."""
    flags, out, skipping = set().union(*(v for k, v in STEP_SHAPING.items() if k.startswith("Megatron-FSDP"))), [], False
    for token in line.split():
        skipping = token in flags if token.startswith("--") else skipping
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
