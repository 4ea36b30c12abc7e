"""Model fields for mixture-of-experts layers and multi-latent attention (Megatron-LM argument names).

``ModelSpec`` inherits these two groups, so a dense model leaves them at their defaults. Defaults are
Megatron-Core's (megatron/core/transformer/transformer_config.py and megatron/training/arguments.py,
NVIDIA/Megatron-LM commit d98e8a64ddf3).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.specs.layer_pattern import moe_layer_pattern

DISPATCHERS = ("allgather", "alltoall", "flex")
# --moe-flex-dispatcher-backend (transformer_config.py at d98e8a64ddf3 also lists ncclep: not modelled)
FLEX_BACKENDS = ("deepep", "hybridep")
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")
ROUTER_DTYPES = (None, "fp32", "fp64")
SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")


@dataclass(frozen=True, kw_only=True)
class MoEFields:
    """Mixture-of-experts settings (all None/default: a dense model)."""

    num_experts: int | None = None
    """``--num-experts``: routed experts per MoE layer; None means no MoE."""

    moe_router_topk: int = 2
    """``--moe-router-topk``: experts each token is routed to."""

    moe_ffn_hidden_size: int | None = None
    """``--moe-ffn-hidden-size``: inner size of one routed expert; None means ffn_hidden_size."""

    moe_shared_expert_intermediate_size: int | None = None
    """``--moe-shared-expert-intermediate-size``: inner size of the shared expert(s); None means none."""

    moe_layer_freq: int | str = 1
    """``--moe-layer-freq``: every N-th layer is MoE, or a 0/1 list expression such as ``([0]*3+[1]*58)``."""

    moe_router_load_balancing_type: str = "aux_loss"
    """``--moe-router-load-balancing-type``: aux_loss, seq_aux_loss, global_aux_loss, sinkhorn or none; several,
    space-separated, combine their losses (the flag takes ``nargs='+'``: "seq_aux_loss global_aux_loss")."""

    moe_aux_loss_coeff: float | str = 0.0
    """``--moe-aux-loss-coeff``: the load-balancing loss coefficient, one per balancing type (space-separated);
    any above 0 computes the aux-loss scores in every forward (router.py ``is_aux_loss_enabled``; workload/
    moe_router.py)."""

    moe_z_loss_coeff: float | None = None
    """``--moe-z-loss-coeff``: the router z-loss (logsumexp of the logits, squared) when set."""

    moe_router_score_function: str = "softmax"
    """``--moe-router-score-function``: softmax, sigmoid (DeepSeek-V3: the chosen scores renormalised) or
    sqrtsoftplus."""

    moe_router_enable_expert_bias: bool = False
    """``--moe-router-enable-expert-bias``: a per-expert bias added to the scores before the top-k, and the tokens
    per expert counted for its update (aux-loss-free balancing)."""

    moe_router_topk_scaling_factor: float | None = None
    """``--moe-router-topk-scaling-factor``: the chosen probabilities times this (one product)."""

    moe_token_dispatcher_type: str = "allgather"
    """``--moe-token-dispatcher-type``: alltoall, allgather (Megatron's default) or flex (DeepEP / HybridEP,
    ``moe_flex_dispatcher_backend``)."""

    moe_grouped_gemm: bool = False
    """``--moe-grouped-gemm``: one grouped GEMM for the local experts instead of a loop of GEMMs."""

    moe_expert_capacity_factor: float | None = None
    """``--moe-expert-capacity-factor``: token-dropping capacity; None is dropless."""

    moe_pad_expert_input_to_capacity: bool = False
    """``--moe-pad-expert-input-to-capacity``: pad every expert's input to its capacity."""

    moe_router_dtype: str | None = None
    """``--moe-router-dtype``: fp32 or fp64 router logits; None keeps the model dtype."""

    moe_flex_dispatcher_backend: str = "deepep"
    """``--moe-flex-dispatcher-backend``: deepep (Megatron's default) or hybridep, the kernels of the flex
    dispatcher (``cost/collectives/moe_dispatch.py``: de-duplicated copies, own bandwidth and SMs)."""

    moe_flex_dispatcher_num_sms: int | None = None
    """``--moe-flex-dispatcher-num-sms`` (deprecated spellings ``--moe-deepep-num-sms``, ``--moe-hybridep-num-sms``,
    routed to it by transformer_config.py __post_init__): SMs the flex dispatcher's dispatch / combine kernels
    occupy; None = the backend's default (DeepEP 20, token_dispatcher.py ``set_deepep_num_sms``; HybridEP its
    library default). They are taken from compute running beside the kernels and set the kernels' copy rate
    (``cost/collectives/moe_dispatch.py``)."""

    moe_enable_deepep: bool = False
    """``--moe-enable-deepep``: the deprecated spelling of ``--moe-flex-dispatcher-backend deepep`` (needs
    the flex dispatcher; transformer_config.py __post_init__)."""

    moe_shared_expert_overlap: bool = False
    """``--moe-shared-expert-overlap``: the shared expert runs on a side stream beside the dispatch and combine
    all-to-alls (megatron/core/transformer/moe/shared_experts.py); hides up to the smaller of the two."""

    moe_shared_expert_gate: bool = False
    """``--moe-shared-expert-gate``: the shared expert's output is scaled by sigmoid(x @ w), w a [1, hidden] weight
    (megatron/core/transformer/moe/shared_experts.py ``gate_weight``; Qwen2-MoE's gated shared expert): one GEMV, a
    sigmoid and a product, outside Transformer Engine (a torch linear: never FP8)."""

    moe_router_fusion: bool = False
    """``--moe-router-fusion``: TE's fused top-k routing kernel (softmax/score, top-k and aux-loss scores in one
    kernel instead of a chain of memory-bound ops)."""

    moe_permute_fusion: bool = False
    """``--moe-permute-fusion``: TE's fused permute / un-permute kernels (token rearrangement in one kernel)."""

    enable_experimental: bool = False
    """``--enable-experimental``: Megatron-Core's experimental code paths (megatron/core/config.py
    ``set_experimental_flag``). What echo-tune models of it: with ``--moe-permute-fusion``, DeepEP's received top-k
    indices become the per-expert map in one fused kernel (token_dispatcher.py ``fused_indices_to_multihot``)
    instead of ``_indices_to_multihot``'s chain of kernels and three host waits (workload/mlp/flex_metadata.py)."""

    moe_apply_probs_on_input: bool = False
    """``--moe-apply-probs-on-input``: weight the tokens by their routing probability before the experts
    instead of at the un-permute (experts.py: only with ``moe_router_topk == 1``)."""

    moe_router_num_groups: int | None = None
    """``--moe-router-num-groups``: expert groups of group-limited routing (DeepSeek's node-limited routing);
    None = plain top-k."""

    moe_router_group_topk: int | None = None
    """``--moe-router-group-topk``: groups a token's experts may come from (with moe_router_num_groups)."""

    moe_router_force_load_balancing: bool = False
    """``--moe-router-force-load-balancing``: random router logits (benchmarking): routing is balanced, so
    the busiest expert gets exactly a balanced share (``moe_routing_imbalance`` is taken as 1)."""

    moe_routing_imbalance: float = 1.0
    """echo-tune's routing assumption, not a Megatron flag: the busiest expert's token share relative to
    a balanced one (1.0 = balanced, the default). It scales the busiest rank's expert GEMMs and dispatch
    bytes, because the slowest rank sets the step."""

    def _check_moe(self) -> None:
        if self.num_experts is None:
            return
        require_positive("num_experts", self.num_experts)
        require_positive("moe_router_topk", self.moe_router_topk)
        require(self.moe_router_topk <= self.num_experts,
                f"`moe_router_topk <= num_experts` must hold, but got (moe_router_topk={self.moe_router_topk}, "
                f"num_experts={self.num_experts})")
        for field in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_expert_capacity_factor"):
            if getattr(self, field) is not None:
                require_positive(field, getattr(self, field))
        moe_layer_pattern(self.moe_layer_freq, self.num_layers)  # type: ignore[attr-defined]
        balancing = str(self.moe_router_load_balancing_type).split()
        require(bool(balancing), "`moe_router_load_balancing_type` must name at least one of "
                                 f"{list(LOAD_BALANCING)}, but got ({self.moe_router_load_balancing_type!r})")
        for kind in balancing:
            require_choice("moe_router_load_balancing_type", kind, LOAD_BALANCING)
        # Megatron-LM d98e8a64ddf3 transformer_config.py __post_init__: token dropping needs a loss-based balancing
        require(self.moe_expert_capacity_factor is None or "sinkhorn" not in balancing,
                f"`moe_expert_capacity_factor` works only with aux_loss, seq_aux_loss, global_aux_loss or none load "
                f"balancing (Megatron-Core), but got (moe_router_load_balancing_type="
                f"{self.moe_router_load_balancing_type!r}); drop --moe-expert-capacity-factor or use aux_loss")
        require_choice("moe_token_dispatcher_type", self.moe_token_dispatcher_type, DISPATCHERS)
        require_choice("moe_router_dtype", self.moe_router_dtype, ROUTER_DTYPES)
        require_choice("moe_router_score_function", self.moe_router_score_function, SCORE_FUNCTIONS)
        try:
            coeffs = [float(c) for c in str(self.moe_aux_loss_coeff).split()]
        except ValueError:
            coeffs = []
        require(bool(coeffs) and all(c >= 0 for c in coeffs),
                f"`moe_aux_loss_coeff` must be one or more numbers >= 0, but got ({self.moe_aux_loss_coeff!r})")
        require(self.moe_z_loss_coeff is None or self.moe_z_loss_coeff >= 0,
                f"`moe_z_loss_coeff >= 0` must hold, but got (moe_z_loss_coeff={self.moe_z_loss_coeff})")
        require(1.0 <= self.moe_routing_imbalance <= self.num_experts / self.moe_router_topk,
                f"`1 <= moe_routing_imbalance <= num_experts / moe_router_topk` must hold (the busiest expert "
                f"gets at most every token), but got (moe_routing_imbalance={self.moe_routing_imbalance})")
        require(not self.moe_pad_expert_input_to_capacity or self.moe_expert_capacity_factor is not None,
                "`moe_pad_expert_input_to_capacity` needs `moe_expert_capacity_factor`, but got "
                "(moe_expert_capacity_factor=None); set --moe-expert-capacity-factor")
        self._check_moe_router_dispatch()

    def _check_moe_router_dispatch(self) -> None:
        """Megatron's rules for the flex dispatcher, group-limited routing and the routing options
        (megatron/core/transformer/transformer_config.py __post_init__ and moe/experts.py, d98e8a64ddf3)."""
        require_choice("moe_flex_dispatcher_backend", self.moe_flex_dispatcher_backend, FLEX_BACKENDS)
        if self.moe_flex_dispatcher_num_sms is not None:
            require_positive("moe_flex_dispatcher_num_sms", self.moe_flex_dispatcher_num_sms)
        flex, backend = self.moe_token_dispatcher_type == "flex", self.moe_flex_dispatcher_backend
        require(not self.moe_enable_deepep or (flex and backend == "deepep"),
                f"`moe_enable_deepep` needs the flex dispatcher with the deepep backend, but got "
                f"(moe_token_dispatcher_type={self.moe_token_dispatcher_type!r}, moe_flex_dispatcher_backend="
                f"{backend!r}); add --moe-token-dispatcher-type flex or drop --moe-enable-deepep")
        require(not (flex and backend == "deepep" and self.moe_pad_expert_input_to_capacity),
                "the flex dispatcher's deepep backend does not support `moe_pad_expert_input_to_capacity`; "
                "drop --moe-pad-expert-input-to-capacity or use --moe-token-dispatcher-type alltoall")
        require(not self.moe_shared_expert_overlap or not self.moe_shared_expert_intermediate_size
                or self.moe_token_dispatcher_type in ("alltoall", "flex"),
                f"`moe_shared_expert_overlap` works with the alltoall or flex dispatcher only, but got "
                f"(moe_token_dispatcher_type={self.moe_token_dispatcher_type!r}); "
                "use --moe-token-dispatcher-type alltoall")
        require(not self.moe_shared_expert_gate or bool(self.moe_shared_expert_intermediate_size),
                "`moe_shared_expert_gate` gates the shared expert, but got (moe_shared_expert_intermediate_size=None); "
                "set --moe-shared-expert-intermediate-size or drop --moe-shared-expert-gate")
        require(not self.moe_apply_probs_on_input or self.moe_router_topk == 1,
                f"`moe_apply_probs_on_input` only works with `moe_router_topk == 1`, but got "
                f"(moe_router_topk={self.moe_router_topk}); drop --moe-apply-probs-on-input")
        groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
        if groups is not None:
            require_positive("moe_router_num_groups", groups)
        if group_topk is None:
            return
        require_positive("moe_router_group_topk", group_topk)
        require(groups is not None, "group-limited routing (`moe_router_group_topk`) needs "
                                    "`moe_router_num_groups`, but got (moe_router_num_groups=None); set it")
        require(self.num_experts % groups == 0,
                f"`num_experts % moe_router_num_groups == 0` must hold, but got (num_experts={self.num_experts}, "
                f"moe_router_num_groups={groups})")
        require(group_topk <= groups, f"`moe_router_group_topk <= moe_router_num_groups` must hold, but got "
                                      f"(moe_router_group_topk={group_topk}, moe_router_num_groups={groups})")
        per_group = self.num_experts // groups
        require(self.moe_router_topk <= group_topk * per_group,
                f"`moe_router_topk <= moe_router_group_topk * num_experts / moe_router_num_groups` must hold (the "
                f"chosen groups must hold k experts), but got (moe_router_topk={self.moe_router_topk}, "
                f"moe_router_group_topk={group_topk}, experts per group={per_group})")

    @property
    def moe_dispatcher_kernel(self) -> str:
        """The dispatch kernels that run: allgather, alltoall (NCCL), deepep or hybridep (flex)."""
        if self.moe_token_dispatcher_type != "flex":
            return self.moe_token_dispatcher_type
        return "deepep" if self.moe_enable_deepep else self.moe_flex_dispatcher_backend

    @property
    def moe_aux_loss_enabled(self) -> bool:
        """Any load-balancing loss with a coefficient above 0 (router.py ``is_aux_loss_enabled``)."""
        return any(float(c) > 0 for c in str(self.moe_aux_loss_coeff).split())

    @property
    def moe_effective_imbalance(self) -> float:
        """The busiest expert's share over a balanced one: 1 under forced load balancing."""
        return 1.0 if self.moe_router_force_load_balancing else self.moe_routing_imbalance


