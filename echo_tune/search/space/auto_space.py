"""A search space from a model, a cluster, a GPU count and a global batch size: no YAML needed.

``echo-tune search --model M --cluster C --num-gpus N --global-batch-size G`` (and ``echo-tune plan``)
build their space here. The values searched are every value the rules allow, with these caps, which keep
the sampler's trials on layouts people run (stated in ``--help`` by ``CAPS_HELP``):

- micro-batch size: divisors of the global batch up to ``MAX_MICRO_BATCH`` (8): larger micro-batches
  only grow activation memory once the GEMMs are large (tokens per micro-batch = mbs x seq_length);
- context parallel: up to ``MAX_CONTEXT_PARALLEL`` (8) and at least ``MIN_TOKENS_PER_CP_RANK`` (1024)
  tokens per CP rank, as Megatron splits the sequence into 2 x CP chunks for load balance;
- TP inside one NVLink domain; PP dividing the GPUs, with the even split where PP divides the layers and
  otherwise a few canonical uneven splits (decoder_first/last_pipeline_num_layers or the
  account_for_embedding/loss_in_pipeline_split flags, search/space/uneven.py); VPP every value dividing every
  stage's layers;
- sequence parallel, the distributed optimizer and both DP overlaps on (Megatron-LM's recommended
  performance flags: docs of ``--overlap-grad-reduce``/``--overlap-param-gather``, d98e8a64ddf3);
  ``--tp-comm-overlap`` off and on; recompute none, selective or full (uniform, one layer);
- MoE: EP every divisor of the expert count, ETP = TP or 1.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import yaml

from echo_tune.config.load.hf_config import load_hf_config
from echo_tune.config.load.loading import load_cluster, load_model
from echo_tune.errors import ConfigError
from echo_tune.io import write_text
from echo_tune.search.space.auto_values import (MAX_CONTEXT_PARALLEL, MAX_MICRO_BATCH, MIN_TOKENS_PER_CP_RANK,
                                          context_parallel_values, micro_batch_values)
from echo_tune.search.space.fields import LAYOUT_FIELDS
from echo_tune.search.space.recipe_defaults import recipe_features
from echo_tune.search.space.search_space import SearchSpace, space_from_dict

CAPS_HELP = (f"the space searched: TP inside a node, PP (uneven first/last stages where it does not divide the "
             f"layers), VPP, CP up to {MAX_CONTEXT_PARALLEL} "
             f"(at least {MIN_TOKENS_PER_CP_RANK} tokens per CP rank), micro-batch 1-{MAX_MICRO_BATCH} dividing the "
             f"global batch, recompute none/selective/full, TP-comm overlap off/on, sequence parallel, distributed "
             f"optimizer and DP overlaps on; MoE: EP every divisor of the experts, ETP = TP or 1; FP8 by --fp8-format "
             f"(auto: BF16 and FP8 hybrid where the GPU has FP8 tensor cores, with the delayed and tensorwise "
             f"recipes); recipe features: MoE dispatcher alltoall/flex (deepep, hybridep), EP overlap with or "
             f"without delayed wgrad, recompute-module sets, the shared-expert and optimizer-step overlaps and MoE "
             f"fusions on (search/space/recipe_defaults.py); any other setting a space file can search by --layout "
             f"FIELD=VALUES (pipeline_model_parallel_layout=auto, cuda_graph_impl=none,transformer_engine, ...)")


FP8_CHOICES = ("auto", "hybrid", "e4m3", "none")
"""``--fp8-format`` of ``search`` (zero-YAML) and ``plan``: auto searches BF16 and FP8 hybrid where the GPU has
FP8 tensor cores; hybrid or e4m3 fixes the format; none trains in BF16 (Megatron-LM's --fp8-format takes
e4m3 or hybrid, d98e8a64ddf3 megatron/training/arguments.py)."""


def fp8_layout_value(fp8_format: str, cluster_spec, cluster: str):
    """The space file's ``fp8_format`` value for a ``--fp8-format`` choice: None (leave it out), "auto" or a
    format; a fixed FP8 format on a GPU without FP8 tensor cores is refused in one line."""
    if fp8_format not in FP8_CHOICES:
        raise ConfigError(f"`--fp8-format` must be one of {list(FP8_CHOICES)}, but got ({fp8_format!r})")
    if fp8_format == "none":
        return None
    if cluster_spec.gpu.peak_fp8_tflops is None:
        if fp8_format == "auto":
            return None  # auto: BF16 alone where the GPU has no FP8 tensor cores
        raise ConfigError(f"FP8 needs FP8 tensor cores, but {cluster!r} has {cluster_spec.gpu.name} (no "
                          f"peak_fp8_tflops); drop fp8 for this cluster or pick an H100, H200 or B200")
    return fp8_format


def layout_overrides(items: list[str] | None) -> dict:
    """``--layout FIELD=VALUES`` items as a space file's ``layout:`` entries: ``recompute_method=auto``,
    ``context_parallel_size=1,2``, ``tp_comm_overlap=true`` (each value read as YAML; several values listed)."""
    out = {}
    for item in items or ():
        field_name, sep, text = str(item).partition("=")
        field_name = field_name.strip().replace("-", "_")
        if not sep or not text.strip():
            raise ConfigError(f"`--layout` takes FIELD=VALUES such as recompute_method=auto or "
                              f"context_parallel_size=1,2, but got ({item!r})")
        if field_name not in LAYOUT_FIELDS:
            raise ConfigError(f"`--layout` field must be a searched setting, one of {list(LAYOUT_FIELDS)}, but got "
                              f"({field_name!r})")
        values = [yaml.safe_load(v.strip()) for v in text.split(",")]
        out[field_name] = values[0] if len(values) == 1 else values
    return out


def load_model_at(model: str, seq_length: int | None = None):
    """A model reference with an optional training length (a config.json is re-read with it, so its
    sliding-window check sees the length trained)."""
    if seq_length is None:
        return load_model(model)
    if seq_length <= 0:
        raise ConfigError(f"`--seq-length > 0` must hold, but got ({seq_length})")
    if str(model).endswith(".json"):
        return load_hf_config(model, seq_length=seq_length)
    return load_model(model).replace(seq_length=seq_length)


def auto_space_dict(model: str, cluster: str, num_gpus: int, global_batch_size: int, *,
                    name: str | None = None, gpu_hour_cost: float | None = None, fp8_format: str = "none",
                    seq_length: int | None = None, layout: dict | None = None) -> dict:
    """The mapping of a space file (what ``--write-space`` saves); values listed, caps applied. With
    ``seq_length`` the model is written as its full mapping of fields (the length changed).

    ``fp8_format`` (FP8_CHOICES): ``none`` trains the GEMMs in BF16; ``hybrid`` or ``e4m3`` fixes that FP8
    format (refused on a GPU without FP8 tensor cores); ``auto`` searches BF16 and FP8 hybrid where the GPU has
    FP8 tensor cores and BF16 alone where it has not. ``layout``: entries that replace the built ones
    (``layout_overrides``), so any setting a space file can search can be searched here too."""
    spec = load_model_at(model, seq_length)
    cluster_spec = load_cluster(cluster)  # fail early on a bad cluster, with its one-line error
    fp8_value = fp8_layout_value(fp8_format, cluster_spec, cluster)
    # context parallelism runs only on flash-style attention (config/rules/compatibility.py): none for a model without it
    cp = list(context_parallel_values(num_gpus, spec.seq_length)) if spec.flash_attention else [1]
    mbs = list(micro_batch_values(global_batch_size))
    is_file = model.endswith((".json", ".yaml", ".yml")) or "/" in model
    if is_file:  # an absolute path, so the written space file works from any folder
        model = str(Path(model).resolve())
    stem = (Path(model).parent.name if model.endswith("config.json") else Path(model).stem) if is_file else model
    layout_values = {
        "tensor_model_parallel_size": "auto", "pipeline_model_parallel_size": "auto", "context_parallel_size": cp,
        "micro_batch_size": mbs, "virtual_pipeline_model_parallel_size": "auto", "sequence_parallel": True,
        "tp_comm_overlap": [False, True], "recompute_granularity": ["none", "selective", "full"],
        "use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
        "decoder_first_pipeline_num_layers": "auto", "decoder_last_pipeline_num_layers": "auto",
        "account_for_embedding_in_pipeline_split": "auto", "account_for_loss_in_pipeline_split": "auto",
    }
    if spec.is_moe:
        layout_values["expert_model_parallel_size"] = "auto"
        layout_values["expert_tensor_parallel_size"] = ["none", 1]
    if fp8_value is not None:
        layout_values["fp8_format"] = fp8_value
    layout_values.update(recipe_features(spec, cluster_spec, fp8_value is not None))
    if layout:
        layout_values.update(layout)
        if "cuda_graph_impl" in layout and "cuda_graph_modules" not in layout:  # what to capture, searched too
            layout_values["cuda_graph_modules"] = "auto"  # (MoE layers need modules: schedule_rules.py)
        stem = f"{stem}-x{hashlib.sha256(repr(sorted(layout.items())).encode()).hexdigest()[:6]}"
    cluster_stem = Path(cluster).stem if cluster.endswith((".yaml", ".yml")) else cluster
    if seq_length is not None:
        stem = f"{stem}-seq{seq_length}"
    if fp8_value is not None:  # its own study: a BF16 study of the same model and cluster is not resumed
        stem = f"{stem}-fp8{fp8_value}"
    data = {"name": name or f"{stem}-{num_gpus}x{cluster_stem}",
            "description": f"built by echo-tune from --model {model} --cluster {cluster} --num-gpus {num_gpus} "
                           f"--global-batch-size {global_batch_size}" + "".join(
                               f" --layout {k}={v}" for k, v in (layout or {}).items()),
            "model": model if seq_length is None else dataclasses.asdict(spec), "cluster": cluster, "num_gpus": num_gpus, "global_batch_size": global_batch_size,
            "precision": "bf16", "objectives": ["step_time"], "layout": layout_values}
    if gpu_hour_cost is not None:
        data["gpu_hour_cost"] = gpu_hour_cost
    return data


def auto_space(model: str, cluster: str, num_gpus: int, global_batch_size: int, **kw) -> SearchSpace:
    data = auto_space_dict(model, cluster, num_gpus, global_batch_size, **kw)
    return space_from_dict(data, name=data["name"], source=data["name"])


def write_space(data: dict, path: str | Path) -> Path:
    """Save a space mapping as a YAML file a user can edit and pass back to ``echo-tune search``."""
    path = Path(path)
    head = (f"# {data['description']}\n# {CAPS_HELP}\n# Edit the values and run: echo-tune search {path.name}\n")
    return write_text(path, head + yaml.safe_dump(data, sort_keys=False), "--write-space file")
