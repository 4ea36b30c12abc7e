"""Run one pipeline stage for real, with the network and the other stages replaced by modelled waits.

The stage runs its micro-batches in Megatron's task order for that stage (``sim.schedules.stage_order``).
- TP/CP collectives: the layer code calls ``context.record_collective`` where each one happens; the
  ``Waiter`` made active here waits the modelled duration (``cost.comm.collective_time_s``) inline. The
  backward collectives Megatron launches asynchronously (``context.start_collective``: a column-parallel
  layer's input re-gather beside its dgrad GEMM, its dgrad reduction beside its wgrad GEMM) start a deadline
  and are waited for after that GEMM: only the part the GEMM did not cover counts as waited.
- p2p: a forward waits until the previous stage's forward of the same micro-batch ended *in the
  simulation* plus one p2p transfer (a backward: the next stage's backward), as NeuronaBox replaces
  the other ranks by their modelled behaviour.
- Activation recompute runs as Megatron checkpoints: full recompute per layer group (``build.py``),
  selective recompute of the core-attention region (``Waiter.run_region``).
- The step tail (DP gradient reduction, optimizer step) is not run: the simulator's value is added.
- MoE layers run as MoE (``emulate/moe.py``): router, permutation, the local experts' GEMMs on a balanced
  router's tokens; dispatch / combine are modelled waits like the TP collectives, reported as ``ep_comm``,
  and the routed experts' own time as ``experts`` (a part of ``compute``).
- What it does not run is refused by name, never run as something else: sliding-window attention, FP8 GEMMs,
  the MoE features of ``moe.moe_problems``, and a device that is not the cluster's GPU
  (``cost.optime_device.mismatch``) unless ``allow_other_device``, when the result names the device it ran on.
Parameter gradients are dropped after each backward instead of accumulated: Megatron's gradient
accumulation fusion (``--gradient-accumulation-fusion``, on by default) writes them into the fp32
main grad inside the weight-gradient GEMM, so there is no separate accumulation kernel to time.

Times and waits go through the clock of ``emulate/clock.py``: on CUDA the host clock with a synchronize
around every task and wait (the GPU idles during a wait, as it would on the collective); on a CPU with
one intra-op thread the thread's CPU time, on which a wait simply advances the clock. Denormal floats
are flushed to zero while the stage runs (GPUs do not slow down on them; x86 CPUs do, by up to 100x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.rules.schedule_rules import cuda_graph_setting
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.optime.optime_device import local_device, mismatch
from echo_tune.cost.profile import ClusterProfile, profile_for
from echo_tune.cost.collectives.tp_overlap import slowdown
from echo_tune.emulate.clock import clock_for
from echo_tune.emulate.build import Stage, build_stage, chunk_forward
from echo_tune.emulate.moe import ExpertTimer, RealMoE, moe_problems
from echo_tune.emulate.predict import StagePrediction, predict_stage
from echo_tune.errors import ConfigError, raise_problems
from echo_tune.sim.schedule.costing import EXPERT_GROUPS
from echo_tune.sim.schedule.schedules import stage_order
from echo_tune.workload.recording import context


class Waiter(RealMoE):
    """The active 'recorder' during emulation: each collective becomes a wait of its modelled time (those of
    the expert groups also counted apart, ``ep_waited_s``); the routed experts are timed (``ExpertTimer``)."""

    def __init__(self, groups, profile: ClusterProfile, clock) -> None:
        super().__init__()
        self.groups, self.profile, self.clock = groups, profile, clock
        self.waited_s = self.ep_waited_s = 0.0
        self.experts = ExpertTimer(clock, lambda: self.waited_s)
        self._durations: dict[tuple[str, str, int], float] = {}

    selective_recompute = False
    """Megatron's selective recompute: the core-attention region is checkpointed (recomputed in backward)."""

    def run_region(self, name: str, fn, *args):
        if self.selective_recompute and name == "core_attention":
            return checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)

    def run_subregion(self, name: str, fn, *args):
        return self.experts.run_subregion(name, fn, *args)

    def add_collective(self, name: str, group: str, size_bytes: int) -> None:
        key = (name, group, size_bytes)
        if key not in self._durations:  # the warm-up run fills this: timed runs pay a dict lookup only
            self._durations[key] = collective_time_s(name, size_bytes, self.groups[group], self.profile)
        duration = self._durations[key]
        self.clock.wait(duration)
        self.waited_s += duration
        if group in EXPERT_GROUPS:
            self.ep_waited_s += duration

    def start_collective(self, name: str, group: str, size_bytes: int) -> float:
        """A collective launched beside the compute that follows (``context.start_collective``): its deadline,
        the modelled duration slowed by the profile's interference curve from now, as the simulator costs it
        (``cost.tp_overlap.async_cost``)."""
        key = ("async " + name, group, size_bytes)
        if key not in self._durations:
            self._durations[key] = collective_time_s(name, size_bytes, self.groups[group], self.profile) * \
                slowdown(self.profile, "comm", size_bytes)
        return self.clock.now() + self._durations[key]

    def finish_collective(self, deadline: float) -> None:
        """Wait out what the compute since the launch did not cover: only that part is exposed."""
        exposed = max(0.0, deadline - self.clock.now())
        self.clock.wait_until(deadline)
        self.waited_s += exposed


