"""Megatron-LM training logs as calibration input: argument dump and iteration lines in Megatron's own shapes
(Megatron-LM d98e8a64ddf3 megatron/training/arguments.py `_print_args`, training.py `training_log`,
megatron/core/tokenizers/utils/build_tokenizer.py `vocab_size_with_padding`)."""

from __future__ import annotations

import pytest
import yaml

from echo_tune.calibrate.logs.megatron_log import parse_log, read_logs, run_row
from echo_tune.cli.main import main
from echo_tune.config.load.loading import _preset_table, load_cluster
from echo_tune.cost.profile import load_profile
from echo_tune.errors import ConfigError
from echo_tune.sim.simulate import simulate

ARGS = {"account_for_embedding_in_pipeline_split": False, "add_bias_linear": True, "attention_backend": "AttnBackend.auto",
        "bf16": True, "data_path": ["/data/gpt2_text_document"], "ffn_hidden_size": 4096, "fp16": False, "fp8": None,
        "global_batch_size": 64, "group_query_attention": False, "hidden_size": 1024, "kv_channels": 64,
        "log_interval": 10, "lr": 0.00015, "max_position_embeddings": 2048, "micro_batch_size": 2,
        "normalization": "LayerNorm", "num_attention_heads": 16, "num_layers": 12, "num_query_groups": 16,
        "params_dtype": "torch.bfloat16", "pipeline_model_parallel_size": 1, "position_embedding_type": "learned_absolute",
        "recompute_granularity": None, "seq_length": 2048, "sequence_parallel": False, "swiglu": False,
        "tensor_model_parallel_size": 1, "tokenizer_type": "GPT2BPETokenizer", "train_iters": 60,
        "transformer_impl": "transformer_engine", "use_distributed_optimizer": True, "vocab_size": None,
        "world_size": 8}


def megatron_log(args: dict, step_ms: list[float], vocab: int = 50257) -> str:
    """A rank-0 log as Megatron-LM prints it."""
    lines = ["using world size: 8, data-parallel size: 8", "------------------------ arguments ------------------------"]
    body = ["  {} {} {}".format(arg, "." * (48 - len(arg)), value) for arg, value in args.items()]
    lines += sorted(body, key=lambda x: x.lower())
    lines.append("-------------------- end of arguments ---------------------")
    lines.append(f" > padded vocab (size: {vocab}) with {-vocab % 128} dummy tokens (new size: {vocab + -vocab % 128})")
    for i, ms in enumerate(step_ms):
        it = (i + 1) * args["log_interval"]
        lines.append(f" [2025-01-01 10:00:{i:02d}.000000] iteration {it:8d}/{args['train_iters']:8d} | consumed samples: "
                     f"{it * args['global_batch_size']:12d} | elapsed time per iteration (ms): {ms:.1f} | "
                     f"learning rate: 1.500000E-04 | global batch size: {args['global_batch_size']:5d} | "
                     f"lm loss: 7.1E+00 | loss scale: 1.0 | grad norm: 1.0 | number of skipped iterations:   0 | "
                     f"number of nan iterations:   0 |")
    return "\n".join(lines) + "\n"


