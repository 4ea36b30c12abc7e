"""plan's default global batch: about 4M tokens, as a power of two of sequences (issue 20 item 2), so it
divides by every power-of-two data-parallel size times micro-batch."""

from echo_tune.plan.planner import default_global_batch_size


def test_default_global_batch_is_the_power_of_two_nearest_4m_tokens():
    assert default_global_batch_size(4096) == 1024 and default_global_batch_size(8192) == 512
    assert default_global_batch_size(40960) == 128  # Qwen3's 40960 positions: 2**22 / 40960 = 102.4 -> 128
    assert default_global_batch_size(2**23) == 1
    for seq in (1000, 3000, 40960, 100_000, 131072):
        gbs = default_global_batch_size(seq)
        assert gbs & (gbs - 1) == 0  # a power of two
        assert 2**21 <= gbs * seq <= 2**23 or gbs == 1  # within a factor sqrt(2)..2 of 4M tokens
