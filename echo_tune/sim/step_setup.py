"""What a step is computed with, shared by ``simulate`` and ``memory/step_memory.py``: the settings checked and the
profile resolved (``prepared``), the GPU at its sustained clock, the passes' cost context, and what each stage holds
(parameters per chunk, the stages' memory)."""

from __future__ import annotations

from echo_tune.config.checked import checked_step
from echo_tune.config.specs.cluster import ClusterSpec, clock_note
from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.moe_dispatch import moe_kernels
from echo_tune.cost.profile import ClusterProfile, check_profile_device
from echo_tune.errors import ConfigError
from echo_tune.sim.features.cuda_graphs import capture_spec
from echo_tune.sim.features.deferred_wgrad import with_buffers
from echo_tune.sim.features.determinism import ring_only_profile
from echo_tune.sim.memory.stage import stage_memory
from echo_tune.sim.outputs.optime_coverage import check_op_times_device
from echo_tune.sim.schedule.costing import CostContext
from echo_tune.sim.schedule.linear_layers import linear_param_delta
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.schedule.schedules import SCHEDULES


def with_sustained_clock(cluster: ClusterSpec, profile: ClusterProfile) -> ClusterSpec:
    """The cluster with its GPU at the compute-bound clock in use: the cluster's ``sustained_clock_mhz``
    (its file or --gpu-clock-mhz), else a clock fitted on training runs (the profile's), else the preset's."""
    clock = cluster.sustained_clock_mhz or profile.fitted_clock_mhz
    if clock is None or cluster.gpu.peak_clock_mhz is None or (
            clock == cluster.gpu.sustained_clock_mhz and cluster.gpu.sustained_clock_derived_from is None):
        return cluster
    return cluster.replace(gpu=cluster.gpu.replace(sustained_clock_mhz=float(clock), sustained_clock_derived_from=None))


def clock_note_for(cluster: ClusterSpec, profile: ClusterProfile | None = None) -> str | None:
    """``clock_note`` of the cluster's GPU at the clock in use (``with_sustained_clock``; ``profile``: the one the
    simulation uses, default the cluster's own): what a report says of a derived or unknown sustained clock."""
    return clock_note(with_sustained_clock(cluster, profile or profile_for_cluster(cluster)).gpu)


def cost_context(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig, layout: Layout,
                 profile: ClusterProfile) -> CostContext:
    """What every pass of ``simulate`` is costed with (``emulate`` predicts with the same): ``cluster`` at its
    sustained clock (``with_sustained_clock``) and ``profile`` as ``simulate`` resolves it."""
    return CostContext(profile=profile, gpu=cluster.gpu, precision=parallel.precision, groups=layout.groups,
                       tp_comm_overlap=layout.tp_comm_overlap,
                       async_tp_backward=parallel.async_tensor_model_parallel_allreduce,
                       fp8_recipe=parallel.quantized_recipe, moe=moe_kernels(model, cluster),
                       overlap_moe_expert_parallel_comm=parallel.overlap_moe_expert_parallel_comm,
                       delay_wgrad_compute=parallel.delay_wgrad_compute,
                       graph_capture=capture_spec(layout.cuda_graphs),
                       moe_dispatch_syncs=not model.moe_pad_expert_input_to_capacity,
                       ub_config=parallel.tp_comm_overlap_cfg or ())


def prepared(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig,
             profile: ClusterProfile | None, schedule: str | None, layout: Layout | None) -> tuple:
    """(parallel, layout, profile, cluster, schedule) as a step is simulated with them: the rules checked once, the
    profile resolved, the GPU at its sustained clock, the schedule checked."""
    parallel, layout = checked_step(model, cluster, num_gpus, parallel, layout)  # the rules, once (config/)
    profile = ring_only_profile(profile or profile_for_cluster(cluster), parallel)  # built once per cluster
    check_profile_device(profile, cluster)
    check_op_times_device(profile, cluster)
    cluster = with_sustained_clock(cluster, profile)
    schedule = schedule or layout.schedule
    if schedule not in SCHEDULES:
        raise ConfigError(f"`schedule` must be one of {', '.join(map(repr, SCHEDULES))}, but got "
                          f"(schedule={schedule!r})")
    if schedule == "gpipe" and layout.virtual_pipeline_size > 1:
        raise ConfigError("the gpipe schedule has no interleaving; drop virtual_pipeline_model_parallel_size")
    return parallel, layout, profile, cluster, schedule


def derived_sizes(layout: Layout, schedule: str) -> dict:
    """The sizes and settings in effect a layout implies (a report's ``config`` holds them beside the flags)."""
    return {"data_parallel_size": layout.data_parallel_size, "num_micro_batches": layout.num_micro_batches,
            "pipeline_schedule": schedule, "effective_sequence_parallel": layout.sequence_parallel,
            "effective_recompute_method": layout.recompute_method,
            "effective_recompute_num_layers": layout.recompute_num_layers}


def mtp_layer_params(model: ModelSpec, parallel: ParallelConfig) -> int:
    """Parameters of one MTP layer on a TP rank: an eh projection [2h -> h] sharded over TP and two norms; its
    output layer shares the main one's weights (megatron/core/transformer/multi_token_prediction.py)."""
    h = model.hidden_size
    return 2 * h * h // parallel.tensor_model_parallel_size + 2 * h


def chunk_param_counts(layout: Layout, pieces, mix, mtp_params: int, linears=None) -> list[tuple[list, list]]:
    """Per stage: (parameters of each chunk, of them the routed experts'), as a rank holds them."""
    layer_params = pieces["layer"].param_count
    moe = pieces.get("moe_layer")
    moe_params, expert_params = (moe.param_count, moe.expert_param_count) if moe else (0, 0)
    # tied weights on the embedding's stage: the output layer reuses the word embedding (counted once)
    shared_output_params = pieces["output"].tied_param_count \
        if layout.holder("embedding")[0] == layout.holder("loss")[0] else 0
    out = []
    for s in range(len(layout.stage_chunk_layers)):
        chunk_params = [dense * layer_params + k * moe_params for dense, k in mix[s]]
        if linears:  # gated-delta-net layers hold other parameters than self-attention (sim/schedule/linear_layers.py)
            chunk_params = [n + linear_param_delta(pieces, la)[0] for n, la in zip(chunk_params, linears[s])]
        chunk_experts = [k * expert_params for _, k in mix[s]]
        for c, contents in enumerate(layout.chunk_contents[s]):
            chunk_params[c] += pieces["embedding"].param_count if contents.embedding else 0
            chunk_params[c] += pieces["output"].param_count - shared_output_params if contents.loss else 0
            chunk_params[c] += contents.mtp_layers * mtp_params
        out.append((chunk_params, chunk_experts))
    return out


def stage_memories(model, cluster, parallel, layout, pieces, schedule, mix, linears, stage_params, stage_experts,
                   drained, defer) -> tuple:
    """Each stage's memory (``stage_memory``), with the deferred embedding wgrad's buffers on the last."""
    memory = tuple(stage_memory(s, layout, parallel, pieces, stage_params[s], schedule, mix=mix[s], linear=linears[s],
                                offload_drained=drained[s],
                                expert_params_on_rank=stage_experts[s], model=model, gpu=cluster.gpu)
                   for s in range(len(layout.stage_chunk_layers)))
    return with_buffers(memory, defer) if defer is not None else memory
