"""sim/schedule/schedules.py: interleaved warm-up as Megatron-LM d98e8a64ddf3 counts it, and the live micro-batches at
the loss (what the loss's working set is added to, sim/memory/stage.py)."""

from echo_tune.sim.schedule.schedules import (after_forward_peak_bytes, after_forward_vectors, live_count_vectors,
                                              stage_order)


def test_interleaved_warmup_when_micro_batches_equal_stages():
    # get_pp_rank_microbatches: (p - s - 1) * 2 + (v - 1) * p warm-up forwards, capped at m * v; no longer
    # every forward first when m == p (older Megatron-LM did): p = 4, v = 3, m = 4
    last = stage_order("interleaved", 3, 4, 4, 3)
    assert [t[0] for t in last[:9]] == [False] * 9 and last[9][0]  # 8 warm-up forwards, then 1F1B
    assert live_count_vectors("interleaved", 3, 4, 4, 3) == ((4, 4, 1),)
    first = stage_order("interleaved", 0, 4, 4, 3)  # 3 * 2 + 2 * 4 = 14 >= 12: all forwards first
    assert [t[0] for t in first[:12]] == [False] * 12
    assert live_count_vectors("interleaved", 0, 4, 4, 3) == ((4, 4, 4),)


def test_live_state_at_the_loss():
    # the loss runs after each forward of the last chunk; the peak there weights each chunk's live count
    assert after_forward_vectors("interleaved", 3, 4, 4, 3, 2) == ((4, 4, 1),)
    assert after_forward_peak_bytes("interleaved", 3, 4, 4, 3, 2, [1.0, 10.0, 100.0]) == 4 + 40 + 100
    # 1F1B on the last stage: one micro-batch in flight, at the loss as at the peak
    assert after_forward_vectors("1f1b", 3, 4, 8, 1, 0) == ((1,),)
    # p = 4, v = 2, m = 8, last stage: 4 warm-up forwards of chunk 0, then 1F1B; the forward of micro-batch 4
    # on chunk 0 comes after the backward of micro-batch 0 on chunk 1 and before chunk 0's: 5 live on chunk 0
    assert (5, 0) in after_forward_vectors("interleaved", 3, 4, 8, 2, 0)