@dataclass(frozen=True, kw_only=True)
class MLAFields:
    """Multi-latent attention (DeepSeek-V2/V3); defaults from Megatron's ``_add_mla_args``."""

    multi_latent_attention: bool = False
    """``--multi-latent-attention``: low-rank compressed Q and KV with a decoupled RoPE part."""

    q_lora_rank: int | None = None
    """``--q-lora-rank``: rank of the compressed query; None projects the query directly."""

    kv_lora_rank: int = 32
    """``--kv-lora-rank``: rank of the compressed key/value latent."""

    qk_head_dim: int = 128
    """``--qk-head-dim``: per-head query/key size without the RoPE part."""

    qk_pos_emb_head_dim: int = 64
    """``--qk-pos-emb-head-dim``: per-head RoPE part of query and key (the key's is shared by heads)."""

    v_head_dim: int = 128
    """``--v-head-dim``: per-head value size."""

    qk_layernorm: bool = False
    """``--qk-layernorm``: RMSNorm on each query and key head (Qwen3); with MLA, on the compressed query
    and key/value latents (DeepSeek)."""

    def _check_mla(self) -> None:
        if not self.multi_latent_attention:
            return
        for field in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
            require_positive(field, getattr(self, field))
        if self.q_lora_rank is not None:
            require_positive("q_lora_rank", self.q_lora_rank)


