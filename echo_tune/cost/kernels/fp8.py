"""FP8 GEMMs as Megatron-LM runs them through Transformer Engine (``--fp8-format``).

Which GEMMs: the linear layers of each transformer layer (QKV, attention output projection, fc1, fc2),
which Megatron builds from TE modules (megatron/core/extensions/transformer_engine.py at d98e8a64ddf3)
inside ``fp8_autocast``. Core attention (``fp8_dot_product_attention`` is off by default), norms,
softmax, the embedding and the output layer stay in bf16 (``fp8_output_proj`` is off by default and
MXFP8-only). In the traced layer those GEMMs are the ``gemm`` ops of the regions in ``FP8_REGIONS``.
Multi-latent attention's projections are TE linears too (the fused down projection is traced in "qkv",
the up projections in "mla_up_proj"; megatron/core/models/gpt/gpt_layer_specs.py builds them from TE
modules).

MoE layers (megatron/core/transformer/moe/ at d98e8a64ddf3): the routed experts are TE linear layers
too (``TEGroupedMLP``'s ``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear`` with
``--moe-grouped-gemm``, else ``SequentialMLP`` of TE-linear MLPs; experts.py pads each expert's tokens
to the FP8 alignment under ``config.fp8``), and so is the shared expert (``SharedExpertMLP`` is an MLP of
TE linears); they run in FP8, with the same per-tensor casts as the dense linears. The router is a plain
``torch`` linear (router.py: ``router_gating_linear``, in ``--moe-router-dtype`` or bf16): not FP8. The
dispatch and combine (all-to-all over EP, all-gather / reduce-scatter over ETP) are explicit
collectives of the token dispatcher on bf16 hidden states: TE's own communication is switched off for
expert linears (``explicit_expert_comm`` in transformer_engine.py), and the FP8 (MXFP8) dispatch of
``--moe-dispatch-fwd-dtype`` exists only for the ``ncclep`` flex backend, default bf16
(transformer_config.py). The shared expert's sequence-parallel all-gather is TE's, so FP8 like the
dense fc1's. Userbuffer TP overlap is off for expert linears (``is_expert`` disables ``ub_overlap_*``)
and is not modelled for the shared expert: ``TP_OVERLAP_REGIONS`` stays the dense layer's.
The padding of each expert's tokens to the FP8 alignment adds negligible GEMM rows, but TE's Fp8Padding /
Fp8Unpadding copy every row when the counts are not aligned: timed as their own ops (workload/mlp/expert_padding.py).

Time of an FP8 GEMM: its FLOPs at the GPU's dense FP8 peak times the profile's
``fp8_gemm_max_efficiency`` and the same size saturation as bf16 GEMMs; its operands are one byte.

Quantisation kernels each recipe adds (memory-bound, at the profile's HBM bandwidth), per element:
- every forward GEMM quantises its activation input X (m x k) and every backward pass quantises the
  output gradient dY (m x n) once for both backward GEMMs. A quantisation reads bf16 (2 B) and writes
  a row-wise and a column-wise (transposed) FP8 copy (1 B each), because Hopper's FP8 tensor cores take
  only the "TN" layout and the wgrad GEMM needs the transposed operand: 4 B per element. From compute
  capability 10.0 (B200, GB200, GB300) per-tensor-scaled FP8 GEMMs take any layout and TE writes the
  row-wise copy alone (TransformerEngine v2.10 ``csrc/quantizer.cpp``: ``with_transpose = columnwise_usage &&
  !nvte_is_non_tn_fp8_gemm_supported()``): 1 B less for ``delayed`` and ``tensorwise`` there
  (``cast_bytes_per_element``; ``GPUSpec.fp8_any_layout``). Block-scaled copies keep both.
- ``delayed``: the scale comes from the amax history and the amax is taken inside the cast: 4 B.
- ``tensorwise`` (current scaling): an extra read of the tensor for its amax first: 6 B, in three kernels
  (TE's ``Float8CurrentScalingQuantizer::quantize_impl``, NVIDIA/TransformerEngine@ad3f651f1dad
  transformer_engine/pytorch/csrc/quantizer.cpp: ``nvte_compute_amax``, ``nvte_compute_scale_from_amax`` --
  "compute scale cannot be fused with quantize kernel" -- then ``nvte_quantize_v2``), so three launches
  (``CAST_KERNELS``); the amax all-reduce TE adds for sequence-parallel inputs is not modelled.
- ``blockwise`` / ``mxfp8``: scales per 128 / 32 elements computed inside the cast kernel: 4 B plus
  the scale factors (4 B per 128 and 1 B per 32 elements, for both copies).
- weights: TE caches the FP8 weight over the micro-batches of a step (Megatron passes
  ``is_first_microbatch``, transformer_engine.py), so their cast is once per step and not charged here.

NVFP4 (``--fp4-format e2m1 --fp4-recipe nvfp4``; TE's NVFP4BlockScaling, Megatron-LM d98e8a64 core/fp4_utils.py;
the recipe of arXiv 2509.25149): the same GEMMs run at the GPU's dense FP4 peak (``peak_fp4_tflops``) times the
profile's FP8 efficiency (no public NVFP4 GEMM benchmark was found: an assumption, said in the report), with
half-byte operands plus one E4M3 scale per 16 elements. A quantisation (TE ``NVFP4Quantizer::quantize_impl``)
takes two kernels: ``nvte_hadamard_transform_amax`` reads the bf16 tensor once for the row-wise amax and the
amax of its random-Hadamard-transformed transpose, then the fused RHT cast reads it again and writes the
row-wise copy and the transformed column-wise copy for the wgrad GEMM (0.5 B + 1/16 B each): 2 + 2 + 2 x 0.5625 =
5.125 B per element (``CAST_BYTES_PER_ELEMENT``). Stochastic rounding of the gradients happens inside the cast.
Weights use 16x16 blocks (one scale per 256 elements) and are quantised once per step. TE saves the column-wise
NVFP4 copy of each linear's input for wgrad (0.5625 B per element). The sequence-parallel all-gathers are taken
in bf16 (a quantised NVFP4 all-gather is not assumed).

Collectives: TE quantises before the sequence-parallel all-gathers of an FP8 linear layer (the input
of QKV and fc1 forward, and the output gradients gathered for backward), so those move 1-byte
elements; the reduce-scatters of GEMM outputs stay bf16.

Amax reduction (delayed scaling): Megatron wraps a model chunk's whole forward in one ``fp8_autocast``
(core/transformer/transformer_block.py, ``get_fp8_context`` in core/fp8_utils.py) whose ``fp8_group`` is
the TP x DP x CP group (``parallel_state.get_amax_reduction_group(with_context_parallel=True)``); TE
all-reduces the region's amaxes over that group when the forward ends and again when its backward ends,
on the compute stream: a small, latency-bound all-reduce per chunk pass (``amax_reduction_s``).

Memory: TE saves the FP8 (column-wise) copy of each linear layer's input for the wgrad GEMM instead
of the bf16 tensor: 1 byte per element saved instead of 2 (see ``fp8_activation_savings_bytes``).
"""