def test_reads_dump_and_median_step_after_the_first_interval(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(megatron_log(ARGS, [9000.0, 410.0, 400.0, 420.0]))
    (run,) = parse_log(path)
    assert run.args["hidden_size"] == "1024"
    assert [it.elapsed_ms for it in run.iterations] == [9000.0, 410.0, 400.0, 420.0]
    row = run_row(path, "a100-80gb")
    assert float(row["measured_step_time_s"]) == pytest.approx(0.410)  # median of 410, 400, 420; not 9000
    assert row["num_gpus"] == "8" and row["precision"] == "bf16" and row["vocab_size"] == "50304"
    assert "recompute_granularity" not in row  # None: not set
    (case,) = read_logs([path], "a100-80gb")
    assert case.error is None and case.model.num_layers == 12 and case.parallel.micro_batch_size == 2


def test_log_without_dump_or_iterations_is_refused_by_name(tmp_path):
    bare = tmp_path / "bare.log"
    bare.write_text(" iteration       10/     100 | elapsed time per iteration (ms): 400.0 |\n")
    with pytest.raises(ConfigError, match="no argument dump"):
        run_row(bare, "a100-80gb")
    short = tmp_path / "short.log"
    short.write_text(megatron_log(ARGS, [9000.0]))
    with pytest.raises(ConfigError, match=r"line 2: `iteration lines after the first > 0` must hold"):
        run_row(short, "a100-80gb")


def test_fit_from_megatron_logs_end_to_end(tmp_path, capsys):
    """Logs whose step times come from a known clock: the fit finds the clock, simulate and plan use it."""
    cluster = load_cluster("a100-80gb")
    true_clock = 1200.0
    logs = []
    for tp, mbs in ((1, 2), (2, 1), (4, 4), (8, 1)):
        args = {**ARGS, "tensor_model_parallel_size": tp, "micro_batch_size": mbs}
        path = tmp_path / f"tp{tp}.log"
        path.write_text(megatron_log(args, [1.0, 1.0]))  # placeholder times, to build the case
        (case,) = read_logs([path], "a100-80gb")
        step_s = simulate(case.model, cluster.replace(sustained_clock_mhz=true_clock), 8, case.parallel).step_time_s
        path.write_text(megatron_log(args, [step_s * 3000, step_s * 1000, step_s * 1000]))
        logs.append(str(path))
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "fit", "--megatron-log", *logs, "--cluster", "a100-80gb", "--params", "clock",
                 "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    profile = load_profile(out)
    assert profile.fitted_clock_mhz == pytest.approx(true_clock, rel=0.01)
    assert profile.fitted["errors"]["in_sample_mape_pct"] < 0.5
    assert profile.fitted["label"].startswith("fitted on runs: Megatron-LM log")
    assert [i["sha256"] for i in profile.fitted["inputs"]] and len(profile.fitted["rows"]) == 4
    # simulate with the profile: the fitted clock is applied
    assert main(["simulate", "--model", "llama3-8b", "--cluster", "a100-80gb", "--num-gpus",
                 "8", "--global-batch-size", "8", "--profile", str(out), "--json"]) == 0
    import json
    fitted_s = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(["simulate", "--model", "llama3-8b", "--cluster", "a100-80gb", "--num-gpus", "8",
                 "--global-batch-size", "8", "--json"]) == 0
    preset_s = json.loads(capsys.readouterr().out)["step_time_s"]
    assert fitted_s > preset_s  # 1,200 MHz is slower than the preset's 1,305
    # plan on a cluster file naming the fitted profile
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({**_preset_table("clusters")["a100-80gb"], "profile": str(out)}))
    assert main(["plan", "--model", "llama3-8b", "--tokens", "1e9", "--candidate", f"{cluster_file}:8",
                 "--global-batch-size", "8", "--n-trials", "4", "--results-dir", str(tmp_path / "r"), "--json"]) == 0


def test_list_valued_arguments_read_as_megatron_prints_them(tmp_path):
    # the dump prints lists and tuples as Python does: "['core_attn', 'mlp']", "[64, 0]"; both were refused and
    # the run quietly skipped by `calibrate fit --megatron-log`
    args = {**ARGS, "recompute_granularity": "selective", "recompute_modules": ["core_attn", "mlp"],
            "window_size": [64, 0], "position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True}
    path = tmp_path / "run.log"
    path.write_text(megatron_log(args, [9000.0, 410.0, 400.0]))
    (case,) = read_logs([path], "a100-80gb")
    assert case.error is None, case.error
    assert case.parallel.recompute_modules == ("core_attn", "mlp") and case.model.window_size == (64, 0)


@pytest.mark.parametrize("cell, expected", [("64,0", (64, 0)), ("(64, 0)", (64, 0)), ("[64, 0]", (64, 0)),
                                            ("64 0", (64, 0))])
def test_runs_csv_window_size_cells(cell, expected):
    from echo_tune.validate.runs import _value

    assert _value("window_size", cell, "tuple[int, int] | None") == expected
    assert _value("recompute_modules", "core_attn mlp", "tuple[str, ...] | None") == ("core_attn", "mlp")
    with pytest.raises(ConfigError, match="window_size.*integers"):
        _value("window_size", "64,x", "tuple[int, int] | None")
