"""The traced workload: one rank's ops for one micro-batch of a layer, the embedding or the output."""

from echo_tune.workload.graph import COLLECTIVES, GROUPS, OP_KINDS, Op, Trace
from echo_tune.workload.tracer import TraceRecorder, trace_embedding, trace_layer, trace_output

__all__ = ["COLLECTIVES", "GROUPS", "OP_KINDS", "Op", "Trace", "TraceRecorder", "trace_embedding",
           "trace_layer", "trace_output"]