from __future__ import annotations

from echo_tune.config.specs.cluster import ClusterSpec, GPUSpec
from echo_tune.config.rules.compatibility import GroupPlacement, Layout
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.kernels.compute import gemm_efficiency
from echo_tune.cost.profile import ClusterProfile
from echo_tune.identity_cache import IdentityCache
from echo_tune.workload.graph import Op, Trace

_SAVINGS = IdentityCache(limit=1024)  # fp8_activation_savings_bytes by (trace, its other arguments)

FP8_REGIONS = ("qkv", "attention_proj", "mlp", "mla_up_proj", "moe/experts", "moe/shared")
"""Where TE linear layers' GEMMs are traced, "region" or "region/subregion" (FP8 under --fp8-format)."""
TP_OVERLAP_REGIONS = ("qkv", "attention_proj", "mlp")
"""The dense layer's TE linears, whose TP collectives userbuffer overlap (--tp-comm-overlap) pairs."""


def where(op: Op) -> str:
    """The op's "region" or "region/subregion", as FP8_REGIONS names them."""
    return f"{op.region}/{op.subregion}" if op.subregion else op.region

CAST_BYTES_PER_ELEMENT = {
    "delayed": 4.0,
    "tensorwise": 6.0,
    "blockwise": 4.0 + 2 * 4.0 / 128,
    "mxfp8": 4.0 + 2 * 1.0 / 32,
    "nvfp4": 2.0 + 2.0 + 2 * (0.5 + 1.0 / 16),
}
"""HBM bytes moved to quantise one bf16 element (read 2 B, write row- and column-wise FP8 copies) where FP8 GEMMs
are TN-only (``cast_bytes_per_element`` for a given GPU)."""


