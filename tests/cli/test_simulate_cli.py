"""`echo-tune simulate`: the JSON contract and one-line errors for bad input."""

import json
import re
import subprocess
import sys

import pytest

from echo_tune.cli.main import main

ISSUE_LINE = ["simulate", "--model", "gpt3-175b", "--cluster", "a100-80gb", "--num-gpus", "1024",
              "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16", "--micro-batch-size", "1",
              "--global-batch-size", "1536", "--recompute-granularity", "full"]
JSON_KEYS = {"step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_bytes", "fits_memory",
             "breakdown_s", "config"}


def run_json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_contract(capsys):
    data = run_json(capsys, ISSUE_LINE)
    assert JSON_KEYS <= set(data)
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["step_time_s"], rel=1e-9)
    cfg = data["config"]
    assert cfg["tensor_model_parallel_size"] == 8 and cfg["pipeline_model_parallel_size"] == 16
    assert cfg["data_parallel_size"] == 8 and cfg["recompute_granularity"] == "full"
    assert cfg["precision"] == "bf16" and cfg["num_gpus"] == 1024


def test_error_band_of_the_datasheet_profile_family(capsys, tmp_path):
    """Without --profile the run carries the validated family's measured/predicted range; with a profile of
    the user's own it does not (the bands come from validating the datasheet profiles)."""
    band = run_json(capsys, ISSUE_LINE)["error_band"]
    assert band["family"] == "a100-80gb/dense/bf16/>512" and band["match"] == "exact" and band["n_runs"] > 0
    lo, hi = band["measured_over_predicted"]
    assert lo <= hi and band["text"].endswith(f"n={band['n_runs']})")
    # the family's median and range applied to this step (issue 19: bands that carry the bias)
    mid = band["median_measured_over_predicted"]
    assert lo <= mid <= hi
    step = run_json(capsys, ISSUE_LINE)["step_time_s"]
    assert band["step_time_s"] == pytest.approx(step * mid)
    assert band["step_time_s_band"] == [pytest.approx(step * lo), pytest.approx(step * hi)]
    assert main(ISSUE_LINE) == 0
    assert f"error band (prediction error of {band['family']}'s runs, predicted - measured, out of sample)" in (
        capsys.readouterr().out.replace("\n", " "))
    from echo_tune.cost.profile import default_profile, save_profile
    from echo_tune.config import load_cluster
    import dataclasses

    path = tmp_path / "p.yaml"
    save_profile(default_profile(load_cluster("a100-80gb")), path)  # the datasheet profile, written out: same band
    assert run_json(capsys, ISSUE_LINE + ["--profile", str(path)])["error_band"]["family"] == band["family"]
    fitted = dataclasses.replace(default_profile(load_cluster("a100-80gb")), name="mine", measured=True,
                                 gemm_max_efficiency=0.7)
    save_profile(fitted, path)  # a profile of the user's own: no band, and a note says why
    data = run_json(capsys, ISSUE_LINE + ["--profile", str(path)])
    assert "error_band" not in data and any("no error band: profile 'mine'" in n for n in data["notes"])


def test_default_run_is_the_issue_line(capsys):
    assert run_json(capsys, ["simulate"])["step_time_s"] == run_json(capsys, ISSUE_LINE)["step_time_s"]


def test_megatron_args_line(capsys):
    line = ("torchrun pretrain_gpt.py --num-layers 96 --hidden-size 12288 --num-attention-heads 96 "
            "--seq-length 2048 --max-position-embeddings 2048 --vocab-size 51200 --micro-batch-size 1 "
            "--global-batch-size 1536 --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 "
            "--recompute-granularity full --recompute-method uniform --bf16 --lr 6e-5 --data-path /data/x")
    # the gpt3-175b preset keeps the 2021 runs' unfused attention; a Megatron line gets Megatron's default
    # backend (auto: flash-style) unless it says otherwise
    data = run_json(capsys, ["simulate", "--num-gpus", "1024", "--megatron-args", line + " --attention-backend unfused"])
    assert data["step_time_s"] == pytest.approx(run_json(capsys, ISSUE_LINE)["step_time_s"], rel=1e-9)
    assert any("--lr" in note for note in data["notes"])
    default = run_json(capsys, ["simulate", "--num-gpus", "1024", "--megatron-args", line])
    assert default["config"]["model_spec"]["attention_backend"] == "auto"
    assert default["step_time_s"] < data["step_time_s"]


def test_out_of_memory_exits_zero_and_says_where(capsys):
    data = run_json(capsys, ["simulate", "--num-gpus", "64", "--tensor-model-parallel-size", "8",
                             "--pipeline-model-parallel-size", "8", "--global-batch-size", "64"])
    assert data["fits_memory"] is False
    assert "does not fit: stage" in data["memory_verdict"]


def test_rich_table(capsys):
    assert main(ISSUE_LINE) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "pp_bubble" in out and "fits" in out


