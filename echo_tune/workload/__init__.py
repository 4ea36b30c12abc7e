"""The traced workload: one rank's ops for one micro-batch of a layer, the embedding or the output.

``graph`` (the Op / Trace types) is light; the tracer imports torch, so it loads on first use.
"""

from echo_tune.workload.graph import COLLECTIVES, GROUPS, OP_KINDS, Op, Trace

_TRACER = ("TraceRecorder", "trace_embedding", "trace_layer", "trace_moe_layer", "trace_output")


def __getattr__(name: str):
    if name in _TRACER:
        # lazy: loads torch (~1.5 s to import), which importing workload does not
        from echo_tune.workload import tracer

        return getattr(tracer, name)
    raise AttributeError(f"module 'echo_tune.workload' has no attribute {name!r}")


__all__ = ["COLLECTIVES", "GROUPS", "OP_KINDS", "Op", "Trace", *_TRACER]
