"""``--test-mode``: Megatron's real-time consistency checks inside attention (Megatron-LM d98e8a64ddf3).

core/transformer/attention.py: ``SelfAttention.get_query_key_value_tensors`` calls ``run_realtime_tests()`` after the
QK layernorms when ``config.test_mode`` (the only reader of the flag; ``--test-mode`` is ValidationConfig's field,
training_config.py, copied into TransformerConfig by argument_utils.py ``core_transformer_config_from_args``). It returns at once without ``--qk-layernorm``; with it, on every forward of every self-attention layer
(MLA's ``get_query_key_value_tensors`` does not call it; nor does the gated delta net):

- ``torch.stack`` of the q/k layernorms' weights and biases ([4, head_dim], the parameters' dtype): 1 kernel;
- ``torch.distributed.all_gather`` of that over the data-parallel group (``get_data_parallel_group()``: without CP),
  then for each of the dp copies four ``assert torch.all(src == tgt)``: an ``eq`` and an ``all`` kernel each, and
  the ``assert`` reads the result on the host, a device-to-host copy that waits for the GPU;
- the same over the tensor-parallel group.

So per self-attention layer and forward: 2 blocking all-gathers, 1 + 8 (dp + tp) kernels and 4 (dp + tp) host
synchronisations. After each synchronisation the host's queue is empty, so every kernel of the block starts when the
host issues it: the block runs at the host's pace, ``host_time_per_kernel_s`` per kernel (cost/host/host_bound.py,
cost/host/host_time.py), plus the two all-gathers' time; the kernels' own GPU time (a few hundred elements) is below it.
Test mode also forces the split QKV path (``not self.config.test_mode`` in ``split_qkv``), which differs only with
``fused_single_qkv_rope``, a config field with no flag at this commit (arguments.py leaves it off the command line):
no change.
"""

from __future__ import annotations

from echo_tune.config.specs.layout import Layout
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.schedule.costing import PhaseCost

CHECKED_TENSORS = 4
"""q_layernorm.weight, q_layernorm.bias, k_layernorm.weight, k_layernorm.bias (attention.py run_realtime_tests)."""


def checks_per_layer(dp: int, tp: int) -> tuple[int, int]:
    """(kernels, host synchronisations) of one layer's checks: the stack, then per copy of each group an eq and an
    all kernel per checked tensor, each ``all`` read by an assert."""
    copies = dp + tp
    return 1 + 2 * CHECKED_TENSORS * copies, CHECKED_TENSORS * copies


def gathered_bytes(group_size: int, head_dim: int, param_bytes: int) -> int:
    """Bytes an all-gather of the stacked [4, head_dim] tensors leaves on each rank (nccl-tests convention)."""
    return group_size * CHECKED_TENSORS * head_dim * param_bytes


def realtime_test_s(layout: Layout, profile: ClusterProfile, head_dim: int, param_bytes: int) -> float:
    """Time one self-attention layer's checks add to its forward."""
    dp, tp = layout.groups["dp"], layout.groups["tp"]
    kernels, _ = checks_per_layer(dp.size, tp.size)
    gathers = sum(collective_time_s("all_gather", gathered_bytes(g.size, head_dim, param_bytes), g, profile)
                  for g in (dp, tp))
    return kernels * profile.host_time_per_kernel_s + gathers


def runs_checks(model, parallel) -> bool:
    """Whether ``--test-mode`` runs the checks: only beside ``--qk-layernorm`` (else run_realtime_tests returns)."""
    return bool(parallel.test_mode and model.qk_layernorm and not model.multi_latent_attention)


def recomputed_layers(layout: Layout, layers: int) -> int:
    """Layers of a chunk whose forward full recompute runs again (the checks with it): all with the uniform
    method, ``recompute_num_layers`` with block; none otherwise (selective recompute does not re-run the QKV)."""
    if layout.recompute_granularity != "full":
        return 0
    if layout.recompute_method == "block":
        return min(layers, layout.recompute_num_layers or 0)
    return layers


def realtime_test_notes(model, parallel, layout: Layout, per_layer_s: float) -> tuple[str, ...]:
    if not parallel.test_mode:
        return ()
    if not runs_checks(model, parallel):
        return ("--test-mode: Megatron's real-time checks run only beside --qk-layernorm on self-attention "
                "(attention.py run_realtime_tests): nothing added",)
    kernels, syncs = checks_per_layer(layout.groups["dp"].size, layout.groups["tp"].size)
    return (f"--test-mode: per self-attention layer and forward, the QK-layernorm consistency checks add 2 all-gathers "
            f"(DP, TP), {kernels} kernels and {syncs} host synchronisations, run at the host's pace: "
            f"{per_layer_s * 1e6:.0f} us in compute",)


PARAM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def with_realtime_tests(passes, model, parallel, layout: Layout, profile: ClusterProfile, linears=None):
    """``passes`` ([stage][chunk] (fwd, bwd, recompute)) with the checks of each chunk's self-attention layers added
    to its forward (and to its recompute where full recompute runs the layer's forward again), as compute; the
    chunk's gated-delta-net layers (``linears[stage][chunk]``, sim/schedule/linear_layers.py) run none. Returns (passes,
    per-layer time)."""
    if not runs_checks(model, parallel):
        return passes, 0.0
    per_layer = realtime_test_s(layout, profile, model.head_dim, PARAM_BYTES[parallel.precision])
    out = []
    for s, row in enumerate(passes):
        new = []
        for c, ((f, b, r), layers) in enumerate(zip(row, layout.stage_chunk_layers[s])):
            layers -= sum(linears[s][c]) if linears else 0
            new.append((f + PhaseCost(compute_s=layers * per_layer), b,
                        r + PhaseCost(compute_s=recomputed_layers(layout, layers) * per_layer)))
        out.append(new)
    return out, per_layer
