"""Datasheet-derived default profiles, one per GPU preset, shipped in ``calibrate/profiles/``.

They are ``default_profile`` of the cluster preset of the same name (a DGX-style node of that GPU;
``gb200`` is the GB200 NVL72 rack, its alias),
written out so a cluster file can point at one with ``profile:`` and edit it. They are labelled
``measured: false`` and list their sources and every efficiency assumption.

Regenerate after changing a preset or an assumption:  python -m echo_tune.calibrate.datasheet
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path

from echo_tune.config.load.loading import PRESET_ALIASES, load_cluster, preset_names
from echo_tune.cost import datasheet_efficiencies as efficiencies_module
from echo_tune.cost.profile import ClusterProfile, default_profile, save_profile


def _assumptions() -> dict:
    module = efficiencies_module
    return {name: getattr(module, name) for name in dir(module) if name.startswith("DATASHEET_")}


def datasheet_profile(gpu_preset: str) -> ClusterProfile:
    """The shipped, not-measured profile of one GPU preset."""
    cluster = load_cluster(gpu_preset)
    profile = default_profile(cluster)
    provenance = {
        "label": "datasheet-derived, NOT measured: replace with `echo-tune calibrate fit` on your cluster",
        "sources": [f"GPU: {cluster.gpu.source}", f"node and fabric: {cluster.source}",
                    "efficiency assumptions: echo_tune/cost/datasheet_efficiencies.py (DATASHEET_*), each with its "
                    "source"],
        "assumptions": _assumptions(), **profile.provenance}
    return dataclasses.replace(profile, name=f"{gpu_preset}-datasheet", provenance=provenance)


def shipped_profile_path(gpu_preset: str) -> Path:
    return Path(str(resources.files("echo_tune.calibrate").joinpath("profiles", f"{gpu_preset}.yaml")))


def write_datasheet_profiles(directory: str | Path | None = None) -> list[Path]:
    """Write one YAML per GPU preset that has a cluster preset of the same name (or alias: gb200)."""
    directory = Path(directory) if directory else shipped_profile_path("x").parent
    written = []
    for name in preset_names("gpus"):
        if name in preset_names("clusters") or name in PRESET_ALIASES:
            path = directory / f"{name}.yaml"
            save_profile(datasheet_profile(name), path)
            written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_datasheet_profiles():
        print(f"wrote {written_path}")
