"""After the last backward: data-parallel gradient reduction and parameter gathers (DDP, the
distributed optimizer, Megatron-FSDP) and the optimizer step (Adam, Muon).
"""
