"""The bad-input catalogue (issue 10): every subcommand, every kind of bad number, file and path.

Each case runs the CLI in-process and asserts exit code 2 and ONE line on stderr that names the
problem (the key or flag, or the file's fault). The table is built from rules (each numeric flag
times NaN / inf / out-of-range, each numeric key of each file kind times the same), so a new flag
or key is one line here. The input-side classes of issue 20 (YAML bombs, config.json types, launch lines
Megatron refuses, op-time databases, ...) and inputs with several problems: test_bad_input_catalogue_inputs.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.validate.datasets import published_runs

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SMALL = str(REPO / "search_spaces" / "small-gpt7b-16xa100.yaml")
RANK = str(REPO / "search_spaces" / "rank" / "gpt3-175b-options.yaml")
RUNS = published_runs("runs_megatron.csv")
LOG2 = REPO / "calibration" / "azure-ndv4-a100-40gb" / "nccl-tests" / "all_reduce_2gpu.log"
A100 = str(REPO / "calibration" / "azure-ndv4-a100-40gb" / "cluster.yaml")
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]

MODEL = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
         "vocab_size": 1000}
CLUSTER = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
PROFILE = yaml.safe_load((REPO / "echo_tune" / "calibrate" / "profiles" / "a100-80gb.yaml").read_text())
SPACE = yaml.safe_load(Path(SMALL).read_text())
BAD_NUMBERS = {"nan": float("nan"), "inf": float("inf"), "neg": -1, "zero": 0, "text": "x"}


def _files(root: Path) -> dict[str, str]:
    """Write every bad file once; name -> path."""
    out: dict[str, str] = {}

    def put(name: str, data: bytes | str | dict) -> None:
        path = root / name
        if isinstance(data, dict):
            data = yaml.safe_dump(data)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = str(path)
    put("latin1.yaml", "name: m\nnum_layers: 4  # caf\xe9\n".encode("latin-1"))
    put("list.yaml", "- a\n- b\n")
    put("broken.yaml", "num_layers: [4, 8\n")
    put("model.yaml", MODEL)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
        for tag, value in BAD_NUMBERS.items():
            put(f"model-{key}-{tag}.yaml", {**MODEL, key: value})
    for key in ("intra_node_bandwidth_gbyte_s", "nic_bandwidth_gbit_s", "gpus_per_node", "nics_per_node"):
        for tag, value in BAD_NUMBERS.items():
            put(f"cluster-{key}-{tag}.yaml", {**CLUSTER, key: value})
    for key, values in {"kernel_launch_overhead_s": (-1e-3, float("nan"), 5.0),
                        "gemm_max_efficiency": (2.0, float("nan"), 0),
                        "memory_bandwidth_gbyte_s": (0, float("inf"), -5)}.items():
        for value in values:
            compute = {**PROFILE["compute"], key: value}
            put(f"profile-{key}-{value}.yaml", {**PROFILE, "compute": compute})
    for key, values in {"global_batch_size": (0, -1, 2**41, "x", 1.5), "num_gpus": (0, -16, 10**9, "x"),
                        "gpu_hour_cost": (float("nan"), -1, 0, float("inf")),
                        "memory_headroom_gib": (float("nan"), -1, 10**6)}.items():
        for value in values:
            put(f"space-{key}-{value}.yaml", {**SPACE, key: value})
    put("space-objectives.yaml", {**SPACE, "objectives": ["speed"]})
    put("space-layout-key.yaml", {**SPACE, "layout": {"tensor_parallel_size": [1]}})
    put("space-mbs-zero.yaml", {**SPACE, "layout": {"micro_batch_size": [0]}})
    runs = RUNS.read_text().splitlines()
    header, row = runs[0], runs[1]
    cols = header.split(",")
    at = cols.index("measured_step_time_s")
    for tag in ("nan", "inf", "-1", "0", "1e9"):
        fields = row.split(",")
        fields[at] = tag
        put(f"runs-measured-{tag}.csv", header + "\n" + ",".join(fields) + "\n")
    put("runs-short-row.csv", header + "\n" + ",".join(row.split(",")[:5]) + "\n")
    put("runs-latin1.csv", (header + "\n" + row.replace("Narayanan", "Narayan\xe9") + "\n").encode("latin-1"))
    put("runs-missing-col.csv", ",".join(c for c in cols if c != "num_gpus") + "\n")
    put("runs-header-only.csv", header + "\n")
    log = LOG2.read_text()
    rows = [i for i, line in enumerate(log.splitlines()) if line.strip()[:1].isdigit()]
    lines = log.splitlines()
    first = lines[rows[0]].split()
    first[5] = "nan"
    lines_nan = list(lines)
    lines_nan[rows[0]] = "  ".join(first)
    put("all_reduce_2gpu-nantime.log", "\n".join(lines_nan) + "\n")
    put("all_reduce_2gpu-twice.log", log + log)
    put("reduce_2gpu.log", log)
    put("all_reduce_2gpu-norank.log", "\n".join(line for line in lines if "Rank  1" not in line) + "\n")
    put("all_reduce_2gpu-latin1.log", b"\xff\xfe garbage\n")
    put("afile", "x")
    (root / "adir").mkdir()
    out["adir"] = str(root / "adir")
    _storage_files(root, out)
    return out


def _storage_files(root: Path, out: dict[str, str]) -> None:
    """Issue 20's storage, output and resume inputs: a FIFO, links planted where outputs go, profiles whose
    op_times name a non-database, and finished studies whose inputs then changed."""
    (root / "space-python-tag.yaml").write_text(f"name: x\nmodel: !!python/object/apply:os.system ['touch {root}/pwned']\n"
                                                f"cluster: a100-40gb\nnum_gpus: 8\nglobal_batch_size: 8\n")
    out["space-python-tag.yaml"] = str(root / "space-python-tag.yaml")
    os.mkfifo(root / "fifo")
    out["fifo"] = str(root / "fifo")
    (root / "victim.txt").write_text("precious\n")
    for name in ("link.json", "link.yaml"):
        os.symlink(root / "victim.txt", root / name)
        out[name] = str(root / name)
    for output in ("best.json", "trials.csv"):
        folder = root / f"planted-{output}" / "small-gpt7b-16xa100"
        folder.mkdir(parents=True)
        os.symlink(root / "victim.txt", folder / output)
        out[f"planted-{output}"] = str(root / f"planted-{output}")
    (root / "empty.db").write_bytes(b"")
    for tag, db in (("empty", "empty.db"), ("text", "afile")):
        out[f"profile-optimes-{tag}.yaml"] = str(root / f"profile-optimes-{tag}.yaml")
        (root / f"profile-optimes-{tag}.yaml").write_text(yaml.safe_dump({**PROFILE, "op_times": db}))
    for tag in ("model", "headroom"):  # a finished study, then its model file edited in place
        folder = root / f"resumed-{tag}"
        folder.mkdir()
        for name in ("tiny-space.yaml", "tiny-llama.yaml", "cpu-cluster.yaml"):
            (folder / name).write_bytes((DATA / name).read_bytes())
        assert main(["search", str(folder / "tiny-space.yaml"), "--sampler", "exhaustive", "--n-trials", "2",
                     "--results-dir", str(folder / "results"), "--json"]) == 0
        out[f"resumed-{tag}"] = str(folder)
    model = root / "resumed-model" / "tiny-llama.yaml"
    model.write_text(model.read_text().replace("hidden_size: 256", "hidden_size: 512"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("bad-inputs"))


def _numeric_flag_cases() -> list[tuple[list[str], str]]:
    cases = []
    for flag, values in {"--num-gpus": ("nan", "0", "-8", "1e9", "2000000"), "--global-batch-size": ("0", "-1"),
                         "--micro-batch-size": ("0", "-2"), "--tensor-model-parallel-size": ("0", "-1"),
                         "--pipeline-model-parallel-size": ("0",), "--seq-length": ("-5", "0", "999999999"),
                         "--num-layers": ("0", "100000"), "--hidden-size": ("0", "-64"),
                         "--vocab-size": ("0",), "--memory-headroom-gib": ("nan", "inf", "-1", "1e9", "1000"),
                         "--moe-routing-imbalance": ("nan", "0.5", "inf"), "--hidden-dropout": ("nan", "1.5"),
                         "--attention-dropout": ("-0.1",)}.items():
        for value in values:
            cases.append((SIM + [flag, value], flag))
    for flag, values in {"--gpu-hour-cost": ("nan", "-1", "0", "inf"), "--timeout": ("nan", "0", "-5", "inf"),
                         "--n-trials": ("0", "-3", "100000000", "nan"), "--n-jobs": ("0", "-1", "99999"),
                         "--seed": ("-1", "8589934592"), "--top": ("-1",),
                         "--memory-headroom-gib": ("nan", "-2", "1000")}.items():
        for value in values:
            cases.append((["search", SMALL, flag, value], flag))
    for value in ("nan", "-1", "0", "inf", "1e30"):
        cases.append((["rank", RANK, "--tokens", value], "--tokens"))
    cases.append((["rank", RANK, "--memory-headroom-gib", "nan"], "--memory-headroom-gib"))
    cases.append((["rank", RANK, "--memory-headroom-gib", "500"], "--memory-headroom-gib"))  # more than the HBM
    for value in ("0", "-8", "nan", "1e9", "x", "1"):  # 1: a collective of one GPU (ZeroDivisionError before)
        cases.append((["calibrate", "predict", "--cluster", "a100-80gb", "--num-gpus", value], "--num-gpus"))
    cases.append((["calibrate", "predict", "--cluster", "a100-80gb", "--num-gpus", "8", "0"], "--num-gpus"))
    for value in ("nan", "-1", "inf"):
        cases.append((["calibrate", "check", "--cluster", A100, "--nccl-tests", str(LOG2), "--max-error-pct", value],
                      "--max-error-pct"))
    for value in ("0", "4"):
        cases.append((["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", "x.yaml",
                       "--max-tiers", value], "--max-tiers"))
    for value in ("0", "-2", "nan"):
        cases.append((["emulate", "--cluster", str(DATA / "cpu-cluster.yaml"), "--num-gpus", "1",
                       "--global-batch-size", "1", "--repeats", value], "--repeats"))
        cases.append((["profile", "--model", str(DATA / "tiny-llama.yaml"), "--cluster",
                       str(DATA / "cpu-cluster.yaml"), "--num-gpus", "1", "--global-batch-size", "1",
                       "--threads", value], "--threads"))
    cases.append((["emulate", "--cluster", str(DATA / "cpu-cluster.yaml"), "--num-gpus", "1",
                   "--global-batch-size", "1", "--stage", "-1"], "--stage"))
    for value in ("0", "-1"):
        cases.append((["bench", "--name", "x", "--ranks-per-node", value], "--ranks-per-node"))
    return cases


def _choice_cases() -> list[tuple[list[str], str]]:
    return [
        (["calibrate", "predict", "--cluster", "a100-80gb", "--num-gpus", "8", "--collective", "bogus"], "--collective"),
        (["search", SMALL, "--sampler", "bogus"], "--sampler"),
        (["search", SMALL, "--objectives", "speed"], "objectives"),
        (["search", SMALL, "--resume", "--overwrite"], "--overwrite"),
        (SIM + ["--recompute-granularity", "everything"], "recompute_granularity"),
        (SIM + ["--fp8-format", "e5m2"], "fp8_format"),
        (SIM + ["--model", "no-such-model"], "no-such-model"),
        (SIM + ["--cluster", "no-such-cluster"], "no-such-cluster"),
        (SIM + ["--megatron-args", "--no-such-flag 3"], "--no-such-flag"),
        (["bench", "--name", "x", "--device", "tpu"], "--device"),
        (["emulate", "--cluster", str(DATA / "cpu-cluster.yaml"), "--num-gpus", "1", "--device", "tpu"], "--device"),
        (["simulate", "--num-gpus"], "--num-gpus"),
        (["no-such-command"], "no-such-command"),
    ]


def _file_cases() -> list[tuple[list[str], str]]:
    """(argv with {name} placeholders for the files fixture, expected text)."""
    cases: list[tuple[list[str], str]] = [
        (SIM + ["--model", "{latin1.yaml}"], "not UTF-8"),
        (SIM + ["--model", "{list.yaml}"], "mapping"),
        (SIM + ["--model", "{broken.yaml}"], "not valid YAML"),
        (SIM + ["--model", "{adir}"], "does not exist"),
        (SIM + ["--cluster", "{latin1.yaml}"], "not UTF-8"),
        (SIM + ["--trace", "{adir}"], "--trace"),
        (SIM + ["--trace", "{afile}/t.json"], "--trace"),
        (SIM + ["--profile", "{list.yaml}"], "mapping"),
        (["search", "{latin1.yaml}"], "not UTF-8"),
        (["search", "{adir}"], "does not exist"),
        (["search", SMALL, "--results-dir", "{afile}"], "--results-dir"),
        (["search", "{space-objectives.yaml}"], "objectives"),
        (["search", "{space-layout-key.yaml}"], "tensor_parallel_size"),
        (["search", "{space-mbs-zero.yaml}"], "micro_batch_size"),
        (["rank", "{list.yaml}"], "mapping"),
        (["rank", "{latin1.yaml}"], "not UTF-8"),
        (["validate", "{runs-short-row.csv}"], "line 2"),
        (["validate", "{runs-latin1.csv}"], "not UTF-8"),
        (["validate", "{runs-missing-col.csv}"], "num_gpus"),
        (["validate", "{runs-header-only.csv}"], "no rows"),
        (["validate", "{adir}"], "does not exist"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{all_reduce_2gpu-nantime.log}"], "finite"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{all_reduce_2gpu-twice.log}"], "several runs"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{reduce_2gpu.log}"], "read as reduce"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{all_reduce_2gpu-norank.log}"], "busbw / algbw"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{all_reduce_2gpu-latin1.log}"], "line 1"),
        (["calibrate", "check", "--cluster", A100, "--nccl-tests", "{adir}"], "does not exist"),
        (["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", "{adir}"], "{adir}"),
        (["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", "{afile}/p.yaml"], "afile"),
        (["calibrate", "predict", "--cluster", "{latin1.yaml}", "--num-gpus", "8"], "not UTF-8"),
    ]
    for key in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size"):
        for tag in BAD_NUMBERS:
            cases.append((SIM + ["--model", f"{{model-{key}-{tag}.yaml}}"], key))
    for key in ("intra_node_bandwidth_gbyte_s", "nic_bandwidth_gbit_s", "gpus_per_node", "nics_per_node"):
        for tag in BAD_NUMBERS:
            cases.append((SIM + ["--cluster", f"{{cluster-{key}-{tag}.yaml}}"], key))
    for key, values in {"kernel_launch_overhead_s": (-1e-3, float("nan"), 5.0),
                        "gemm_max_efficiency": (2.0, float("nan"), 0),
                        "memory_bandwidth_gbyte_s": (0, float("inf"), -5)}.items():
        for value in values:
            cases.append((SIM + ["--cluster", "a100-80gb", "--profile", f"{{profile-{key}-{value}.yaml}}"], key))
            cases.append((["calibrate", "predict", "--cluster", "a100-80gb", "--num-gpus", "8", "--profile",
                           f"{{profile-{key}-{value}.yaml}}"], key))
    for key, values in {"global_batch_size": (0, -1, 2**41, "x", 1.5), "num_gpus": (0, -16, 10**9, "x"),
                        "gpu_hour_cost": (float("nan"), -1, 0, float("inf")),
                        "memory_headroom_gib": (float("nan"), -1, 10**6)}.items():
        for value in values:
            cases.append((["search", f"{{space-{key}-{value}.yaml}}"], key))
    for tag in ("nan", "inf", "-1", "0", "1e9"):
        cases.append((["validate", f"{{runs-measured-{tag}.csv}}"], "measured_step_time_s"))
    return cases


def _storage_cases() -> list[tuple[list[str], str]]:
    """Issue 20: storages that cannot work, outputs through links or outside their root, resumed studies whose
    inputs changed, launch settings torchrun would fail on."""
    search = ["search", SMALL, "--n-trials", "2"]
    cases: list[tuple[list[str], str]] = [
        (search + ["--storage", "/dev/zero"], "regular journal file"),
        (search + ["--storage", "{fifo}"], "regular journal file"),
        (search + ["--storage", "{adir}"], "regular journal file"),
        (search + ["--storage", "redis://127.0.0.1:1"], "redis"),
        (search + ["--storage", "sqlite:///:memory:"], "in-memory"),
        (search + ["--storage", "sqlite:///:memory:", "--n-jobs", "2"], "in-memory"),
        (search + ["--storage", "sqlite://"], "in-memory"),
        (search + ["--storage", "sqlite:///file::memory:?cache=shared"], "in-memory"),
        (search + ["--storage", "sqlite:///{afile}/study.db"], "--storage"),
        (SIM + ["--trace", "{link.json}"], "symbolic link"),
        (["search", "--model", "gpt-1.7b", "--cluster", "a100-80gb", "--num-gpus", "8", "--global-batch-size", "64",
          "--write-space", "{link.yaml}"], "symbolic link"),
        (["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", "{link.yaml}"], "symbolic link"),
        (["profile", "--model", str(DATA / "tiny-llama.yaml"), "--cluster", str(DATA / "cpu-cluster.yaml"),
          "--num-gpus", "1", "--global-batch-size", "1", "--write-profile", "{link.yaml}"], "symbolic link"),
        (["profile", "--model", str(DATA / "tiny-llama.yaml"), "--cluster", str(DATA / "cpu-cluster.yaml"),
          "--num-gpus", "1", "--global-batch-size", "1", "--db", "{link.json}"], "symbolic link"),
        (search + ["--results-dir", "{planted-best.json}"], "symbolic link"),
        (search + ["--results-dir", "{planted-trials.csv}"], "symbolic link"),
        (SIM + ["--cluster", "a100-80gb", "--profile", "{profile-optimes-empty.yaml}"], "is empty"),
        (SIM + ["--cluster", "a100-80gb", "--profile", "{profile-optimes-text.yaml}"], "not an SQLite database"),
        (["search", "{resumed-model}/tiny-space.yaml", "--sampler", "exhaustive", "--resume", "--results-dir",
          "{resumed-model}/results"], "changed: model"),
        (["search", "{resumed-headroom}/tiny-space.yaml", "--sampler", "exhaustive", "--resume", "--results-dir",
          "{resumed-headroom}/results", "--memory-headroom-gib", "30"], "changed: memory_headroom_gib"),
        (["bench", "--nproc-per-node", "2", "--ranks-per-node", "3"], "--ranks-per-node"),
        (["bench", "--nproc-per-node", "4", "--ranks-per-node", "3"], "--ranks-per-node"),
    ]
    cases += [(search + ["--study-name", name], "plain folder name") for name in ("../escape", "a/b", "..")]
    cases.append((["search", "{space-python-tag.yaml}"], "python/object"))  # kept: tags are never constructed
    for name in ("/tmp/echo-tune-elsewhere", "..", "../up", "a/b"):
        cases.append((["bench", "--name", name, "--quick"], "--name"))
    return cases


CASES = _numeric_flag_cases() + _choice_cases() + _file_cases() + _storage_cases()


def test_the_catalogue_is_large():
    assert len(CASES) >= 150
    assert {argv[0] for argv, _ in CASES} >= {"simulate", "search", "rank", "calibrate", "validate", "profile",
                                               "emulate", "bench"}


def _fill(text: str, files: dict[str, str]) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("argv,expected", CASES, ids=[" ".join(a)[-70:] for a, _ in CASES])
def test_bad_input_exits_2_with_one_line(argv, expected, files, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a case that wrongly ran on would write here, not into the repository
    argv = [_fill(a, files) for a in argv]
    if argv[0] == "search" and "--results-dir" not in argv:
        argv += ["--results-dir", str(tmp_path / "results")]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    expected = _fill(expected, files)
    # a flag may be named as the flag or as its Megatron argument name (--seq-length / seq_length)
    assert expected in err or expected.lstrip("-").replace("-", "_") in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_results_dir(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main(["search", SMALL, "--results-dir", str(folder), "--n-trials", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--results-dir" in err
    finally:
        folder.chmod(0o700)


def test_bom_csv_is_read(tmp_path, capsys):
    """A byte-order mark is not bad input: the first column is still `name`."""
    runs = RUNS.read_text().splitlines()
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + ("\n".join(runs[:2]) + "\n").encode())
    assert main(["validate", str(path), "--json"]) in (0, 1)
    assert "missing" not in capsys.readouterr().err


def test_planted_links_and_tags_left_nothing_behind(files, tmp_path, capsys):
    """After the catalogue's cases: no link's target was written, no YAML tag ran (issue 20: keep it so)."""
    assert main(["search", files["space-python-tag.yaml"], "--results-dir", str(tmp_path)]) == 2
    root = Path(files["fifo"]).parent
    assert not (root / "pwned").exists()
    assert (root / "victim.txt").read_text() == "precious\n"
    assert (root / "empty.db").read_bytes() == b""
