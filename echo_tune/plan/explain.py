"""Why the winner wins: its breakdown beside the best layout of each other TP x PP x CP family, one
paragraph on the parts that differ most, and how the ranking moves when a key assumption fails.

Sensitivity re-simulates the best layout of the top families with each assumption off or worse:

- ``tp_comm_overlap off``: Transformer Engine's userbuffer TP overlap does not hide the TP collectives (the
  column-parallel layers' backward ones still run beside a GEMM, as NCCL runs them without userbuffers);
- ``DP overlap off``: ``--overlap-grad-reduce`` / ``--overlap-param-gather`` hide nothing;
- ``interference x2``: compute and communication slow each other twice as much where they overlap
  (the profile's slowdowns: 1 + 2 (s - 1), curves included);
- ``GEMM efficiency -15%``: the profile's GEMM and attention efficiencies 15% lower.
"""

from __future__ import annotations

import dataclasses

from echo_tune.cost.profile import profile_for
from echo_tune.search.space.labels import full_label, short_labels
from echo_tune.search.outputs.results import candidate_of
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.sim.simulate import simulate

GIB = 2**30


def family_of(cfg: dict) -> tuple[int, int, int]:
    return (cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"], cfg.get("context_parallel_size", 1))


def family_name(fam: tuple[int, int, int]) -> str:
    return f"TP{fam[0]} PP{fam[1]} CP{fam[2]}"


def family_bests(records: list[dict], limit: int = 4) -> list[dict]:
    """The fastest feasible record of each TP x PP x CP family, fastest family first."""
    best: dict[tuple, dict] = {}
    for r in records:
        if not r["fits_memory"]:
            continue
        fam = family_of(r["config"])
        if fam not in best or r["step_time_s"] < best[fam]["step_time_s"]:
            best[fam] = r
    return sorted(best.values(), key=lambda r: r["step_time_s"])[:limit]


def why(winner: dict, other: dict) -> str:
    """One paragraph: where the winner gains and where it pays, against another family's best."""
    a, b = winner["breakdown_s"], other["breakdown_s"]
    diff = {p: b.get(p, 0.0) - a.get(p, 0.0) for p in set(a) | set(b)}
    gains = sorted((p for p in diff if diff[p] > 0), key=lambda p: -diff[p])[:3]
    pays = sorted((p for p in diff if diff[p] < 0), key=lambda p: diff[p])[:2]
    margin = other["step_time_s"] - winner["step_time_s"]
    text = (f"{family_name(family_of(winner['config']))} wins over the best {family_name(family_of(other['config']))} "
            f"layout by {margin:.3f} s per step ({100 * margin / other['step_time_s']:.1f}%)")
    if gains:
        text += ": it spends less on " + ", ".join(f"{p} ({diff[p]:.3f} s)" for p in gains)
    if pays:
        text += "; it pays more for " + ", ".join(f"{p} ({-diff[p]:.3f} s)" for p in pays)
    if margin < 0.03 * other["step_time_s"]:
        text += ". The two are within 3%, inside the simulator's error band: either is a sound choice"
    return text + "."


def _worse_profile(profile, what: str):
    if what == "interference x2":
        curves = {}
        for k, v in (profile.slowdown_curves or {}).items():  # tp_overlap.py: amplitude or median forms
            v = dict(v)
            if "amplitude" in v:
                v["amplitude"] *= 2
            if "median" in v:
                v["median"] = 1 + 2 * (v["median"] - 1)
            curves[k] = v
        return dataclasses.replace(profile, compute_slowdown=1 + 2 * (profile.compute_slowdown - 1),
                                   comm_slowdown=1 + 2 * (profile.comm_slowdown - 1), slowdown_curves=curves)
    if what == "GEMM efficiency -15%":
        # every GEMM and attention efficiency: FP8 GEMMs run at gemm_efficiency x fp8_gemm_max / gemm_max
        # (cost/kernels/fp8.py), so scaling gemm_max_efficiency alone left them unchanged; the attention backward has
        # its own efficiency where the profile sets one
        backward = profile.attention_backward_efficiency
        return dataclasses.replace(profile, gemm_max_efficiency=profile.gemm_max_efficiency * 0.85,
                                   fp8_gemm_max_efficiency=profile.fp8_gemm_max_efficiency * 0.85,
                                   attention_efficiency=profile.attention_efficiency * 0.85,
                                   attention_backward_efficiency=None if backward is None else backward * 0.85)
    return profile


ASSUMPTIONS = ("as modelled", "tp_comm_overlap off", "DP overlap off", "interference x2", "GEMM efficiency -15%")


def sensitivity(space: SearchSpace, layouts: list[dict]) -> list[dict]:
    """Step time of each layout under each assumption, and which layout is fastest then."""
    base = profile_for(space.cluster)
    out = []
    for what in ASSUMPTIONS:
        profile = _worse_profile(base, what)
        times = []
        for rec in layouts:
            cand = candidate_of(space, rec)
            parallel = cand.parallel
            if what == "tp_comm_overlap off":
                parallel = dataclasses.replace(parallel, tp_comm_overlap=False)
            elif what == "DP overlap off":
                parallel = dataclasses.replace(parallel, overlap_grad_reduce=False, overlap_param_gather=False,
                                               overlap_param_gather_with_optimizer_step=False)
            report = simulate(cand.model, space.cluster, cand.num_gpus, parallel, profile=profile,
                              memory_headroom_bytes=int(space.memory_headroom_gib * GIB))
            times.append(report.step_time_s if report.fits_memory else None)
        fastest = min((t, i) for i, t in enumerate(times) if t is not None) if any(t is not None for t in times) \
            else (None, None)
        out.append({"assumption": what, "step_time_s": times, "fastest": fastest[1],
                    "winner_holds": fastest[1] == 0})
    return out


def explain(space: SearchSpace, records: list[dict], *, limit: int = 4) -> dict | None:
    """Breakdowns of the family bests, the why paragraph and the sensitivity table (None: nothing fits)."""
    bests = family_bests(records, limit)
    if not bests:
        return None
    labels, common = short_labels([r["config"] for r in bests], [r["derived"].get("data_parallel_size") for r in bests])
    layouts = [{"family": family_name(family_of(r["config"])), "label": label, "common": common,
                "layout": full_label(r["config"], r["derived"].get("data_parallel_size")),
                "step_time_s": r["step_time_s"], "breakdown_s": r["breakdown_s"], "megatron_config": r["config"],
                "headroom_gib": (space.cluster.gpu.memory_bytes - r["peak_memory_bytes"]) / GIB} for r, label in zip(bests, labels)]
    text = why(bests[0], bests[1]) if len(bests) > 1 else (
        f"only the {layouts[0]['family']} family has a layout that fits in memory.")
    sens = sensitivity(space, bests[:3])
    failing = [s["assumption"] for s in sens if not s["winner_holds"]]
    worst = max((s for s in sens[1:] if s["step_time_s"][0] is not None),
                key=lambda s: s["step_time_s"][0], default=None)
    if worst is not None and worst["step_time_s"][0] > sens[0]["step_time_s"][0]:
        text += (f" Its step time depends most on the assumption tested as '{worst['assumption']}' "
                 f"(+{worst['step_time_s'][0] - sens[0]['step_time_s'][0]:.3f} s if it fails).")
    text += (" The winner stays fastest under every assumption tested." if not failing else
             " If " + " or ".join(failing) + ", another family is faster (see the sensitivity table): "
             "fall back to it.")
    return {"families": layouts, "why": text, "sensitivity": sens, "assumptions": list(ASSUMPTIONS)}
