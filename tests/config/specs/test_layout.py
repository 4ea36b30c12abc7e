"""The checked spec (config/specs/layout.py): check_compatible resolves the rules' decisions once, into the Layout the
simulator reads (CUDA graphs as Megatron resolves the flags, whether TP overlap reaches the linears, the notes)."""

import dataclasses

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible

TINY = et.load_model("tests/data/tiny-llama.yaml")  # 4 layers, h 256, seq 256, vocab 1000
H100 = et.load_cluster("h100-sxm")
BASE = et.ParallelConfig(global_batch_size=8)


def test_cuda_graphs_as_megatron_resolves_the_flags():
    assert check_compatible(TINY, H100, 1, BASE).cuda_graphs == ("none", ())
    # --enable-cuda-graph is the local implementation (training/arguments.py validate_args)
    assert check_compatible(TINY, H100, 1, BASE.replace(enable_cuda_graph=True)).cuda_graphs == ("local", ())
    # --cuda-graph-scope is --cuda-graph-modules' old name; "full" alone is the whole layer (no module list)
    scoped = BASE.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    assert check_compatible(TINY, H100, 1, scoped).cuda_graphs == ("transformer_engine", ("attn",))
    full = BASE.replace(cuda_graph_impl="local", cuda_graph_scope=("full",))
    assert check_compatible(TINY, H100, 1, full).cuda_graphs == ("local", ())


def test_tp_overlap_reaches_the_linears_except_with_mla():
    tp2 = BASE.replace(tensor_model_parallel_size=2, sequence_parallel=True, tp_comm_overlap=True)
    layout = check_compatible(TINY, H100, 2, tp2)
    assert layout.tp_comm_overlap is True and layout.notes == ()
    assert check_compatible(TINY, H100, 2, tp2.replace(tp_comm_overlap=False)).tp_comm_overlap is False
    mla = dataclasses.replace(TINY, multi_latent_attention=True, kv_lora_rank=64, qk_head_dim=32,
                              qk_pos_emb_head_dim=16, v_head_dim=32)
    layout = check_compatible(mla, H100, 2, tp2)
    assert layout.tp_comm_overlap is False
    assert len(layout.notes) == 1 and "multi-latent attention" in layout.notes[0]
