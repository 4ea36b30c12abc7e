"""Collective times: NCCL bandwidth and latency by group placement, link coefficients, the MoE
dispatchers (all-to-all, DeepEP, HybridEP) and TP communication overlapped with GEMMs.
"""