CAST_READS = {"delayed": 1, "tensorwise": 2, "blockwise": 1, "mxfp8": 1, "nvfp4": 2}
"""Reads of the high-precision tensor per quantisation in ``CAST_BYTES_PER_ELEMENT`` (current scaling and NVFP4 read
it once for the amax, once to cast): with fp32 activations (no --bf16: FP8 GEMMs beside fp32 parameters, which
Megatron-LM allows) each read moves 4 bytes, not 2 (``cast_bytes_per_element``)."""
ACTIVATION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0}
"""Bytes of an activation element by training precision: what a TE linear reads, writes and, unquantised, saves."""
CAST_KERNELS = {"delayed": 1, "tensorwise": 3, "blockwise": 1, "mxfp8": 1, "nvfp4": 2}
"""Kernels one quantisation launches: current scaling takes its amax, then the scale, then casts; NVFP4 its
(RHT) amaxes, then the fused cast."""
OPERAND_BYTES = {"nvfp4": 0.5 + 1.0 / 16}
"""Bytes per GEMM operand element (and per saved activation element) of a recipe; 1 for the FP8 recipes."""
FP4_RECIPES = ("nvfp4",)


def operand_bytes(recipe: str | None) -> float:
    return OPERAND_BYTES.get(recipe, 1.0)


def fused_group_cast(recipe: str, gpu: GPUSpec | None) -> bool:
    """Whether TE quantises a grouped GEMM's per-expert inputs in one kernel, not one per expert.

    TransformerEngine v2.10 ``csrc/extensions/cast.cpp`` ``multi_tensor_quantize_impl`` (called by the
    ``split_quantize`` of ``GroupedLinear``): one ``nvte_multi_cast_transpose`` for all experts when every
    quantiser is a delayed-scaling ``Float8Quantizer`` with both row-wise and transposed outputs ("Currently only
    have fused kernel for FP8 delayed scaling"), i.e. on TN-only GPUs; every other recipe, and delayed scaling
    where no transposed copy is written (compute capability 10.x), quantises expert by expert (current scaling's
    group quantisation arrived in TE v2.17, PR 3114, after the published runs; not modelled)."""
    return recipe == "delayed" and not (gpu is not None and gpu.fp8_any_layout)


def is_fp8_gemm(op: Op) -> bool:
    return op.kind == "gemm" and where(op) in FP8_REGIONS


def fp8_gemm_time_s(op: Op, profile: ClusterProfile, gpu: GPUSpec, recipe: str | None = None,
                    precision: str = "bf16") -> float:
    """Time of one FP8 GEMM: FP8 peak x FP8 efficiency x size saturation; 1-byte operands (NVFP4: the FP4 peak,
    half-byte operands with their scales), the output in the training precision."""
    m, n, k = op.gemm_mnk or (4096, 4096, 4096)
    efficiency = gemm_efficiency(m, n, k, profile) * profile.fp8_gemm_max_efficiency / profile.gemm_max_efficiency
    peak = gpu.peak_tflops("fp4" if recipe in FP4_RECIPES else "fp8")
    compute_s = op.flops / (peak * 1e12 * gpu.clock_factor * efficiency)
    out = ACTIVATION_BYTES[precision] * m * n
    memory_s = ((m * k + k * n) * operand_bytes(recipe) + out) / (profile.memory_bandwidth_gbyte_s * 1e9)
    return max(compute_s, memory_s) + profile.kernel_launch_overhead_s


