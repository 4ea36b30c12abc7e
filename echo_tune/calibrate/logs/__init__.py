"""Measurements read from others' logs: nccl-tests outputs (every layout) with their cross-checks
against the cluster, and Megatron-LM training logs and argument dumps as measured runs.
"""
