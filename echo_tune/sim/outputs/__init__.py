"""What a simulated step returns: the StepReport (a named sum of parts), model FLOPs and MFU, the
share of measured op times, and the Chrome trace of the timeline.
"""
