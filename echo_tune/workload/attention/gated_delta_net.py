"""The gated delta net (``--experimental-attention-variant gdn``), traced as one tensor-parallel rank runs it.

Megatron-LM d98e8a64ddf3 core/ssm/gated_delta_net/gdn.py ``GatedDeltaNet.forward`` and common.py ``_GDNBase``
(CP 1, no packed sequences), in place of self-attention in the layers ``linear_attention_pattern`` selects:

1. ``in_proj`` (TE LayerNormLinear: the layer's input norm fused in; column-parallel, no bias): h -> (2 qk + 2 v +
   2 value heads) / TP, traced in the "qkv" region (its TP collectives and FP8 as the QKV projection's);
2. split into qkv, the output gate z, beta and alpha; the causal depthwise conv1d over qkv (kernel
   ``linear_conv_kernel_dim``, SiLU): under ``--deterministic-mode`` torch's ``F.conv1d`` on a transposed copy, else
   FLA's fused ``causal_conv1d`` (one kernel each way);
3. ``_prepare_input_for_gated_delta_rule`` (``@jit_fuser``: torch.compile, one fused kernel each way here): L2 norm of
   q and k, their heads repeated to the value heads, g = -exp(A_log) softplus(alpha + dt_bias) in fp32, sigmoid(beta);
4. the gated delta rule over chunks of 64 tokens: under ``--deterministic-mode`` Megatron's torch-native
   ``torch_chunk_gated_delta_rule`` (gdn.py; traced op by op as written, so its kernels, loops and saved tensors are
   what autograd keeps), else FLA's ``chunk_gated_delta_rule`` (one op each way; ``chunk_rule_flops``);
5. ``_apply_gated_norm`` (``@jit_fuser``): the output norm over a value head times SiLU(z), one fused kernel each way;
   a transposed copy back to [s, b, v / TP];
6. ``out_proj`` (row-parallel, no bias): v / TP -> h and its reduction, traced in "attention_proj".

Steps 2-5 are the "linear_attention" region, which no ``--recompute-modules`` entry replays (Megatron's
``core_attn`` checkpoints self-attention's core attention only; ``gdn_norm_out`` is refused as not modelled).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from echo_tune.workload.recording import kernels
from echo_tune.workload.recording.comm import column_parallel_linear, row_parallel_linear
from echo_tune.workload.recording.context import in_region

CHUNK = 64
"""Tokens per chunk of the gated delta rule (gdn.py ``self.chunk_size``; FLA's default)."""
NORM_EPS = 1e-5


def dims(shard) -> dict[str, int]:
    """This rank's sizes: key / value heads and head dims, the q, k, v widths, the conv channels."""
    m, tp = shard.model, shard.tp
    kh, vh = m.linear_num_key_heads // tp, m.linear_num_value_heads // tp
    dk, dv = m.linear_key_head_dim, m.linear_value_head_dim
    return dict(kh=kh, vh=vh, dk=dk, dv=dv, qk=kh * dk, v=vh * dv, conv=2 * kh * dk + vh * dv,
                in_proj=2 * kh * dk + 2 * vh * dv + 2 * vh)


def gdn_params(shard) -> dict[str, dict[str, torch.Tensor]]:
    """in_proj and out_proj as linear groups (``gdn_in`` / ``gdn_out``), the rest in ``gdn``."""
    d, m = dims(shard), shard.model
    norm = {"out_norm": shard.tensor(d["dv"], grad=True)}
    if m.normalization == "LayerNorm":
        norm["out_norm_bias"] = shard.tensor(d["dv"], grad=True)
    return {"gdn_in": {"weight": shard.tensor(d["in_proj"], m.hidden_size, grad=True)},
            "gdn": {"conv": shard.tensor(d["conv"], 1, m.linear_conv_kernel_dim, grad=True),
                    "dt_bias": shard.tensor(d["vh"], grad=True), "A_log": shard.tensor(d["vh"], grad=True), **norm},
            "gdn_out": {"weight": shard.tensor(m.hidden_size, d["v"], grad=True)}}


# --- fused kernels (one op each way) ---
def _prepare_fake(qkv, alpha, beta, A_log, dt_bias, kh, vh, dk, dv):
    b, s = qkv.shape[:2]
    qk = qkv.new_empty((b, s, vh, dk))
    return (qk, torch.empty_like(qk), qkv.new_empty((b, s, vh, dv)), qkv.new_empty((b, s, vh), dtype=torch.float32),
            qkv.new_empty((b, s, vh)))


prepare = kernels._define(
    "gdn_prepare", "(Tensor qkv, Tensor alpha, Tensor beta, Tensor A_log, Tensor dt_bias, int kh, int vh, int dk, "
                   "int dv) -> (Tensor, Tensor, Tensor, Tensor, Tensor)", _prepare_fake)
prepare_backward = kernels._define(
    "gdn_prepare_backward", "(Tensor dq, Tensor dk, Tensor dv, Tensor dg, Tensor dbeta, Tensor qkv, Tensor alpha, "
                            "Tensor beta, Tensor A_log, Tensor dt_bias) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    lambda dq, dk, dv, dg, db, qkv, alpha, beta, A_log, dt_bias: tuple(
        torch.empty_like(t) for t in (qkv, alpha, beta, A_log, dt_bias)))


