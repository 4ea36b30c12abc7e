"""A Megatron-style transformer layer, sharded as one tensor-parallel rank holds it, on ``meta``.

Shapes follow Megatron's [s, b, h] layout. A layer's input is [s / cp / (tp if SP), b, h]; its
forward is: input norm -> QKV column-parallel linear -> core attention -> output row-parallel linear
(+ all-reduce, or reduce-scatter with SP) -> bias + dropout + residual -> post-attention norm ->
fc1 column-parallel -> GeLU / SwiGLU -> fc2 row-parallel (+ reduction) -> bias + dropout + residual.
Each step runs inside ``in_region`` so that its forward and backward ops carry its region name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import echo_tune.workload.recording.kernels  # noqa: F401  (registers the echo_tune:: ops)
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError
from echo_tune.workload.attention import gated_delta_net
from echo_tune.workload.attention import mla
from echo_tune.workload.mlp import moe
from echo_tune.workload.attention.core_attention import core_attention
from echo_tune.workload.recording.comm import column_parallel_linear, row_parallel_linear
from echo_tune.workload.recording.context import in_region
from echo_tune.workload.mlp.fused_elementwise import fused_bias_dropout_add
from echo_tune.workload.attention.output_gate import apply_output_gate
from echo_tune.workload.attention.rotary import apply_rope, rotary_dim
from echo_tune.workload.attention.scale_mask_softmax import local_softmax
from echo_tune.workload.mlp.activations import activation, fc1_fuses_bias

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NORM_EPS = 1e-5


@dataclass(frozen=True)
class Shard:
    """One rank's view of the model under tensor (tp) and context (cp) parallelism."""

    model: ModelSpec
    tp: int
    cp: int
    sequence_parallel: bool
    micro_batch_size: int
    precision: str
    ep: int = 1
    """Expert-model-parallel size (MoE layers only)."""
    etp: int = 1
    """Expert-tensor-parallel size (MoE layers only)."""
    moe: bool = False
    """Trace the MoE variant of the layer (its MLP is ``workload.moe``)."""
    window: bool = False
    """Trace the sliding-window variant of the layer's attention (``model.window_size``)."""
    cp_comm: tuple[str, int] = ("p2p", 1)
    """How attention talks across CP: (``--cp-comm-type``, all-to-all ranks); config/rules/cp_comm_rules.py."""
    linear: bool = False
    """Trace the gated delta net in place of self-attention (workload/attention/gated_delta_net.py)."""
    deterministic: bool = False
    """``--deterministic-mode``: the gated delta net's torch-native path (linear layers only)."""

    def __post_init__(self) -> None:
        m, tp, cp = self.model, self.tp, self.cp
        for what, value in (("num_attention_heads", m.num_attention_heads), ("num_query_groups", m.query_groups),
                            ("ffn_hidden_size", m.ffn_size)):
            if value % tp:
                raise ConfigError(f"`{what} % tensor_model_parallel_size == 0` must hold, but got "
                                  f"({what}={value}, tensor_model_parallel_size={tp})")
        chunks = cp * (tp if self.sequence_parallel else 1) * (2 if cp > 1 else 1)
        if m.seq_length % chunks:
            raise ConfigError(f"`seq_length % {chunks} == 0` must hold (context parallel x sequence-parallel "
                              f"chunks), but got (seq_length={m.seq_length}, tensor_model_parallel_size={tp}, "
                              f"context_parallel_size={cp}, sequence_parallel={self.sequence_parallel})")
        kind = self.cp_comm[0]
        if cp > 1 and ((m.windowed_attention or m.softmax_type != "vanilla") and kind != "a2a"):
            # TE d0067d0 context_parallel.py attn_forward_func_with_cp: attention sinks run with a2a only, a sliding
            # window with a2a or all_gather (echo-tune traces its window under a2a only; p2p is Megatron's default)
            raise ConfigError(f"`context_parallel_size == 1` must hold with a sliding window or attention sinks "
                              f"(window_size={m.window_size}, softmax_type={m.softmax_type!r}), but got "
                              f"(context_parallel_size={cp}, cp_comm_type={kind}): TE's context parallelism runs "
                              f"sinks with a2a only, and echo-tune models a window under CP with a2a only; use "
                              f"--cp-comm-type a2a")
        if self.precision not in DTYPES:
            raise ConfigError(f"precision must be one of {sorted(DTYPES)}, but got (precision={self.precision!r})")

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    @property
    def seq(self) -> int:
        """Tokens of one sample on this CP rank (what attention and the TP regions see)."""
        return self.model.seq_length // self.cp

    @property
    def seq_in(self) -> int:
        """Tokens of the layer input on this rank (sequence-parallel shard under SP)."""
        return self.seq // self.tp if self.sequence_parallel else self.seq

    @property
    def heads(self) -> int:
        return self.model.num_attention_heads // self.tp

    @property
    def groups(self) -> int:
        return self.model.query_groups // self.tp

    @property
    def ffn(self) -> int:
        return self.model.ffn_size // self.tp

    @property
    def vocab(self) -> int:
        """Rows of the vocabulary-parallel embedding / output layer held by this rank."""
        return self.model.padded_vocab_size(self.tp) // self.tp

    def hidden_shape(self) -> tuple[int, int, int]:
        return (self.seq_in, self.micro_batch_size, self.model.hidden_size)

    def tensor(self, *shape: int, dtype: torch.dtype | None = None, grad: bool = False) -> torch.Tensor:
        """A ``meta`` tensor (a leaf parameter or input when ``grad``)."""
        return torch.empty(shape, device="meta", dtype=dtype or self.dtype, requires_grad=grad)


