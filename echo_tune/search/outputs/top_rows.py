"""The rows of the search's table of best layouts: one per layout and its variants in virtual pipeline stages and
recompute (a structure's batch settings that change memory for time), its best one shown with what they span.

Listed one by one, the variants of one layout filled the table: the interleaving and recompute settings of the
best few layouts often differ by a fraction of a percent, and the next layout worth reading was off the page.
"""

from __future__ import annotations

from echo_tune.search.space.layouts import config_key

VARIANT_FIELDS = ("virtual_pipeline_model_parallel_size", "recompute_granularity", "recompute_method",
                  "recompute_num_layers", "recompute_modules")


def variant_group(config: dict) -> tuple:
    """A layout's settings but VARIANT_FIELDS: the same for a layout and its VPP / recompute variants."""
    return config_key({k: v for k, v in config.items() if k not in VARIANT_FIELDS})


def _recompute(config: dict) -> str:
    granularity = config.get("recompute_granularity")
    if granularity == "full":
        return f"full-{config.get('recompute_method') or 'uniform'}{config.get('recompute_num_layers') or 1}"
    modules = config.get("recompute_modules")
    if granularity == "selective" and modules:
        return "selective:" + "+".join(modules.split() if isinstance(modules, str) else modules)
    return granularity or "none"


def variant_span(configs: list[dict]) -> str:
    """What the variants differ in, e.g. ``VPP 1-4; recompute none, selective`` ('' for a single layout)."""
    parts = []
    vpp = sorted({c.get("virtual_pipeline_model_parallel_size") or 1 for c in configs})
    if len(vpp) > 1:
        parts.append(f"VPP {vpp[0]}-{vpp[-1]}" if vpp == list(range(vpp[0], vpp[-1] + 1)) else
                     "VPP " + ",".join(map(str, vpp)))
    recompute = list(dict.fromkeys(_recompute(c) for c in configs))
    if len(recompute) > 1:
        parts.append("recompute " + ", ".join(recompute))
    return "; ".join(parts)


def top_rows(ranked: list[tuple[int, dict]], n: int = 20) -> list[dict]:
    """The best layout of each of the first ``n`` groups (``variant_group``) of ``ranked`` ((trial number, feasible
    record), best first), as ``{"trial": number, **record}`` with ``variants`` (feasible layouts in its group) and
    ``variant_span`` (``variant_span`` of them, best first)."""
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for number, record in ranked:
        groups.setdefault(variant_group(record["config"]), []).append((number, record))
    out = []
    for members in list(groups.values())[:n]:
        number, record = members[0]
        out.append({"trial": number, **record, "variants": len(members),
                    "variant_span": variant_span([r["config"] for _, r in members])})
    return out