def _prepare_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*inputs[:5])


def _prepare_backward(ctx, dq, dk, dv, dg, dbeta):
    grads = torch.ops.echo_tune.gdn_prepare_backward(dq, dk, dv, dg, dbeta, *ctx.saved_tensors)
    return (*grads, None, None, None, None)


prepare.register_autograd(_prepare_backward, setup_context=_prepare_setup)

gated_norm = kernels._define("gdn_gated_norm", "(Tensor x, Tensor gate, Tensor weight) -> Tensor",
                             lambda x, gate, weight: x.new_empty(x.shape))
gated_norm_backward = kernels._define(
    "gdn_gated_norm_backward", "(Tensor dy, Tensor x, Tensor gate, Tensor weight) -> (Tensor, Tensor, Tensor)",
    lambda dy, x, gate, weight: (torch.empty_like(x), torch.empty_like(gate), torch.empty_like(weight)))


def _norm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _norm_backward(ctx, dy):
    return tuple(torch.ops.echo_tune.gdn_gated_norm_backward(dy, *ctx.saved_tensors))


gated_norm.register_autograd(_norm_backward, setup_context=_norm_setup)

causal_conv = kernels._define("gdn_causal_conv1d", "(Tensor x, Tensor weight) -> Tensor",
                              lambda x, weight: torch.empty_like(x))
causal_conv_backward = kernels._define(
    "gdn_causal_conv1d_backward", "(Tensor dy, Tensor x, Tensor weight) -> (Tensor, Tensor)",
    lambda dy, x, weight: (torch.empty_like(x), torch.empty_like(weight)))


def _conv_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _conv_backward(ctx, dy):
    return tuple(torch.ops.echo_tune.gdn_causal_conv1d_backward(dy, *ctx.saved_tensors))


causal_conv.register_autograd(_conv_backward, setup_context=_conv_setup)


# --- FLA's chunked gated delta rule ---
def chunk_rule_flops(b: int, s: int, heads: int, dk: int, dv: int, c: int = CHUNK) -> float:
    """Forward FLOPs of FLA's ``chunk_gated_delta_rule`` (fla-org/flash-linear-attention bc3b101d
    fla/ops/gated_delta_rule/chunk.py ``chunk_gated_delta_rule_fwd``; Yang et al., arXiv 2412.06464, section 3),
    per head and chunk of c tokens: A = beta K K^T (2 c^2 dk), its triangular inverse (2 c^3 / 3), W = A K and U = A V
    (2 c^2 (dk + dv)), the state pass v_new = U - W S and S += K^T v_new (4 c dk dv), and the output Q S plus the
    masked Q K^T applied to v_new (2 c dk dv + 2 c^2 (dk + dv)). Per token: 6 c dk + 4 c dv + 6 dk dv + 2 c^2 / 3."""
    per_token = 6 * c * dk + 4 * c * dv + 6 * dk * dv + 2 * c * c / 3
    return float(b * s * heads * per_token)