def norm_params(shard: Shard) -> dict[str, torch.Tensor]:
    h = shard.model.hidden_size
    params = {"weight": shard.tensor(h, grad=True)}
    if shard.model.normalization == "LayerNorm":
        params["bias"] = shard.tensor(h, grad=True)
    return params


def norm(x: torch.Tensor, params: dict[str, torch.Tensor], shard: Shard) -> torch.Tensor:
    """LayerNorm (aten's fused kernel, keeps x, mean, rstd) or TE's fused RMSNorm (keeps x, rstd)."""
    if shard.model.normalization == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), params["weight"], params["bias"], NORM_EPS)
    return torch.ops.echo_tune.rms_norm(x, params["weight"], NORM_EPS)[0]


def _linear_params(shard: Shard, out_features: int, in_features: int, bias: bool) -> dict[str, torch.Tensor]:
    params = {"weight": shard.tensor(out_features, in_features, grad=True)}
    if bias and shard.model.add_bias_linear:
        params["bias"] = shard.tensor(out_features, grad=True)
    return params


def layer_params(shard: Shard) -> dict[str, dict[str, torch.Tensor]]:
    """This rank's parameters of one layer (column-parallel outputs and row-parallel inputs sharded)."""
    m, d = shard.model, shard.model.head_dim
    fc1_out = 2 * shard.ffn if m.gated_linear_unit else shard.ffn
    params = {"input_norm": norm_params(shard)}
    if shard.linear:  # the gated delta net's parameters in place of the attention's
        params.update(gated_delta_net.gdn_params(shard))
    elif m.multi_latent_attention:
        params["mla"] = mla.mla_params(shard)
        params["proj"] = _linear_params(shard, m.hidden_size, shard.heads * m.v_head_dim, bias=True)
        d = m.qk_pos_emb_head_dim  # RoPE applies to the decoupled rope part only
    else:
        gate = shard.heads * d if m.attention_output_gate else 0  # workload/attention/output_gate.py: the gate's columns
        params["qkv"] = _linear_params(shard, (shard.heads + 2 * shard.groups) * d + gate, m.hidden_size, bias=True)
        params["proj"] = _linear_params(shard, m.hidden_size, shard.heads * d, bias=True)
        if m.qk_layernorm:  # one RMSNorm weight over the head dimension for queries, one for keys
            params["qk_norm"] = {"q": shard.tensor(d, grad=True), "k": shard.tensor(d, grad=True)}
    if m.softmax_type == "learnable" and not shard.linear:  # one sink logit per local head (dot_product_attention.py softmax_offset)
        params["softmax_offset"] = {"offset": shard.tensor(shard.heads, grad=True)}
    params["mlp_norm"] = norm_params(shard)
    if shard.moe:
        params["moe"] = moe.moe_params(shard)
    else:
        params["fc1"] = _linear_params(shard, fc1_out, m.hidden_size, bias=True)
        params["fc2"] = _linear_params(shard, m.hidden_size, shard.ffn, bias=True)
    if m.rotary and not shard.linear:  # rope or yarn (config/specs/model.py POSITION_EMBEDDING_TYPES); a constant buffer, not a parameter (no gradient)
        rot = d if m.multi_latent_attention else rotary_dim(d, m.rotary_percent)
        params["buffers"] = {"rope_freqs": shard.tensor(shard.seq, 1, 1, rot, dtype=torch.float32)}
    return params


