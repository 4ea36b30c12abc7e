"""``simulate``: one training step of a layout, from specs to a StepReport.

specs -> checked (config/checked.py) -> traced pieces (cached) -> costed passes -> pipeline simulation ->
DP reduction and optimizer per stage -> the critical stage's step as a sum of named parts.
"""

from __future__ import annotations

import dataclasses
import functools

from echo_tune.limits import MAX_SIMULATED_MICRO_BATCHES
from echo_tune.config.specs.cluster import ClusterSpec, clock_note
from echo_tune.config.specs.layout import GroupPlacement, Layout
from echo_tune.config.launch.launch_notes import launch_notes
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.kernels.fp8 import amax_reduction_s, amax_tensors_per_layer, mxfp8_notes
from echo_tune.cost.profile import ClusterProfile
from echo_tune.errors import ConfigError
from echo_tune.sim.outputs.optime_coverage import measured_compute_share
from echo_tune.sim.schedule.costing import ZERO, PhaseCost
from echo_tune.sim.features.activation_offload import (activation_offload_notes, stage_drained_bytes,
                                                       with_activation_offload)
from echo_tune.sim.features.cpu_offload import offload_costs, offload_notes
from echo_tune.sim.features.realtime_tests import realtime_test_notes, with_realtime_tests
from echo_tune.sim.features.cuda_graphs import graph_memory_notes
from echo_tune.sim.features.deferred_wgrad import deferred_wgrad, with_deferral
from echo_tune.sim.data_parallel.dp import grad_bytes_per_param, stage_tail
from echo_tune.sim.data_parallel.fsdp import dp_cp_group, fsdp_notes, fsdp_root_params, fsdp_stage_tail, with_fsdp_comm
from echo_tune.sim.schedule.grad_accumulation import chunk_accumulation_s
from echo_tune.sim.schedule.engine import run_pipeline, simulate_pipeline
from echo_tune.sim.outputs.flops import model_flops_per_step
from echo_tune.sim.schedule.layer_mix import chunk_layer_mix, chunk_window_mix, layer_notes, moe_notes
from echo_tune.sim.schedule.linear_layers import chunk_linear_mix, linear_notes
from echo_tune.sim.data_parallel.muon_shards import spread_notes
from echo_tune.sim.data_parallel.optimizer_muon import step_extra_s
from echo_tune.sim.features.moe_overlap import paired_fraction
from echo_tune.sim.schedule.chunk_passes import all_chunk_passes
from echo_tune.sim.schedule.passes import pass_costs, trace_pieces
from echo_tune.sim.outputs.report import StepReport
from echo_tune.sim.outputs.step_parts import step_breakdown, step_timeline
from echo_tune.sim.outputs.trace_args import chunk_work, p2p_message_bytes, span_args
from echo_tune.sim.step_setup import (chunk_param_counts, cost_context, derived_sizes, mtp_layer_params, prepared,
                                      stage_memories)


def _stage_pair(layout: Layout) -> GroupPlacement:
    """Two pipeline stages talking to each other: on one node, or one rank on each of two nodes."""
    crosses = layout.groups["pp"].crosses_nodes
    return GroupPlacement(size=2, ranks_per_node=1 if crosses else 2, num_nodes=2 if crosses else 1)


def p2p_time_s(pieces, layout: Layout, profile: ClusterProfile) -> float:
    """Activation (or its gradient) sent between neighbouring stages for one micro-batch: each TP rank sends
    its copy of the layer's output (1/TP of it with sequence parallelism), as Megatron-Core's p2p does
    (core/pipeline_parallel/p2p_communication.py at d98e8a64ddf3).

    ``--scatter-gather-tensors-in-pipeline`` (Megatron-LM 2021-2023, ``layout.p2p_scatter_gather``): each rank
    sends 1/TP and the receiver all-gathers it over NVLink (Narayanan et al. 2021, sec. 4.1). Assumed: the
    tensor's elements divide by TP (Megatron sent it whole otherwise).
    """
    if len(layout.stage_chunk_layers) == 1:
        return 0.0
    send = collective_time_s("send_recv", p2p_message_bytes(pieces, layout), _stage_pair(layout), profile)
    if not layout.p2p_scatter_gather:
        return send
    return send + collective_time_s("all_gather", pieces["layer"].output_bytes, layout.groups["tp"], profile)


def _embedding_sync_s(pieces, layout: Layout, parallel: ParallelConfig, profile) -> float:
    """Tied embeddings: the stages holding the embedding and the loss all-reduce the word-embedding
    gradient (the output piece's tied parameters; none when untied or both on one stage)."""
    if layout.holder("embedding")[0] == layout.holder("loss")[0]:
        return 0.0
    size = pieces["output"].tied_param_count * grad_bytes_per_param(parallel)
    return collective_time_s("all_reduce", size, _stage_pair(layout), profile)


