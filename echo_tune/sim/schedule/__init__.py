"""One pipeline's schedule: traced pieces costed into passes, the GPipe / 1F1B / interleaved order
and the event-driven engine that times it.
"""
