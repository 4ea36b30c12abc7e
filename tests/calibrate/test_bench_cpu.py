"""The CPU (gloo) bench path end to end: torchrun with 2 (and 4) processes -> raw files -> fit -> profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from echo_tune.calibrate.bench import raw
from echo_tune.calibrate.fit.fit_profile import fit_profile
from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.profile import load_profile, profile_for
from echo_tune.errors import ConfigError

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _run(cmd: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _check_columns(directory, kinds):
    for kind in kinds:
        rows = raw.read_csv(directory, kind)
        assert rows, kind
        header = (directory / f"{kind}.csv").read_text().splitlines()[0].split(",")
        assert tuple(header) == raw.COLUMNS[kind]
    return {kind: raw.read_csv(directory, kind) for kind in kinds}


def test_two_process_bench_then_fit_then_profile(tmp_path):
    out_root = tmp_path / "calibration"
    _run([sys.executable, "-m", "echo_tune.cli.main", "bench", "--nproc-per-node", "2", "--quick",
          "--name", "cpu-pair", "--output-root", str(out_root)])
    directory = out_root / "cpu-pair" / "raw"
    env = json.loads((directory / "env.json").read_text())
    assert env["backend"] == "gloo" and env["world_size"] == 2 and env["num_nodes"] == 1
    assert env["torch"] and env["python"] and env["quick"] is True
    tables = _check_columns(directory, ("gemm", "attention", "memory", "collectives", "interference"))
    assert {r["rank"] for r in tables["gemm"]} == {0, 1}
    assert {r["collective"] for r in tables["collectives"]} == {"all_reduce", "all_gather", "reduce_scatter",
                                                                "all_to_all", "broadcast", "send_recv"}
    sizes = sorted({r["size_bytes"] for r in tables["collectives"] if r["collective"] == "all_reduce"})
    assert sizes[0] == 1024 and sizes[-1] == 4 << 20
    assert all(r["gemm_alone_us"] > 0 and r["compute_slowdown"] > 0 for r in tables["interference"])

    profile_path = tmp_path / "cpu-pair.yaml"
    fit_args = ["calibrate", "fit", "--cluster", "a100-40gb", "--bench", str(out_root / "cpu-pair"),
                "--out", str(profile_path)]
    assert main(fit_args) == 2 and not profile_path.exists()  # a CPU bench for a GPU cluster is refused ...
    assert main(fit_args + ["--allow-cpu-bench"]) == 0  # ... unless explicitly allowed
    profile = load_profile(profile_path)
    assert profile.measured and profile.provenance["sources"][0]["kind"] == "echo-tune bench"
    assert profile.measured_on == {"backend": "gloo", "device": "cpu", "gpu": "none", "cpu_override": True}
    assert set(profile.comm["intra_node"]) >= {"default", "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                               "broadcast", "send_recv"}
    assert profile.slowdown_curves["compute"]["points"] and profile.compute_slowdown >= 1
    assert (tmp_path / "cpu-pair.residuals.csv").is_file()
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("gpu: a100-40gb\ngpus_per_node: 8\nintra_node_bandwidth_gbyte_s: 300\n"
                            "nics_per_node: 8\nnic_bandwidth_gbit_s: 200\nprofile: cpu-pair.yaml\n")
    assert profile_for(load_cluster(cluster_file)).name == profile.name
    # ... and the simulator runs on that cluster with the measured profile
    from echo_tune import ParallelConfig, load_model, simulate

    report = simulate(load_model("gpt-1.7b"), load_cluster(cluster_file), 16,
                      ParallelConfig(tensor_model_parallel_size=2, global_batch_size=16))
    assert report.profile.startswith(profile.name) and "measured on CPU (gloo)" in report.profile
    assert "used by explicit override" in report.profile
    # the same profile without the override is refused for the GPU cluster
    data = yaml.safe_load(profile_path.read_text())
    del data["measured_on"]["cpu_override"]
    profile_path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="measured on CPU"):
        simulate(load_model("gpt-1.7b"), load_cluster(cluster_file), 16,
                 ParallelConfig(tensor_model_parallel_size=2, global_batch_size=16))
    assert report.step_time_s > 0 and sum(report.breakdown_s.values()) == pytest.approx(report.step_time_s)


def test_four_processes_as_two_nodes_fit_the_inter_node_scope(tmp_path):
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
          "-m", "echo_tune.calibrate.bench.microbench", "--quick", "--name", "fake-2node", "--output-root", str(tmp_path),
          "--ranks-per-node", "2", "--skip", "gemm,attention,memory,interference"])
    directory = tmp_path / "fake-2node" / "raw"
    rows = _check_columns(directory, ("collectives",))["collectives"]
    layouts = {(r["scope"], r["group_size"], r["num_nodes"], r["ranks_per_node"]) for r in rows}
    assert layouts == {("inter_node", 4, 2, 2), ("intra_node", 2, 1, 2), ("inter_node", 2, 2, 1)}
    outcome = fit_profile(load_cluster("a100-40gb"), bench_dir=directory, allow_cpu_bench=True)
    methods = {r.quantity: r.method for r in outcome.results}
    assert methods["all_reduce inter_node"] == "least squares"
    assert methods["all_reduce intra_node"] == "least squares"
    assert outcome.profile.provenance["coverage"]["num_nodes"] == [1, 2]


def test_single_process_bench_measures_compute_only(tmp_path):
    assert main(["bench", "--quick", "--name", "solo", "--output-root", str(tmp_path), "--skip", "attention"]) == 0
    directory = tmp_path / "solo" / "raw"
    env = json.loads((directory / "env.json").read_text())
    assert env["world_size"] == 1 and set(env["skipped"]) == {"attention", "collectives", "interference"}
    assert (directory / "gemm.csv").is_file() and not (directory / "collectives.csv").exists()


def test_bench_rejects_unknown_part(tmp_path, capsys):
    assert main(["bench", "--quick", "--output-root", str(tmp_path), "--skip", "gpus"]) == 2
    assert "unknown --skip part(s) ['gpus']" in capsys.readouterr().err


def test_bench_json_lists_the_files(tmp_path, capsys):
    assert main(["bench", "--quick", "--name", "js", "--output-root", str(tmp_path), "--skip",
                 "attention,gemm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["output_dir"].endswith("raw") and any(f.endswith("env.json") for f in data["files"])


def test_attention_writes_no_backward_row_when_the_timings_leave_none():
    # forward+backward timed below the forward alone (a noisy device): the backward was written as 1 ns
    # (20,971 TFLOP/s) and calibrate fit took it; now both are timed again, and without a backward no row
    import torch

    from echo_tune.calibrate.bench.bench_compute import SweepPlan, attention_rows

    class Noisy:
        def __init__(self, times):
            self.times = list(times)

        def time_s(self, fn, min_time_s, max_iters):
            return self.times.pop(0)

    plan = SweepPlan(dtypes=("fp32",), hidden_sizes=(), tp_degrees=(), tokens=1, probe_dims=(), with_weight_grads=False,
                     attention_seq_lens=(16,), attention_heads=1, attention_head_dim=8, memory_sizes_bytes=(),
                     min_time_s=0.0)
    cpu = torch.device("cpu")
    rows = attention_rows(plan, cpu, Noisy([2e-3, 1e-3] * 3), 0)
    assert [r["phase"] for r in rows] == ["fwd"]
    rows = attention_rows(plan, cpu, Noisy([2e-3, 1e-3, 1e-3, 3.5e-3]), 0)  # the second try holds a backward
    assert [r["phase"] for r in rows] == ["fwd", "bwd"] and rows[1]["time_us"] == pytest.approx(2500)
