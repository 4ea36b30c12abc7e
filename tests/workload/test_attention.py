"""workload/attention.py: the attention kernels' shapes."""

import torch

from echo_tune.workload.attention import unfused_attention


def test_unfused_attention_takes_a_value_head_size_other_than_the_query_one():
    # On the meta device, as the tracer runs it. MLA (Megatron-LM d98e8a64ddf3, multi_latent_attention.py):
    # queries and keys are qk_head_dim + qk_pos_emb_head_dim wide (16 + 8 = 24), values v_head_dim (16);
    # the output is heads x v_head_dim. Before the fix this raised a reshape RuntimeError.
    s, b, heads = 8, 2, 4
    q, k, v = (torch.empty(s, b, heads, d, device="meta") for d in (24, 24, 16))
    assert unfused_attention(q, k, v, 0.0).shape == (s, b, heads * 16)