@dataclass(frozen=True, kw_only=True)
class EmulatedRun:
    parts: dict[str, float]
    """compute, tp_cp_comm, pp_wait, pipeline (end of the last task), tail (modelled), stage_step; with MoE
    layers also ep_comm (modelled waits) and experts (of compute)."""
    order: list[tuple[bool, int, int]]
    """The tasks as run: (is_backward, micro_batch, chunk)."""
    task_compute_s: list[float]


def _refuse_unrun(model: ModelSpec, parallel: ParallelConfig) -> None:
    """What emulate does not run (sliding-window attention, FP8 GEMMs, the MoE features of ``moe_problems``) is
    refused by name, never run as something else."""
    problems = moe_problems(model, parallel)
    if model.windowed_attention:
        problems.append(f"emulate runs full attention only and cannot run this model's sliding-window layers, but "
                        f"got (window_size={model.window_size[0]},{model.window_size[1]}); use `echo-tune simulate` "
                        f"for sliding-window models")
    if parallel.fp8_format is not None:
        problems.append(f"emulate runs the GEMMs in {parallel.precision} only and cannot run FP8 GEMMs, but got "
                        f"(fp8_format={parallel.fp8_format}); drop --fp8-format to emulate the {parallel.precision} "
                        f"layout, or use `echo-tune simulate` for FP8")
    if model.mtp_num_layers:
        problems.append(f"emulate does not build multi-token-prediction layers, but got (mtp_num_layers="
                        f"{model.mtp_num_layers}); drop --mtp-num-layers to emulate the main model, or use "
                        f"`echo-tune simulate`")
    modules = tuple(parallel.recompute_modules or ("core_attn",)) if parallel.recompute_granularity == "selective" \
        else ("core_attn",)
    dense_other = [m for m in modules if m != "core_attn" and not m.startswith("moe")]  # MoE ones: moe_problems
    if dense_other:
        problems.append(f"emulate's selective recompute replays core attention only, but got (recompute_modules="
                        f"{','.join(modules)}); keep --recompute-modules core_attn to emulate, or use "
                        f"`echo-tune simulate`")
    unrun = [name for name, on in (("--no-gradient-accumulation-fusion", not parallel.gradient_accumulation_fusion),
                                   ("--no-async-tensor-model-parallel-allreduce",
                                    not parallel.async_tensor_model_parallel_allreduce),
                                   ("--use-megatron-fsdp", parallel.use_megatron_fsdp),
                                   (f"--cp-comm-type {parallel.cp_comm_type}", parallel.cp_comm_type != "p2p"),
                                   ("--test-mode", parallel.test_mode),
                                   ("CUDA graphs (--cuda-graph-impl / --enable-cuda-graph)",
                                    cuda_graph_setting(parallel)[0] != "none"))
             if on]
    if unrun:
        problems.append(f"emulate does not run {', '.join(unrun)} (its stage runs the plain Megatron-Core path), "
                        f"but the layout sets them; drop them to emulate, or use `echo-tune simulate`")
    raise_problems(problems, "the emulated layout")


