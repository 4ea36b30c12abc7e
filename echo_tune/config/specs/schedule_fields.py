"""The schedule and step features of ParallelConfig: CUDA graphs, pipeline layouts and grouping, deferred weight
gradients, context-parallel communication, offloading (Megatron-LM d98e8a64ddf3; mechanics in
sim/features/cuda_graphs.py, sim/data_parallel/dp.py, sim/features/deferred_wgrad.py; rules in
config/rules/schedule_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.specs.pipeline_layout import normalize_layout, parse_layout

# Megatron-LM d98e8a64ddf3 core/transformer/transformer_config.py ``cuda_graph_impl``.
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")


@dataclass(frozen=True, kw_only=True)
class ScheduleFields:
    cuda_graph_impl: str = "none"
    """``--cuda-graph-impl``: none, local (Megatron-Core's CudaGraphManager, per layer), transformer_engine
    (TE make_graphed_callables, per layer) or full_iteration (one graph for the forward-backward of a step,
    optimizer excluded); core/transformer/transformer_config.py ``cuda_graph_impl``."""

    cuda_graph_modules: tuple[str, ...] | None = None
    """``--cuda-graph-modules``: what the per-layer graphs capture (attn, mlp, moe, moe_router,
    moe_preprocess, mamba); None or empty = the whole transformer layer."""

    cuda_graph_scope: tuple[str, ...] | None = None
    """``--cuda-graph-scope``: the deprecated spelling of ``--cuda-graph-modules`` (Megatron migrates it, and
    its value ``full_iteration`` to ``--cuda-graph-impl full_iteration``, training/arguments.py)."""

    enable_cuda_graph: bool = False
    """``--enable-cuda-graph``: the deprecated spelling of ``--cuda-graph-impl local``."""

    external_cuda_graph: bool = False
    """``--external-cuda-graph``: the deprecated spelling of ``--cuda-graph-impl transformer_engine``."""

    cuda_graph_warmup_steps: int = 3
    """``--cuda-graph-warmup-steps``: eager steps before capture (not a steady-state step's cost)."""

    overlap_param_gather_with_optimizer_step: bool = False
    """``--overlap-param-gather-with-optimizer-step``: all-gather the first model chunk's parameters while the
    optimizer steps the other chunks (distributed optimizer, interleaved schedule)."""

    defer_embedding_wgrad_compute: bool = False
    """``--defer-embedding-wgrad-compute``: the last stage defers the output layer's weight-gradient GEMMs to
    the pipeline flush."""

    wgrad_deferral_limit: int = 0
    """``--wgrad-deferral-limit``: micro-batches whose output-layer wgrad is deferred; 0 = all of them."""

    num_distributed_optimizer_instances: int = 1
    """``--num-distributed-optimizer-instances``: shard the distributed optimizer over DP x CP / N ranks (N
    instances), all-reducing each gradient shard across the instances."""

    pipeline_model_parallel_layout: str | None = None
    """``--pipeline-model-parallel-layout``: what each pipeline chunk holds, in Megatron's layout language
    (``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` between virtual stages listed
    chunk by chunk, ``(...)*N`` and ``t*N`` repeats; ``/`` is read as ``|``). Sets VPP; see
    config/specs/pipeline_layout.py."""

    microbatch_group_size_per_vp_stage: int | None = None
    """``--microbatch-group-size-per-virtual-pipeline-stage``: micro-batches the interleaved schedule runs
    through one chunk before the next; None means PP (Megatron's default, model_parallel_config.py)."""

    use_tp_pp_dp_mapping: bool = False
    """``--use-tp-pp-dp-mapping``: rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp (training/initialize.py):
    pipeline stages sit inside the data-parallel stride."""

    cpu_offloading_num_layers: int = 0
    """``--cpu-offloading-num-layers``: the first N layers' activations are copied to host memory during the
    forward and back before their backward (Transformer Engine's offload context; sim/features/cpu_offload.py)."""

    cp_comm_type: str = "p2p"
    """``--cp-comm-type``: how context parallelism communicates in attention: p2p (ring), all_gather, a2a (Ulysses) or
    a2a+p2p (config/rules/cp_comm_rules.py, workload/attention/cp_attention.py); one value per layer, repeated, reads as one."""

    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    """``--hierarchical-context-parallel-sizes``: the CP levels of a2a+p2p (all-to-all inside the first, ring over
    the second)."""

    fine_grained_activation_offloading: bool = False
    """``--fine-grained-activation-offloading``: what the ``offload_modules`` save for backward goes to host memory
    during the forward and comes back before their backward (sim/features/activation_offload.py)."""

    offload_modules: tuple[str, ...] | None = None
    """``--offload-modules``: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act."""

    tp_comm_overlap_cfg: tuple | None = None
    """``--tp-comm-overlap-cfg FILE``: the file's userbuffer settings per TE GEMM, read when the launch line is
    (config/launch/ub_config.py ``read_ub_config``); None: TE's defaults."""

    test_mode: bool = False
    """``--test-mode``: Megatron's real-time consistency checks of the QK layernorms in every self-attention forward
    (all-gathers over DP and TP, compared on the host; sim/features/realtime_tests.py)."""

    overlap_p2p_comm_warmup_flush: bool = False
    """``--overlap-p2p-communication-warmup-flush``: overlap the interleaved schedule's pipeline sends and
    receives with compute in the warm-up and flush phases too, not only in steady 1F1B (Megatron-LM d98e8a64ddf3
    core/pipeline_parallel/schedules.py ``forward_backward_pipelining_with_interleaving``: the receive for
    micro-batch k+1 is posted before computing k). echo-tune's pipeline engine (sim/schedule/engine.py) overlaps every
    send / receive in all phases, so this setting is what it models; Megatron's default (blocking
    send-and-receive in warm-up and flush) is not modelled. Needs the interleaved schedule
    (model_parallel_config.py: only with overlap_p2p_comm, which Megatron turns off without it)."""

    def _check_schedule(self) -> None:
        if self.microbatch_group_size_per_vp_stage is not None:
            require_positive("microbatch_group_size_per_vp_stage", self.microbatch_group_size_per_vp_stage)
        if self.pipeline_model_parallel_layout is not None:
            layout = self.pipeline_model_parallel_layout
            require(isinstance(layout, str) and normalize_layout(layout) != "",
                    f"`pipeline_model_parallel_layout` must be a layout string such as 'Et|(tt|)*30mL', but got "
                    f"(pipeline_model_parallel_layout={layout!r})")
            object.__setattr__(self, "pipeline_model_parallel_layout", normalize_layout(layout))
            parse_layout(self.pipeline_model_parallel_layout)  # the characters, checked early
        if self.hierarchical_context_parallel_sizes is not None:
            sizes = tuple(self.hierarchical_context_parallel_sizes)
            for size in sizes:
                require(isinstance(size, int) and not isinstance(size, bool) and size > 0,
                        f"`hierarchical_context_parallel_sizes` must be positive integers, but got "
                        f"(hierarchical_context_parallel_sizes={list(sizes)})")
            object.__setattr__(self, "hierarchical_context_parallel_sizes", sizes)
        for name in ("cuda_graph_modules", "cuda_graph_scope", "offload_modules"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        require_choice("cuda_graph_impl", self.cuda_graph_impl, CUDA_GRAPH_IMPLS)
        require_positive("num_distributed_optimizer_instances", self.num_distributed_optimizer_instances)
        for name in ("wgrad_deferral_limit", "cuda_graph_warmup_steps"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, f"`{name} >= 0` must hold, but got ({name}={value!r})")
