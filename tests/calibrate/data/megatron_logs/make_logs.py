"""Write the Megatron-LM log fixtures of tests/calibrate/test_megatron_real_logs.py with Megatron-LM's own code.

    python tests/calibrate/data/megatron_logs/make_logs.py --megatron /path/to/Megatron-LM   # at d98e8a64ddf3
    python tests/calibrate/data/megatron_logs/make_logs.py --megatron /path/to/Megatron-LM --defaults

The argument dump of each log is what Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 prints on rank 0: this
script runs its ``parse_and_validate_args`` (pretrain_gpt.py's ``args_defaults``) on the launch line of
examples/llama/train_llama3_8b_h100_fp8.sh at that commit with DTYPE=bf16 (the script's bf16 branch: no FP8
flags), on 8 GPUs (WORLD_SIZE=8, RANK=0), and keeps its stdout: ``_print_args`` prints every argument, defaults
included. Variants: the script's line (TP1 CP1, ``--attention-backend fused``); CP2 without
``--attention-backend`` (auto, Megatron's default); TP2 (with the script's ``--sequence-parallel``); and the
script as shipped, DTYPE=fp8 (its four FP8 flags), which the tests read but do not fit. No GPU is
needed: modules that import triton are stubbed (none of them touches argument parsing) and the device reports
sm_90, as an H100 does (validate_args reads the device arch when TP or CP > 1).

Iteration lines follow training.py ``training_log`` at the same commit, with ``--log-interval 1`` and
``--log-throughput`` as in the script (throughput from its ``num_floating_point_operations``). Step times are
not measurements of these exact runs: the CP2 run's median is the 12.91 s dgxc-benchmarking v24.11.1 publishes
for Llama 3.1 8B BF16, TP1 PP1 CP2, MBS 1, GBS 128, seq 8192 on 8 H100 (calibration/published-runs/
runs_modern.csv, dgxc2411-llama31-8b-bf16-8gpu); CP1 and TP2 are set 2% below and 4% above it; the FP8 run's is
the 9.67 s published there for FP8 (delayed scaling, CP2), as a representative number only. Each iteration
varies by a fixed pattern of +-0.4%; the first iteration carries start-up.

``--defaults`` prints megatron_dump.DEFAULTS: argparse's default of every argument whose flag echo-tune classes
as step-shaping, out of scope or value-ruled, where that default is neither None nor False.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import logging
import subprocess
import os
import shlex
import sys
import types
import typing
from pathlib import Path
from unittest import mock

HERE = Path(__file__).resolve().parent
# modules that import triton at import time (megatron.core imports them; argument parsing never calls them)
TRITON_MODULES = {"megatron.core.transformer.moe.ops.paged_stash", "megatron.core.ssm.ops.common.causal_conv1d_varlen",
                  "megatron.core.ssm.ops.mamba2.batch_invariant_decode"}
RECIPE = ("--use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
          "--group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 "
          "--max-position-embeddings 8192 --position-embedding-type rope --rotary-base 1000000 --rotary-percent 1.0 "
          "--attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --normalization RMSNorm --init-method-std 0.0134 "
          "--attention-backend fused --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear "
          "--micro-batch-size 1 --global-batch-size 128 --train-samples 1953125000 --lr-decay-samples 1949218748 "
          "--lr-warmup-samples 3906252 --lr 0.00015 --min-lr 0.00001 --decoupled-lr 5.0e-4 --decoupled-min-lr 4.5e-5 "
          "--lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16 "
          "--grad-reduce-in-bf16 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc "
          "--empty-unused-memory-level 1 --exit-duration-in-mins 235 --use-distributed-optimizer --overlap-grad-reduce "
          "--overlap-param-gather --tensor-model-parallel-size 1 --context-parallel-size 1 --sequence-parallel "
          "--mock-data --tokenizer-type NullTokenizer --vocab-size 128256 "
          "--data-cache-path /workspace/Megatron-LM/benchmark_cache_llama3_8b_bf16 --tiktoken-pattern v2 "
          "--split '99,1,0' --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1 "
          "--log-interval 1 --eval-iters 32 --eval-interval 100 --save-interval 1000 --log-throughput "
          "--ckpt-format torch_dist --distributed-timeout-minutes 60 --save checkpoints/llama3_8b_bf16 "
          "--load checkpoints/llama3_8b_bf16 --tensorboard-dir tensorboard_logs/llama3_8b_bf16")
LOGS = {  # file -> (launch line, median step ms)
    "llama3_8b_bf16_tp1cp1_8xh100.log": (RECIPE, 12650.0),
    "llama3_8b_bf16_tp1cp2_8xh100.log": (RECIPE.replace("--attention-backend fused ", "").replace(
        "--context-parallel-size 1", "--context-parallel-size 2"), 12910.0),
    "llama3_8b_bf16_tp2cp1_8xh100.log": (RECIPE.replace("--tensor-model-parallel-size 1",
                                                        "--tensor-model-parallel-size 2"), 13430.0),
    # the script as shipped (DTYPE=fp8): its FP8 flags
    "llama3_8b_fp8_tp1cp1_8xh100.log": (RECIPE.replace("--bf16 ", "--bf16 --fp8-format hybrid --fp8-amax-history-len "
                                                       "1024 --fp8-amax-compute-algo max --fp8-param-gather "), 9670.0),
}
JITTER = (0.0, 0.003, -0.002, 0.004, -0.004, 0.001, -0.001, 0.002, -0.003, 0.0)
ITERATIONS = 30


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if name in TRITON_MODULES else None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__name__ = [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


def _megatron(root: Path):
    sys.meta_path.insert(0, _Stub())
    if not hasattr(typing, "override"):  # Python < 3.12
        typing.override = lambda f: f
    sys.path.insert(0, str(root))
    import torch

    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0)
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    os.environ.update(WORLD_SIZE="8", RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    import megatron.training.utils as utils

    utils.is_rank0 = lambda: True


def dump(line: str):
    """(stdout of parse_and_validate_args, the args) for a launch line."""
    from megatron.training.arguments import parse_and_validate_args

    sys.argv = ["pretrain_gpt.py", *shlex.split(line)]
    out = io.StringIO()
    handlers = [h for h in logging.root.handlers if isinstance(h, logging.StreamHandler)]
    streams = [h.setStream(out) for h in handlers]  # Megatron's logging (INFO lines) goes to stdout too
    with contextlib.redirect_stdout(out):
        args = parse_and_validate_args(args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
    for handler, stream in zip(handlers, streams):
        handler.setStream(stream)
    return out.getvalue(), args


def iteration_lines(args, median_ms: float) -> list[str]:
    from megatron.training.training import num_floating_point_operations

    args.train_iters = args.train_samples // args.global_batch_size  # training.py update_train_iters
    flops = num_floating_point_operations(args, args.global_batch_size)
    lines = []
    for i in range(1, ITERATIONS + 1):
        ms = median_ms * (2.31 if i == 1 else 1 + JITTER[i % len(JITTER)])
        samples = i * args.global_batch_size
        lr = args.lr * samples / args.lr_warmup_samples
        loss = 11.76 - 0.045 * i
        lines.append(f" [2026-08-25 10:{14 + i // 4:02d}:{(i * 13) % 60:02d}.{(i * 7919) % 1000000:06d}] iteration "
                     f"{i:8d}/{args.train_iters:8d} | consumed samples: {samples:12d} | elapsed time per iteration "
                     f"(ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {flops / (ms / 1000 * 1e12 * 8):.1f} | "
                     f"learning rate: {lr:.6E} | global batch size: {args.global_batch_size:5d} | lm loss: "
                     f"{loss:.6E} | loss scale: 1.0 | grad norm: {9.8 / i ** 0.5:.3f} | number of skipped "
                     f"iterations: {0:3d} | number of nan iterations: {0:3d} |")
    return lines


def write_logs(megatron: Path) -> None:
    for name in LOGS:  # one process each: parse_and_validate_args sets process-wide state once
        subprocess.run([sys.executable, __file__, "--megatron", str(megatron), "--one", name], check=True)


def write_log(name: str) -> None:
    line, median_ms = LOGS[name]
    text, args = dump(line)
    lines = ["> PyTorch version ................ 2.8.0a0+5228986c39.nv25.06",
             "> Megatron-Core version .......... 0.16.0rc0", *text.splitlines(),
             "> initializing torch distributed ...", "> setting random seeds to 1234 ...",
             "building GPT model ...",
             " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
             f"{8030261248 // args.tensor_model_parallel_size}",
             "[after model, optimizer, and learning rate scheduler are built] datetime: 2026-08-25 10:13:51",
             "[after dataloaders are built] datetime: 2026-08-25 10:14:02", "training ...",
             "[before the start of training step] datetime: 2026-08-25 10:14:02",
             *iteration_lines(args, median_ms)]
    (HERE / name).write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / name}")


def print_defaults() -> None:
    from megatron.training.arguments import add_megatron_arguments

    sys.path.insert(0, str(HERE.parents[3]))
    from echo_tune.config.flags.flag_catalog import megatron_flags
    from echo_tune.config.flags.unmodelled import STEP_SHAPING_FLAGS

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    defaults = {a.dest: str(a.default) for a in reversed(parser._actions)}
    dests = {megatron_flags()[f]["dest"] for f in STEP_SHAPING_FLAGS if f in megatron_flags()}
    print({d: defaults[d] for d in sorted(dests) if d in defaults and defaults[d] not in ("None", "False")})


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--megatron", type=Path, required=True, help="a Megatron-LM checkout at d98e8a64ddf3")
    cli.add_argument("--defaults", action="store_true", help="print megatron_dump.DEFAULTS instead")
    cli.add_argument("--one", choices=sorted(LOGS), help=argparse.SUPPRESS)
    options = cli.parse_args()
    if options.one or options.defaults:
        _megatron(options.megatron)
    if options.defaults:
        print_defaults()
    elif options.one:
        write_log(options.one)
    else:
        write_logs(options.megatron)