def _qkv(x, params, shard: Shard):
    """QKV projection, split into q [s, b, heads, d] and k, v [s, b, groups, d] (+ fused RoPE), and the output
    gate (q's shape) with ``attention_output_gate`` (per group [q, gate, k, v]; else None)."""
    p, d = params["qkv"], shard.model.head_dim
    mixed = column_parallel_linear(x, p["weight"], p.get("bias"), shard.tp, shard.sequence_parallel)
    s, b = mixed.shape[:2]
    per_group = shard.heads // shard.groups
    gated = shard.model.attention_output_gate
    mixed = mixed.view(s, b, shard.groups, ((2 if gated else 1) * per_group + 2) * d)
    if gated:
        q, gate, k, v = torch.split(mixed, [per_group * d, per_group * d, d, d], dim=3)
    else:
        (q, k, v), gate = torch.split(mixed, [per_group * d, d, d], dim=3), None
    q = q.reshape(s, b, shard.heads, d)
    if "qk_norm" in params:
        q = torch.ops.echo_tune.rms_norm(q, params["qk_norm"]["q"], NORM_EPS)[0]
        k = torch.ops.echo_tune.rms_norm(k, params["qk_norm"]["k"], NORM_EPS)[0]
    if "buffers" in params:
        freqs, m = params["buffers"]["rope_freqs"], shard.model
        q = apply_rope(q, freqs, fused=m.rope_fused, interleaved=m.rotary_interleaved)
        k = apply_rope(k, freqs, fused=m.rope_fused, interleaved=m.rotary_interleaved)
    return q, k, v, gate


def _attention_proj(context, params, shard: Shard):
    return row_parallel_linear(context, params["proj"]["weight"], shard.tp, shard.sequence_parallel)


def _mlp(x, params, shard: Shard):
    """fc1 (column-parallel) -> activation (workload/mlp/activations.py) -> fc2 (row-parallel, then the reduction)."""
    fc1, fc2, tp, sp = params["fc1"], params["fc2"], shard.tp, shard.sequence_parallel
    fused = fc1_fuses_bias(shard.model)  # the bias rides in the fused activation kernel (traced in the GEMM)
    hidden = column_parallel_linear(x, fc1["weight"], fc1.get("bias") if fused else None, tp, sp)
    hidden = activation(hidden, None if fused else fc1.get("bias"), shard.model)
    return row_parallel_linear(hidden, fc2["weight"], tp, sp)


def bias_dropout_add(x, bias, residual, dropout_p: float, fused: bool = False):
    """residual + dropout(x + bias): Megatron's bias-dropout-add (keeps the 1-byte dropout mask); one kernel
    when ``fused`` and there is a bias or dropout (fused_elementwise.py), else the separate torch ops."""
    if fused and (bias is not None or dropout_p > 0):
        return fused_bias_dropout_add(x, bias, residual, dropout_p)
    if bias is not None:
        x = x + bias
    if dropout_p > 0:
        x, _mask = torch.native_dropout(x, dropout_p, True)
    return residual + x


def layer_forward(x: torch.Tensor, params: dict, shard: Shard) -> torch.Tensor:
    """One transformer layer on this rank; ``x`` is [seq_in, b, h]."""
    m = shard.model
    hidden = in_region("input_norm", norm, x, params["input_norm"], shard)
    if shard.linear:  # the gated delta net in place of self-attention (its in_proj fuses the input norm)
        attn = gated_delta_net.gdn_forward(hidden, params, shard, shard.deterministic)
        return _mlp_block(in_region("attention_residual", bias_dropout_add, attn, None, x, m.hidden_dropout,
                                    m.bias_dropout_fusion), params, shard)
    if m.multi_latent_attention:
        (q, k, v), gate = mla.mla_qkv(hidden, params, shard), None
    else:
        q, k, v, gate = in_region("qkv", _qkv, hidden, params, shard)
    context = in_region("core_attention", lambda: core_attention(
        q, k, v, flash=m.flash_attention, context_parallel_size=shard.cp, cp_comm=shard.cp_comm,
        dropout_p=m.attention_dropout,
        window_left=m.window_left if shard.window else None,
        softmax=local_softmax(shard, params.get("softmax_offset", {}).get("offset")),
        te_layout=m.transformer_impl == "transformer_engine"))
    if gate is not None:  # --attention-output-gate (workload/attention/output_gate.py)
        context = in_region("output_gate", apply_output_gate, context, gate)
    attn = in_region("attention_proj", _attention_proj, context, params, shard)
    x = in_region("attention_residual", bias_dropout_add, attn, params["proj"].get("bias"), x, m.hidden_dropout,
                  m.bias_dropout_fusion)
    return _mlp_block(x, params, shard)


