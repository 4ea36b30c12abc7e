"""`echo-tune profile` with a shape too large for the device (issue 41): refused in one line, with the op, its
size, the free memory and the fix, before any tensor is allocated or any file written; an allocator refusal
while a micro-batch runs in place is one line too, never a RuntimeError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.optime import measure
from echo_tune.optime.collect import OpInstance
from echo_tune.workload.recording.opkey import op_key

DATA = Path(__file__).parents[1] / "data"
CPU = torch.device("cpu")
UNFUSED = """num_layers: 2
hidden_size: 256
num_attention_heads: 4
ffn_hidden_size: 512
seq_length: 256
vocab_size: 1000
use_flash_attn: false
"""
SMALL = ["--model", str(DATA / "tiny-llama.yaml"), "--cluster", str(DATA / "cpu-cluster.yaml"), "--num-gpus", "2",
         "--tensor-model-parallel-size", "2", "--global-batch-size", "2", "--fp32", "--seq-length", "64",
         "--hidden-size", "64", "--ffn-hidden-size", "128", "--threads", "1", "--quiet", "--json"]


def _mm_key(n: int, dtype=torch.bfloat16) -> str:
    a = torch.empty(n, n, dtype=dtype, device="meta")
    return op_key(torch.ops.aten.mm.default, (a, a), {})


def _refusal(capsys, argv) -> str:
    threads = torch.get_num_threads()
    try:
        assert main(argv) == 2
    finally:
        torch.set_num_threads(threads)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and out == "", err
    return lines[0]


def test_memory_needed_counts_inputs_their_float32_draw_outputs_and_the_flush():
    n = 1024
    half = n * n * 2
    assert measure.memory_needed(_mm_key(n), CPU) == 2 * half + 2 * half + half + measure.flush_bytes(CPU)
    single = n * n * 4  # float32 inputs are drawn as they are: no extra copy
    assert measure.memory_needed(_mm_key(n, torch.float32), CPU) == 3 * single + measure.flush_bytes(CPU)
    cuda = torch.device("cuda")  # the flush buffer is CUDA's 256 MiB (no CUDA needed: outputs come from meta)
    assert measure.memory_needed(_mm_key(n), cuda) == 5 * half + measure.CUDA_FLUSH_BYTES


def test_available_memory_is_the_hosts_on_cpu_and_cudas_free_memory(monkeypatch):
    free = measure.available_memory(CPU)
    assert free is not None and 2**20 < free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * 2**30, 80 * 2**30))
    assert measure.available_memory(torch.device("cuda", 0)) == 3 * 2**30


def test_check_fits_names_the_largest_op_its_size_and_the_fix(monkeypatch):
    ops = [OpInstance(key=_mm_key(n), name="aten.mm", kind="gemm", flops=2.0 * n**3, bytes=6.0 * n * n)
           for n in (256, 8192, 1024)]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**29, 80 * 2**30))
    with pytest.raises(ConfigError) as caught:
        measure.check_fits(ops, torch.device("cuda"))
    message = str(caught.value)
    assert "\n" not in message and "`op memory <= free memory` must hold" in message
    # 5 x 128 MiB (inputs, one input's float32 draw, output) and CUDA's 256 MiB flush: 896 MiB
    assert "op=aten.mm.default, shapes=8192x8192;8192x8192 bfloat16, op memory=0.88 GiB, free memory on cuda=0.50 GiB" \
        in message
    assert "a smaller --seq-length or --micro-batch-size" in message
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    measure.check_fits(ops, torch.device("cuda"))  # 1 GiB free: fits
    measure.check_fits([], torch.device("cuda"))


def test_a_million_token_sequence_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.yaml").write_text(UNFUSED)
    line = _refusal(capsys, ["profile", "--model", "model.yaml", "--cluster", str(DATA / "cpu-cluster.yaml"),
                             "--num-gpus", "1", "--global-batch-size", "1", "--seq-length", "1048576",
                             "--device", "cpu", "--threads", "1", "--quiet"])
    assert line.startswith("echo-tune profile: error: `op memory <= free memory` must hold")
    assert "shapes=4x1048576x1048576" in line and "free memory on cpu=" in line and "--seq-length" in line
    assert list(tmp_path.iterdir()) == [tmp_path / "model.yaml"]  # no database, no profile


def test_a_shape_over_the_free_memory_is_refused_and_a_small_one_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(measure, "available_memory", lambda device: 2**20)  # 1 MiB free
    line = _refusal(capsys, ["profile", *SMALL])
    assert "free memory on cpu=0.00 GiB" in line and not (tmp_path / "calibration").exists()
    monkeypatch.setattr(measure, "available_memory", lambda device: 2**40)
    threads = torch.get_num_threads()
    try:
        assert main(["profile", *SMALL]) == 0
    finally:
        torch.set_num_threads(threads)
    assert json.loads(capsys.readouterr().out)["measured"] > 0


def test_an_allocator_refusal_in_place_is_one_line(tmp_path, monkeypatch, capsys):
    from echo_tune.optime import profiler

    def refuse(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 35184372088832 bytes. Error code 12")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiler, "profile_layouts", refuse)
    line = _refusal(capsys, ["profile", *SMALL])
    assert "`a micro-batch's tensors <= free memory` must hold to run it in place" in line
    assert "can't allocate memory: you tried to allocate 35184372088832 bytes" in line and "--seq-length" in line
    monkeypatch.setattr(profiler, "profile_layouts", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):  # any other failure is not dressed up as a memory limit
        main(["profile", *SMALL])
