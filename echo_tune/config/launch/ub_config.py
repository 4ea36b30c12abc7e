"""``--tp-comm-overlap-cfg``: Transformer Engine's userbuffer overlap settings per TE linear GEMM (a YAML file).

Megatron-LM d98e8a64ddf3 training/initialize.py hands the file's contents to TE's ``initialize_ub(..., ub_cfgs=...)``
(TE d0067d0 pytorch/module/base.py), which starts from ``get_default_config(name)`` and updates it with the file's
entry for that GEMM: ``method`` (ring_exchange, pipeline, bulk), ``num_sm`` (SMs of the communication kernels; TE's
default 1 for ring exchange, which copies with the copy engines, 16 otherwise), ``num_splits`` (the pipelined GEMM's
chunks; default 4), ``set_sm_margin`` (the GEMM leaves the communication's SMs free; default on but for ring
exchange) and ``aggregate`` (ring exchange: two received chunks per GEMM; default off). cost/collectives/tp_overlap.py prices
them. Other keys (``atomic_gemm``, ``use_ce``, ``cga_size``, ``fp8_buf``, the stream priorities) are not modelled:
a file that sets one is refused by name; so is a method TE does not run for that GEMM (``external``, cuBLASMp's
ring-exchange dgrad).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from echo_tune.config._checks import require
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError
from echo_tune.safe_yaml import load_yaml

DEFAULT_METHODS = {"qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
                   "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
                   "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
                   "proj_wgrad": "external", "fc2_wgrad": "external"}
"""TE ``initialize_ub`` ``methods``: each GEMM's default method."""
ALLOWED_METHODS = {name: ({"ring_exchange", "pipeline"} if method == "pipeline" else {method})
                   for name, method in DEFAULT_METHODS.items()}
"""Methods echo-tune models per GEMM: a reduce-scatter GEMM pipelined or by ring exchange, the others TE's default."""
KEYS = ("method", "num_sm", "num_splits", "set_sm_margin", "aggregate")


@dataclass(frozen=True, kw_only=True)
class UBSetting:
    """One GEMM's userbuffer overlap (TE ``get_default_config`` unless the file says otherwise)."""
    method: str
    num_sm: int
    num_splits: int
    set_sm_margin: bool
    aggregate: bool = False


def te_default(name: str, tp: int) -> UBSetting:
    method = DEFAULT_METHODS[name]
    ring = method == "ring_exchange"
    return UBSetting(method=method, num_sm=1 if ring else 16, num_splits=tp if ring else 4, set_sm_margin=not ring)


def read_ub_config(path: str) -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
    """The file's entries, checked, as a hashable tuple of (GEMM name, ((key, value), ...))."""
    file = Path(path)
    require(file.is_file(), f"--tp-comm-overlap-cfg {path}: no such file; give the path of the YAML file of "
                            f"userbuffer settings")
    data = load_yaml(file.read_text(), f"--tp-comm-overlap-cfg {path}") or {}
    require(isinstance(data, dict), f"--tp-comm-overlap-cfg {path}: must map GEMM names (qkv_fprop, ...) to settings")
    entries = []
    for name, entry in data.items():
        require(name in DEFAULT_METHODS, f"--tp-comm-overlap-cfg {path}: {name!r} is not a TE userbuffer GEMM (one of "
                                         f"{', '.join(DEFAULT_METHODS)})")
        require(isinstance(entry, dict), f"--tp-comm-overlap-cfg {path}: {name} must map keys to values")
        other = sorted(set(entry) - set(KEYS))
        if other:
            raise UnmodelledError(f"--tp-comm-overlap-cfg {path}: {name}: {', '.join(other)} not modelled (echo-tune "
                                  f"models {', '.join(KEYS)}); remove them")
        method = entry.get("method", DEFAULT_METHODS[name])
        if method not in ALLOWED_METHODS[name]:
            raise UnmodelledError(f"--tp-comm-overlap-cfg {path}: {name}: method {method!r} is not modelled (echo-tune "
                                  f"models {' or '.join(sorted(ALLOWED_METHODS[name]))} there)")
        for key in ("num_sm", "num_splits"):
            value = entry.get(key)
            require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
                    f"--tp-comm-overlap-cfg {path}: {name}: {key} must be a positive integer, but got {value!r}")
        entries.append((name, tuple(sorted(entry.items()))))
    return tuple(entries)


def ub_settings(cfg, tp: int) -> dict[str, UBSetting]:
    """Every GEMM's setting: TE's default for that GEMM updated with the file's entry (``initialize_ub``:
    ``ub_cfg.update(user_ub_cfg[name])``, so another method keeps the GEMM's default num_sm / num_splits / margin)."""
    out = {}
    for name in DEFAULT_METHODS:
        entry = dict(dict(cfg or ()).get(name, ()))
        kw = {k: (bool(v) if k in ("set_sm_margin", "aggregate") else v) for k, v in entry.items()}
        out[name] = UBSetting(**{**te_default(name, tp).__dict__, **kw})
    return out


def ub_config_problem(parallel) -> None:
    """--tp-comm-overlap-cfg without --tp-comm-overlap: Megatron reads it only then (training/initialize.py)."""
    if parallel.tp_comm_overlap_cfg and not parallel.tp_comm_overlap:
        raise ConfigError("--tp-comm-overlap-cfg applies with --tp-comm-overlap (Megatron-LM reads it only then), but "
                          "got (tp_comm_overlap=False); add --tp-comm-overlap or drop the file")
