"""``echo-tune emulate``: run one pipeline stage of a layout for real, next to the simulator's prediction."""

from __future__ import annotations

import argparse

from rich.table import Table


from echo_tune.console import make_console
from echo_tune.cli.common import add_layout_arguments, human_time, print_json, set_torch_threads, specs_from_args
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.profile import load_profile
from echo_tune.errors import ConfigError

PART_NAMES = {"compute": "compute (kernels + host)", "experts": "  of it: routed experts (GEMMs + activation)",
              "tp_cp_comm": "TP/CP collectives (modelled waits)",
              "ep_comm": "MoE dispatch/combine (modelled waits)", "interference": "interference", "pp_wait": "waiting on neighbour stages (bubble + p2p)",
              "pipeline": "pipeline phase (end of last task)", "tail": "DP reduction + optimizer (modelled)",
              "stage_step": "stage step"}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "emulate", help="run one pipeline stage of a layout for real, with modelled communication",
        description="Build one pipeline stage's real sharded modules, run its micro-batches in Megatron's order "
                    "on this device with every collective and p2p transfer replaced by its modelled wait, and "
                    "compare with the simulator part by part.")
    parser.add_argument("--model", help="model preset or YAML file")
    parser.add_argument("--cluster", required=True, help="cluster preset or YAML file")
    parser.add_argument("--num-gpus", type=int, required=True, help="GPUs in the run")
    parser.add_argument("--stage", type=int, default=0, help="pipeline stage to run (default 0)")
    parser.add_argument("--profile", help="calibration profile YAML (overrides the cluster's), e.g. the one "
                                          "`echo-tune profile` wrote")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of the stage (median reported)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where to run (default: cuda when present)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads on CPU")
    parser.add_argument("--allow-other-device", action="store_true",
                        help="run even when this device is not the cluster's GPU (e.g. the CPU against h100-sxm); "
                             "every emulated figure is then labelled with the device it ran on")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_layout_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # lazy: loads torch (~1.5 s to import), which importing cli.emulate does not
    from echo_tune.emulate.run import emulate

    set_torch_threads(args.threads)
    if args.device == "cuda":
        # lazy: loads torch (~1.5 s to import), which importing cli.emulate does not
        import torch

        if not torch.cuda.is_available():  # else torch's AssertionError "Torch not compiled with CUDA enabled"
            raise ConfigError("--device cuda was asked for, but torch sees no CUDA device on this machine; drop "
                              "--device or use --device cpu")
    if args.repeats < 1:
        raise ConfigError(f"`repeats >= 1` must hold, but got (repeats={args.repeats})")
    model, parallel, notes = specs_from_args(args)
    cluster = load_cluster(args.cluster)
    profile = load_profile(args.profile) if args.profile else None
    try:
        result = emulate(model, cluster, args.num_gpus, parallel, stage=args.stage, profile=profile,
                         device=args.device, repeats=args.repeats, allow_other_device=args.allow_other_device)
    except (MemoryError, RuntimeError) as exc:  # torch's allocator: "DefaultCPUAllocator: can't allocate ..."
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if not isinstance(exc, MemoryError) and "alloc" not in text.lower() and "out of memory" not in text.lower():
            raise
        raise ConfigError(f"stage {args.stage}'s tensors do not fit in this machine's memory ({text[:160]}); "
                          f"emulate a smaller model or layout (more TP/PP, a smaller micro-batch)") from None
    if args.json:
        data = result.to_dict()
        data["notes"] += notes
        print_json(data)
        return 0
    console = make_console()
    console.print(f"[bold]stage {result.stage} of {model.name} on {result.device}[/bold] "
                  f"(median of {result.repeats} runs, lowest..highest in brackets; seq_length {model.seq_length:,})")
    columns = ("part", "simulated", "emulated", "difference")
    if result.other_device:  # every figure says where it comes from: two different devices are compared
        console.print(f"[bold yellow]warning: ran on {result.device}, not on the cluster's GPU {result.cluster_gpu}: "
                      f"the differences compare two devices[/bold yellow]")
        short = "cpu" if result.device.startswith("cpu") else result.device.removeprefix("NVIDIA ")
        columns = ("part", f"simulated ({result.cluster_gpu})", f"emulated (on {short})",
                   f"difference ({short} vs {result.cluster_gpu})")
    table = Table(show_header=True)
    for col in columns:
        table.add_column(col, justify="left" if col == "part" else "right")
    for key, label in PART_NAMES.items():
        if key not in result.simulated:  # experts and ep_comm: MoE models only
            continue
        sim, emu = result.simulated[key], result.emulated[key]
        # a difference of parts that are both nothing (a float residue such as 5e-17 s of pp_wait at PP 1) is none
        tiny = 1e-9 * max(result.simulated["stage_step"], 1e-12)
        diff = f"{100 * (emu / sim - 1):+.1f}%" if sim > tiny else "-"
        low, high = result.emulated_range[key]
        spread = f" ({human_time(low)}..{human_time(high)})" if result.repeats > 1 and high > low else ""
        table.add_row(label, human_time(sim), human_time(emu) + spread, diff)
    console.print(table)
    for note in [*result.notes, *notes]:
        console.print(f"[dim]note: {note}[/dim]")
    return 0