def simulate(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig, *,
             profile: ClusterProfile | None = None, schedule: str | None = None,
             timeline: bool = False, memory_headroom_bytes: int = 0, layout: Layout | None = None,
             known_memory: tuple | None = None) -> StepReport:
    """Simulate one training step. Raises ConfigError for a layout that breaks a rule.

    ``memory_headroom_bytes``: a layout fits only if its peak stays this far under the HBM size
    (the CLI and search use ``sim.memory.DEFAULT_MEMORY_HEADROOM_GIB``; validation of measured runs 0).
    ``layout``: what ``check_compatible(model, cluster, num_gpus, parallel)`` returned for these very objects
    (the search's candidates carry it), so the rules are not checked twice; used only where Megatron-FSDP
    does not change the settings (its settings in effect are checked again). ``known_memory``: the stages' memory
    ``sim/memory/step_memory.step_memory`` returned for these very arguments (a search computes it first), used as
    it is."""
    parallel, layout, profile, cluster, schedule = prepared(model, cluster, num_gpus, parallel, profile, schedule,
                                                            layout)
    p, v, m = len(layout.stage_chunk_layers), layout.virtual_pipeline_size, layout.num_micro_batches
    if timeline and m > MAX_SIMULATED_MICRO_BATCHES:  # a timeline records every task: memory grows with m
        raise ConfigError(f"`num_micro_batches <= {MAX_SIMULATED_MICRO_BATCHES}` must hold to record a timeline "
                          f"(--trace), but got (num_micro_batches={m}); drop --trace or lower --global-batch-size")
    pieces = trace_pieces(model, parallel, layout)
    ctx = cost_context(model, cluster, parallel, layout, profile)
    costs = pass_costs(pieces, ctx, layout.recompute_regions)
    bf16 = None
    if parallel.fp8 and parallel.first_last_layers_bf16:
        bf16 = (pass_costs(pieces, dataclasses.replace(ctx, fp8_recipe=None), layout.recompute_regions),
                parallel.num_layers_at_start_in_bf16, parallel.num_layers_at_end_in_bf16)
    amax = ZERO
    if parallel.fp8 and parallel.fp8_recipe == "delayed":
        chunk_layers = max(max(row) for row in layout.stage_chunk_layers)
        amax = PhaseCost(comm_exposed_s=amax_reduction_s(layout, cluster, profile, chunk_layers,
                                                         amax_tensors_per_layer(pieces)))
    mix, windows = chunk_layer_mix(model, layout), chunk_window_mix(model, layout)
    linears = chunk_linear_mix(model, layout)  # gated-delta-net layers (sim/schedule/linear_layers.py)
    paired = [paired_fraction(schedule, s, p, m, v) if parallel.overlap_moe_expert_parallel_comm else 0.0
              for s in range(p)]
    passes = all_chunk_passes(layout, costs, mix, windows, bf16, amax, paired, linears)
    if parallel.use_megatron_fsdp:  # per-unit all-gathers / reduce-scatters inside the passes
        passes = with_fsdp_comm(passes, layout, parallel, pieces, costs, mix, profile)
    if not parallel.gradient_accumulation_fusion:  # main_grad += grad, one kernel per weight and micro-batch
        extra = chunk_accumulation_s(pieces, mix, layout, parallel, profile, linears)
        passes = [[(f, b + PhaseCost(compute_s=extra[s][c]), r) for c, (f, b, r) in enumerate(row)]
                  for s, row in enumerate(passes)]
    offload_bytes = offloaded_layer_bytes(pieces, mix) if parallel.cpu_offloading_num_layers else 0.0
    if offload_bytes:  # activation copies to / from the host beside the layers' compute (sim/features/cpu_offload.py)
        passes = [[(f + of, b + ob, r) for (f, b, r), layers in zip(row, layout.stage_chunk_layers[s])
                   for of, ob in [offload_costs(f, b, layers=layers, offloaded=parallel.cpu_offloading_num_layers,
                                                layer_bytes=offload_bytes, gpu_name=cluster.gpu.name)]]
                  for s, row in enumerate(passes)]
    passes = with_activation_offload(passes, pieces, model, parallel, layout, mix, cluster.gpu.name)
    passes, check_s = with_realtime_tests(passes, model, parallel, layout, profile, linears)  # --test-mode's checks
    defer = deferred_wgrad(pieces["output"], ctx, m, parallel.wgrad_deferral_limit) \
        if parallel.defer_embedding_wgrad_compute else None
    if defer is not None:
        passes = with_deferral(passes, defer, m)
    fwd_s = [[f.total_s for f, _, _ in row] for row in passes]
    bwd_s = [[b.total_s + r.total_s for _, b, r in row] for row in passes]
    p2p_s = p2p_time_s(pieces, layout, profile)
    group = {"group": parallel.microbatch_group_size_per_vp_stage} if parallel.microbatch_group_size_per_vp_stage \
        else {}  # the interleaved schedule's micro-batch group size, when not the default p
    run = run_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s, record=True, **group) if timeline else \
        simulate_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s, **group)
    drains = [ZERO] * (p - 1) + [defer.drain if defer is not None else ZERO]  # the flush, after the last backward
    pipeline_end_s = run.end_s
    if defer is not None:
        run = dataclasses.replace(run, end_s=tuple(e + d.total_s for e, d in zip(run.end_s, drains)))

    mtp_params = mtp_layer_params(model, parallel)  # per MTP layer, on the last stage
    buckets = [] if timeline else None
    muon = functools.partial(step_extra_s, model, parallel, layout, profile, cluster.gpu) if parallel.muon else None
    stage_params, stage_experts, tails, finals = _stage_tails(layout, parallel, profile, pieces, run, bwd_s, mix,
                                                              mtp_params, buckets, muon=muon, linears=linears)
    crit = max(range(p), key=lambda s: finals[s])
    step_time = finals[crit]
    parts = step_breakdown(passes[crit], m, run.end_s[crit], run.critical_p2p_s[crit], tails[crit], step_time,
                       drains[crit])

    drained = [stage_drained_bytes(pieces, model, parallel, layout, mix[s], [f.total_s for f, _, _ in passes[s]],
                                   cluster.gpu.name) for s in range(p)]  # fine-grained offloading (activation_offload.py)
    memory = known_memory or stage_memories(model, cluster, parallel, layout, pieces, schedule, mix, linears,
                                            stage_params, stage_experts, drained, defer)
    peak = max(mem.worst_rank_bytes for mem in memory)  # the most loaded rank of each stage must fit
    flops = model_flops_per_step(model, parallel.global_batch_size, parallel.tensor_model_parallel_size)
    peak_flops = cluster.gpu.peak_tflops(parallel.precision) * 1e12
    config = {"model": model.name, "cluster": cluster.name, "num_gpus": num_gpus, **parallel.to_dict(),
              **derived_sizes(layout, schedule), "model_spec": dict(_model_spec(model))}
    share = measured_compute_share(pieces, layout, crit, profile, cluster, parallel.precision,
                                   fp8=parallel.quantized_recipe)
    notes = moe_notes(model, layout, cluster.gpu.name) + layer_notes(model, parallel) + launch_notes(config) + \
        layout.notes + mxfp8_notes(parallel.quantized_recipe) + linear_notes(model, parallel.deterministic_mode)
    if (share or 0.0) < 0.5 and (clock := clock_note(cluster.gpu)):  # op times measured there hold their clock
        notes += (clock,)
    if share is not None:
        notes += (f"{share:.1%} of the critical stage's compute time comes from op times measured on "
                  f"{profile.op_times.device!r} ({profile.op_times.path}); the rest from the profile's "
                  f"efficiency surface",)
    notes += graph_memory_notes(memory) + fsdp_notes(parallel, layout, memory) + spread_notes(memory)
    notes += offload_notes(parallel.cpu_offloading_num_layers, offload_bytes, cluster.gpu.name)
    notes += realtime_test_notes(model, parallel, layout, check_s)
    notes += activation_offload_notes(pieces, model, parallel, layout, mix, cluster.gpu.name)
    notes += _imbalance_notes(fwd_s, bwd_s, m, crit, parts["pp_bubble"])
    if memory_headroom_bytes:
        notes += (f"memory limit: {cluster.gpu.memory_bytes / 2**30:.1f} GiB of HBM less a "
                  f"{memory_headroom_bytes / 2**30:.1f} GiB headroom",)
    spans = step_timeline(run, tails, passes, buckets, pipeline_end_s, drains) if timeline else []
    args = span_args(spans, chunk_work(pieces, layout, mix, windows), p2p_message_bytes(pieces, layout),
                     grad_bytes_per_param(parallel)) if timeline else []
    return StepReport(
        measured_compute_share=share, notes=notes, timeline_args=args,
        step_time_s=step_time, breakdown_s=parts,
        tokens_per_s=parallel.global_batch_size * model.seq_length / step_time,
        model_flops_per_step=flops, model_tflops_per_gpu=flops / step_time / num_gpus / 1e12,
        mfu=flops / (step_time * num_gpus * peak_flops), peak_memory_bytes=peak,
        memory_capacity_bytes=cluster.gpu.memory_bytes - memory_headroom_bytes,
        fits_memory=peak + memory_headroom_bytes <= cluster.gpu.memory_bytes,
        stage_memory=memory, critical_stage=crit, config=config,
        profile=f"{profile.name} ({profile.label})",
        timeline=spans)


