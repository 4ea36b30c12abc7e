"""The rule checks: Megatron-LM's and Megatron-Core's asserts on specs and launch lines, run once
where a step's specs are built (config/checked.py); the simulator imports none of them.
"""