def _mlp_block(x, params, shard: Shard):
    """Post-attention norm, the MLP (or MoE block) and its residual."""
    m = shard.model
    hidden = in_region("mlp_norm", norm, x, params["mlp_norm"], shard)
    if shard.moe:
        mlp = in_region("moe", moe.moe_forward, hidden, params["moe"], shard)
        return in_region("mlp_residual", bias_dropout_add, mlp, None, x, m.hidden_dropout, m.bias_dropout_fusion)
    mlp = in_region("mlp", _mlp, hidden, params, shard)
    return in_region("mlp_residual", bias_dropout_add, mlp, params["fc2"].get("bias"), x, m.hidden_dropout,
                     m.bias_dropout_fusion)


def parameters(params: dict) -> list[torch.Tensor]:
    """The trainable tensors of a nested parameter dict (buffers excluded: the "buffers" group, and a buffer kept
    beside its module's weights without a gradient, as the router's expert bias)."""
    return [t for name, group in params.items() if name != "buffers" for t in _leaves(group) if t.requires_grad]


def _leaves(group: dict) -> list[torch.Tensor]:
    """Tensors of a (possibly nested: the MoE block's router / experts / shared) parameter group."""
    return [t for v in group.values() for t in (_leaves(v) if isinstance(v, dict) else [v])]


def param_tensors(params: dict, tied: bool = False) -> tuple[tuple[int, str], ...]:
    """``Trace.param_tensors``: 2-D tensors are Muon's "matrix" but for the word embeddings and the output layer,
    which Megatron tags ``is_embedding_or_output_parameter`` (language_module.py; the position embeddings are
    not tagged, so Muon takes them); the stacked local experts are one "expert" tensor each."""
    experts = {id(t) for t in expert_parameters(params)}
    out = []
    for name, group in params.items():
        for t in _leaves(group) if name != "buffers" else ():
            if id(t) in experts:
                out += [(t.numel() // t.shape[0], "expert")] * t.shape[0]
            elif name == "output" and t.dim() == 2:
                out.append((t.numel(), "tied" if tied else "other"))
            else:
                word = name == "embedding" and t is group.get("word")
                out.append((t.numel(), "matrix" if t.dim() == 2 and not word else "other"))
    return tuple(out)


def expert_parameters(params: dict) -> list[torch.Tensor]:
    """The routed experts' tensors (reduced over the expert-data-parallel group, not DP)."""
    return list(params.get("moe", {}).get("experts", {}).values())


def linear_param_counts(params: dict) -> dict[str, int]:
    """Weights of the layer's linear layers keyed by where their GEMMs are traced (``Trace.linear_param_counts``)."""
    where = {"qkv": "qkv", "proj": "attention_proj", "fc1": "mlp", "fc2": "mlp", "gdn_in": "qkv",
             "gdn_out": "attention_proj"}
    counts: dict[str, int] = {}
    for group, region in where.items():
        if group in params:
            counts[region] = counts.get(region, 0) + params[group]["weight"].numel()
    for name, weight in params.get("mla", {}).items():  # down projection traced in "qkv", up ones apart
        if not name.endswith("_norm"):
            region = "qkv" if name == "down" else "mla_up_proj"
            counts[region] = counts.get(region, 0) + weight.numel()
    for part, group in params.get("moe", {}).items():
        counts[f"moe/{part}"] = sum(t.numel() for t in _leaves(group))
    return counts


def constants(params: dict) -> list[torch.Tensor]:
    """Parameters and buffers: tensors that live across steps, so they are not activations."""
    return [t for group in params.values() for t in _leaves(group)]
