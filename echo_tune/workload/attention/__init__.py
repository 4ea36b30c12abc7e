"""The attention block as Megatron-Core runs it: core attention (flash, unfused, ring and other
context parallel), sliding windows, MLA, the gated delta net, RoPE, the output gate.
"""