def cast_bytes_per_element(recipe: str, gpu: GPUSpec | None = None, precision: str = "bf16") -> float:
    """HBM bytes one quantisation moves per element of ``precision`` on ``gpu``: no transposed copy of a
    per-tensor-scaled tensor where FP8 GEMMs take any layout (compute capability 10.x)."""
    transposed_copy = recipe in ("delayed", "tensorwise") and gpu is not None and gpu.fp8_any_layout
    wider = CAST_READS[recipe] * (ACTIVATION_BYTES[precision] - 2.0)
    return CAST_BYTES_PER_ELEMENT[recipe] + wider - (1.0 if transposed_copy else 0.0)


def _cast_bytes_s(op: Op, recipe: str, profile: ClusterProfile, gpu: GPUSpec | None, precision: str = "bf16") -> float:
    """HBM time of the quantisation charged to one FP8 GEMM.

    Forward GEMMs have mnk = (tokens, out, in): X is m x k. Both backward GEMMs of a linear layer have
    dY as their m x k operand (dgrad: dY @ W, wgrad: dY^T @ X), so each carries half of dY's cast.
    """
    m, _, k = op.gemm_mnk or (4096, 4096, 4096)
    elements = m * k if op.phase == "fwd" else m * k / 2
    return elements * cast_bytes_per_element(recipe, gpu, precision) / (profile.memory_bandwidth_gbyte_s * 1e9)


def group_cast(one: Op, groups: int, recipe: str, profile: ClusterProfile, gpu: GPUSpec | None,
               precision: str = "bf16") -> tuple[float, int]:
    """Time and kernels of the quantisations charged to a GEMM run once per local expert (``one``: one expert's
    share; ``groups`` 1: a plain linear layer; ``gpu`` None: TN-only, as Hopper; module docstring): every expert's
    bytes, one quantisation per expert unless TE fuses the group (``fused_group_cast``)."""
    kernels = CAST_KERNELS[recipe] * (1 if fused_group_cast(recipe, gpu) else groups)
    return groups * _cast_bytes_s(one, recipe, profile, gpu, precision) + kernels * profile.kernel_launch_overhead_s, \
        kernels


MXFP8_MEASURED_OVER_CS = {"Llama3 8B, 8 B200": 30624 / 29521, "Llama3.1 405B, 128 B200": 661 / 624}
"""Measured MXFP8 / FP8-current-scaling step time of the same recipe (Megatron-Bridge's base config for FP8-MX is its
FP8-CS one): NVIDIA-NeMo/Megatron-Bridge@067f987df03b docs/performance-summary-archive.md, "25.11 NeMo Container",
DGX-B200, tokens/s/GPU FP8-CS (FP8-MX): Llama3 8B 30,624 (29,521), Llama3.1 405B 661 (624)."""


def mxfp8_notes(fp8_recipe: str | None) -> tuple[str, ...]:
    """What a report of an MXFP8 step says: the one public comparison measured it slower than current scaling,
    which this model does not reproduce (tests/cost/test_fp8.py keeps the two facts in step); of an NVFP4 step,
    where its GEMM efficiency comes from."""
    if fp8_recipe in FP4_RECIPES:
        return ("nvfp4: GEMMs at the GPU's dense FP4 peak times the profile's FP8 GEMM efficiency (no public NVFP4 "
                "GEMM benchmark found), with TE's RHT-amax and fused RHT cast per quantisation (cost/kernels/fp8.py)",)
    if fp8_recipe != "mxfp8":
        return ()
    measured = ", ".join(f"{100 * (r - 1):.1f}% ({name})" for name, r in MXFP8_MEASURED_OVER_CS.items())
    return (f"mxfp8: Megatron-Bridge's 25.11 B200 table measured MXFP8 steps {measured} longer than FP8 current "
            f"scaling with the same recipes, where this model puts them ~1% shorter (one quantisation kernel against "
            f"current scaling's three; what makes MXFP8 slower there is not modelled): this step time is likely "
            f"optimistic by about that difference",)


