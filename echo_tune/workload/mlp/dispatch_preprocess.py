"""The all-to-all dispatcher's metadata step before it moves any token, as Megatron-Core runs it dropless.

Megatron-LM d98e8a64ddf3 moe/token_dispatcher.py ``MoEAlltoAllTokenDispatcher.preprocess`` (no capacity factor,
expert-parallel or expert-tensor-parallel group above 1): the tokens each expert gets from this rank
(``routing_map.sum(dim=0)``), the rows sent to each EP rank (a sum per rank), an all-gather of the per-expert counts
over the TP x EP group (``gather_from_sequence_parallel_region``), this rank's experts' slice of it made contiguous
(a copy), the rows received per rank and per TP rank and per local expert (three sums); then
``_maybe_dtoh_and_synchronize`` copies five of them to the host (the token counts per local expert, the input and
output splits, the TP splits and, with more than one local expert, the counts per rank and local expert) on its
device-to-host stream, and the host waits for them before the all-to-all (sim/schedule/costing.py times that wait).
Counted in Megatron's own code by ``benchmarks/megatron_host_ops.py`` (EP 8, 16 local experts): 5 sums, 1 copy,
1 all-gather and 5 device-to-host copies forward, nothing backward. With drop-and-pad the counts are the capacity
(``torch.full``, one fill on the device: not traced, a launch) and nothing goes to the host.

The copies to the host are ``DTOH_OP`` ops: on their own stream, so no time on the compute stream, but a Python call
each on the host (cost/host/host_bound.py). The flex dispatcher's metadata kernels: workload/mlp/flex_metadata.py.
"""

from __future__ import annotations

import torch

from echo_tune.workload.mlp.moe_comm import gather
from echo_tune.workload.recording import kernels

device_to_host = kernels._define("device_to_host", "(Tensor x) -> Tensor", lambda x: torch.empty_like(x))
device_to_host.register_kernel(("cpu", "cuda"), lambda x: x.clone())


def runs_preprocess(model, shard) -> bool:
    """Whether the step runs: the all-to-all dispatcher, dropless, over more than one rank."""
    return model.moe_token_dispatcher_type == "alltoall" and model.moe_expert_capacity_factor is None \
        and shard.ep * shard.etp > 1


def alltoall_preprocess(tokens: torch.Tensor, shard) -> None:
    """The metadata kernels of one forward, from the router's [tokens, experts] routing map."""
    m = shard.model
    experts, local = m.num_experts, m.num_experts // shard.ep
    routing_map = tokens.new_empty((tokens.shape[0], experts), dtype=torch.bool)  # the fused top-k's output
    with torch.no_grad():
        per_expert = routing_map.sum(dim=0)
        input_splits = per_expert.reshape(shard.ep, local).sum(dim=1)
        gathered = gather(per_expert.reshape(1, experts), "tpep", shard.ep * shard.etp)
        mine = gathered.reshape(shard.ep, shard.etp, experts).transpose(0, 1)[:, :, :local].contiguous()
        per_rank = mine.sum(dim=2)
        output_splits_tp = per_rank.sum(dim=1)
        per_local_expert = mine.sum(dim=(0, 1))
        for value in (per_local_expert, input_splits, per_rank[0], output_splits_tp) + ((mine,) if local > 1 else ()):
            torch.ops.echo_tune.device_to_host(value)