def chunk_rule_backward_flops(b: int, s: int, heads: int, dk: int, dv: int, c: int = CHUNK) -> float:
    """Backward FLOPs: twice the forward's (each product's two gradients) plus the forward parts FLA recomputes
    (``chunk_gated_delta_rule_bwd``: ``recompute_w_u_fwd`` 2 c (dk + dv) and ``chunk_gated_delta_rule_fwd_h``
    4 dk dv per token)."""
    return 2 * chunk_rule_flops(b, s, heads, dk, dv, c) + float(b * s * heads * (2 * c * (dk + dv) + 4 * dk * dv))


rule = kernels._define(
    "gdn_chunk_rule", "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, bool causal) -> (Tensor, Tensor)",
    lambda q, k, v, g, beta, causal: (v.new_empty(v.shape), k.new_empty((*k.shape[:3], CHUNK))))
rule_backward = kernels._define(
    "gdn_chunk_rule_backward", "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor A, bool causal)"
                               " -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    lambda do, q, k, v, g, beta, A, causal: tuple(torch.empty_like(t) for t in (q, k, v, g, beta)))


def _rule_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs[:5], output[1])  # q, k, v, g, beta and A (FLA's save_for_backward)


def _rule_backward(ctx, do, _dA):
    return (*torch.ops.echo_tune.gdn_chunk_rule_backward(do, *ctx.saved_tensors, True), None)


rule.register_autograd(_rule_backward, setup_context=_rule_setup)


def _rule_shape(args, at: int) -> tuple[int, int, int, int, int]:
    q, v = args[at], args[at + 2]
    return q.shape[0], q.shape[1], q.shape[2], q.shape[3], v.shape[3]


kernels.ATTENTION_FLOPS[torch.ops.echo_tune.gdn_chunk_rule] = lambda args: chunk_rule_flops(*_rule_shape(args, 0))
kernels.ATTENTION_FLOPS[torch.ops.echo_tune.gdn_chunk_rule_backward] = \
    lambda args: chunk_rule_backward_flops(*_rule_shape(args, 1))
# exponentials: the decay exp(g_i - g_j) over each chunk's c x c pairs (half of them, below the diagonal)
kernels.ATTENTION_EXPS[torch.ops.echo_tune.gdn_chunk_rule] = \
    lambda args: float(args[0].shape[0] * args[0].shape[1] * args[0].shape[2] * CHUNK / 2)
kernels.ATTENTION_EXPS[torch.ops.echo_tune.gdn_chunk_rule_backward] = \
    lambda args: float(args[1].shape[0] * args[1].shape[1] * args[1].shape[2] * CHUNK / 2)
kernels.ATTENTION_CAUSAL_ARG[torch.ops.echo_tune.gdn_chunk_rule] = 5
kernels.ATTENTION_CAUSAL_ARG[torch.ops.echo_tune.gdn_chunk_rule_backward] = 7


