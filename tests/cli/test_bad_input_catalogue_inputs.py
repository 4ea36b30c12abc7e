"""The bad-input catalogue, input-side classes of issue 20 item 8 and issue 21 item 4 (continues
test_bad_input_catalogue.py, the same rule): every case exits 2 with one line per problem on stderr (one
line, or, for an input with several problems, a header line and one line each, all reported in one run),
never a traceback, never a silent answer, and big inputs are refused past a stated limit in bounded time.

Classes: cluster keys of the wrong type; deeply nested, alias-bomb and oversized YAML; best.json without
its keys; nccl-tests logs with a negative count or read as the wrong collective; config.json values of the
wrong type; --moe-layer-freq / first_k_dense_replace past the layer count; op-time databases with bad
values or a foreign schema; rank files with NaN prices or too many GPUs; --currency with control characters;
emulate --device cuda without CUDA; a runs CSV past the row limit; launch lines Megatron's argparse refuses;
several problems of one input at once.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.profile import default_profile, save_profile
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB
from echo_tune.cost.optime.optime_device import DeviceInfo
from ..optime.test_db_values import KEY, db_with_time

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
HF = REPO / "tests" / "config" / "data" / "hf"
CPU_CLUSTER = str(DATA / "cpu-cluster.yaml")
TINY = str(DATA / "tiny-llama.yaml")
RANK = str(REPO / "search_spaces" / "rank" / "gpt3-175b-options.yaml")
A100 = str(REPO / "calibration" / "azure-ndv4-a100-40gb" / "cluster.yaml")
LOG2 = REPO / "calibration" / "azure-ndv4-a100-40gb" / "nccl-tests" / "all_reduce_2gpu.log"
RUNS = Path("/work/shared/data/published-runs/runs_megatron.csv")
if not RUNS.is_file():
    RUNS = REPO.parent / "shared" / "data" / "published-runs" / "runs_megatron.csv"
CLUSTER = yaml.safe_load(Path(CPU_CLUSTER).read_text())
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]
TINY_SIM = ["simulate", "--model", TINY, "--cluster", CPU_CLUSTER, "--num-gpus", "1", "--global-batch-size", "1"]
LINE = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--vocab-size 1000 --micro-batch-size 1 --global-batch-size 8 --bf16")


def _yaml_bombs(put) -> None:
    put("deep-20000.yaml", "a: " + "[" * 20000 + "]" * 20000 + "\n")
    put("deep-100.yaml", "a: " + "[" * 100 + "]" * 100 + "\n")
    put("deep-map.yaml", "".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n")
    laughs = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        laughs.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    put("laughs.yaml", "\n".join(laughs) + "\n")
    put("laughs-map.yaml", "x: &x {" + ", ".join(f"k{i}: [1,2,3,4,5,6,7,8,9,10]" for i in range(10)) + "}\n"
        + "".join(f"y{i}: &y{i} [" + ",".join([f"*{'x' if i == 0 else f'y{i - 1}'}"] * 10) + "]\n"
                  for i in range(6)))
    row = "key_{:07d}: value_{}_xxxxxxxxxxxxxxxxxxxx\n"
    put("huge-40mb.yaml", "".join(row.format(i, i) for i in range(1_000_000)))
    put("huge-9mib.yaml", "# " + "x" * (9 * 2**20) + "\nname: m\n")


def _hf(put) -> None:
    qwen = json.loads((HF / "qwen2.5-7b.json").read_text())
    llama = json.loads((HF / "llama-3.1-70b.json").read_text())
    deepseek = json.loads((HF / "deepseek-v3.json").read_text())
    gpt2 = json.loads((HF / "gpt2.json").read_text())
    cases = {"hs-text": (llama, {"hidden_size": "8192"}), "hs-null": (llama, {"hidden_size": None}),
             "hs-list": (llama, {"hidden_size": [8192]}), "hs-nan": (llama, {"hidden_size": float("nan")}),
             "hs-float": (llama, {"hidden_size": 8192.9}), "hs-bool": (llama, {"hidden_size": True}),
             "head-dim": (llama, {"head_dim": "128"}), "kv-heads": (llama, {"num_key_value_heads": 4.5}),
             "window": (qwen, {"sliding_window": "4096"}),
             "rope-orig": (llama, {"rope_scaling": {**llama["rope_scaling"],
                                                    "original_max_position_embeddings": "8192"}}),
             "rope-list": (qwen, {"rope_scaling": [1, 2]}),
             "rope-factor": (llama, {"rope_scaling": {**llama["rope_scaling"], "factor": "8"}}),
             "q-lora": (deepseek, {"q_lora_rank": 1536.5}), "n-embd": (gpt2, {"n_embd": "768"}),
             "dense-1e12": (deepseek, {"first_k_dense_replace": 1e12}),
             "three-bad": (llama, {"hidden_size": "x", "num_hidden_layers": None, "vocab_size": 1.5})}
    for name, (base, change) in cases.items():
        put(f"hf-{name}.json", json.dumps({**base, **change}))


def _op_times(root: Path, put) -> None:
    # the CPU cluster's datasheet-derived profile, as `profile` writes it beside its database
    save_profile(default_profile(load_cluster(CPU_CLUSTER)), root / "profile-template.yaml")
    template = yaml.safe_load((root / "profile-template.yaml").read_text())
    for name, value in (("negative", -6e-2), ("text", "fast"), ("zero", 0.0), ("inf", float("inf"))):
        db_with_time(root / f"optime-{name}.sqlite", value)
    foreign = root / "optime-foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE op_times (name TEXT)")
    conn.commit()
    conn.close()
    (root / "optime-empty").write_bytes(b"")
    for name in ("negative", "text", "zero", "inf", "foreign", "empty"):
        db = root / (f"optime-{name}.sqlite" if name != "empty" else "optime-empty")
        put(f"profile-optime-{name}.yaml", yaml.safe_dump({**template, "op_times": str(db)}))
    with OpTimeDB(root / "optime-a100-40gb.sqlite") as db:  # issue 20: a 40GB A100 does not serve an 80GB one
        db.add(DeviceInfo(name="NVIDIA A100-SXM4-40GB", kind="cuda", torch_version="2.13.0", cuda_version="12.8"),
               KEY, Measurement(time_s=1e-5, spread=0.1, repeats=5, warmup=3, method="cuda-events"))
    put("profile-optime-a100-40gb.yaml", yaml.safe_dump({**template, "gpu": "a100-80gb",
                                                         "op_times": str(root / "optime-a100-40gb.sqlite")}))


def _rank_and_logs(root: Path, put) -> None:
    base = {"name": "c", "model": "gpt3-175b", "cluster": "a100-80gb", "num_gpus": 64,
            "layout": {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 8,
                       "global_batch_size": 64, "micro_batch_size": 1}}
    for tag, change in {"cost-nan": {"gpu_hour_cost": float("nan")}, "cost-inf": {"gpu_hour_cost": float("inf")},
                        "gpus-1e12": {"num_gpus": 10**12}, "gpus-2e6": {"num_gpus": 2_000_000},
                        "profile-42": {"profile": 42}, "profile-list": {"profile": ["p.yaml"]}}.items():
        put(f"rank-{tag}.yaml", yaml.safe_dump({"candidates": [{**base, **change}]}))
    for tag, best in {"no-gpus": {"config": {"tensor_model_parallel_size": 1}, "specs": {"model_spec": {},
                                                                                         "cluster_spec": {}}},
                      "no-model": {"config": {"num_gpus": 8}, "specs": {"cluster_spec": {}}},
                      "model-list": {"config": {"num_gpus": 8}, "specs": {"model_spec": [], "cluster_spec": {}}}
                      }.items():
        (root / f"best-{tag}").mkdir()
        (root / f"best-{tag}" / "best.json").write_text(json.dumps(best))
        put(f"rank-from-{tag}.yaml", yaml.safe_dump({"candidates": [
            {"name": "s", "from_search": str(root / f"best-{tag}")}]}))
    lines = LOG2.read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
    for tag, column in (("count", 1), ("size", 0)):
        bad = list(lines)
        fields = bad[rows[0]].split()
        fields[column] = "-" + fields[column]
        bad[rows[0]] = "  ".join(fields)
        put(f"all_reduce_2gpu-neg{tag}.log", "\n".join(bad) + "\n")
    put("sendrecv_2gpu.log", LOG2.read_text())
    put("send_recv_2gpu.log", LOG2.read_text())
    header, row = RUNS.read_text().splitlines()[:2]
    put("runs-100k.csv", header + "\n" + (row + "\n") * 100_000)
    put("runs-2001.csv", header + "\n" + (row + "\n") * 2001)
    put("cluster-gpu-list.yaml", yaml.safe_dump({**CLUSTER, "gpu": ["a100-80gb"]}))
    put("cluster-gpu-int.yaml", yaml.safe_dump({**CLUSTER, "gpu": 42}))
    put("cluster-profile-42.yaml", yaml.safe_dump({**CLUSTER, "profile": 42}))
    put("cluster-profile-list.yaml", yaml.safe_dump({**CLUSTER, "profile": ["p.yaml"]}))
    put("cluster-both.yaml", yaml.safe_dump({**CLUSTER, "gpu": [1], "profile": 42}))
    put("model-three-bad.yaml", yaml.safe_dump({"name": "m", "num_layers": "x", "hidden_size": -1,
                                                "num_attention_heads": 4, "seq_length": float("nan"),
                                                "vocab_size": 1000}))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs-20")
    out: dict[str, str] = {}

    def put(name: str, text: str) -> None:
        (root / name).write_text(text)
        out[name] = str(root / name)
    _yaml_bombs(put)
    _hf(put)
    _op_times(root, put)
    _rank_and_logs(root, put)
    return out


def _cases() -> list[tuple[list[str], str, int]]:
    """(argv with {file} placeholders, text the error must hold, lines on stderr)."""
    cases: list[tuple[list[str], str, int]] = []
    for name in ("deep-20000.yaml", "deep-100.yaml", "deep-map.yaml"):
        cases += [(SIM + ["--model", "{%s}" % name], "depth" if "20000" in name else "nests deeper", 1),
                  (SIM + ["--cluster", "{%s}" % name], "depth" if "20000" in name else "nests deeper", 1),
                  (["search", "{%s}" % name], "depth" if "20000" in name else "nests deeper", 1)]
    cases.append((["rank", "{deep-100.yaml}"], "nests deeper", 1))
    for name in ("laughs.yaml", "laughs-map.yaml"):
        cases += [(SIM + ["--model", "{%s}" % name], "aliases", 1), (["search", "{%s}" % name], "aliases", 1),
                  (["rank", "{%s}" % name], "aliases", 1), (SIM + ["--profile", "{%s}" % name], "aliases", 1)]
    for name in ("huge-40mb.yaml", "huge-9mib.yaml"):
        cases += [(SIM + ["--model", "{%s}" % name], "8 MiB", 1), (["search", "{%s}" % name], "8 MiB", 1),
                  (["rank", "{%s}" % name], "8 MiB", 1)]
    for key, words in {"hs-text": "hidden_size", "hs-null": "hidden_size", "hs-list": "hidden_size",
                       "hs-nan": "hidden_size", "hs-float": "8192.9", "hs-bool": "hidden_size",
                       "head-dim": "head_dim", "kv-heads": "num_key_value_heads", "window": "sliding_window",
                       "rope-orig": "rope_scaling.original_max_position_embeddings", "rope-list": "rope_scaling",
                       "rope-factor": "rope_scaling.factor", "q-lora": "q_lora_rank", "n-embd": "n_embd",
                       "dense-1e12": "first_k_dense_replace"}.items():
        cases.append((SIM + ["--model", "{hf-%s.json}" % key, "--seq-length", "1024"], words, 1))
    cases.append((SIM + ["--model", "{hf-three-bad.json}", "--seq-length", "1024"], "3 problems in config.json", 4))
    for freq in ("[1]*300000000", "[1]*100000000000", "+".join(["[1]"] * 5000), "([0]*1+[1]*31)*1000000"):
        cases.append((["simulate", "--model", "mixtral-8x7b", "--num-gpus", "8", "--global-batch-size", "8",
                       "--moe-layer-freq", freq], "moe_layer_freq", 1))
    for name, words in (("negative", "time_s > 0"), ("text", "time_s > 0"), ("zero", "time_s > 0"),
                        ("inf", "time_s > 0"), ("foreign", "echo-tune profile"), ("empty", "is empty")):
        cases.append((TINY_SIM + ["--profile", "{profile-optime-%s.yaml}" % name], words, 1))
    cases.append((SIM + ["--cluster", "a100-80gb", "--profile", "{profile-optime-a100-40gb.yaml}"],
                  "the memory size differs: 40 GB against 80 GB", 1))
    emulate = ["emulate", "--model", TINY, "--num-gpus", "1", "--global-batch-size", "1", "--device", "cpu"]
    cases += [(emulate + ["--cluster", CPU_CLUSTER, "--num-experts", "8", "--moe-token-dispatcher-type", "flex"],
               "cannot run the flex dispatcher's fused deepep kernels", 1),
              (emulate + ["--cluster", CPU_CLUSTER, "--bf16", "--fp8-format", "e4m3"], "cannot run FP8 GEMMs", 1),
              (emulate + ["--cluster", "h100-sxm"], "--allow-other-device", 1),
              (emulate + ["--cluster", "a100-40gb", "--num-experts", "4", "--moe-permute-fusion", "--fp8-format",
                          "hybrid"], "2 problems", 3)]
    for tag, words in (("cost-nan", "gpu_hour_cost"), ("cost-inf", "gpu_hour_cost"), ("gpus-1e12", "num_gpus"),
                       ("gpus-2e6", "num_gpus"), ("profile-42", "`profile`"), ("profile-list", "`profile`"),
                       ("from-no-gpus", "num_gpus"), ("from-no-model", "model_spec"),
                       ("from-model-list", "model_spec")):
        cases.append((["rank", "{rank-%s.yaml}" % tag, "--json"], words, 1))
    for currency in ("\x1b[31mUSD", "US\x07D", "USD\n", "", "x" * 13, "\u202eDSU"):
        cases.append((["rank", RANK, "--currency", currency], "--currency", 1))
    cases.append((["plan", "--model", "gpt-1.7b", "--tokens", "1e9", "--candidate", "a100-80gb:8:1.0",
                   "--currency", "\x1b]0;pwned\x07"], "--currency", 1))
    for name, words in (("all_reduce_2gpu-negcount.log", "count >= 0"), ("all_reduce_2gpu-negsize.log", "cannot read"),
                        ("sendrecv_2gpu.log", "redop column"), ("send_recv_2gpu.log", "redop column")):
        cases.append((["calibrate", "check", "--cluster", A100, "--nccl-tests", "{%s}" % name], words, 1))
    cases += [(["validate", "{runs-100k.csv}"], "rows <= 2,000", 1), (["validate", "{runs-2001.csv}"], "2,001 rows", 1)]
    for name, words in (("cluster-gpu-list.yaml", "`gpu`"), ("cluster-gpu-int.yaml", "`gpu`"),
                        ("cluster-profile-42.yaml", "`profile`"), ("cluster-profile-list.yaml", "`profile`")):
        cases.append((SIM + ["--cluster", "{%s}" % name], words, 1))
    cases.append((SIM + ["--cluster", "{cluster-both.yaml}"], "2 problems", 3))
    cases.append((SIM + ["--model", "{model-three-bad.yaml}"], "3 problems", 4))
    for extra, words in (("--sequence-parallel=false", "takes no value"), ("--swiglu false", "`false`"),
                         ("--use-distributed-optimizer=1", "takes no value"), ("--fp16", "--bf16 and --fp16"),
                         ("\u2014tensor-model-parallel-size 2", "typographic dash"),
                         ("\u2013pipeline-model-parallel-size 2", "typographic dash"),
                         ("-tp 2", "--tensor-model-parallel-size"), ("-x", "`-x`"),
                         ("--seq-length 256", "max_position_embeddings >= seq_length"),
                         ("--tensor-model-parallel-size", "needs a value"),
                         ("--tensor-model-parallel-size --swiglu", "needs a value"),
                         ("--scatter-gather-tensors-in-pipeline=false", "takes no value"),
                         ("--scatter-gather-tensors-in-pipeline --no-scatter-gather-tensors-in-pipeline",
                          "never flags of one Megatron-LM version")):
        cases.append((["simulate", "--num-gpus", "8", "--megatron-args", f"{LINE} {extra}"], words, 1))
    cases.append((["simulate", "--num-gpus", "8", "--megatron-args", f"{LINE} --no-such-a 1 --no-such-b --no-such-c x"],
                  "3 problems in the Megatron launch line", 4))
    cases.append((["simulate", "--num-gpus", "8", "--megatron-args",
                   f"{LINE} --swiglu=true -tp 2 --fp16 --no-such-flag"], "4 problems", 5))
    return cases


CASES = _cases()


def test_every_class_has_several_cases():
    text = " ".join(" ".join(argv) for argv, _, _ in CASES)
    for marker, least in (("deep-", 6), ("laughs", 6), ("huge-", 4), ("hf-", 10), ("moe-layer-freq", 3),
                          ("profile-optime-", 4), ("rank-", 5), ("--currency", 5), (".log", 4), ("runs-", 2),
                          ("cluster-", 4), ("--megatron-args", 10)):
        assert text.count(marker) >= least, marker


def _fill(text: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("argv,expected,lines", CASES, ids=[ascii(" ".join(a))[-70:] for a, _, _ in CASES])
def test_bad_input_exits_2_with_one_line_per_problem(argv, expected, lines, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [_fill(a, files) for a in argv]
    if argv[0] == "search":
        argv += ["--results-dir", str(tmp_path / "results")]
    start = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == lines, err
    assert expected in err, err
    assert time.monotonic() - start < 60, "a big input must be refused in bounded time"


def test_emulate_cuda_without_cuda_is_one_line(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["emulate", "--model", TINY, "--cluster", CPU_CLUSTER, "--num-gpus", "1", "--global-batch-size", "1",
                 "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--device cuda" in err and "Traceback" not in err, err
