"""``echo-tune bench``: short microbenchmarks that calibrate a cluster, launched by torchrun.

    torchrun --standalone --nproc-per-node 8 -m echo_tune.calibrate.bench.microbench --name my-cluster
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST0:29500 \\
        -m echo_tune.calibrate.bench.microbench --name my-cluster

CUDA uses the nccl backend and CUDA events; CPU uses gloo and the wall clock (so the whole path
runs on a laptop). Global rank 0 writes ``<output-root>/<name>/raw/``: gemm, attention, memory,
collectives and interference CSVs plus env.json (see raw.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from echo_tune.calibrate.bench import bench_comm
from echo_tune.calibrate.bench import bench_compute
from echo_tune.calibrate.bench import raw
from echo_tune.calibrate.bench.bench_args import PARTS, add_bench_arguments  # noqa: F401  (re-exported)
from echo_tune.calibrate.bench.plans import comm_plan, compute_plan
from echo_tune.errors import CalibrationError



def _pick_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise CalibrationError("--device cuda was asked for, but torch sees no CUDA device; use --device cpu")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _init(device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" not in os.environ:  # one process, not launched by torchrun
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    else:
        dist.init_process_group(backend)


def _node_layout(ranks_per_node: int | None) -> list[int]:
    """Node index of every rank (by hostname unless overridden); nodes must hold contiguous, equal rank blocks."""
    world = dist.get_world_size()
    if ranks_per_node:
        if world % ranks_per_node:
            raise CalibrationError(f"`world_size % ranks_per_node == 0` must hold, but got (world_size={world}, "
                                   f"ranks_per_node={ranks_per_node})")
        return [r // ranks_per_node for r in range(world)]
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    order = list(dict.fromkeys(hosts))
    node_of = [order.index(h) for h in hosts]
    sizes = {node_of.count(i) for i in range(len(order))}
    if node_of != sorted(node_of) or len(sizes) != 1:
        raise CalibrationError(f"ranks must fill nodes in contiguous, equal blocks (as torchrun does), but got "
                               f"hosts {hosts}; launch the same --nproc-per-node on every node")
    return node_of


def _group_lists(node_of: list[int]) -> list[tuple[str, list[list[int]]]]:
    """(scope, partition of all ranks into groups) for every kind of group measured."""
    world, nodes = len(node_of), max(node_of) + 1
    per_node = world // nodes
    kinds = [("intra_node" if nodes == 1 else "inter_node", [list(range(world))])]
    size = 2
    while size < per_node or (nodes > 1 and size <= per_node):
        kinds.append(("intra_node", [list(range(s, s + size)) for s in range(0, world, size)]))
        size *= 2
    if nodes > 1 and per_node > 1:
        kinds.append(("inter_node", [list(range(i, world, per_node)) for i in range(per_node)]))
    return kinds


def build_groups(node_of: list[int]) -> list[bench_comm.GroupSpec]:
    """This rank's group of each kind (every rank joins every kind, so all groups of a kind run at once)."""
    me, specs = dist.get_rank(), []
    for scope, partition in _group_lists(node_of):
        group = None
        if len(partition) > 1 or len(partition[0]) < len(node_of):
            group, _ = dist.new_subgroups_by_enumeration(partition)
        mine = next(p for p in partition if me in p)
        nodes = sorted({node_of[r] for r in mine})
        specs.append(bench_comm.GroupSpec(scope=scope, ranks=tuple(mine), group=group, num_nodes=len(nodes),
                                          ranks_per_node=len(mine) // len(nodes)))
    return specs


def environment(device: torch.device, node_of: list[int], args: argparse.Namespace) -> dict:
    hosts: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    env = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "backend": dist.get_backend(), "device": device.type, "world_size": dist.get_world_size(),
           "num_nodes": max(node_of) + 1, "ranks_per_node": node_of.count(0), "hostnames": sorted(set(hosts)),
           "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "quick": bool(args.quick),
           "argv": sys.argv[1:], "echo_tune_name": args.name}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({"gpu_name": props.name, "gpu_memory_bytes": props.total_memory,
                    "gpu_capability": f"{props.major}.{props.minor}", "gpu_sm_count": props.multi_processor_count,
                    "cuda": torch.version.cuda, "nccl": _nccl_version()})
    return env


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _gather_rows(rows: list[dict]) -> list[dict]:
    everyone: list[list[dict]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(everyone, rows)
    return [row for part in everyone for row in part]


def _progress(rank: int, message: str) -> None:
    """One plain line per phase on rank 0's stderr (a batch job's log shows how far the bench got)."""
    if rank == 0:
        print(f"echo-tune bench: {message}", file=sys.stderr, flush=True)


def _phase(rank: int, index: int, total: int, part: str, fn):
    started = time.perf_counter()
    _progress(rank, f"[{index}/{total}] {part} ...")
    rows = fn()
    _progress(rank, f"[{index}/{total}] {part}: {len(rows)} rows in {time.perf_counter() - started:.1f} s")
    return rows


def run_bench(args: argparse.Namespace) -> Path:
    """Run the selected parts on every rank; rank 0 writes the raw files and returns their folder."""
    started = time.perf_counter()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _pick_device(args.device, local_rank)
    _init(device)
    try:
        skip = {p.strip() for p in args.skip.split(",") if p.strip()}
        unknown = sorted(skip - set(PARTS))
        if unknown:
            raise CalibrationError(f"unknown --skip part(s) {unknown}; choose from {list(PARTS)}")
        node_of = _node_layout(args.ranks_per_node)
        if device.type == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, node_of.count(0))))
        dtypes = tuple(args.dtypes.split(",")) if args.dtypes else None
        cplan, mplan = compute_plan(device, args.quick, dtypes), comm_plan(device, args.quick)
        timer, rank = bench_compute.Timer(device), dist.get_rank()
        tables = {}
        specs = build_groups(node_of) if dist.get_world_size() > 1 else []
        todo = [p for p in PARTS if p not in skip and (specs or p not in ("collectives", "interference"))]
        _progress(rank, f"{len(todo)} part(s) ({', '.join(todo)}) on {dist.get_world_size()} rank(s), "
                        f"{device.type}{' (quick)' if args.quick else ''}")
        step = iter(range(1, len(todo) + 1))
        for part, fn in (("gemm", bench_compute.gemm_rows), ("attention", bench_compute.attention_rows),
                         ("memory", bench_compute.memory_rows)):
            if part in todo:
                tables[part] = _phase(rank, next(step), len(todo), part,
                                      lambda fn=fn: _gather_rows(fn(cplan, device, timer, rank)))
        side_group = dist.new_group(list(range(dist.get_world_size()))) if specs and device.type == "cpu" else None
        if "collectives" in todo:
            tables["collectives"] = _phase(rank, next(step), len(todo), "collectives",
                                           lambda: bench_comm.collective_rows(specs, mplan, timer, device))
        if "interference" in todo:
            tables["interference"] = _phase(
                rank, next(step), len(todo), "interference",
                lambda: bench_comm.interference_rows(specs[0], side_group, mplan, timer, device))
        env = environment(device, node_of, args)
        out = raw.raw_dir(args.output_root, args.name)
        if rank == 0:
            for part, rows in tables.items():
                raw.write_csv(out, part, rows)
            env["skipped"] = sorted(skip) + (["collectives", "interference"] if not specs else [])
            env["duration_s"] = round(time.perf_counter() - started, 1)
            raw.write_env(out, env)
        dist.barrier()
        return out
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="echo_tune.calibrate.bench.microbench", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    args = parser.parse_args(argv)
    out = run_bench(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"echo-tune bench: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
