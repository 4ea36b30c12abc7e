"""Pipeline sends as Megatron-Core sends them (whole tensor per TP rank), and the 2021-2023 scatter/gather."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import default_profile
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.sim.simulate import _stage_pair, p2p_time_s
from echo_tune.sim.outputs.trace_args import p2p_message_bytes

GPT3 = et.load_model("gpt3-175b")
A100 = et.load_cluster("a100-80gb")
PROFILE = default_profile(A100)
BASE = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, micro_batch_size=1,
                         global_batch_size=1536)


def _p2p(parallel):
    layout = check_compatible(GPT3, A100, 1024, parallel)
    pieces = trace_pieces(GPT3, parallel, layout)
    return layout, pieces, p2p_time_s(pieces, layout, PROFILE), p2p_message_bytes(pieces, layout)


def test_without_sequence_parallelism_each_rank_sends_the_whole_activation():
    """Megatron-Core's p2p (since 39b83c7953, 2023-01-31) sends each TP rank's copy of the layer output: the
    whole [seq, mbs, hidden] tensor without sequence parallelism, 1/TP of it with."""
    layout, pieces, time_s, sent = _p2p(BASE)
    whole = pieces["layer"].output_bytes
    assert whole == 2048 * 1 * 12288 * 2  # the bf16 activation, not a TP shard
    assert sent == whole and not layout.p2p_scatter_gather
    assert time_s == pytest.approx(collective_time_s("send_recv", whole, _stage_pair(layout), PROFILE))
    sp_layout, sp_pieces, sp_time_s, sp_sent = _p2p(BASE.replace(sequence_parallel=True))
    assert sp_sent == whole // 8
    assert sp_time_s < time_s


def test_scatter_gather_sends_a_shard_and_all_gathers_it():
    """``--scatter-gather-tensors-in-pipeline`` (Megatron-LM 2021-02..2023-01): 1/TP sent between the stages'
    nodes, all-gathered over NVLink by the receiver; cheaper than the whole tensor over the network. With
    sequence parallelism Megatron skipped it (the tensor is already sharded): the same time as without."""
    whole_layout, _, whole_s, _ = _p2p(BASE)
    layout, pieces, time_s, sent = _p2p(BASE.replace(scatter_gather_tensors_in_pipeline=True))
    assert layout.p2p_scatter_gather and sent == pieces["layer"].output_bytes // 8
    expected = (collective_time_s("send_recv", sent, _stage_pair(layout), PROFILE)
                + collective_time_s("all_gather", pieces["layer"].output_bytes, layout.groups["tp"], PROFILE))
    assert time_s == pytest.approx(expected)
    assert time_s < whole_s
    sp = BASE.replace(sequence_parallel=True)
    assert _p2p(sp.replace(scatter_gather_tensors_in_pipeline=True))[2] == _p2p(sp)[2]
    step = et.simulate(GPT3, A100, 1024, BASE).step_time_s
    assert et.simulate(GPT3, A100, 1024, BASE.replace(scatter_gather_tensors_in_pipeline=True)).step_time_s < step


def test_the_flag_round_trips_and_its_later_spelling_selects_the_default():
    flags = to_megatron_flags({}, {"scatter_gather_tensors_in_pipeline": True}, "bf16")
    assert "--scatter-gather-tensors-in-pipeline" in flags
    assert parse_megatron_line(" ".join(flags))[1]["scatter_gather_tensors_in_pipeline"] is True
    assert "--scatter-gather-tensors-in-pipeline" not in to_megatron_flags({}, {}, "bf16")
    # Megatron-LM 72e4230bb5..10e7b74597: store_false, whole-tensor sends; accepted (not refused) and off
    _, parallel, *_ = parse_megatron_line("--tensor-model-parallel-size 8 --no-scatter-gather-tensors-in-pipeline")
    assert parallel["scatter_gather_tensors_in_pipeline"] is False
    from echo_tune.errors import ConfigError
    with pytest.raises(ConfigError, match="never flags of one Megatron-LM version"):
        parse_megatron_line("--scatter-gather-tensors-in-pipeline --no-scatter-gather-tensors-in-pipeline")
    with pytest.raises(ConfigError, match="takes no value"):
        parse_megatron_line("--scatter-gather-tensors-in-pipeline=false")


def test_the_papers_rows_are_simulated_with_scatter_gather():
    """Narayanan et al. 2021 ran it (sec. 4.1, on by default in their code): every row of the paper carries the
    erratum; no other row of the developers' sets does."""
    from echo_tune.validate.errata import errata_path_for, load_errata

    rows = load_errata(errata_path_for("runs_megatron.csv"))
    paper = {row for row, errata in rows.items() if any("--no-async-tensor" in e.flags for e in errata)}
    with_it = {row for row, errata in rows.items() if any(e.flags == "--scatter-gather-tensors-in-pipeline"
                                                          for e in errata)}
    assert with_it == paper and len(paper) == 16
    for name in ("runs_modern.csv", "runs_bridge.csv"):
        path = errata_path_for(name)
        assert path is None or not any("scatter-gather" in e.flags for es in load_errata(path).values() for e in es)