def torch_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size: int = CHUNK):
    """Megatron-LM d98e8a64ddf3 gdn.py ``torch_chunk_gated_delta_rule`` (deterministic mode), as written there
    (initial state None, no final state, no L2 norm in the kernel): [b, s, heads, d] in, [b, s, heads, dv] out."""
    initial_dtype = q.dtype
    query, key, value, beta, g = [x.transpose(1, 2).contiguous().to(torch.float32) for x in (q, k, v, beta, g)]
    batch_size, num_heads, sequence_length, k_head_dim = key.shape
    v_head_dim = value.shape[-1]
    pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size
    query, key, value = (F.pad(x, (0, 0, 0, pad_size)) for x in (query, key, value))
    beta, g = F.pad(beta, (0, pad_size)), F.pad(g, (0, pad_size))
    total_sequence_length = sequence_length + pad_size
    query = query * (1 / (query.shape[-1] ** 0.5))
    v_beta = value * beta.unsqueeze(-1)
    k_beta = key * beta.unsqueeze(-1)
    query, key, value, k_beta, v_beta = [x.reshape(x.shape[0], x.shape[1], -1, chunk_size, x.shape[-1])
                                         for x in (query, key, value, k_beta, v_beta)]
    g = g.reshape(g.shape[0], g.shape[1], -1, chunk_size)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=0)
    g = g.cumsum(dim=-1)
    decay_mask = ((g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().float()).tril()
    attn = -((k_beta @ key.transpose(-1, -2)) * decay_mask).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype, device=attn.device)
    value = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp().unsqueeze(-1))
    last_recurrent_state = torch.zeros(batch_size, num_heads, k_head_dim, v_head_dim).to(value)
    core_attn_out = torch.zeros_like(value)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=query.device), diagonal=1)
    for i in range(0, total_sequence_length // chunk_size):
        q_i, k_i, v_i = query[:, :, i], key[:, :, i], value[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2) * decay_mask[:, :, i]).masked_fill_(mask, 0)
        v_prime = (k_cumdecay[:, :, i]) @ last_recurrent_state
        v_new = v_i - v_prime
        attn_inter = (q_i * g[:, :, i, :, None].exp()) @ last_recurrent_state
        core_attn_out[:, :, i] = attn_inter + attn @ v_new
        last_recurrent_state = (last_recurrent_state * g[:, :, i, -1, None, None].exp()
                                + (k_i * (g[:, :, i, -1, None] - g[:, :, i]).exp()[..., None]).transpose(-1, -2)
                                @ v_new)
    core_attn_out = core_attn_out.reshape(core_attn_out.shape[0], core_attn_out.shape[1], -1, core_attn_out.shape[-1])
    core_attn_out = core_attn_out[:, :, :sequence_length]
    return core_attn_out.transpose(1, 2).contiguous().to(initial_dtype)


def _core(qkvzba, p, shard, deterministic: bool):
    """Steps 2-5 on [s, b, in_proj / TP]: the gated norm's output [s, b, v / TP]."""
    d, m = dims(shard), shard.model
    s, b = qkvzba.shape[:2]
    qkvzba = qkvzba.transpose(0, 1)
    qkv, gate, beta, alpha = torch.split(qkvzba, [d["conv"], d["v"], d["vh"], d["vh"]], dim=-1)
    if deterministic:
        conv = F.conv1d(qkv.transpose(1, 2).contiguous(), p["conv"], None, padding=m.linear_conv_kernel_dim - 1,
                        groups=d["conv"])
        qkv = F.silu(conv[..., :s]).transpose(1, 2)
    else:
        qkv = torch.ops.echo_tune.gdn_causal_conv1d(qkv, p["conv"])
    q, k, v, g, beta = torch.ops.echo_tune.gdn_prepare(qkv, alpha, beta, p["A_log"], p["dt_bias"],
                                                       d["kh"], d["vh"], d["dk"], d["dv"])
    if deterministic:
        out = torch_chunk_gated_delta_rule(q, k, v, g, beta)
    else:
        out, _A = torch.ops.echo_tune.gdn_chunk_rule(q, k, v, g, beta, True)
    gate = gate.reshape(b, s, d["vh"], d["dv"])
    normed = torch.ops.echo_tune.gdn_gated_norm(out, gate, p["out_norm"])
    return normed.reshape(b, s, d["v"]).transpose(0, 1).contiguous()


def gdn_forward(hidden, params, shard, deterministic: bool):
    """The gated delta net on the normed layer input [s_in, b, h]: its output [s_in, b, h] before the residual."""
    tp, sp = shard.tp, shard.sequence_parallel
    qkvzba = in_region("qkv", lambda: column_parallel_linear(hidden, params["gdn_in"]["weight"], None, tp, sp))
    normed = in_region("linear_attention", _core, qkvzba, params["gdn"], shard, deterministic)
    return in_region("attention_proj", lambda: row_parallel_linear(normed, params["gdn_out"]["weight"], tp, sp))
