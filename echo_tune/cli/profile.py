"""``echo-tune profile``: time the distinct ops of a search space (or one layout) on this device."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
import os

from echo_tune.cli.common import add_layout_arguments, human_time, print_json, set_torch_threads, specs_from_args
from echo_tune.config.load.loading import load_cluster, read_yaml
from echo_tune.cost.optime.optime_db import OpTimeDB
from echo_tune.cost.optime.optime_device import local_device, mismatch
from echo_tune.cost.profile import profile_for, save_profile
from echo_tune.errors import ConfigError
from echo_tune.optime.collect import distinct_ops, space_layouts
from echo_tune.io import check_not_symlink


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "profile", help="measure the ops of a search space or layout on this device (op-time database)",
        description="Collect the distinct ops the simulator needs for a search space, the candidates of a rank "
                    "file, or one layout given by Megatron flags, time each with real tensors on this device "
                    "(CUDA when present), and store them in an op-time database; an interrupted run resumes "
                    "where it stopped. Also writes a calibration profile that points at the database.")
    parser.add_argument("space", nargs="?", metavar="FILE",
                        help="search-space or rank-file YAML (else one layout from --model and the flags)")
    parser.add_argument("--model", help="model preset or YAML file (with layout flags)")
    parser.add_argument("--cluster", help="cluster preset or YAML file (with layout flags)")
    parser.add_argument("--num-gpus", type=int, help="GPUs in the run (with layout flags)")
    parser.add_argument("--db", help="op-time database (default calibration/<cluster>/optime.sqlite)")
    parser.add_argument("--write-profile", metavar="YAML",
                        help="calibration profile to write, pointing at the database (default "
                             "calibration/<cluster>/profile-optime.yaml)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where to measure (default: cuda when present)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads on CPU (part of the device's name)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_layout_arguments(parser)
    parser.set_defaults(run=run)


def _targets(args) -> list[tuple]:
    """[(model, cluster, num_gpus, [layouts])]: from a search space, a rank file, or the flags."""
    if args.space:
        given = [flag for flag, value in (("--model", args.model), ("--cluster", args.cluster),
                                          ("--num-gpus", args.num_gpus), ("--megatron-args", args.megatron_args))
                 if value is not None]
        if given:
            raise ConfigError(f"a search-space or rank file fixes the model, cluster and layouts, but got "
                              f"{' '.join(given)} too; drop them or drop the file")
        return _file_targets(Path(args.space))
    if not args.cluster or args.num_gpus is None:
        raise ConfigError("profile needs a search-space or rank file, or --cluster, --num-gpus and the layout "
                          "flags (--model, --global-batch-size, ...); add them")
    model, parallel, _notes = specs_from_args(args)
    return [(model, load_cluster(args.cluster), args.num_gpus, [parallel])]


def _file_targets(path: Path) -> list[tuple]:
    if "candidates" in read_yaml(path, "search-space or rank"):
        # lazy: loads optuna (~0.3 s), which importing cli.profile does not
        from echo_tune.plan.rank import load_rank_file

        groups: dict[tuple, tuple] = {}
        for c in load_rank_file(path)[0]:
            group = groups.setdefault((c.model, c.cluster.name, c.num_gpus), (c.model, c.cluster, c.num_gpus, []))
            group[3].append(c.parallel)
        gpus = sorted({g[1].gpu.name for g in groups.values()})
        if len(gpus) > 1:
            raise ConfigError(f"one device measures for one GPU type, but rank file {str(path)!r} names {gpus}; "
                              f"profile the candidates of each GPU type from their own file")
        return list(groups.values())

    model, cluster, by_gpus = space_layouts(path)
    return [(model, cluster, n, layouts) for n, layouts in sorted(by_gpus.items())]


def run(args: argparse.Namespace) -> int:
    # lazy: loads torch (~1.5 s to import), which importing cli.profile does not
    import torch

    # lazy: loads torch (~1.5 s to import), which importing cli.profile does not
    from echo_tune.optime.measure import check_fits
    # lazy: loads torch (~1.5 s to import), which importing cli.profile does not
    from echo_tune.optime.profiler import profile_layouts

    set_torch_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but torch sees no CUDA device; drop --device or use cpu")
    targets = _targets(args)
    cluster = targets[0][1]
    device, info = local_device(args.device)
    folder = Path("calibration") / cluster.name
    db_path = Path(args.db) if args.db else folder / "optime.sqlite"

    check_not_symlink(db_path, "--db file")
    check_not_symlink(args.write_profile or folder / "profile-optime.yaml", "--write-profile file")
    notes = []
    why = mismatch(info.name, info.kind, cluster.gpu.name, cluster.gpu.memory_bytes)
    if why is not None:
        notes.append(f"measuring on {info.name!r}, which is not the GPU {cluster.gpu.name!r} of cluster {cluster.name!r} "
                     f"({why}): the simulator will refuse these times for that cluster")
    notes += _unrun_notes(targets)

    def progress(i, n, op, m):
        if not args.quiet:
            sys.stderr.write(f"[{i}/{n}] {op.name:<40} {human_time(m.time_s):>10}  (spread {m.spread:.0%})\n")

    for model, group_cluster, num_gpus, layouts in targets:  # before any tensor or file: each op fits in memory
        check_fits(distinct_ops(model, group_cluster, num_gpus, layouts), device)
    results = []
    with OpTimeDB(db_path) as db:
        for model, group_cluster, num_gpus, layouts in targets:
            try:
                results.append(profile_layouts(model, group_cluster, num_gpus, layouts, db, device, info,
                                               progress=progress))
            except RuntimeError as exc:  # the CPU allocator's refusal of a micro-batch's pieces run in place
                if "allocate" not in str(exc) and "out of memory" not in str(exc):
                    raise
                raise ConfigError(f"`a micro-batch's tensors <= free memory` must hold to run it in place on "
                                  f"{info.name}, but the allocator refused ({str(exc).splitlines()[0][-120:]}); the "
                                  f"ops measured so far are kept in {db_path}; profile a smaller shape: a smaller "
                                  f"--seq-length or --micro-batch-size") from None
    profile_path = Path(args.write_profile) if args.write_profile else folder / "profile-optime.yaml"
    base = profile_for(cluster)
    relative = _relative(db_path, profile_path.parent)
    save_profile(dataclasses.replace(base, gpu=cluster.gpu.name, op_times_db=str(relative), op_times=None),
                 profile_path)
    summary = {"device": info.name, "torch_version": info.torch_version, "cuda_version": info.cuda_version,
               "db": str(db_path), "profile": str(profile_path),
               "ops": sum(r.total for r in results), "already_measured": sum(r.already for r in results),
               "measured": sum(r.measured for r in results), "timed_alone": sum(r.timed_alone for r in results),
               "host_overhead_s": results[-1].host_overhead_s if results else None, "notes": notes}
    not_run = [op for r in results for op in r.not_run]
    if not_run:
        summary["not_run"] = not_run
        notes = notes + [f"{len(not_run)} op(s) could not run alone on {info.name} from their traced inputs and are "
                         f"not in the database (the efficiency surface prices them): {'; '.join(not_run[:3])}"
                         + (" ..." if len(not_run) > 3 else "")]
        summary["notes"] = notes
    if args.json:
        print_json(summary)
    else:
        print(f"{summary['measured']} ops measured ({summary['timed_alone']} of them timed alone, not in place), "
              f"{summary['already_measured']} already in {db_path} ({summary['ops']} distinct ops) on {info.name}")
        print(f"profile written: {profile_path} (pass it as --profile, or point the cluster's `profile:` at it)")
        for note in notes:
            print(f"note: {note}")
    return 0


def _unrun_notes(targets: list[tuple]) -> list[str]:
    """What the in-place run does not run as the model would, said by name (issue 20): it runs plain precision,
    an MoE layer on a balanced router's tokens, and full attention only."""
    notes = []
    moe = sorted({f"{m.name} (num_experts={m.num_experts})" for m, _c, _n, _l in targets if m.is_moe})
    if moe:
        notes.append(f"MoE model {', '.join(moe)}: the in-place run runs one MoE layer (router, permutation, the "
                     f"local experts' GEMMs) on the tokens a balanced router sends, as the simulator assumes; "
                     f"its dispatch/combine collectives are not run")
    window = sorted({m.name for m, _c, _n, _l in targets if m.windowed_attention})
    if window:
        notes.append(f"sliding-window model {', '.join(window)}: the in-place run builds full-attention layers, so "
                     f"the window layers' attention ops were timed alone from their traced shapes (counted in "
                     f"timed_alone)")
    fp8 = sorted({p.fp8_format for _m, _c, _n, layouts in targets for p in layouts if p.fp8_format})
    if fp8:
        notes.append(f"FP8 layouts (fp8_format={', '.join(fp8)}): no FP8 GEMM was run; the GEMMs were timed in the "
                     f"layouts' plain precision, and the simulator prices their FP8 GEMMs from the GPU's FP8 peak "
                     f"(cost/kernels/fp8.py), not from these times")
    return notes


def _relative(target: Path, start: Path) -> Path:
    return Path(os.path.relpath(target.resolve(), start.resolve()))