def _device_info(device: str, cluster: ClusterSpec, allow_other_device: bool):
    """(DeviceInfo, why it is not the cluster's GPU or None); a device that is not it is refused unless allowed."""
    info = local_device("cuda" if device.startswith("cuda") else "cpu")[1]
    why = mismatch(info.name, info.kind, cluster.gpu.name, cluster.gpu.memory_bytes)
    if why is not None and not allow_other_device:
        raise ConfigError(f"emulate compares a run on this device with the cluster's simulated GPU, so the device "
                          f"must be that GPU, but got (device={info.name!r}, gpu={cluster.gpu.name!r}: {why}); run "
                          f"on that GPU ({cluster.gpu.name}), or pass --allow-other-device to get figures labelled "
                          f"with the device they ran on")
    return info, why


def _refuse_unmodelled(parallel: ParallelConfig, layout) -> None:
    if parallel.tp_comm_overlap:
        raise ConfigError("emulate waits for TP collectives inline and cannot overlap them, but got "
                          "(tp_comm_overlap=True); drop --tp-comm-overlap to emulate this stage")


def _dependency(task, stage: int, p: int, v: int):
    backward, mb, c = task
    if not backward:
        return (stage - 1, False, mb, c) if stage > 0 else ((p - 1, False, mb, c - 1) if c > 0 else None)
    return (stage + 1, True, mb, c) if stage < p - 1 else ((0, True, mb, c + 1) if c < v - 1 else None)


def run_stage_once(stage: Stage, prediction: StagePrediction, order, waiter: Waiter, p: int, v: int) -> EmulatedRun:
    live: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
    compute, task_compute, pp_wait = 0.0, [], 0.0
    waiter.waited_s = waiter.ep_waited_s = waiter.experts.expert_s = 0.0
    clock = waiter.clock
    origin = clock.now()
    for task in order:
        backward, mb, c = task
        dep = _dependency(task, prediction.stage, p, v)
        if dep is not None:
            ready = origin + prediction.task_end_s[dep] + prediction.p2p_s
            now = clock.now()
            if now < ready:
                pp_wait += ready - now
                clock.wait_until(ready)
        waited_before = waiter.waited_s
        begin = clock.now()
        if not backward:
            x = None if dep is None and stage.chunks[c].embedding else stage.received.detach().requires_grad_(True)
            live[(mb, c)] = (x, chunk_forward(stage, c, x))
        else:
            _x, out = live.pop((mb, c))
            if out.dim() == 0:
                out.backward()
            else:
                out.backward(stage.received_grad)
        spent = clock.now() - begin - (waiter.waited_s - waited_before)
        if backward:
            for param in stage.params:
                param.grad = None
        compute += spent
        task_compute.append(spent)
    pipeline = clock.now() - origin
    parts = {"compute": compute, "tp_cp_comm": waiter.waited_s - waiter.ep_waited_s, "interference": 0.0,
             "pp_wait": pp_wait, "pipeline": pipeline, "tail": prediction.tail_s,
             "stage_step": pipeline + prediction.tail_s}
    if prediction.experts is not None:  # an MoE model: the parts simulate has for it, zero on an all-dense stage
        parts.update(ep_comm=waiter.ep_waited_s, experts=waiter.experts.expert_s)
    return EmulatedRun(parts=parts, order=list(order), task_compute_s=task_compute)


