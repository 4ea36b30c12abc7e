"""Megatron-LM launch lines: a line read into specs, specs written back as flags (the flag tables),
and the notes a launch line must carry.
"""
