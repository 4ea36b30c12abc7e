"""The simulator of one training step: the traced, costed passes of each pipeline stage in Megatron-LM's order,
the data-parallel tail, memory per stage, and the StepReport whose total is the sum of named parts.
"""
