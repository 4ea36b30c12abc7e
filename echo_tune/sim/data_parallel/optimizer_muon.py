"""Muon (``--optimizer muon``): its optimizer states, and its step's Newton-Schulz compute and communication.

Mechanics from Megatron-LM d98e8a64ddf3 core/optimizer/emerging_optimizers.py and layer_wise_optimizer.py,
and NVIDIA-NeMo/Emerging-Optimizers orthogonalized_optimizers/muon_utils.py (the ``newton_schulz`` it calls):

- Which parameters: every 2-D weight matrix that is not the embedding or output layer
  (``_is_nonlinear_or_embedding`` / ``is_managed_by_layer_wise_optimizer``): QKV, the attention projection,
  the MLP's fc1 / fc2, the MoE router, each local expert's fc1 / fc2 and the shared expert's. The rest (embedding,
  output layer, norms, biases) take ``--muon-scalar-optimizer`` (Adam by default). The QKV weight is
  orthogonalized as separate Q, K and V matrices unless ``--muon-no-split-qkv`` (``_get_qkv_split_shapes``).
  Megatron's Muon also takes the learned position embeddings and MTP's eh projections (2-D, not tagged
  ``is_embedding_or_output_parameter``): the memory counts them as Muon's (sim/data_parallel/muon_shards.py), the
  Newton-Schulz time here leaves them out.
- States: Muon keeps one momentum buffer per matrix next to the fp32 master weight (4 + 4 bytes per
  parameter for bf16 training, against Adam's 4 + 4 + 4); Lion, as scalar optimizer, keeps one too. Which rank
  holds which: sim/data_parallel/muon_shards.py.
- Newton-Schulz, per matrix and step: X is the momentum normalised and transposed so that it is m x n with
  m <= n, cast to bf16 (the default ``--muon-fp32-matmul-prec medium``); each of the k iterations
  (``--muon-num-ns-steps``, default 5) runs three GEMMs: A = X X^T (m x m, inner n), B = bA + cA A (m x m,
  inner m) and X = aX + B X (m x n, inner m): 2m^2 n + 2m^3 + 2m^2 n FLOPs (``newton_schulz_step``).
- Tensor parallelism (``--muon-tp-mode``): duplicated (default) all-gathers a TP-sharded momentum (fp32) over
  TP (ETP for experts) and orthogonalizes the whole matrix on every TP rank (``newton_schulz_tp``); blockwise
  orthogonalizes each rank's shard alone. Replicated matrices (the router) run whole on every rank.
- Distributed (``--use-distributed-optimizer`` / dist_muon, the layer-wise distributed optimizer): each
  matrix is owned by one rank of the data-parallel group (DP x CP; expert-data-parallel for experts), which
  alone runs its Newton-Schulz; Megatron balances the owners by Newton-Schulz cost (``_ns_compute_cost``), so
  a rank's share is taken as the mean, 1/DP of the stage's work (also with ``--no-use-layer-wise-param-layout``,
  where whole tensors are dealt by size and the memory differs by rank: sim/data_parallel/muon_shards.py). Gradients are reduce-scattered into the
  shard-aligned buffer and the updated parameters all-gathered, as with the distributed optimizer (sim/data_parallel/dp.py;
  all-reduced with ``--no-use-layer-wise-param-layout``).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.workload.graph import Op

DROPPED_UPDATE_BYTES = 8.0
"""Bytes per parameter the memory-bound update moves less than Adam's (sim/data_parallel/dp.py OPTIMIZER_BYTES_PER_PARAM):
the second moment's read and write, 4 + 4."""
MOMENTUM_GATHER_BYTES = 4.0
"""The momentum Muon all-gathers over TP is the fp32 main-gradient-sized buffer."""


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """One weight matrix of a layer as Muon orthogonalizes it: whole (unsharded) shape."""

    rows: int
    cols: int
    count: int = 1
    """How many such matrices one rank holds per layer (local experts)."""
    tp_dim: int | None = None
    """The dimension TP (ETP for experts) shards, or None when every TP rank holds it whole."""
    expert: bool = False


def layer_matrices(model: ModelSpec, parallel: ParallelConfig, ep: int, moe: bool) -> tuple[Matrix, ...]:
    """The matrices of one transformer layer (dense or MoE MLP) that one rank holds (see the module docstring)."""
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_attention_heads * d, model.query_groups * d
    gated = 2 if model.gated_linear_unit else 1
    gate = (q,) if getattr(model, "attention_output_gate", False) else ()
    qkv = (q, *gate, kv, kv) if parallel.muon_split_qkv else (q + len(gate) * q + 2 * kv,)
    out = [Matrix(rows=rows, cols=h, tp_dim=0) for rows in qkv]
    out.append(Matrix(rows=h, cols=q, tp_dim=1))  # attention projection (row-parallel)
    if not moe:
        f = model.ffn_size
        return (*out, Matrix(rows=gated * f, cols=h, tp_dim=0), Matrix(rows=h, cols=f, tp_dim=1))
    f = model.moe_ffn_size
    n = model.num_experts // ep
    out += [Matrix(rows=model.num_experts, cols=h),  # the router, replicated over TP
            Matrix(rows=gated * f, cols=h, count=n, tp_dim=0, expert=True),
            Matrix(rows=h, cols=f, count=n, tp_dim=1, expert=True)]
    shared = model.moe_shared_expert_intermediate_size
    if shared:
        out += [Matrix(rows=gated * shared, cols=h, tp_dim=0), Matrix(rows=h, cols=shared, tp_dim=1)]
    return tuple(out)


def local_params(matrix: Matrix, tp: int) -> int:
    """Parameters of one such matrix on one rank (sharded over ``tp`` along ``tp_dim``)."""
    return matrix.rows * matrix.cols * matrix.count // (tp if matrix.tp_dim is not None else 1)