def offloaded_layer_bytes(pieces: dict, mix) -> float:
    """Activation bytes one offloaded layer saves per micro-batch: the MoE layer's where the stage's layers are
    all MoE, else the dense layer's (CPU offloading runs without pipeline parallelism: one stage, one chunk)."""
    dense, moe = mix[0][0] if mix and mix[0] else (1, 0)
    piece = "moe_layer" if moe and not dense and "moe_layer" in pieces else "layer"
    return float(pieces[piece].activation_bytes)


def _imbalance_notes(fwd_s, bwd_s, m: int, crit: int, bubble_s: float) -> tuple[str, ...]:
    """Where the stage that ends last (whose step the breakdown shows) is not the busiest: its pp_bubble then
    holds waiting on the busier stages (an uneven split), not only the pipeline's fill and drain."""
    busy = [m * (sum(f) + sum(b)) for f, b in zip(fwd_s, bwd_s)]
    top = max(range(len(busy)), key=busy.__getitem__)
    waiting = busy[top] - busy[crit]
    if waiting <= 0.05 * (busy[top] or 1.0) or bubble_s <= 0:
        return ()
    return (f"the breakdown is stage {crit}'s (it ends last), but stage {top} is the busiest: {busy[top]:.3f} s of "
            f"passes against {busy[crit]:.3f} s; about {min(waiting, bubble_s):.3f} s of pp_bubble is stage {crit} "
            f"waiting on the busier stages (uneven work per stage: its layers, the embedding, the output layer and "
            f"loss), not the pipeline's fill and drain",)


