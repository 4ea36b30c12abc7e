"""One functional-test launch line through ``echo-tune simulate``'s own path, classified.

The line goes through the simulate CLI's parser and ``specs_from_args`` (echo_tune/cli/common.py) and then
``simulate`` with the CLI's memory headroom, exactly as ``echo-tune simulate --megatron-args LINE --cluster C
--num-gpus N`` runs it, in-process. Outcomes:

- ``simulated``: a step report came back;
- ``refused``: a flag that shapes the step is not modelled (``UnmodelledError``), named by the first such flag;
- ``rejected``: another deliberate one-line error (``ConfigError`` or a usage error): a rule of the layout
  or model, e.g. a missing setting;
- ``error``: anything else, a traceback: a bug.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import re
import shlex
import traceback
from pathlib import Path

OUTCOMES = ("simulated", "refused", "rejected", "error")


@functools.lru_cache(maxsize=1)
def _parser():
    from echo_tune.cli.main import build_parser

    return build_parser()


def refusing_flag(message: str) -> str:
    """The flag an ``UnmodelledError`` names (its first backticked ``--flag``)."""
    match = re.search(r"`(--[A-Za-z0-9][\w-]*)", message)
    return match.group(1) if match else message.split(":")[0]


def blocking_flags(line: str) -> list[str]:
    """Every flag of the line that config/flags/unmodelled.py refuses (not only the first), in line order."""
    from echo_tune.config.launch.megatron_args import ALIASES, LINE_FLAGS, MEGATRON_FLAGS
    from echo_tune.config.flags.unmodelled import refusal

    read = set(MEGATRON_FLAGS) | set(LINE_FLAGS) | set(ALIASES) | {"--bf16", "--fp16", "--checkpoint-activations"}
    tokens = shlex.split(line)
    out = []
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            continue
        flag, _, inline = token.partition("=")
        flag = flag.replace("_", "-")
        if flag in read or flag in out:
            continue
        j = i + 1
        while j < len(tokens) and not tokens[j].startswith("--"):
            j += 1
        if refusal(flag, (inline,) if inline else tuple(tokens[i + 1:j])) is not None:
            out.append(flag)
    return out


def drop_flags(line: str, flags: list[str]) -> str:
    """The line without ``flags`` and the values that follow each of them."""
    tokens, out, skipping = shlex.split(line), [], False
    for token in tokens:
        if token.startswith("--"):
            skipping = token.partition("=")[0].replace("_", "-") in flags
        if not skipping:
            out.append(shlex.quote(token))
    return " ".join(out)


def simulate_line(line: str, cluster: str, num_gpus: int) -> dict:
    """Run one line as ``echo-tune simulate`` would; a JSON-able record of the outcome and the prediction."""
    from echo_tune.cli.common import specs_from_args
    from echo_tune.cli.simulate import DEFAULT_MODEL
    from echo_tune.config.load.loading import load_cluster
    from echo_tune.config.flags.unmodelled import UnmodelledError
    from echo_tune.errors import ConfigError
    from echo_tune.sim.memory.stage import DEFAULT_MEMORY_HEADROOM_GIB
    from echo_tune.sim.simulate import simulate

    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            args = _parser().parse_args(["simulate", "--megatron-args", line, "--cluster", cluster,
                                         "--num-gpus", str(num_gpus)])
        model, parallel, _ = specs_from_args(args, default_model=DEFAULT_MODEL)
        report = simulate(model, load_cluster(cluster), num_gpus, parallel,
                          memory_headroom_bytes=int(DEFAULT_MEMORY_HEADROOM_GIB * 2**30))
    except UnmodelledError as exc:
        return {"outcome": "refused", "flag": refusing_flag(str(exc)), "reason": str(exc),
                "blocking_flags": blocking_flags(line)}
    except ConfigError as exc:
        return {"outcome": "rejected", "reason": str(exc)}
    except SystemExit:
        return {"outcome": "rejected", "reason": usage.getvalue().strip() or "usage error"}
    except Exception as exc:  # noqa: BLE001 - anything else is a bug to list
        return {"outcome": "error", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    last = report.stage_memory[-1]  # Megatron logs memory on the last rank: the last pipeline stage
    return {"outcome": "simulated", "step_time_s": report.step_time_s, "fits_memory": report.fits_memory,
            # torch's allocated bytes: after a step the activations are freed (static state and workspaces),
            # its peak adds them; neither counts the runtime reserve outside the caching allocator (sim/memory/stage.py)
            "mem_allocated_bytes": last.steady_bytes, "mem_max_allocated_bytes": last.total_bytes - last.reserve_bytes}


def code_hash() -> str:
    """A digest of the imported echo-tune's sources and presets: cached outcomes are reused only for the
    same code."""
    import echo_tune

    package = Path(echo_tune.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yaml", ".json", ".csv"):
            digest.update(str(path.relative_to(package)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class OutcomeCache:
    """Outcomes per (line, cluster, GPUs) on disk, one JSON file per code digest."""

    def __init__(self, folder: Path | None):
        self.path = None if folder is None else folder / f"functional-coverage-{code_hash()}.json"
        self.data: dict[str, dict] = {}
        if self.path is not None and self.path.exists():
            with contextlib.suppress(ValueError, OSError):
                self.data = json.loads(self.path.read_text())

    def outcome(self, line: str, cluster: str, num_gpus: int) -> dict:
        key = hashlib.sha256(json.dumps([line, cluster, num_gpus]).encode()).hexdigest()
        if key not in self.data:
            self.data[key] = simulate_line(line, cluster, num_gpus)
        return self.data[key]

    def save(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data))
