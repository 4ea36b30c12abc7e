"""In-place profile of an MoE model runs an MoE layer too: its router, permutation and expert ops are timed in a
real step, none left to be timed alone."""

import dataclasses

import torch

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.optime.insitu import measure_in_situ
from echo_tune.sim.schedule.passes import trace_pieces

from .conftest import CLUSTER, MODEL, tiny_layout


def test_every_op_of_the_moe_layer_is_timed_in_place(one_thread):
    model = dataclasses.replace(et.load_model(str(MODEL)), num_layers=2, seq_length=32, hidden_size=64,
                                ffn_hidden_size=128, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96,
                                moe_token_dispatcher_type="alltoall", moe_shared_expert_intermediate_size=64)
    cluster = et.load_cluster(str(CLUSTER))
    layout = tiny_layout(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, expert_model_parallel_size=2,
                         global_batch_size=2)
    pieces = trace_pieces(model, layout, check_compatible(model, cluster, 2, layout))
    moe_ops = [op for op in pieces["moe_layer"].forward + pieces["moe_layer"].backward if op.kind != "collective"]
    assert {op.subregion for op in moe_ops} >= {"router", "dispatch", "experts", "combine", "shared"}
    in_situ = measure_in_situ(model, cluster, 2, layout, torch.device("cpu"), warmup=1, repeats=1)
    missing = {op.name for op in moe_ops if op.key not in in_situ.times}
    assert not missing
    # the host overhead per op is spread over the ops of all four pieces run, the MoE layer's included
    ran = [op for p in ("layer", "moe_layer", "embedding", "output") for op in pieces[p].forward + pieces[p].backward
           if op.kind != "collective"]
    assert in_situ.ops == len(ran)