@functools.lru_cache(maxsize=64)
def _model_spec(model: ModelSpec) -> dict:
    """The model's fields (cached: ``asdict`` costs more than a short simulation)."""
    return dataclasses.asdict(model)


def _stage_tails(layout, parallel, profile, pieces, run, bwd_s, mix, mtp_params=0, bucket_spans=None, muon=None,
                 linears=None):
    """Per stage: parameters held (all, and of them the routed experts'), the step tail after its last
    backward, and when its step ends. ``mtp_params``: the extra parameters of one MTP layer.
    ``bucket_spans``: a list to receive, per stage, its DP buckets' (begin_s, end_s, params) for the trace
    (the tail itself is computed as without it). ``muon``: with ``--optimizer muon``, what it adds to a stage's
    optimizer step, from (its layer mix, its parameters, their routed experts'): sim/data_parallel/optimizer_muon.py."""
    moe = pieces.get("moe_layer")
    emb_stage, loss_stage = layout.holder("embedding")[0], layout.holder("loss")[0]
    emb_sync = _embedding_sync_s(pieces, layout, parallel, profile)
    stage_params, stage_experts, tails, finals = [], [], [], []
    for s, (chunk_params, chunk_experts) in enumerate(chunk_param_counts(layout, pieces, mix, mtp_params, linears)):
        stage_params.append(sum(chunk_params))
        stage_experts.append(sum(chunk_experts))
        last_bwd = [(end - bwd_s[s][c], end) for c, end in enumerate(run.last_backward_end_s[s])]
        # dense gradients reduce over DP x CP (Megatron-Core DDP's intra_dp_cp_group; the bucket size too)
        kwargs = dict(parallel=parallel, dp=dp_cp_group(layout), profile=profile, chunk_params=chunk_params,
                      chunk_backward=last_bwd, compute_end_s=run.end_s[s],
                      embedding_sync_s=emb_sync if s in (emb_stage, loss_stage) else 0.0,
                      expert_chunk_params=chunk_experts if moe else None, edp=layout.groups["edp"] if moe else None)
        if parallel.use_megatron_fsdp:
            kwargs.update(root_params=fsdp_root_params(layout, pieces, s))
        tail_of = fsdp_stage_tail if parallel.use_megatron_fsdp else stage_tail
        tail = tail_of(**kwargs)
        if muon is not None:
            tail = dataclasses.replace(tail, optimizer_s=tail.optimizer_s + muon(mix[s], stage_params[s],
                                                                                 stage_experts[s]))
        if bucket_spans is not None:
            bucket_spans.append([])
            tail_of(**kwargs, spans=bucket_spans[-1])
        tails.append(tail)
        finals.append(run.end_s[s] + tail.dp_exposed_s + tail.interference_s + tail.optimizer_s)
    return stage_params, stage_experts, tails, finals
