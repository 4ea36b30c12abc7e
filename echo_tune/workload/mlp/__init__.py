"""The MLP block: activations and jit-fused elementwise kernels, the MoE layer and its router.
"""
