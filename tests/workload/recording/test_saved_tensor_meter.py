"""The saved-tensor meter counts what the autograd graph holds when the forward ends (workload/recording/recorder.py)."""

import torch

from echo_tune.workload.recording.recorder import SavedTensorMeter, TraceRecorder


def test_a_dropped_branch_saves_nothing_and_a_live_one_counts_once():
    x = torch.ones(1000, requires_grad=True)  # 1000 fp32 = 4000 bytes per tensor
    meter = SavedTensorMeter(TraceRecorder("mlp"), constants=[])
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        dropped = (x * 2).exp()  # exp saves its output; the branch is dropped before the forward ends
        del dropped
        kept = (x * 2).sin()  # sin saves its input, the product (4000 bytes)
        kept_twice = kept * kept  # mul saves ``kept`` twice: one storage
    meter.close()
    # by hand: the live graph holds x * 2 (saved by sin) and ``kept`` (saved twice by the mul): 2 x 4000 bytes; the
    # dropped exp's output is freed with its graph, whatever address the allocator gives the next tensor
    assert sum(meter.nbytes.values()) == 8000
    assert meter.by_region() == {"mlp": 8000}
    assert kept_twice.grad_fn is not None