def moe_params(model) -> int:
    """Parameters of one MoE block, unsharded: router, routed experts, shared expert; with ``add_bias_linear``
    their biases (Megatron-LM d98e8a64ddf3: the router's ``bias`` [experts] in router.py, each expert's fc1 / fc2
    biases in TE's GroupedLinear, the shared expert's as a dense MLP's)."""
    h, per = model.hidden_size, (3 if model.gated_linear_unit else 2)
    shared = model.moe_shared_expert_intermediate_size or 0
    gate = h if model.moe_shared_expert_gate else 0
    biases = 0
    if model.add_bias_linear:
        fc1 = (2 if model.gated_linear_unit else 1)
        biases = model.num_experts * (1 + fc1 * model.moe_ffn_size + h) + (fc1 * shared + h if shared else 0)
    return model.num_experts * h + model.num_experts * per * h * model.moe_ffn_size + per * h * shared + gate + biases


def mla_params(model) -> int:
    """MLA projections and latent norms (without the output projection), unsharded."""
    h, a = model.hidden_size, model.num_attention_heads
    qk, pos, v, kv = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, model.kv_lora_rank
    q = (model.q_lora_rank * (h + a * (qk + pos)) if model.q_lora_rank else h * a * (qk + pos))
    norms = (kv + (model.q_lora_rank or 0)) if model.qk_layernorm else 0
    return q + h * (kv + pos) + kv * a * (qk + v) + norms
