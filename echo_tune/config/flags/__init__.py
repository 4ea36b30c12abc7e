"""The catalogue of every Megatron-LM flag at d98e8a64ddf3 and the class of each: modelled,
harmless, step-shaping or out of scope (refused by name).
"""
