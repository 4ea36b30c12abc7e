"""Kernel times on one GPU: GEMMs on the efficiency surface (public benchmarks, size saturation),
FP8 quantisation, the MoE experts' per-expert GEMMs and fused permutations.
"""
