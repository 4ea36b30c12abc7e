"""A prediction beside what was measured: the fastest published run of the same model on the same GPU.

An error band says how far the simulator was from the runs of a family; it cannot say whether a layout nobody ran
is as fast as predicted. The published runs can at least say what the people who tuned the recipes measured for the
same model on the same GPU. ``anchor`` finds, among the shipped published runs (``error_bands.json``'s ``runs``,
written by ``python -m echo_tune.plan.bands``), those of the same architecture (``arch_key``: layers, widths, heads,
experts, sequence length) on the same GPU preset, and compares time per token per GPU (step x GPUs / (global batch
x sequence length), which a different GPU count or batch leaves comparable under weak scaling) with the fastest of
them. A layout predicted much faster than every measured run of its model is not wrong for that, but the user
should know before booking the GPUs: ``anchor_text`` says it in one line, with the run's name and source.
"""

from __future__ import annotations

from echo_tune.plan.bands_table import load_bands

FASTER_THAN_MEASURED = 0.67
"""A prediction under this share of the fastest measured run's time per token is called out as such."""


def arch_key(model) -> list:
    """What makes two models the same architecture for an anchor (the width of an unused dense MLP left out)."""
    ffn = model.ffn_hidden_size or 4 * model.hidden_size
    moe = model.is_moe
    return [model.num_layers, model.hidden_size, model.num_attention_heads,
            model.num_query_groups or model.num_attention_heads, None if moe else ffn,
            model.num_experts if moe else None, model.moe_router_topk if moe else None,
            (model.moe_ffn_hidden_size or ffn) if moe else None, model.seq_length]


def per_token_gpu_s(step_time_s: float, num_gpus: int, global_batch_size: int, seq_length: int) -> float:
    """Seconds per token per GPU of a step."""
    return step_time_s * num_gpus / (global_batch_size * seq_length)


def anchor_run(case, error_pct: float) -> dict:
    """What ``error_bands.json`` keeps of a validated published run for anchors (``error_pct``: the simulator's error
    on it, out of sample)."""
    return {"name": case.name, "source": _short(case.source or ""), "gpu": case.cluster.gpu.name,
            "arch": arch_key(case.model), "num_gpus": case.num_gpus,
            "precision": "fp4" if getattr(case.parallel, "fp4_format", None) else (
                "fp8" if case.parallel.fp8_format else "bf16"),
            "per_token_gpu_s": per_token_gpu_s(case.measured_step_time_s, case.num_gpus,
                                               case.parallel.global_batch_size, case.model.seq_length),
            "error_pct": error_pct}


def _short(source: str, width: int = 110) -> str:
    """A run's source up to its first ';' (the table and section it came from), at most ``width`` characters."""
    head = source.split(";")[0].strip()
    return head if len(head) <= width else head[:width - 3] + "..."


def anchor(model, gpu: str, num_gpus: int, global_batch_size: int, step_time_s: float,
           runs: list[dict] | None = None) -> dict | None:
    """The fastest published run of ``model``'s architecture on ``gpu`` beside this prediction, or None."""
    if runs is None:
        runs = load_bands().get("runs", [])
    key = arch_key(model)
    same = [r for r in runs if r["gpu"] == gpu and r["arch"] == key]
    if not same or step_time_s is None:
        return None
    best = min(same, key=lambda r: r["per_token_gpu_s"])
    mine = per_token_gpu_s(step_time_s, num_gpus, global_batch_size, model.seq_length)
    return {"gpu": gpu, "run": best["name"], "source": best["source"], "run_num_gpus": best["num_gpus"],
            "run_precision": best["precision"], "n_runs": len(same),
            "measured_per_token_gpu_s": best["per_token_gpu_s"], "run_error_pct": best.get("error_pct"),
            "predicted_per_token_gpu_s": mine, "ratio": mine / best["per_token_gpu_s"]}


def faster_than_measured(a: dict | None) -> bool:
    """Whether a prediction is faster per token than every measured run of its model on its GPU by more than
    ``FASTER_THAN_MEASURED`` allows (``plan`` / ``rank`` note it)."""
    return a is not None and a["ratio"] < FASTER_THAN_MEASURED


def _simulated(a: dict) -> str:
    error = a.get("run_error_pct")
    return "" if error is None else f" (simulated {error:+.0f}% out of sample)"


def anchor_text(a: dict) -> str:
    """One line: the fastest measured run of the model on the GPU, and this prediction against it."""
    text = (f"measured anchor: the fastest of {a['n_runs']} published run(s) of this model on {a['gpu']} "
            f"({a['run']}, {a['run_num_gpus']} GPUs, {a['run_precision']}; {a['source']}) took "
            f"{a['measured_per_token_gpu_s'] * 1e6:.1f} us per token per GPU{_simulated(a)}; this prediction "
            f"{a['predicted_per_token_gpu_s'] * 1e6:.1f} us ({a['ratio']:.2f}x)")
    if faster_than_measured(a):
        text += (f": {1 / a['ratio']:.1f}x faster than any measured run of it on this GPU, a layout the published "
                 f"recipes did not run; weigh it with the error band")
    return text
