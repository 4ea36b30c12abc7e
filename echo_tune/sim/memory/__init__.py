"""Memory per pipeline stage: weights, gradients, optimizer states, activations and workspaces,
against the caching allocator, with the memory model's measured error band.
"""
