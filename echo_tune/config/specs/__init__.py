"""The specs: frozen keyword-only dataclasses named as Megatron-LM's arguments (model, GPU, cluster,
layout) with their field groups, and the checked Layout the simulator reads.
"""
