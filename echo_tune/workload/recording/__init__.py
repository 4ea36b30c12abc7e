"""How a trace is recorded: the recorder and its region tags, Megatron's TP communication as
recording autograd Functions, fused kernels as meta-device custom ops, an op's identity.
"""
