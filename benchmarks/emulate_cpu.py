"""Profile then emulate, in one process, on this CPU: emulated vs simulated per stage, for variants of
the tiny Llama-shaped test model (one intra-op thread; about a minute on a 2-core machine).

    python benchmarks/emulate_cpu.py [--repeats 3] [--only moe]

MoE variants also print the routed experts' compute (simulated / emulated) and the dispatch / combine waits.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch

import echo_tune as et
from echo_tune.cost.profile import default_profile, load_profile, save_profile
from echo_tune.emulate.run import emulate
from echo_tune.cost.optime.optime_db import OpTimeDB
from echo_tune.cost.optime.optime_device import local_device
from echo_tune.optime.profiler import profile_layouts

DATA = Path(__file__).parents[1] / "tests" / "data"
GPT_STYLE = dict(use_flash_attn=False, swiglu=False, normalization="LayerNorm", add_bias_linear=True,
                 position_embedding_type="learned_absolute", hidden_dropout=0.1, attention_dropout=0.1,
                 untie_embeddings_and_output_weights=False)
MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=256, moe_grouped_gemm=True,
           moe_token_dispatcher_type="alltoall", moe_layer_freq="([0]+[1]*3)")
VARIANTS = {
    "llama TP2": ({}, dict(tensor_model_parallel_size=2)),
    "llama TP2 SP": ({}, dict(tensor_model_parallel_size=2, sequence_parallel=True)),
    "llama CP2": ({}, dict(context_parallel_size=2)),
    "gpt-style TP2": (GPT_STYLE, dict(tensor_model_parallel_size=2)),
    "llama TP2 full recompute": ({}, dict(tensor_model_parallel_size=2, recompute_granularity="full")),
    "llama TP2 selective": ({}, dict(tensor_model_parallel_size=2, recompute_granularity="selective")),
    "moe EP2 alltoall": (MOE, dict(expert_model_parallel_size=2)),
    "moe TP2 SP allgather shared": ({**MOE, "moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": False,
                                     "moe_shared_expert_intermediate_size": 256},
                                    dict(tensor_model_parallel_size=2, sequence_parallel=True)),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run the variants whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    base, cluster = et.load_model(str(DATA / "tiny-llama.yaml")), et.load_cluster(str(DATA / "cpu-cluster.yaml"))
    device, info = local_device("cpu")
    print(f"{info.name}, torch {info.torch_version}; PP2, global batch 4 (4 micro-batches), fp32")
    print(f"{'variant':<26}{'stage':>6}{'sim compute':>13}{'emu compute':>13}{'error':>8}{'sim step':>11}"
          f"{'emu step':>11}{'error':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for i, (name, (model_changes, layout_changes)) in enumerate(VARIANTS.items()):
            if args.only not in name:
                continue
            model = base.replace(**model_changes)
            layout = et.ParallelConfig(pipeline_model_parallel_size=2, global_batch_size=4, precision="fp32",
                                       **layout_changes)
            db = Path(folder) / f"optime-{i}.sqlite"
            with OpTimeDB(db) as handle:
                profile_layouts(model, cluster, 4, [layout], handle, device, info)
            save_profile(dataclasses.replace(default_profile(cluster), op_times_db=db.name), Path(folder) / "p.yaml")
            profile = load_profile(Path(folder) / "p.yaml")
            for stage in (0, 1):
                r = emulate(model, cluster, 4, layout, stage=stage, profile=profile, repeats=args.repeats)
                sim, emu = r.simulated, r.emulated
                print(f"{name:<26}{stage:>6}{sim['compute'] * 1e3:>11.1f}ms{emu['compute'] * 1e3:>11.1f}ms"
                      f"{100 * (emu['compute'] / sim['compute'] - 1):>+7.1f}%{sim['stage_step'] * 1e3:>9.1f}ms"
                      f"{emu['stage_step'] * 1e3:>9.1f}ms{100 * r.error:>+7.1f}%")
                if "experts" in sim:
                    print(f"{'':<32}experts {sim['experts'] * 1e3:.1f} / {emu['experts'] * 1e3:.1f} ms "
                          f"({100 * (emu['experts'] / sim['experts'] - 1):+.1f}%), ep_comm "
                          f"{sim['ep_comm'] * 1e3:.2f} / {emu['ep_comm'] * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
