"""`calibrate fit --megatron-log` on whole Megatron-LM logs (issue 40, items 1 and 5).

The fixtures in data/megatron_logs/ hold the WHOLE argument dump Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553
prints (`_print_args` in megatron/training/arguments.py: every argument, defaults included), written by running
that commit's own `parse_and_validate_args` on examples/llama/train_llama3_8b_h100_fp8.sh's launch line
(DTYPE=bf16) on 8 GPUs: TP1 CP1 (`--attention-backend fused`), CP2 (attention backend auto, Megatron's default) and
TP2; iteration lines in training.py `training_log`'s format. How they were made, and where the step times come
from: data/megatron_logs/make_logs.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from echo_tune.calibrate.fit.fit_runs import BOUNDS, fit_runs
from echo_tune.calibrate.logs.megatron_log import parse_log, read_logs
from echo_tune.cli.main import main
from echo_tune.config.load.loading import build, load_cluster
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.profile import load_cluster_profile, load_profile
from echo_tune.errors import ConfigError

DATA = Path(__file__).parent / "data" / "megatron_logs"
CP1, CP2, TP2 = (DATA / f"llama3_8b_bf16_{n}_8xh100.log" for n in ("tp1cp1", "tp1cp2", "tp2cp1"))
FP8 = DATA / "llama3_8b_fp8_tp1cp1_8xh100.log"


def _edit(tmp_path, source: Path, name: str, *replacements: tuple[str, str]) -> Path:
    text = source.read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def _arg(name: str, value: str) -> str:
    return "  {} {} {}".format(name, "." * (48 - len(name)), value)


def test_fixtures_are_whole_dumps_as_megatron_prints_them():
    for path in (CP1, CP2, TP2):
        (run,) = parse_log(path)
        assert len(run.args) > 800  # every argument, not a hand-picked few
        assert run.args["use_flash_attn"] == "False" and run.args["transformer_impl"] == "transformer_engine"
        assert run.args["world_size"] == "8" and len(run.iterations) == 30
    assert parse_log(CP1)[0].args["attention_backend"] == "AttnBackend.fused"
    assert parse_log(CP2)[0].args["attention_backend"] == "AttnBackend.auto"


def test_attention_and_fields_read_as_megatron_resolves_them():
    # use_flash_attn False (printed for every run) once read as unfused attention; CP2 was then refused
    cp1, cp2, tp2 = (read_logs([p], "h100-sxm")[0] for p in (CP1, CP2, TP2))
    for case in (cp1, cp2, tp2):
        assert case.error is None and case.model.flash_attention and case.model.use_flash_attn is None
        assert case.model.num_query_groups == 8 and case.model.apply_layernorm_1p  # --apply-layernorm-1p's dest
        assert case.parallel.main_grads_dtype == "fp32" and case.parallel.precision == "bf16"  # torch.float32
    assert (cp1.model.attention_backend, cp2.model.attention_backend) == ("fused", "auto")
    assert cp2.parallel.context_parallel_size == 2 and tp2.parallel.tensor_model_parallel_size == 2
    assert tp2.parallel.sequence_parallel and not cp1.parallel.sequence_parallel  # Megatron turns it off at TP1
    assert (cp1.measured_step_time_s, cp2.measured_step_time_s) == (pytest.approx(12.65), pytest.approx(12.91))


def test_whole_dumps_fit_a_physical_clock_and_predict_their_own_steps():
    cases = read_logs([CP1, CP2, TP2], "h100-sxm")
    cluster = cases[0].cluster
    result = fit_runs(cases, load_cluster_profile(cluster), cluster.gpu, params=("clock",))
    clock = result.params["sustained_clock_mhz"]
    _, low, high = BOUNDS["sustained_clock_mhz"]
    assert low * 1830 < clock < 0.99 * high * 1830 and clock < 1980  # inside H100 SXM's range, not at its edge
    assert not any("edge of its physical range" in w for w in result.warnings)
    assert all(abs(row["error_pct"]) < 5 for row in result.rows), result.rows


def test_the_shipped_fp8_recipe_reads_its_fp8_settings():
    # fp8 is --fp8-format's dest; the amax history and algorithm are harmless to the step, not refusals
    (run,) = parse_log(FP8)
    assert (run.args["fp8"], run.args["fp8_amax_history_len"], run.args["fp8_amax_compute_algo"]) == \
        ("hybrid", "1024", "max")
    (case,) = read_logs([FP8], "h100-sxm")
    assert (case.parallel.fp8_format, case.parallel.fp8_recipe, case.parallel.fp8_param_gather) == \
        ("hybrid", "delayed", True)
    assert case.parallel.precision == "bf16" and case.model.flash_attention


def test_no_gqa_means_one_query_group_per_head(tmp_path):
    # the dump prints num_query_groups' default, 1, for every model without GQA: read as-is it was MQA
    path = _edit(tmp_path, CP1, "mha.log", (_arg("group_query_attention", "True"), _arg("group_query_attention", "False")),
                 (_arg("num_query_groups", "8"), _arg("num_query_groups", "1")))
    (case,) = read_logs([path], "h100-sxm")
    assert case.model.num_query_groups is None and case.model.num_attention_heads == 32


def test_a_log_that_cannot_be_read_names_file_and_line(tmp_path, capsys):
    lines = CP1.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if "iteration        5/" in line)
    lines[number - 1] = re.sub(r"\(ms\): [0-9.]+", "(ms): 1.2.3", lines[number - 1])
    path = tmp_path / "corrupt.log"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"corrupt.log' line {number}: `elapsed time per iteration \(ms\)` must be "
                                          rf"a number, but got \('1.2.3'\)"):
        read_logs([path], "h100-sxm")
    assert main(["calibrate", "fit", "--megatron-log", str(path), str(CP2), str(TP2), "--cluster", "h100-sxm",
                 "--params", "clock", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"line {number}" in err and "corrupt.log" in err and err.count("\n") == 1 and "Traceback" not in err


def test_torchrun_prefixed_log_reads_as_the_plain_one(tmp_path):
    path = tmp_path / "tee.log"
    path.write_text("".join(f"[default0]:{line}\n" for line in CP2.read_text().splitlines()))
    (plain,), (prefixed,) = read_logs([CP2], "h100-sxm"), read_logs([path], "h100-sxm")
    assert prefixed.model == plain.model.replace(name="tee") and prefixed.parallel == plain.parallel
    assert prefixed.measured_step_time_s == plain.measured_step_time_s


def test_two_runs_appended_in_one_file_are_kept_apart(tmp_path):
    path = tmp_path / "job.log"
    path.write_text(CP1.read_text() + CP2.read_text())
    first, second = read_logs([path], "h100-sxm")
    assert (first.parallel.context_parallel_size, second.parallel.context_parallel_size) == (1, 2)
    assert (first.measured_step_time_s, second.measured_step_time_s) == (pytest.approx(12.65), pytest.approx(12.91))
    assert first.name == "job@line6" and second.name.startswith("job@line") and first.source != second.source
    # iteration numbers that restart without a new dump: two runs mixed, refused with the line
    lines = CP1.read_text().splitlines()
    tail = [line for line in lines if " iteration " in line][:3]
    path.write_text("\n".join(lines + tail) + "\n")
    with pytest.raises(ConfigError, match=rf"line {len(lines) + 1}: iteration 1 follows iteration 30"):
        read_logs([path], "h100-sxm")


def test_fp4_run_is_read_as_nvfp4_not_fitted_as_bf16(tmp_path):
    path = _edit(tmp_path, CP1, "fp4.log", (_arg("fp4", "None"), _arg("fp4", "e2m1")))
    (case,) = read_logs([path], "b200")
    assert case.error is None and case.parallel.fp4_format == "e2m1" and case.parallel.quantized_recipe == "nvfp4"
    (hopper,) = read_logs([path], "h100-sxm")  # an H100 has no FP4 tensor cores: refused by name when simulated
    from echo_tune.sim.simulate import simulate

    with pytest.raises(ConfigError, match="no fp4 tensor cores"):
        simulate(hopper.model, hopper.cluster, hopper.num_gpus, hopper.parallel)
    # a step-shaping argument away from Megatron's default is refused too; at its default it is not
    history = _edit(tmp_path, CP2, "history.log", (_arg("record_memory_history", "False"),
                                                   _arg("record_memory_history", "True")))
    with pytest.raises(ConfigError, match=r"`record_memory_history True` \(--record-memory-history\)"):
        read_logs([history], "h100-sxm")
    # a modelled list argument is read as Megatron prints it (issue 39: --cp-comm-type)
    a2a = _edit(tmp_path, CP2, "a2a.log", (_arg("cp_comm_type", "['p2p']"), _arg("cp_comm_type", "['a2a']")))
    (case,) = read_logs([a2a], "h100-sxm")
    assert case.error is None and case.parallel.cp_comm_type == "a2a"


def test_the_same_log_given_twice_counts_once(tmp_path, capsys):
    notes = []
    assert len(read_logs([CP1, CP1, CP2], "h100-sxm", notes)) == 2
    assert len(notes) == 1 and "the same run as" in notes[0] and "counted once" in notes[0]
    copy = tmp_path / "copy.log"
    copy.write_text(CP1.read_text())
    out = tmp_path / "p.yaml"
    # four logs given, three runs: the copy is dropped, the fit has its three rows
    assert main(["calibrate", "fit", "--megatron-log", str(CP1), str(copy), str(CP2), str(TP2), "--cluster",
                 "h100-sxm", "--params", "clock", "--out", str(out), "--json"]) == 0
    assert "counted once" in capsys.readouterr().out
    assert load_profile(out).fitted["errors"]["rows"] == 3


def test_intervals_with_skipped_iterations_are_left_out(tmp_path):
    lines = CP2.read_text().splitlines()
    for i, line in enumerate(lines):
        if any(f"iteration {n:8d}/" in line for n in range(2, 20)):  # 18 of 29 intervals: they would set the median
            lines[i] = line.replace("skipped iterations:   0", "skipped iterations:   1").replace(
                "(ms): 12", "(ms): 9")
    path = tmp_path / "overflow.log"
    path.write_text("\n".join(lines) + "\n")
    (case,) = read_logs([path], "h100-sxm")
    assert case.measured_step_time_s == pytest.approx(12.91, rel=0.004)


def test_duplicate_rows_are_one_piece_of_evidence():
    cluster = load_cluster("h100-sxm")
    base = load_cluster_profile(cluster)
    cp1, cp2, tp2 = read_logs([CP1, CP2, TP2], "h100-sxm")
    copies = [dataclasses.replace(cp1, name=f"copy{i}", source=f"copy {i}") for i in range(50)]
    with pytest.raises(ConfigError, match=r"rows=1 distinct \(of 50 given: duplicates count once\)"):
        fit_runs(copies, base, cluster.gpu, params=("clock",))
    result = fit_runs([*copies, cp2, tp2], base, cluster.gpu, params=("clock",))
    assert len(result.rows) == 3 and result.loo_mape_pct > 0.1
    assert any("50 rows are the same run" in w for w in result.warnings)


def test_a_run_that_cannot_be_simulated_names_its_log(tmp_path):
    # 33 heads do not split over TP 2: Megatron would refuse the run, and so does the fit, by the log's name
    path = _edit(tmp_path, TP2, "odd.log", (_arg("num_attention_heads", "32"), _arg("num_attention_heads", "33")))
    with pytest.raises(ConfigError, match=r"odd.log' line 6: the run whose argument dump starts here cannot be "
                                          r"simulated: .*num_attention_heads"):
        read_logs([path], "h100-sxm")


def test_arguments_of_48_characters_or_more_print_without_dots_and_are_read(tmp_path):
    # '.' * (48 - len(arg)) is '' for long names: "  ddp_param_name_patterns_for_fp32_local_accumulation  []"
    (run,) = parse_log(CP1)
    assert run.args["ddp_param_name_patterns_for_fp32_local_accumulation"] == "[]"
    assert run.args["config_logger_dir"] == ""  # a '' value: the line ends in the separating space
    name = "ddp_param_name_patterns_for_fp32_local_accumulation"
    path = _edit(tmp_path, CP1, "fp32acc.log", (f"  {name}  []", f"  {name}  ['*.bias']"))
    with pytest.raises(ConfigError, match=rf"`{name} \['\*.bias'\]`"):
        read_logs([path], "h100-sxm")


def test_srun_labels_are_read(tmp_path):
    path = tmp_path / "srun.log"
    path.write_text("".join(f" 0: {line}\n" for line in TP2.read_text().splitlines()))
    (case,) = read_logs([path], "h100-sxm")
    assert case.parallel.tensor_model_parallel_size == 2 and case.measured_step_time_s == pytest.approx(13.43)


def _launch_lines() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("make_logs", DATA / "make_logs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: line for name, (line, _) in module.LOGS.items()}


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.log")))
def test_a_dump_reads_as_the_launch_line_it_came_from(name):
    """The dump and `--megatron-args` with the line that printed it give the same model and layout, but for what
    Megatron's validate_args resolves (and the line leaves at a default that means the same)."""
    model_fields, parallel_fields, precision, _ = parse_megatron_line(_launch_lines()[name], megatron_lm=True)
    model = build(ModelSpec, {**model_fields, "name": Path(name).stem}, "model")
    parallel = build(ParallelConfig, {**parallel_fields, "precision": precision}, "layout")
    (case,) = read_logs([DATA / name], "h100-sxm")
    tp = parallel.tensor_model_parallel_size
    resolved_model = {"max_position_embeddings": 8192,  # None on the line: the sequence length
                      "bias_gelu_fusion": False}  # validate_args: no GeLU fusion with --swiglu (unused either way)
    resolved_parallel = {"expert_tensor_parallel_size": tp,  # None: TP's size
                         "sequence_parallel": tp > 1}  # validate_args turns it off at TP 1
    assert case.model == model.replace(**resolved_model)
    assert case.parallel == dataclasses.replace(parallel, **resolved_parallel)


def test_a_launch_that_died_before_training_is_left_out_of_its_file(tmp_path):
    crashed = "\n".join(line for line in CP1.read_text().splitlines() if " iteration " not in line)
    path = tmp_path / "relaunched.log"
    path.write_text(crashed + "\ntorch.OutOfMemoryError: CUDA out of memory.\n" + CP2.read_text())
    notes = []
    (case,) = read_logs([path], "h100-sxm", notes)
    assert case.parallel.context_parallel_size == 2 and case.name.startswith("relaunched@line")
    assert len(notes) == 1 and "line 6: the run whose dump starts here logged 0 iteration line(s)" in notes[0]
    path.write_text(crashed + "\n")  # alone it is an error, not an empty fit
    with pytest.raises(ConfigError, match=r"relaunched.log' line 6: `iteration lines after the first > 0` must hold"):
        read_logs([path], "h100-sxm")
