"""Op keys: the same op instance has the same key on meta and on a real device, and rebuilds to itself."""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import echo_tune as et
from echo_tune.workload import trace_layer
from echo_tune.workload.recording.opkey import key_summary, materialize, op_key, parse_key, resolve_op

from .conftest import MODEL


def test_key_names_op_shapes_strides_dtype_and_scalars():
    a, b = torch.empty(4, 8, device="meta"), torch.empty(3, 8, device="meta", dtype=torch.float32)
    key = op_key(torch.ops.aten.addmm.default, (torch.empty(3, device="meta"), a, b.t()), {"beta": 0.5})
    name, args, kwargs = parse_key(key)
    assert name == "aten.addmm.default" and kwargs == {"beta": 0.5}
    assert args[2] == {"t": [8, 3], "s": [1, 8], "d": "float32"}
    assert key_summary(key) == ("aten.addmm.default", "3;4x8;8x3", "float32")
    assert op_key(torch.ops.aten.addmm.default, (torch.empty(3, device="meta"), a, b.t().contiguous()), {}) != \
        op_key(torch.ops.aten.addmm.default, (torch.empty(3, device="meta"), a, b.t()), {})


def test_size_one_dimensions_do_not_split_keys():
    x = torch.empty(256, 1, 64)
    odd = x.as_strided((256, 1, 64), (64, 999, 1))  # same layout in memory, another stride on the size-1 dim
    assert x.stride() != odd.stride()
    assert op_key(torch.ops.aten.relu.default, (x,), {}) == op_key(torch.ops.aten.relu.default, (odd,), {})


def test_meta_and_cpu_agree_and_materialized_calls_keep_their_key():
    class Keys(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.keys = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.keys.append(op_key(func, args, kwargs or {}))
            return func(*args, **(kwargs or {}))

    def run(device):
        x = torch.randn(6, 2, 8).to(device).requires_grad_()
        w = torch.randn(16, 8).to(device).requires_grad_()
        with Keys() as mode:
            torch.nn.functional.gelu(x @ w.t()).sum().backward()
        return mode.keys

    assert run("meta") == run("cpu")
    for key in run("cpu"):
        name, args, kwargs = parse_key(key)
        real_args, real_kwargs = materialize(args, torch.device("cpu")), materialize(kwargs, torch.device("cpu"))
        assert op_key(resolve_op(name), tuple(real_args), real_kwargs) == key


def test_traced_ops_carry_keys_and_collectives_none():
    model = et.load_model(str(MODEL))
    trace = trace_layer(model, tensor_model_parallel_size=2)
    ops = trace.forward + trace.backward
    assert all((op.key == "") == (op.kind == "collective") for op in ops)
    assert any(op.kind == "collective" for op in ops)
    assert json.loads(next(op.key for op in ops if op.kind == "gemm"))[0] == "aten.mm.default"
