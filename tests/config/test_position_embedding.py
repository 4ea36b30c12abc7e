"""--position-embedding-type yarn: RoPE with rescaled frequencies, costed with rope's kernels."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError
from echo_tune.workload.tracer import trace_layer

LLAMA = et.load_model("llama3-8b").replace(num_layers=2, seq_length=1024)


def test_yarn_is_read_from_a_megatron_line():
    model, _, _, _ = parse_megatron_line("--position-embedding-type yarn --num-layers 2")
    assert model["position_embedding_type"] == "yarn"
    assert LLAMA.replace(position_embedding_type="yarn").rotary
    with pytest.raises(ConfigError, match="position_embedding_type"):
        LLAMA.replace(position_embedding_type="alibi")


def test_yarn_traces_the_unfused_rope_kernels():
    # Megatron-LM arguments.py: `if args.position_embedding_type != 'rope': args.apply_rope_fusion = False`
    fused = trace_layer(LLAMA.replace(position_embedding_type="rope"), tensor_model_parallel_size=1)
    unfused = trace_layer(LLAMA.replace(position_embedding_type="rope", apply_rope_fusion=False),
                          tensor_model_parallel_size=1)
    yarn = trace_layer(LLAMA.replace(position_embedding_type="yarn"), tensor_model_parallel_size=1)
    none = trace_layer(LLAMA.replace(position_embedding_type="none"), tensor_model_parallel_size=1)
    names = [op.name for op in yarn.forward + yarn.backward]
    assert names == [op.name for op in unfused.forward + unfused.backward]
    assert names != [op.name for op in fused.forward + fused.backward]
    assert "echo_tune.rope" not in names and "echo_tune.rope" in [op.name for op in fused.forward]
    assert len(names) > len(none.forward + none.backward)  # q and k rotated: not the no-position path
    assert yarn.activation_bytes == unfused.activation_bytes