def ns_gemms(rows: int, cols: int) -> tuple[tuple[int, int, int], ...]:
    """(m, n, k) of the three GEMMs of one Newton-Schulz iteration on a rows x cols matrix."""
    m, n = min(rows, cols), max(rows, cols)
    return (m, m, n), (m, m, m), (m, n, m)


def ns_flops(rows: int, cols: int, steps: int) -> float:
    """Newton-Schulz FLOPs: steps x (2m^2 n + 2m^3 + 2m^2 n), m = min(rows, cols), n = max."""
    return steps * sum(2.0 * m * n * k for m, n, k in ns_gemms(rows, cols))


def ns_time_s(rows: int, cols: int, steps: int, profile: ClusterProfile, gpu: GPUSpec) -> float:
    """Newton-Schulz time on one GPU: its bf16 GEMMs costed by cost/kernels/compute.py's GEMM model."""
    total = 0.0
    for m, n, k in ns_gemms(rows, cols):
        op = Op(name="aten.addmm", kind="gemm", phase="bwd", region="optimizer", flops=2.0 * m * n * k,
                bytes=2.0 * (m * k + k * n + 2 * m * n), gemm_mnk=(m, n, k))
        total += op_time_s(op, profile, gpu, "bf16")
    return steps * total


def _owners(matrix: Matrix, parallel: ParallelConfig, layout: Layout) -> int:
    """Ranks among which the layer-wise distributed optimizer spreads such matrices (1 without it)."""
    if not parallel.use_distributed_optimizer:
        return 1
    if matrix.expert:
        return layout.expert_data_parallel_size
    return layout.data_parallel_size * parallel.context_parallel_size


def _stage_matrices(model: ModelSpec, parallel: ParallelConfig, layout: Layout, dense_layers: int,
                    moe_layers: int):
    """(matrix, its group, layers of the stage that hold it) for a stage's transformer layers."""
    ep = parallel.expert_model_parallel_size or 1
    for moe, layers in ((False, dense_layers), (True, moe_layers)):
        if layers:
            for matrix in layer_matrices(model, parallel, ep, moe):
                yield matrix, layout.groups["etp" if matrix.expert else "tp"], layers


def matrix_params(model: ModelSpec, parallel: ParallelConfig, layout: Layout, dense_layers: int,
                  moe_layers: int) -> tuple[int, int]:
    """(all, routed experts') parameters of a stage's rank that Muon updates (0, 0 with Adam)."""
    if not parallel.muon:
        return 0, 0
    params = experts = 0
    for matrix, group, layers in _stage_matrices(model, parallel, layout, dense_layers, moe_layers):
        local = local_params(matrix, group.size) * layers
        params, experts = params + local, experts + (local if matrix.expert else 0)
    return params, experts


def newton_schulz_s(model: ModelSpec, parallel: ParallelConfig, layout: Layout, profile: ClusterProfile,
                    gpu: GPUSpec, dense_layers: int, moe_layers: int) -> tuple[float, float]:
    """(Newton-Schulz GEMM time, TP all-gather time) of the matrices one rank of the stage orthogonalizes."""
    ns_s = gather_s = 0.0
    for matrix, group, layers in _stage_matrices(model, parallel, layout, dense_layers, moe_layers):
        rows, cols, gather = matrix.rows, matrix.cols, 0.0
        if matrix.tp_dim is not None and group.size > 1:
            if parallel.muon_tp_mode == "duplicated":
                gather = collective_time_s("all_gather", rows * cols * MOMENTUM_GATHER_BYTES, group, profile)
            elif matrix.tp_dim == 0:
                rows //= group.size
            else:
                cols //= group.size
        share = matrix.count * layers / _owners(matrix, parallel, layout)
        ns_s += share * ns_time_s(rows, cols, parallel.muon_num_ns_steps, profile, gpu)
        gather_s += share * gather
    return ns_s, gather_s


def _saved(parallel: ParallelConfig, layout: Layout, params: int, expert_params: int, matrices: tuple[int, int],
           per_param: float) -> float:
    """``per_param`` bytes on the parameters (of one rank's ``params``, ``expert_params`` of them routed experts')
    that Muon or Lion update instead of Adam, divided as the distributed optimizer shards them."""
    dense_m, expert_m = matrices[0] - matrices[1], matrices[1]
    if parallel.muon_scalar_optimizer == "lion":  # every parameter drops Adam's second moment
        dense_m, expert_m = params - expert_params, expert_params
    if parallel.use_distributed_optimizer:
        dense_m /= layout.data_parallel_size * parallel.context_parallel_size
        expert_m /= layout.expert_data_parallel_size
    return (dense_m + expert_m) * per_param


def step_extra_s(model: ModelSpec, parallel: ParallelConfig, layout: Layout, profile: ClusterProfile,
                 gpu: GPUSpec, mix: tuple[tuple[int, int], ...], params: int, expert_params: int) -> float:
    """What Muon adds to sim/data_parallel/dp.py's Adam step time on one rank of a stage with layer ``mix`` (per chunk:
    dense, MoE layers): Newton-Schulz and its all-gathers, less the second moment's traffic on the parameters
    whose update drops it."""
    if not parallel.muon:
        return 0.0
    dense, moe = sum(d for d, _ in mix), sum(k for _, k in mix)
    ns_s, gather_s = newton_schulz_s(model, parallel, layout, profile, gpu, dense, moe)
    matrices = matrix_params(model, parallel, layout, dense, moe)
    saved = _saved(parallel, layout, params, expert_params, matrices, DROPPED_UPDATE_BYTES)
    return ns_s + gather_s - saved / (profile.memory_bandwidth_gbyte_s * 1e9)
