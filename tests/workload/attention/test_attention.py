"""workload/attention/core_attention.py: the attention kernels' shapes."""

import torch

from echo_tune.workload.attention.core_attention import unfused_attention


def test_unfused_attention_takes_a_value_head_size_other_than_the_query_one():
    # On the meta device, as the tracer runs it. MLA (Megatron-LM d98e8a64ddf3, multi_latent_attention.py):
    # queries and keys are qk_head_dim + qk_pos_emb_head_dim wide (16 + 8 = 24), values v_head_dim (16);
    # the output is heads x v_head_dim. Before the fix this raised a reshape RuntimeError.
    s, b, heads = 8, 2, 4
    q, k, v = (torch.empty(s, b, heads, d, device="meta") for d in (24, 24, 16))
    assert unfused_attention(q, k, v, 0.0).shape == (s, b, heads * 16)


def test_te_qkv_layout_copies_a_strided_v_beside_roped_k():
    """TE's get_qkv_layout: k and v strides (over their head size) must match, else all three are made
    contiguous. After RoPE, k is a new tensor and v a strided view of the QKV output: v is copied, and the
    QKV output is no longer kept alive through it."""
    import torch

    from echo_tune.workload.attention.core_attention import te_qkv_layout

    s, b, groups, per_group, d = 4, 2, 2, 3, 8
    mixed = torch.zeros(s, b, groups, (per_group + 2) * d)
    q, k, v = torch.split(mixed, [per_group * d, d, d], dim=3)
    q_rope, k_rope = q.reshape(s, b, groups * per_group, d).clone(), k.clone()  # RoPE writes new tensors
    q2, k2, v2 = te_qkv_layout(q_rope, k_rope, v)
    assert v2.is_contiguous() and v2.untyped_storage().data_ptr() != mixed.untyped_storage().data_ptr()
    assert k2 is k_rope and q2 is q_rope  # already contiguous: .contiguous() returns them
    # multi-head attention without RoPE: q, k, v are views of one [s, b, h, 3 d] tensor with equal strides (TE's
    # sbh3d layout), read in place
    mha = torch.zeros(s, b, groups, 3 * d)
    q, k, v = torch.split(mha, [d, d, d], dim=3)
    assert all(x is y for x, y in zip(te_qkv_layout(q, k, v), (q, k, v)))