def fp8_collective_bytes(op: Op, recipe: str | None = None, precision: str = "bf16") -> float:
    """Message size of a TP collective under FP8: all-gathers of an FP8 linear layer move 1-byte data instead of the
    traced training-precision elements (NVFP4: unquantised, module docstring)."""
    if op.collective == "all_gather" and where(op) in FP8_REGIONS and recipe not in FP4_RECIPES:
        return op.size_bytes / ACTIVATION_BYTES[precision]
    return op.size_bytes


def fp8_activation_savings_bytes(layer: Trace, tensor_model_parallel_size: int, sequence_parallel: bool,
                                 recomputed_regions: tuple[str, ...] = ()) -> float:
    """Bytes per micro-batch TE saves less than bf16: each FP8 linear layer keeps a 1-byte copy of its
    input. A GEMM right after its TP all-gather (sequence parallelism) keeps the local, un-gathered shard.
    GEMMs of ``recomputed_regions`` (selective recompute) save nothing across the pass: no saving. Nor does the
    experts' fc2 under ``moe_act`` recompute ("moe/expert_act" recomputed): Megatron-LM d98e8a64ddf3
    moe/experts.py ``set_save_original_input(linear_fc2)`` keeps its bf16 input, which the recompute discards.
    Remembered per trace and arguments (every stage of every layout of a shape asks it)."""
    return _SAVINGS.get((layer,), (tensor_model_parallel_size, sequence_parallel, tuple(recomputed_regions)),
                        lambda: _savings(layer, tensor_model_parallel_size, sequence_parallel, recomputed_regions))


def _savings(layer: Trace, tensor_model_parallel_size: int, sequence_parallel: bool,
             recomputed_regions: tuple[str, ...]) -> float:
    saved, previous = 0.0, None
    for op in layer.forward:
        after_act = previous is not None and where(previous) == "moe/expert_act" and "moe/expert_act" in recomputed_regions
        if is_fp8_gemm(op) and op.region not in recomputed_regions and not after_act:
            m, _, k = op.gemm_mnk
            gathered = sequence_parallel and previous is not None and previous.kind == "collective" \
                and previous.collective == "all_gather" and previous.group == "tp"
            saved += m * k / (tensor_model_parallel_size if gathered else 1)
        previous = op
    return saved


def fp8_linear_param_count(layer: Trace) -> int:
    """Weights of the layer's FP8 linear layers (what TE keeps FP8 copies of); the router's excluded."""
    return sum(n for place, n in layer.linear_param_counts.items() if place in FP8_REGIONS)


AMAX_TENSORS_PER_LAYER = 4 * 3
"""FP8 tensors whose amax a dense layer records in forward: input, weight and output of its 4 linears."""


def amax_tensors_per_layer(pieces: dict[str, Trace]) -> int:
    """Input, weight and output of every FP8 linear of the larger layer (a MoE layer's local experts and
    shared expert count, one TE linear per forward FP8 GEMM)."""
    return max(3 * sum(1 for op in pieces[name].forward if is_fp8_gemm(op))
               for name in ("layer", "moe_layer") if name in pieces)


def amax_reduction_s(layout: Layout, cluster: ClusterSpec, profile: ClusterProfile, layers: int,
                     tensors_per_layer: int = AMAX_TENSORS_PER_LAYER) -> float:
    """One amax all-reduce of a chunk of ``layers`` layers over TP x DP x CP (delayed scaling)."""
    g = layout.groups
    size = g["tp"].size * g["cp"].size * g["dp"].size
    if size == 1:
        return 0.0
    domain = cluster.nvlink_domain_gpus  # the group is the innermost TP x CP x DP ranks: contiguous
    placement = GroupPlacement(size=size, ranks_per_node=min(size, domain), num_nodes=-(-size // domain))
    return collective_time_s("all_reduce", 4 * tensors_per_layer * max(layers, 1), placement, profile)
