"""``echo-tune simulate``: one layout, one step, where the time goes and whether it fits."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rich.console import Console

from echo_tune.console import make_console
from rich.table import Table

from echo_tune.cli.common import (add_clock_argument, add_layout_arguments, human_bytes, human_time, model_header,
                                  print_json, specs_from_args, with_clock)
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.profile import load_profile, profile_for
from echo_tune.sim.simulate import simulate
from echo_tune.sim.outputs.trace_export import write_chrome_trace
from echo_tune.errors import ConfigError
from echo_tune.sim.memory.stage import DEFAULT_MEMORY_HEADROOM_GIB
from echo_tune.plan.bands import band_note, band_or_none, kind_of, precision_of
from echo_tune.plan.anchors import anchor, anchor_text
from echo_tune.plan.host_share import host_bound_note, host_share_once

if TYPE_CHECKING:
    from echo_tune.sim.outputs.report import StepReport

DEFAULT_MODEL, DEFAULT_CLUSTER, DEFAULT_NUM_GPUS = "gpt3-175b", "a100-80gb", 1024
SEARCH_HINT = ("no throughput or MFU for a layout that does not fit in memory: run `echo-tune search` with the "
               "same --model, --cluster, --num-gpus and batch to find layouts that fit")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate", help="simulate one training step of a Megatron-LM layout",
        description="Simulate one training step. Without arguments: GPT-3 175B on 1024 A100-80GB, "
                    "TP8 PP16, micro-batch 1, global batch 1536, full recompute.")
    parser.add_argument("--model", help="model preset, YAML file or Hugging Face config.json (default gpt3-175b)")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER, help="cluster preset or YAML file (default a100-80gb)")
    parser.add_argument("--num-gpus", type=int, default=None, help=f"GPUs in the run (default {DEFAULT_NUM_GPUS})")
    parser.add_argument("--profile", help="calibration profile YAML (overrides the cluster's)")
    parser.add_argument("--trace", metavar="FILE", help="write the simulated timeline as Chrome-trace JSON (Perfetto)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--memory-headroom-gib", type=float, default=None,
                        help="GiB the layout must leave free under the HBM size to count as fitting (default 2: "
                             "allocator fragmentation, see sim/memory/stage.py)")
    add_clock_argument(parser)
    add_layout_arguments(parser)
    parser.set_defaults(run=run)


def _defaults(args: argparse.Namespace) -> None:
    """The built-in default run: GPT-3 175B on 1024 A100-80GB (Narayanan et al. 2021 style layout)."""
    if args.model or args.megatron_args or args.num_gpus is not None:
        return
    for field, value in (("tensor_model_parallel_size", 8), ("pipeline_model_parallel_size", 16),
                         ("micro_batch_size", 1), ("global_batch_size", 1536), ("recompute_granularity", "full")):
        if getattr(args, field) is None:
            setattr(args, field, value)


def run(args: argparse.Namespace) -> int:
    _defaults(args)
    model, parallel, notes = specs_from_args(args, default_model=DEFAULT_MODEL)
    header = model_header(model, args.model, args.seq_length)
    cluster = with_clock(load_cluster(args.cluster), args)
    profile = load_profile(args.profile) if args.profile else None
    num_gpus = args.num_gpus if args.num_gpus is not None else DEFAULT_NUM_GPUS

    headroom = DEFAULT_MEMORY_HEADROOM_GIB if args.memory_headroom_gib is None else args.memory_headroom_gib
    if headroom < 0:
        raise ConfigError(f"`--memory-headroom-gib >= 0` must hold, but got ({headroom})")
    cluster.gpu.check_headroom(headroom)
    report = simulate(model, cluster, num_gpus, parallel, profile=profile, timeline=bool(args.trace),
                      memory_headroom_bytes=int(headroom * 2**30))
    if args.trace:
        write_chrome_trace(report, args.trace)
        notes.append(f"timeline written to {args.trace} (open in https://ui.perfetto.dev)")
    # the bands come from validating the datasheet profiles; a measured or fitted profile has its own error

    share = host_share_once(model, cluster, num_gpus, parallel, profile=profile, step_time_s=report.step_time_s,
                            memory_headroom_bytes=int(headroom * 2**30))
    used = profile or profile_for(cluster)
    band = band_or_none(used, cluster, kind_of(model), precision_of(parallel), num_gpus, host_share=share)
    host_note = host_bound_note(share(), model, parallel, used.host_time_per_kernel_s) if report.fits_memory and \
        used.host_time_per_kernel_s > 0 else None
    if host_note is not None:
        notes.append(host_note)
    if band["match"] == "none":
        notes.append(band["note"])
        band = None
    elif report.fits_memory or just_over_risk(report):  # the band applied to the step (none where it cannot run)
        lo, hi = band["measured_over_predicted"]
        band["step_time_s"] = report.step_time_s * band["median_measured_over_predicted"]
        band["step_time_s_band"] = [report.step_time_s * lo, report.step_time_s * hi]
    measured = anchor(model, cluster.gpu.name, num_gpus, parallel.global_batch_size,
                      report.step_time_s) if report.fits_memory else None
    if args.json:
        data = report.to_dict()
        data["notes"] = header[1:] + list(report.notes) + notes
        risk = just_over_risk(report)
        if risk is not None:  # over by less than the memory model's error: it may run (plan/safety.py)
            data.update(memory_verdict=risk)
        elif not report.fits_memory:  # a layout that cannot run has no throughput
            data.update(tokens_per_s=None, model_tflops_per_gpu=None, mfu=None, search_hint=SEARCH_HINT)
        if band is not None:
            data["error_band"] = band
        if measured is not None:
            data["measured_anchor"] = measured
        if share.cache_info().currsize:  # simulated for the band or the note
            data["host_share"] = share()
        print_json(data)
    else:
        print_report(report, header[1:] + notes)
        if band is not None:
            step = "" if "step_time_s" not in band else (
                f"; step with the family's median applied: {band['step_time_s']:.3f} s "
                f"({band['step_time_s_band'][0]:.3f}-{band['step_time_s_band'][1]:.3f} s)")
            note = band_note(band)  # an exact family's own note is only its name
            make_console().print(f"[dim]error band (prediction error of {band['family']}'s runs, predicted - "
                                 f"measured, out of sample): {band['text']}"
                                 f"{'' if note is None else ' (' + note + ')'}{step}[/dim]", highlight=False)
        if measured is not None:
            make_console().print(anchor_text(measured), highlight=False, markup=False)
    return 0


def just_over_risk(report: "StepReport") -> str | None:
    """The "at risk" verdict of a layout predicted over its memory limit by less than the memory model's measured
    over-prediction (plan/safety.py ``over_limit_risk``): it may still run, so its throughput is shown."""
    # lazy: loads optuna (~0.3 s), which importing cli.simulate does not
    from echo_tune.plan.safety import over_limit_risk

    worst = report.worst_stage
    return over_limit_risk(worst.worst_rank_bytes, worst.reserve_bytes, report.memory_capacity_bytes)


def print_report(report: "StepReport", notes: list[str], console: Console | None = None) -> None:
    console = console or make_console()
    cfg = report.config
    title = (f"{cfg['model']} on {cfg['num_gpus']} x {cfg['cluster']}: TP{cfg['tensor_model_parallel_size']} "
             f"PP{cfg['pipeline_model_parallel_size']} CP{cfg['context_parallel_size']} DP{cfg['data_parallel_size']}, "
             f"micro-batch {cfg['micro_batch_size']} x {cfg['num_micro_batches']}, global batch {cfg['global_batch_size']}"
             f" of {cfg['model_spec']['seq_length']:,}-token sequences")
    console.print(f"[bold]{title}[/bold]")
    table = Table(show_header=True)
    table.add_column("step part")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for name, seconds in report.breakdown_s.items():
        table.add_row(name, human_time(seconds), f"{100 * seconds / report.step_time_s:.1f}%")
    table.add_row("[bold]step time[/bold]", f"[bold]{human_time(report.step_time_s)}[/bold]", "100%")
    console.print(table)
    risk = just_over_risk(report)
    if report.fits_memory or risk:
        console.print(f"throughput {report.tokens_per_s:,.0f} tokens/s, {report.model_tflops_per_gpu:.1f} model "
                      f"TFLOP/s per GPU, MFU {100 * report.mfu:.1f}%"
                      f"{' of the BF16 peak' if report.config.get('fp8_format') else ''}  "
                      f"(critical stage {report.critical_stage})")
    mem = Table(title="memory per GPU, by pipeline stage", show_header=True)
    stages = report.stage_memory
    shown = stages if len(stages) <= 6 else stages[:3] + stages[-2:]
    # every part of the total (the runtime reserve, CUDA graphs' and FSDP's buffers only where there are any),
    # so the columns add up to it
    parts = [("weights", "weights_bytes"), ("grads", "gradients_bytes"), ("optimizer", "optimizer_bytes"),
             ("activations", "activations_bytes"), ("workspaces", "workspace_bytes"), ("reserve", "reserve_bytes"),
             ("CUDA graphs", "cuda_graph_bytes"), ("FSDP buffers", "fsdp_buffer_bytes")]
    parts = [(label, key) for label, key in parts
             if label in ("weights", "grads", "optimizer", "activations") or any(getattr(m, key) for m in stages)]
    spread = any(m.dp_spread_bytes for m in stages)
    for col in ("stage", *(label for label, _ in parts), "total", *(("most loaded rank",) if spread else ())):
        mem.add_column(col, justify="right")
    for m in shown:
        cells = [f"{getattr(m, key) / 2**20:.0f} MiB" if key == "workspace_bytes" else human_bytes(getattr(m, key))
                 for _, key in parts]
        mem.add_row(str(m.stage), *cells, human_bytes(m.total_bytes),
                    *((human_bytes(m.worst_rank_bytes),) if spread else ()))
    console.print(mem)
    band = report.memory_band()
    style = {"fits": "green", "at risk": "bold yellow"}.get("at risk" if risk else band.band, "bold red")
    console.print(f"[{style}]{risk or band.text}[/{style}]", soft_wrap=True)
    if not report.fits_memory and not risk:
        console.print(f"[{style}]{SEARCH_HINT}[/{style}]", soft_wrap=True)
    console.print(f"[dim]profile: {report.profile}[/dim]")
    for note in [*report.notes, *notes]:
        console.print(f"[dim]note: {note}[/dim]", soft_wrap=True)
