"""The traced workload: what one rank executes for one micro-batch, op by op.

A ``Trace`` is produced by ``echo_tune.workload.tracer`` (ex-situ, on the ``meta`` device) and
consumed by the cost models and the schedule simulator. It holds no timing: only what ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Op kinds the cost model knows how to time.
OP_KINDS = ("gemm", "attention", "memory", "collective")
# Collective names follow nccl-tests; size_bytes follows nccl-tests' "size" column convention:
# all_reduce: the buffer; all_gather: the gathered output; reduce_scatter: the full input;
# send_recv / broadcast: the message; all_to_all: the whole send buffer of one rank.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all", "broadcast")
GROUPS = ("tp", "cp", "dp", "pp", "ep", "etp", "tpep", "cp_a2a", "cp_p2p")
"""Process groups; ep / etp / tpep (the ETP x EP group) are the expert groups of ``config/rules/expert_layout.py``; cp_a2a
and cp_p2p the two levels of a2a+p2p context parallelism (``config/rules/cp_comm_rules.py``)."""


ROUTER_FUSED_CHAINS = ("router_topk", "router_aux_scores", "router_aux_loss")
"""Sub-regions of the MoE router (nested in "router") holding the chains Transformer Engine fuses into one kernel
each under ``--moe-router-fusion`` (workload/mlp/moe_router.py, cost/kernels/moe_fusion.py)."""

@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One recorded operation."""

    name: str
    """The aten op (``aten.mm``) or, for collectives, ``all_gather`` etc."""
    kind: str
    """One of OP_KINDS: gemm (matmul-like, tensor cores), attention (fused flash kernel), memory
    (memory-bound: norms, activations, dropout, softmax, adds, copies), collective."""
    phase: str
    """"fwd" or "bwd"."""
    region: str
    """Which part of the model recorded it, e.g. "core_attention" (what selective recompute replays)."""
    subregion: str = ""
    """The part of the region that recorded it, where the region tags parts (the MoE block: "router",
    "dispatch", "experts", "combine", "shared"); empty elsewhere."""
    flops: float = 0.0
    """Floating-point operations (a multiply-add counts 2)."""
    bytes: float = 0.0
    """Bytes read plus written in HBM (memory-bound cost)."""
    gemm_mnk: tuple[int, int, int] | None = None
    """For gemm: (m, n, k) with any batch folded into m, for the efficiency surface."""
    gemm_groups: int = 1
    """For gemm: the batch count of a batched matmul (bmm), 1 otherwise. The MoE experts' grouped GEMM is
    traced as one bmm over the local experts; ``cost/kernels/moe_grouped_gemm.py`` times it as that many GEMMs."""
    collective: str | None = None
    """For collective: one of COLLECTIVES."""
    group: str | None = None
    """For collective: one of GROUPS."""
    size_bytes: int = 0
    """For collective: message size in nccl-tests' convention (see COLLECTIVES above)."""
    causal: bool = False
    """For attention: the kernel applies the causal mask (its FLOPs count only the unmasked half; masked
    forward kernels run at a lower rate, ``ClusterProfile.attention_causal_factor``)."""
    exps: float = 0.0
    """For attention: the exponentials its softmax evaluates (one per unmasked score, forward and, recomputing the
    probabilities, backward), which the GPU's special-function units bound (``cost/kernels/compute.py``)."""
    key: str = ""
    """For compute ops: the op and its arguments' shapes, strides and dtypes (``workload/recording/opkey.py``),
    under which ``echo-tune profile`` stores a measured time; empty for collectives."""


@dataclass(frozen=True, kw_only=True)
class Trace:
    """One micro-batch of one model piece (a transformer layer, the embedding, or the output layer)."""

    piece: str
    """"layer", "embedding" or "output"."""
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    activation_bytes: int
    """Bytes kept from forward to backward (saved-tensor hooks, parameters excluded)."""
    activation_bytes_by_region: dict[str, int] = field(default_factory=dict)
    """``activation_bytes`` split by the region whose op first saved each tensor (sums to the total)."""
    activation_bytes_by_part: dict[str, int] = field(default_factory=dict)
    """The same split by "region/subregion" where the region tags parts (the MoE block's), else by region."""
    region_internal_bytes: dict[str, int] = field(default_factory=dict)
    """Bytes created and saved only inside each region: what recomputing that region alone frees
    (selective recompute: ``region_internal_bytes["core_attention"]``, Korthikanti's 5as^2b/t). A
    region's inputs and outputs are not counted: the checkpoint or the next region keeps them."""
    region_created_bytes: dict[str, int] = field(default_factory=dict)
    """Saved bytes by the region whose op created them, whoever saves them: what output-discarding
    recompute of that region frees (Megatron's layernorm / mla_up_proj / moe_act modules). Both dicts also
    hold "region/subregion" keys for tagged sub-regions (e.g. "moe/expert_act", "moe/shared"), which overlap
    their region's total: sum only the keys you recompute."""
    input_bytes: int = 0
    """Bytes of the piece's input tensor (what full recompute keeps per checkpointed layer)."""
    output_bytes: int = 0
    """Bytes of the piece's output (the pipeline p2p message when it ends a stage)."""
    param_count: int = 0
    """Parameters held by this rank for this piece (already sharded by TP)."""
    tied_param_count: int = 0
    """Of ``param_count``, those tied to another piece's (the output layer's copy of the word
    embeddings when they are tied): a pipeline stage that holds both pieces holds them once."""
    expert_param_count: int = 0
    """Of ``param_count``, the routed experts' (MoE layers): sharded over EP x ETP, their gradients
    reduced and optimizer states sharded over the expert-data-parallel group."""
    param_tensors: tuple[tuple[int, str], ...] = ()
    """This rank's trainable tensors as (elements, kind), in model order: "matrix" (2-D, what Muon
    orthogonalizes), "expert" (one routed expert's weight matrix: Megatron keeps each local expert's as its own
    tensor), "other" (norms, biases, the word embeddings: the scalar optimizer's) and "tied" (the output
    layer's weight, a copy of the word embeddings when tied). Sums to ``param_count`` (sim/data_parallel/muon_shards.py)."""
    linear_param_counts: dict[str, int] = field(default_factory=dict)
    """Weights of this rank's linear layers by where their GEMMs run, "region" or "region/subregion"
    ("qkv", "attention_proj", "mlp", "moe/router", "moe/experts", "moe/shared"): what FP8 weight copies
    are counted on (``cost/kernels/fp8.py``)."""

    @property
    def forward_flops(self) -> float:
        return sum(op.flops for op in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(op.flops for op in self.backward)