@dataclass(frozen=True, kw_only=True)
class EmulateResult:
    stage: int
    device: str
    repeats: int
    cluster_gpu: str = ""
    """The GPU the simulated figures are for."""
    other_device: bool = False
    """The stage ran on a device that is not ``cluster_gpu`` (``--allow-other-device``)."""
    emulated: dict[str, float]
    """The median run's parts (by stage step)."""
    simulated: dict[str, float]
    runs_stage_step_s: list[float]
    emulated_range: dict[str, tuple[float, float]] | None = None
    """Each part's (lowest, highest) over the timed runs: the spread the median hides."""
    order: list[tuple[bool, int, int]]
    notes: tuple[str, ...] = ()

    @property
    def error(self) -> float:
        """(emulated - simulated) / simulated of the stage step."""
        return self.emulated["stage_step"] / self.simulated["stage_step"] - 1.0

    def to_dict(self) -> dict:
        return {"stage": self.stage, "device": self.device, "cluster_gpu": self.cluster_gpu,
                "device_is_cluster_gpu": not self.other_device, "repeats": self.repeats,
                "emulated_s": self.emulated, "simulated_s": self.simulated, "stage_step_error": self.error,
                "runs_stage_step_s": self.runs_stage_step_s,
                "emulated_range_s": {k: list(v) for k, v in (self.emulated_range or {}).items()},
                "task_order": [("B" if b else "F") + f"{mb}" + (f".{c}" if c else "") for b, mb, c in self.order],
                "notes": list(self.notes)}


def emulate(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig, *, stage: int = 0,
            profile: ClusterProfile | None = None, device: str | None = None, repeats: int = 3,
            warmup: int = 1, seed: int = 0, allow_other_device: bool = False) -> EmulateResult:
    """Emulate pipeline stage ``stage`` of a layout ``repeats`` times (after ``warmup`` runs).

    FP8 and the MoE features of ``moe.moe_problems`` are refused, and so is a device that is not the cluster's
    GPU unless ``allow_other_device`` (the result then says which device it ran on)."""
    _refuse_unrun(model, parallel)
    layout = check_compatible(model, cluster, num_gpus, parallel)
    _refuse_unmodelled(parallel, layout)
    p, v, m = len(layout.stage_chunk_layers), layout.virtual_pipeline_size, layout.num_micro_batches
    if not 0 <= stage < p:
        raise ConfigError(f"`0 <= stage < pipeline_model_parallel_size` must hold, but got (stage={stage}, "
                          f"pipeline_model_parallel_size={p})")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info, other = _device_info(device, cluster, allow_other_device)
    profile = profile or profile_for(cluster)
    prediction = predict_stage(model, cluster, num_gpus, parallel, layout, profile, stage)
    clock = clock_for(device)
    built = build_stage(model, parallel, layout, stage, device, seed)
    order = stage_order(prediction.report.config["pipeline_schedule"], stage, p, m, v,
                        parallel.microbatch_group_size_per_vp_stage)
    waiter = Waiter(layout.groups, profile, clock)
    waiter.selective_recompute = layout.recompute_granularity == "selective"
    runs = []
    flush = torch.set_flush_denormal(True)
    try:
        with context.activate(waiter):
            for i in range(warmup + repeats):
                run = run_stage_once(built, prediction, order, waiter, p, v)
                if i >= warmup:
                    runs.append(run)
    finally:
        if flush:
            torch.set_flush_denormal(False)
    steps = [r.parts["stage_step"] for r in runs]
    median = sorted(runs, key=lambda r: r.parts["stage_step"])[len(runs) // 2]
    notes = [f"clock: {clock.kind}",
             "the step tail (DP gradient reduction, optimizer) is the simulator's value, not run"]
    if layout.groups["cp"].size > 1:
        notes.append("CP ring exchanges are waited inline; the simulator overlaps them with attention")
    if built.moe:
        notes.append(f"MoE layers: the router runs, its tokens go where a balanced router sends them (what simulate "
                     f"assumes); dispatch/combine ({model.moe_token_dispatcher_type}) are modelled waits (ep_comm); "
                     f"experts = the local experts' GEMMs and activation, part of compute")
    if other is not None:
        notes.insert(0, f"ran on {info.name}, not on the cluster's GPU {cluster.gpu.name} ({other}): "
                        f"the emulated figures are this device's, the simulated ones the {cluster.gpu.name}'s")
    return EmulateResult(stage=stage, device=info.name, cluster_gpu=cluster.gpu.name, other_device=other is not None,
                         repeats=repeats, emulated=median.parts, simulated=prediction.parts(m),
                         runs_stage_step_s=steps, order=median.order, notes=tuple(notes),
                         emulated_range={k: (min(r.parts[k] for r in runs), max(r.parts[k] for r in runs))
                                         for k in median.parts})
