"""Physical bounds on every hardware number a user gives (issue 41 item 3): clocks, bandwidths, peaks, memory,
the fabric's oversubscription, from a flag, a cluster file or a GPU mapping, each refused in one line that states
the bound; and `plan` prices and `--mtp-num-layers` within their limits. Valid hardware still reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.config.load.loading import cluster_from_dict, load_cluster
from echo_tune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CPU = yaml.safe_load((REPO / "tests" / "data" / "cpu-cluster.yaml").read_text())
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]


def _refused(argv: list[str], capsys, *words: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


@pytest.mark.parametrize("clock,words", [
    ("9999", ("`sustained_clock_mhz <= 1.1 x peak_clock_mhz`", "peak_clock_mhz=1830 on h100-sxm")),
    ("2100", ("`sustained_clock_mhz <= 1.1 x peak_clock_mhz`",)),
    ("1e-300", ("`100 <= sustained_clock_mhz <= 6000`",)),
    ("1.755", ("`100 <= sustained_clock_mhz <= 6000`", "looks like GHz: give 1755 (MHz)")),
])
def test_gpu_clock_flag_is_within_the_gpus_clocks(clock, words, capsys):
    _refused(SIM + ["--cluster", "h100", "--gpu-clock-mhz", clock], capsys, *words)


@pytest.mark.parametrize("clock", ["1575", "1980", "800"])
def test_real_clocks_are_accepted(clock, capsys):
    assert main(SIM + ["--cluster", "h100", "--gpu-clock-mhz", clock]) == 0, capsys.readouterr().err


def _cluster_file(tmp_path, **changes) -> str:
    data = {**CPU, **changes}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("key,value,words", [
    ("spine_oversubscription", float("inf"), "must be finite"),
    ("spine_oversubscription", 1e6, "`1 <= spine_oversubscription <= 1000`"),
    ("intra_node_bandwidth_gbyte_s", 1e300, "`0.1 <= intra_node_bandwidth_gbyte_s <= 10000`"),
    ("intra_node_bandwidth_gbyte_s", 1e-300, "`0.1 <= intra_node_bandwidth_gbyte_s <= 10000`"),
    ("nic_bandwidth_gbit_s", 1e9, "`0.1 <= nic_bandwidth_gbit_s <= 10000`"),
    ("gpus_per_node", 10**7, "`1 <= gpus_per_node <= 4096`"),
    ("nodes_per_leaf", 10**12, "nodes_per_leaf"),
])
def test_cluster_file_numbers_have_physical_bounds(tmp_path, capsys, key, value, words):
    path = _cluster_file(tmp_path, **{key: value})
    _refused(SIM + ["--cluster", path], capsys, words, f"cluster file {path!r}")


@pytest.mark.parametrize("key,value,words", [
    ("peak_bf16_tflops", 1e300, "`0.001 <= peak_bf16_tflops <= 100000`"),
    ("peak_fp32_tflops", 1e-300, "peak_fp32_tflops"),
    ("memory_bandwidth_gbyte_s", 1e12, "`0.1 <= memory_bandwidth_gbyte_s <= 100000`"),
    ("memory_bytes", 2**60, "memory_bytes"),
    ("sm_count", 10**9, "sm_count"),
    ("peak_clock_mhz", 1.83, "looks like GHz"),
])
def test_gpu_mapping_numbers_have_physical_bounds(tmp_path, capsys, key, value, words):
    path = _cluster_file(tmp_path, gpu={**CPU["gpu"], key: value})
    _refused(SIM + ["--cluster", path], capsys, words, f"cluster file {path!r}")


@pytest.mark.parametrize("gpu_clock,cluster_clock,words", [
    (1e9, None, "`100 <= sustained_clock_mhz <= 6000`"),
    (1800, None, "`gpu.sustained_clock_mhz <= 1.1 x peak_clock_mhz`"),
    (None, 1e9, "`100 <= sustained_clock_mhz <= 6000`"),
    (None, 1700, "`sustained_clock_mhz <= 1.1 x peak_clock_mhz`"),
])
def test_sustained_clock_keys_are_at_most_the_boost_clock(tmp_path, capsys, gpu_clock, cluster_clock, words):
    gpu = {**CPU["gpu"], "peak_clock_mhz": 1500, **({"sustained_clock_mhz": gpu_clock} if gpu_clock else {})}
    path = _cluster_file(tmp_path, gpu=gpu, **({"sustained_clock_mhz": cluster_clock} if cluster_clock else {}))
    _refused(SIM + ["--cluster", path], capsys, words, f"cluster file {path!r}")


def test_replace_checks_the_bounds_too():
    h100 = load_cluster("h100")
    with pytest.raises(ConfigError, match="spine_oversubscription"):
        h100.replace(spine_oversubscription=float("inf"))
    with pytest.raises(ConfigError, match="nic_bandwidth_gbit_s"):
        h100.replace(nic_bandwidth_gbit_s=1e300)
    assert h100.replace(sustained_clock_mhz=1980.0).gpu.clock_factor < 1.1


def test_every_shipped_cluster_and_the_cpu_test_cluster_still_read():
    from echo_tune.config.load.loading import preset_names

    for name in preset_names("clusters"):
        load_cluster(name)
    assert cluster_from_dict(CPU, name="cpu").gpu.peak_bf16_tflops == 0.1


# --- --mtp-num-layers -----------------------------------------------------------------------------------------

def test_a_million_mtp_layers_is_refused_by_flag_line_and_file(tmp_path, capsys):
    _refused(SIM + ["--mtp-num-layers", "1000000"], capsys, "`1 <= --mtp-num-layers <= 1024`")
    line = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
            "--vocab-size 1000 --micro-batch-size 1 --global-batch-size 8 --bf16 --position-embedding-type rope "
            "--mtp-num-layers 1000000")
    _refused(["simulate", "--num-gpus", "8", "--megatron-args", line], capsys, "`1 <= mtp_num_layers <= 1024`")
    _refused(SIM + ["--megatron-args", "--mtp-num-layers 1000000 --position-embedding-type rope --bf16"], capsys,
             "`1 <= mtp_num_layers <= 1024`")
    model = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
             "vocab_size": 1000, "position_embedding_type": "rope", "mtp_num_layers": 10**6}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(model))
    _refused(SIM + ["--model", str(tmp_path / "m.yaml")], capsys, "mtp_num_layers")


# --- plan prices ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("candidate,words", [
    ("a100-80gb:8:inf", "`PRICE` must be finite"), ("a100-80gb:8:nan", "`PRICE` must be finite"),
    ("a100-80gb:8:1e300", "`0 < PRICE <= 1e+06`"), ("a100-80gb:8:" + "9" * 5000, "`PRICE` must be finite"),
    ("a100-80gb:8:1e300:bf16", "`0 < PRICE <= 1e+06`"), ("a100-80gb:10000000:1", "`1 <= num_gpus <= 1048576`"),
], ids=["inf", "nan", "1e300", "5000-digits", "1e300-bf16", "10M-gpus"])
def test_plan_prices_and_gpu_counts_are_bounded(candidate, words, capsys):
    err = _refused(["plan", "--model", "gpt-1.7b", "--tokens", "1e9", "--candidate", candidate], capsys, words)
    assert len(err) < 400, "a long candidate is quoted cut short"


def test_a_real_price_still_parses():
    from echo_tune.plan.planner import parse_candidate

    assert parse_candidate("h100:256:2.49:fp8").gpu_hour_price == 2.49
