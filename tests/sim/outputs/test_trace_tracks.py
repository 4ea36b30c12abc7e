"""The Chrome trace's blocks add up to the breakdown on the critical stage."""

import json

import pytest

from echo_tune.config import ParallelConfig, load_cluster, load_model
from echo_tune.sim.simulate import simulate
from echo_tune.sim.outputs.trace_export import write_chrome_trace
from echo_tune.sim.outputs.trace_tracks import COMM_TRACK, DP_TRACK, P2P_TRACK, TRANSFER_TRACK, p2p_spans


@pytest.mark.parametrize("model, cluster, gpus, layout", [
    ("llama3.1-8b", "h100", 16, dict(tensor_model_parallel_size=4, pipeline_model_parallel_size=2,
                                      virtual_pipeline_model_parallel_size=2, sequence_parallel=True,
                                      tp_comm_overlap=True, use_distributed_optimizer=True, overlap_grad_reduce=True,
                                      recompute_granularity="full", global_batch_size=32)),
    ("mixtral-8x7b", "h100", 32, dict(pipeline_model_parallel_size=4, expert_model_parallel_size=8,
                                       use_distributed_optimizer=True, global_batch_size=64)),
    # the deferred embedding wgrad's flush (its all-gathers on the communication track) and CUDA graphs
    ("llama3.1-8b", "h100", 16, dict(tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                                      sequence_parallel=True, use_distributed_optimizer=True, overlap_grad_reduce=True,
                                      defer_embedding_wgrad_compute=True, cuda_graph_impl="local",
                                      global_batch_size=64)),  # 32 micro-batches: the flush makes stage 3 critical
])
def test_trace_blocks_equal_the_breakdown(tmp_path, model, cluster, gpus, layout):
    report = simulate(load_model(model), load_cluster(cluster), gpus, ParallelConfig(**layout), timeline=True)
    crit = report.critical_stage
    sums: dict[str, float] = {}
    for tid, _, category, start, end in report.timeline:
        if tid in (crit, COMM_TRACK + crit, P2P_TRACK + crit):
            sums[category] = sums.get(category, 0.0) + (end - start)
    assert report.breakdown_s["pp_p2p"] > 0
    for part in ("tp_cp_comm", "ep_comm", "interference", "recompute", "dp_comm", "optimizer", "pp_p2p"):
        assert sums.get(part, 0.0) == pytest.approx(report.breakdown_s[part], rel=1e-9, abs=1e-12), part
    # the passes' spans hold compute plus the blocks drawn on the communication track
    comm_track = sum(e - s for t, _, _, s, e in report.timeline if t == COMM_TRACK + crit)
    assert sums["forward"] + sums["backward"] - comm_track == pytest.approx(report.breakdown_s["compute"], rel=1e-9)
    # DP buckets: back to back on one stream, the last one ending where the exposed reduction ends
    buckets = sorted((s, e) for t, _, c, s, e in report.timeline if t == DP_TRACK + crit)
    assert buckets and all(b[1] <= n[0] + 1e-12 for b, n in zip(buckets, buckets[1:]))
    exposed = [(s, e) for t, _, c, s, e in report.timeline if t == crit and c == "dp_comm"]
    untied = report.config["model_spec"]["untie_embeddings_and_output_weights"]  # no tied-embedding sync
    assert untied
    if exposed and exposed[0][1] - exposed[0][0] > 1e-9:
        assert buckets[-1][1] == pytest.approx(exposed[0][1], rel=1e-9)
    # p2p: on every track a block at a time; each stage receives every transfer its passes wait on
    by_tid: dict[int, list[tuple[float, float]]] = {}
    for tid, _, category, start, end in report.timeline:
        if tid >= P2P_TRACK:
            by_tid.setdefault(tid, []).append((start, end))
    for blocks in by_tid.values():
        blocks.sort()
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(blocks, blocks[1:]))
    p = report.config["pipeline_model_parallel_size"]
    v = report.config["virtual_pipeline_model_parallel_size"] or 1
    received = sum(1 for tid, _, c, _, _ in report.timeline if tid >= TRANSFER_TRACK and c == "p2p")
    assert received == 2 * report.config["num_micro_batches"] * (p * v - 1)
    path = tmp_path / "trace.json"
    write_chrome_trace(report, path)
    names = [e["args"]["name"] for e in json.loads(path.read_text())["traceEvents"] if e["name"] == "thread_name"]
    assert any("exposed communication" in n for n in names)
    assert any("p2p on its critical path" in n for n in names) and any("p2p received" in n for n in names)


def test_critical_path_p2p_beyond_the_idle_time_is_not_counted_as_exposed():
    # two transfers of 1 s on stage 0's critical path, but only 1.5 s idle: 1.5 s exposed, 0.5 s hidden
    transfers = [(1, 0, True, 0, 0, 2.0, 3.0), (1, 0, True, 1, 0, 5.0, 6.0)]
    spans = p2p_spans(transfers, [(0, 1), ()], [1.5, 0.0])
    exposed = [(s, e) for t, _, c, s, e in spans if t == P2P_TRACK and c == "pp_p2p"]
    hidden = [(s, e) for t, _, c, s, e in spans if t == P2P_TRACK and c == "p2p_hidden"]
    assert exposed == [(2.0, 3.0), (5.0, 5.5)] and hidden == [(5.5, 6.0)]
    # overlapping transfers into one stage go to two lanes
    lanes = p2p_spans(transfers + [(1, 0, True, 2, 0, 2.5, 3.5)], [(), ()], [0.0, 0.0])
    assert sorted(t for t, *_ in lanes) == [TRANSFER_TRACK, TRANSFER_TRACK, TRANSFER_TRACK + COMM_TRACK]
