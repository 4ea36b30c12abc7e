"""The Chrome trace names its process and gives every event `args`: stage, micro-batch, chunk, FLOPs, bytes."""

import json

import pytest

from echo_tune.config import ParallelConfig, load_cluster, load_model
from echo_tune.sim.outputs.flops import model_flops_per_step
from echo_tune.sim.simulate import simulate
from echo_tune.sim.outputs.trace_export import write_chrome_trace

MODEL = load_model("llama3.1-8b")


@pytest.mark.parametrize("tp, pp, vpp", [(4, 2, 2), (2, 4, None), (1, 2, None)])
def test_trace_metadata_and_args(tmp_path, tp, pp, vpp):
    parallel = ParallelConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              virtual_pipeline_model_parallel_size=vpp, sequence_parallel=tp > 1,
                              use_distributed_optimizer=True, overlap_grad_reduce=True, global_batch_size=32)
    report = simulate(MODEL, load_cluster("h100"), 16, parallel, timeline=True)
    path = tmp_path / "trace.json"
    write_chrome_trace(report, path)
    events = json.loads(path.read_text())["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    process = [e for e in meta if e["name"] == "process_name"]
    assert len(process) == 1 and "llama3.1-8b" in process[0]["args"]["name"] and f"TP{tp} PP{pp}" in \
        process[0]["args"]["name"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all("stage" in e["args"] and "category" in e["args"] for e in spans)
    passes = [e for e in spans if e["cat"] in ("forward", "backward") and "micro_batch" in e["args"]]
    m = report.config["num_micro_batches"]
    assert {e["args"]["micro_batch"] for e in passes} == set(range(m))
    assert {e["args"]["chunk"] for e in passes} == set(range(vpp or 1))
    assert all(e["args"]["flops"] > 0 and e["args"]["hbm_bytes"] > 0 for e in passes)
    # one micro-batch's forward passes over every stage and chunk hold the model's forward FLOPs (Megatron's
    # count, a third of fwd + bwd), split over TP
    forward = sum(e["args"]["flops"] for e in passes if e["args"]["pass"] == "forward" and e["args"]["micro_batch"] == 0)
    megatron = model_flops_per_step(MODEL, parallel.micro_batch_size, tp) / 3
    assert forward * tp == pytest.approx(megatron, rel=0.01)
    backward = sum(e["args"]["flops"] for e in passes if e["args"]["pass"] == "backward" and e["args"]["micro_batch"] == 0)
    assert backward == pytest.approx(2 * forward, rel=0.05)  # dgrad + wgrad
    p2p = [e for e in spans if e["cat"] in ("p2p", "pp_p2p")]
    assert p2p and all(e["args"]["bytes"] > 0 and "micro_batch" in e["args"] for e in p2p)
    buckets = [e for e in spans if e["cat"] == "dp_bucket"]
    assert buckets and all(e["args"]["bytes"] == e["args"]["params"] * parallel.grad_bytes_per_param
                           for e in buckets)
    comm = [e for e in spans if e["tid"] >= 1000 and e["tid"] < 2000]
    assert (comm or tp == 1) and all("micro_batch" in e["args"] and "pass" in e["args"] for e in comm)
