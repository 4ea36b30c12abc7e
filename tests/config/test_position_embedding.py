"""--position-embedding-type yarn: RoPE with rescaled frequencies, costed with rope's kernels."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError
from echo_tune.workload.tracer import trace_layer

LLAMA = et.load_model("llama3-8b").replace(num_layers=2, seq_length=1024)


def test_yarn_is_read_from_a_megatron_line():
    model, _, _, _ = parse_megatron_line("--position-embedding-type yarn --num-layers 2")
    assert model["position_embedding_type"] == "yarn"
    assert LLAMA.replace(position_embedding_type="yarn").rotary
    with pytest.raises(ConfigError, match="position_embedding_type"):
        LLAMA.replace(position_embedding_type="alibi")


def test_yarn_traces_the_rope_kernels():
    rope = trace_layer(LLAMA.replace(position_embedding_type="rope"), tensor_model_parallel_size=1)
    yarn = trace_layer(LLAMA.replace(position_embedding_type="yarn"), tensor_model_parallel_size=1)
    none = trace_layer(LLAMA.replace(position_embedding_type="none"), tensor_model_parallel_size=1)
    names = [op.name for op in yarn.forward + yarn.backward]
    assert names == [op.name for op in rope.forward + rope.backward]
    assert any("rope" in name for name in names)  # q and k rotated: not the no-position path
    assert len(names) > len(none.forward + none.backward)
    assert yarn.activation_bytes == rope.activation_bytes
