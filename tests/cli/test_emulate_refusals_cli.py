"""issue 20 from the command line: emulate refuses what it does not run (the flex dispatcher, FP8) and another
device in one line (exit 2); --allow-other-device labels every figure; an MoE model's table has its expert
lines; profile runs an MoE model's MoE ops in place."""

import json
from pathlib import Path

import pytest
import torch

from echo_tune.cli.main import main

DATA = Path(__file__).parents[1] / "data"
SHAPE = ["--model", str(DATA / "tiny-llama.yaml"), "--num-gpus", "2", "--tensor-model-parallel-size", "2",
         "--global-batch-size", "2", "--seq-length", "64", "--hidden-size", "64", "--ffn-hidden-size", "128",
         "--threads", "1", "--device", "cpu"]
CPU = ["--cluster", str(DATA / "cpu-cluster.yaml")]


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("extra, message", [
    (["--fp32", "--num-experts", "8", "--moe-router-topk", "2", "--moe-token-dispatcher-type", "flex"],
     "emulate runs the alltoall and allgather dispatchers (NCCL collectives as modelled waits) and cannot run the "
     "flex dispatcher's fused deepep kernels, but got (moe_token_dispatcher_type=flex, "
     "moe_flex_dispatcher_backend=deepep); use --moe-token-dispatcher-type alltoall, or `echo-tune simulate` for "
     "deepep"),
    (["--bf16", "--fp8-format", "hybrid"],
     "emulate runs the GEMMs in bf16 only and cannot run FP8 GEMMs, but got (fp8_format=hybrid); drop "
     "--fp8-format to emulate the bf16 layout, or use `echo-tune simulate` for FP8"),
])
def test_emulate_refuses_what_it_does_not_run(capsys, extra, message):
    assert main(["emulate", *SHAPE, *CPU, *extra]) == 2
    err = capsys.readouterr().err
    assert err == f"echo-tune emulate: error: {message}\n"


def test_emulate_refuses_the_cpu_for_an_h100_cluster_unless_allowed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table's headers on one line each
    assert main(["emulate", *SHAPE, "--cluster", "h100-sxm", "--fp32", "--repeats", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("echo-tune emulate: error: emulate compares a run on this device with the cluster's "
                          "simulated GPU, so the device must be that GPU, but got (device='cpu: ")
    assert err.endswith("gpu='h100-sxm': this is a CPU, not a GPU); run on that GPU (h100-sxm), or pass "
                        "--allow-other-device to get figures labelled with the device they ran on\n")
    args = ["emulate", *SHAPE, "--cluster", "h100-sxm", "--fp32", "--repeats", "1", "--allow-other-device"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for label in ("simulated (h100-sxm)", "emulated (on cpu)", "difference (cpu vs", "warning: ran on cpu: "):
        assert label in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device_is_cluster_gpu"] is False and data["cluster_gpu"] == "h100-sxm"
    assert data["device"].startswith("cpu: ") and data["notes"][0].startswith(f"ran on {data['device']}, not on")


def test_emulate_on_the_cpu_cluster_has_no_device_warning(capsys):
    assert main(["emulate", *SHAPE, *CPU, "--fp32", "--repeats", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device_is_cluster_gpu"] is True and not any(n.startswith("ran on") for n in data["notes"])


def test_emulate_of_an_moe_model_shows_its_expert_work(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    moe = ["--fp32", "--num-experts", "4", "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
           "--expert-tensor-parallel-size", "1", "--sequence-parallel", "--moe-token-dispatcher-type", "alltoall",
           "--repeats", "1"]
    assert main(["emulate", *SHAPE, *CPU, *moe]) == 0
    out = capsys.readouterr().out
    assert "of it: routed experts (GEMMs + activation)" in out and "MoE dispatch/combine (modelled waits)" in out
    assert main(["emulate", *SHAPE, *CPU, *moe, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["emulated_s"]["ep_comm"] == pytest.approx(data["simulated_s"]["ep_comm"]) and \
        data["simulated_s"]["ep_comm"] > 0 and data["emulated_s"]["experts"] > 0


def test_profile_of_an_moe_model_runs_its_moe_ops_in_place(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["profile", "--model", str(DATA / "tiny-llama.yaml"), *CPU, "--num-gpus", "1", "--global-batch-size", "1",
            "--seq-length", "32", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-layers", "2",
            "--num-experts", "4", "--moe-router-topk", "2", "--fp32", "--threads", "1", "--quiet", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timed_alone"] == 0 and out["measured"] == out["ops"]  # router, permutation, experts: in place
    assert out["notes"] == ["MoE model tiny-llama (num_experts=4): the in-place run runs one MoE layer (router, "
                            "permutation, the local experts' GEMMs) on the tokens a balanced router sends, as the "
                            "simulator assumes; its dispatch/combine collectives are not run"]
