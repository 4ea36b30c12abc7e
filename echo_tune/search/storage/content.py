"""What a study was made from, by content: a resumed study must be the same search (issue 20).

Comparing names is not enough: a model, cluster or profile file edited in place keeps its name, and the
resumed study would mix both models' trials (and ``best.json`` would pick the old model's layout). So a
study stores, as the user attribute ``content``, a SHA-256 digest of each input as it was *read*:

``model``                the ModelSpec (every field)
``cluster``              the ClusterSpec (every field; the profile's path is left to ``profile``)
``profile``              the calibration profile in effect (the space's, else the cluster's, else the
                         datasheet defaults), every coefficient
``op_times``             the measured op times that profile reads (device, times, host overhead)
``space``                the searched values, batch, precision, objectives, cost, uneven-split rule
``memory_headroom_gib``  the memory limit: what "fits" means for every stored trial
``gpu_hour_cost``        the price each stored trial's cost per step was computed at
``code``                 echo-tune's sources (``code_version.sources_sha256``): a study simulated by other
                         code (an upgrade, a local edit) would mix two simulators' trials

and ``sha256``, the digest of them all. ``--resume`` compares them part by part and refuses a change in one
line naming the parts (``check_content``). The attribute is set while the storage's cross-process lock is
held, together with the study's creation (``create_or_check``), so two different searches started at
once on one study name cannot both pass the check: the second sees the first one's digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import optuna

from echo_tune.code_version import sources_sha256
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.search.storage.claim import claim

CONTENT_ATTR = "content"


def _digest(obj) -> str:
    text = json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def content_parts(space, profile=None) -> dict[str, str]:
    """A digest per input of ``space`` (see the module docstring); ``profile``: the space's loaded profile."""
    cluster = dataclasses.asdict(space.cluster)
    cluster.pop("profile", None)
    effective = profile if profile is not None else profile_for(space.cluster)
    op_times = getattr(effective, "op_times", None)
    described = space.describe()
    for key in ("name", "source", "model", "cluster"):  # names: the specs themselves are hashed
        described.pop(key, None)
    if "cost" not in space.objectives:  # the price only scales a column then; the old check ignored it too
        described.pop("gpu_hour_cost", None)
    described["canonical_splits"] = space.canonical_splits
    parts = {"model": _digest(dataclasses.asdict(space.model)), "cluster": _digest(cluster),
             "profile": _digest(effective.to_dict()),
             "op_times": _digest(None if op_times is None else {"device": op_times.device, "kind": op_times.kind,
                                                               "times": op_times.times,
                                                               "host_overhead_s": op_times.host_overhead_s}),
             "space": _digest(described), "memory_headroom_gib": repr(float(space.memory_headroom_gib)),
             "safe_memory": repr(bool(space.safe_memory)),  # whether "at risk" counts as not fitting
             # each trial stores its cost per step at this price: a resume at another would mix two prices
             "gpu_hour_cost": repr(None if space.gpu_hour_cost is None else float(space.gpu_hour_cost)),
             "code": sources_sha256()}
    return {**parts, "sha256": _digest(parts)}


def check_content(study_name: str, stored: dict | None, now: dict[str, str]) -> None:
    """Refuse (one line) a study made from other inputs than ``now``; a study without the attribute (made by
    an older version) is checked by names only, elsewhere."""
    if not isinstance(stored, dict) or stored.get("sha256") == now["sha256"]:
        return
    # a part an older version did not store (gpu_hour_cost) is not compared: its digest differs for that alone
    changed = [k for k in now if k != "sha256" and k in stored and stored[k] != now[k]]
    if not changed and any(k not in stored for k in now):
        return
    changed = changed or ["inputs"]
    hint = (" (the memory limit decides which stored layouts fit: resume with the old --memory-headroom-gib, or "
            "start another study)") if "memory_headroom_gib" in changed else ""
    if "gpu_hour_cost" in changed:
        hint += (" (every stored trial holds its cost per step at the old price: resume with the old --gpu-hour-cost, "
                 "or start another study)")
    if changed == ["code"]:
        raise ConfigError(f"study {study_name!r} was simulated by another version of echo-tune (its sources' "
                          f"SHA-256 was {stored['code'][:12]}, now {now['code'][:12]}): resuming would mix two "
                          f"simulators' trials; start over with --overwrite, or use another --study-name")
    raise ConfigError(f"study {study_name!r} was created from a different search space (changed: "
                      f"{', '.join(changed)}; a file may have been edited in place); resume it with the same model, "
                      f"cluster, profile and space, or use another --study-name{hint}")


def check_names(space, study) -> None:
    """A study made before ``content`` existed: compare what it stored, the names and searched values."""
    stored = study.user_attrs.get("space")
    if stored is None or CONTENT_ATTR in study.user_attrs:
        return
    now = space.describe()
    keys = ["model", "cluster", "global_batch_size", "precision", "objectives", "choices"]
    keys += ["gpu_hour_cost"] if "cost" in space.objectives else []
    diff = [k for k in keys if stored.get(k) != now[k]]
    if diff:
        raise ConfigError(f"study {study.study_name!r} was created from a different search space (changed: "
                          f"{', '.join(diff)}); resume it with the same space or use another --study-name")


def create_or_check(store, name: str, sampler, directions: list[str], parts: dict[str, str],
                    first_attrs: dict) -> tuple[optuna.Study, bool]:
    """Create the study (setting ``content`` and ``first_attrs``) or load it and check its content, as one
    step under the storage's cross-process lock. Returns (study, whether this call created it)."""
    with claim(store):
        existed = name in optuna.get_all_study_names(store.storage)
        study = optuna.create_study(study_name=name, storage=store.storage, sampler=sampler, directions=directions,
                                    load_if_exists=True)
        if not existed:
            study.set_user_attr(CONTENT_ATTR, parts)
            for key, value in first_attrs.items():
                study.set_user_attr(key, value)
    if existed:
        check_content(name, study.user_attrs.get(CONTENT_ATTR), parts)
    return study, not existed