def test_trace_file(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["simulate", "--num-gpus", "64", "--model", "gpt-1.7b", "--tensor-model-parallel-size", "2",
                 "--pipeline-model-parallel-size", "4", "--global-batch-size", "64", "--trace", str(path)]) == 0
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # per stage: its passes and tail, its tracks of exposed communication / interference, DP buckets, critical-path
    # p2p and received p2p transfers (one lane or more; trace_tracks.py)
    tids = {e["tid"] for e in spans}
    assert {t for t in tids if t < 4000} == {k * 1000 + s for k in range(4) for s in range(4)}
    assert {t % 1000 for t in tids if t >= 4000} == {0, 1, 2, 3}
    assert {e["cat"] for e in spans} >= {"forward", "backward", "optimizer"}
    assert sum(e["cat"] == "forward" for e in spans) == 4 * (64 // 8)  # 4 stages x 8 micro-batches (DP 8)
    # the last span ends at the step time (critical stage's optimizer step)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(trace["otherData"]["step_time_s"] * 1e6)


@pytest.mark.parametrize("argv, fragment", [
    (["--model", "gpt-9"], "unknown model preset 'gpt-9'"),
    (["--cluster", "tpu-v5"], "unknown cluster preset 'tpu-v5'"),
    (["--model", "missing.yaml"], "does not exist"),
    (["--tensor-model-parallel-size", "7", "--num-gpus", "7", "--pipeline-model-parallel-size", "1",
      "--global-batch-size", "7"], "num_attention_heads % tensor_model_parallel_size == 0` must hold"),
    (["--recompute-granularity", "partial"], "recompute_granularity"),
    (["--tensor-model-parallel-size", "abc"], "invalid int value"),
])
def test_bad_input_one_line_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["simulate"] + argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err


def test_bad_yaml_files(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_layers: [1, 2\n")
    assert main(["simulate", "--model", str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("num_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nseq_length: 128\n"
                       "vocab_size: 1000\nnum_heads: 4\n")
    assert main(["simulate", "--model", str(unknown)]) == 2
    assert "unknown model key(s) ['num_heads']" in capsys.readouterr().err
    cluster = tmp_path / "c.yaml"
    cluster.write_text("gpu: h100-sxm\ngpus_per_node: 8\nintra_node_bandwidth_gbyte_s: 450\nnics_per_node: 8\n"
                       "nic_bandwidth_gbit_s: 400\nnvlink: 900\n")
    assert main(["simulate", "--cluster", str(cluster)]) == 2
    assert "unknown cluster key(s) ['nvlink']" in capsys.readouterr().err


def test_real_process_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "echo_tune.cli.main", "simulate", "--tensor-model-parallel-size",
                           "7", "--num-gpus", "1024"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("text, fragment", [
    ("hidden_size: 1000.5", "model key 'hidden_size' must be an integer, but got (hidden_size=1000.5)"),
    ("swiglu: 'yes'", "model key 'swiglu' must be true or false, but got (swiglu='yes')"),
])
def test_wrong_types_in_model_files(tmp_path, capsys, text, fragment):
    path = tmp_path / "m.yaml"
    base = {"num_layers": "4", "hidden_size": "1024", "num_attention_heads": "8", "seq_length": "128",
            "vocab_size": "1000"}
    key = text.split(":")[0]
    base.pop(key, None)
    path.write_text("".join(f"{k}: {v}\n" for k, v in base.items()) + text + "\n")
    assert main(["simulate", "--model", str(path), "--num-gpus", "8", "--global-batch-size", "8"]) == 2
    assert fragment in capsys.readouterr().err


def test_flags_without_global_batch_size(capsys):
    assert main(["simulate", "--num-gpus", "64"]) == 2
    assert "--global-batch-size is required" in capsys.readouterr().err


def test_memory_headroom_and_fp8_flags(capsys):
    base = ["simulate", "--model", "llama3-8b", "--cluster", "h100", "--num-gpus", "8", "--global-batch-size", "128",
            "--context-parallel-size", "2", "--use-distributed-optimizer"]
    data = run_json(capsys, base + ["--fp8-format", "hybrid", "--fp8-param-gather"])
    assert data["config"]["fp8_format"] == "hybrid" and data["config"]["precision"] == "bf16"
    assert any("2.0 GiB headroom" in note for note in data["notes"])
    none = run_json(capsys, base + ["--memory-headroom-gib", "0"])
    assert not any("headroom" in note for note in none["notes"])
    assert main(base + ["--memory-headroom-gib", "-1"]) == 2
    assert "`0 <= --memory-headroom-gib <= 4096` must hold" in capsys.readouterr().err
    assert main(base + ["--fp8-format", "e5m2"]) == 2
    assert "fp8_format" in capsys.readouterr().err


def test_pipeline_layout_flag_and_trace(capsys, tmp_path):
    # GPT-3 175B, PP 14 does not divide 96 layers; the layout puts 6 layers + embedding on stage 0, 7 on each of
    # the 12 middle stages, 6 + loss on stage 13 (6 + 12 * 7 + 6 = 96)
    argv = ["simulate", "--model", "gpt3-175b", "--cluster", "a100-80gb", "--num-gpus", "896",
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "14", "--global-batch-size", "1792",
            "--recompute-granularity", "full", "--pipeline-model-parallel-layout", "Et*6|(t*7|)*12t*6L"]
    trace = tmp_path / "trace.json"
    data = run_json(capsys, argv + ["--trace", str(trace)])
    assert data["config"]["pipeline_model_parallel_layout"] == "Et*6|(t*7|)*12t*6L"
    assert len(data["stage_memory_bytes"]) == 14
    assert sum(data["breakdown_s"].values()) == pytest.approx(data["step_time_s"], rel=1e-9)
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    # 896 GPUs / (TP 8 x PP 14) = DP 8, 1792 / 8 = 224 micro-batches: one forward per stage and micro-batch
    assert sum(e["cat"] == "forward" for e in spans) == 14 * 224
    # a layout that miscounts the layers is one line on stderr
    assert main(argv[:-1] + ["Et*6|(t*7|)*12t*5L"]) == 2
    err = capsys.readouterr().err
    assert "number of t == num_layers" in err and len(err.strip().splitlines()) == 1


def test_a_layout_that_does_not_fit_prints_no_throughput_or_mfu(capsys):
    """Issue 20 item 4: the memory verdict and a pointer at `search` instead of throughput and MFU."""
    oom = ["simulate", "--num-gpus", "64", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
           "--global-batch-size", "64"]
    assert main(oom) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "does not fit: stage 0" in out and "echo-tune search" in out
    assert "tokens/s" not in out and "TFLOP/s per GPU" not in out and not re.search(r"MFU \d", out)
    data = run_json(capsys, oom)
    assert data["memory_band"] == "does not fit" and data["fits_memory"] is False
    assert data["tokens_per_s"] is None and data["mfu"] is None and data["model_tflops_per_gpu"] is None
    assert "echo-tune search" in data["search_hint"]
    assert main(ISSUE_LINE) == 0  # a layout that fits keeps them
    out = capsys.readouterr().out
    assert "throughput" in out and "MFU" in out and "GiB spare" in out


def _size_gib(cell: str) -> float:
    value, unit = cell.split()
    return float(value) * {"GiB": 1.0, "MiB": 1 / 1024, "KiB": 1 / 2**20, "B": 1 / 2**30, "TiB": 1024.0}[unit]


def test_memory_table_columns_add_up_to_the_total(capsys):
    # the 1 GiB runtime reserve was in the total but in no column (30.0 GiB of parts, 31.0 GiB total)
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    lines = out[out.index("memory per GPU"):].splitlines()
    header = [c.strip() for c in lines[2].split("┃")[1:-1]]
    assert "reserve" in header
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert rows
    for row in rows:
        cells = dict(zip(header, row))
        parts = sum(_size_gib(cells[k]) for k in header if k not in ("stage", "total", "most loaded rank"))
        assert parts == pytest.approx(_size_gib(cells["total"]), abs=0.06 * len(header)), cells


def test_a_megatron_line_may_begin_with_a_flag_and_its_value_joined(capsys):
    line = ("--num-layers=4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings "
            "2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 16 --bf16")
    joined = run_json(capsys, ["simulate", "--cluster", "h100", "--num-gpus", "8", "--megatron-args", line])
    spaced = run_json(capsys, ["simulate", "--cluster", "h100", "--num-gpus", "8", "--megatron-args",
                               line.replace("--num-layers=4", "--num-layers 4")])
    assert joined["config"]["model_spec"]["num_layers"] == 4
    assert joined["step_time_s"] == spaced["step_time_s"]


QWEN3_2602_H100 = ["simulate", "--model", "qwen3-30b-a3b", "--cluster", "h100", "--num-gpus", "16",
                   "--global-batch-size", "1024", "--micro-batch-size", "1", "--pipeline-model-parallel-size", "2",
                   "--num-virtual-stages-per-pipeline-rank", "12", "--expert-model-parallel-size", "8",
                   "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep",
                   "--moe-permute-fusion", "--moe-router-fusion", "--moe-router-force-load-balancing",
                   "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--use-distributed-optimizer",
                   "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]


def test_a_host_bound_step_says_so_and_what_issues_fewer_kernels(capsys):
    """Megatron-Bridge 26.02's Qwen3-30B-A3B recipe on 16 H100 (FP8 current scaling, 16 local experts, micro-batch 1):
    most of its step is the GPU waiting on the host; the report says how much and names the settings that issue
    fewer kernels per token. A GPU-bound dense step says nothing of the kind."""
    data = run_json(capsys, QWEN3_2602_H100)
    assert 0.4 < data["host_share"] < 0.7
    note = next(n for n in data["notes"] if n.startswith("host-bound:"))
    assert f"for {data['host_share']:.0%} of this step" in note
    for lever in ("--micro-batch-size (now 1", "--cuda-graph-impl", "--expert-model-parallel-size; now 16",
                  "tokens over capacity are dropped"):
        assert lever in note, lever
    dense = run_json(capsys, ISSUE_LINE)
    assert not any(n.startswith("host-bound:") for n in dense["notes"])
