"""``echo-tune presets``: list the shipped model, GPU and cluster presets (``--json`` for scripts)."""

from __future__ import annotations

import argparse

from rich.table import Table

from echo_tune.cli.common import print_json
from echo_tune.console import make_console
from echo_tune.config.load.loading import PRESET_ALIASES, load_cluster, load_gpu, load_model, preset_names

KINDS = ("models", "gpus", "clusters")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("presets", help="list the model, GPU and cluster presets",
                                   description="List the shipped presets (sources: echo_tune/config/presets/*.yaml).")
    parser.add_argument("kind", nargs="?", choices=KINDS, default=None,
                        help="list only this kind (default: all three)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(run=run)


def model_rows() -> list[dict]:
    rows = []
    for name in preset_names("models"):
        m = load_model(name)
        rows.append({"name": name, "params_billion": round(m.num_params() / 1e9, 2), "num_layers": m.num_layers,
                     "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
                     "num_query_groups": m.query_groups, "seq_length": m.seq_length,
                     "num_experts": m.num_experts, "moe_router_topk": m.moe_router_topk if m.is_moe else None})
    return rows


def gpu_rows() -> list[dict]:
    rows = []
    for name in preset_names("gpus"):
        g = load_gpu(name)
        rows.append({"name": name, "peak_bf16_tflops": g.peak_bf16_tflops, "peak_fp8_tflops": g.peak_fp8_tflops,
                     "memory_gib": round(g.memory_bytes / 2**30, 1),
                     "memory_bandwidth_gbyte_s": g.memory_bandwidth_gbyte_s, "source": g.source})
    return rows


def cluster_rows() -> list[dict]:
    aliases = {v: k for k, v in PRESET_ALIASES.items()}
    rows = []
    for name in preset_names("clusters"):
        c = load_cluster(name)
        rows.append({"name": name, "alias": aliases.get(name), "gpu": c.gpu.name, "gpus_per_node": c.gpus_per_node,
                     "nvlink_domain_size": c.nvlink_domain_size or c.gpus_per_node,
                     "intra_node_bandwidth_gbyte_s": c.intra_node_bandwidth_gbyte_s,
                     "nics_per_node": c.nics_per_node, "nic_bandwidth_gbit_s": c.nic_bandwidth_gbit_s})
    return rows


ROWS = {"models": model_rows, "gpus": gpu_rows, "clusters": cluster_rows}


def run(args: argparse.Namespace) -> int:
    kinds = (args.kind,) if args.kind else KINDS
    data = {kind: ROWS[kind]() for kind in kinds}
    if args.json:
        print_json(data)
        return 0

    console = make_console()
    for kind, rows in data.items():
        table = Table(title=f"{kind} ({len(rows)})")
        cols = [k for k in rows[0] if k != "source"]
        for col in cols:
            table.add_column(col, justify="left" if col in ("name", "gpu", "alias") else "right",
                             no_wrap=col == "name")
        for r in rows:
            table.add_row(*["-" if r[c] is None else str(r[c]) for c in cols])
        console.print(table)
    return 0
