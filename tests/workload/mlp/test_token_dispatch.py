"""workload/mlp/token_dispatch.py: how the alltoall dispatcher moves the tokens, worked by hand on a small layer."""

import pytest

import echo_tune as et
from echo_tune.workload import trace_moe_layer

T, H, K = 1024, 4096, 2  # tokens per rank (seq 1024, MBS 1), hidden, top-k of the Mixtral-shaped layer below
SMALL = et.load_model("mixtral-8x7b").replace(num_layers=4, seq_length=T)
ROW_BYTES = H * 2  # one bf16 token row


def _routed(model, phase):
    t = trace_moe_layer(model, tensor_model_parallel_size=1, expert_model_parallel_size=4)
    return [op for op in getattr(t, phase) if op.region == "moe" and op.subregion in ("dispatch", "combine")
            and op.kind == "memory" and op.bytes > T * ROW_BYTES / 2]


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_fused_permutation_reads_each_token_once(phase):
    # TE's moe_permute reads a token once and writes its k copies; moe_unpermute reads the copies and writes the sum
    # once (their backwards are each other): T h + T k h bf16 either way, plus the int64 index of the copies
    fused = _routed(SMALL.replace(moe_permute_fusion=True), phase)
    names = {op.name for op in fused}
    assert names >= {"echo_tune.fused_permute", "echo_tune.fused_unpermute"}
    for op in fused:
        if op.name.startswith("echo_tune.fused_"):
            assert op.bytes == pytest.approx((T + T * K) * ROW_BYTES + T * K * 8)
    # unfused, Megatron gathers the copies with index_select: a row read per copy
    unfused = _routed(SMALL.replace(moe_permute_fusion=False), phase)
    gather = next(op for op in unfused if op.name == "aten.index_select")
    assert gather.bytes == pytest.approx(2 * T * K * ROW_BYTES + T * K * 8)
