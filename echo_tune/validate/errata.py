"""Errata for the published-runs datasets: settings a row's own source states but its CSV has no column for.

The shared CSVs cannot be edited, and some of what shapes a run is not in them (dropout, biases, the
gradient-buffer dtype, the MoE dispatcher...). An errata file, ``errata/<csv stem>.yaml`` beside this
module, names for each row the source files that state such settings, each setting as the Megatron-LM
flag(s) it maps to, with the source file at a commit and the quoted key. ``echo-tune validate`` applies
them by default where no CSV column (and no flag of the row's ``assumptions``) sets the field, lists
them per row, and leaves them out with ``--no-errata``.

File format::

    dataset: runs_modern.csv
    sources:
      <source id>:
        source: "<owner/repo>@<commit> <path>"
        settings:
          - flags: "--hidden-dropout 0.0 --attention-dropout 0.0"   # Megatron-LM flags
            quote: "model.hidden_dropout: 0.0; model.attention_dropout: 0.0"   # what the source says
            note: "how the source's key maps to the flag, when it is not a rename"   # optional
          - flags: "--micro-batch-size 1"
            quote: "GPT_OSS_120B_H100_BF16_BASE_CONFIG: micro_batch_size=1 (from the base config)"
            corrects: "micro_batch_size"   # only where the row contradicts itself: overrides that column
            reason: "why the CSV's value cannot be what ran (its own columns disagree), in one sentence"
          - flags: "--quick-geglu"
            config: {swiglu: false, activation_func_clamp_value: 7.0}   # optional: model fields no flag states
            quote: "GPTOSSProvider: activation_func = quick_gelu; activation_func_clamp_value: 7.0"
            corrects: "swiglu"
            reason: "..."
    rows:
      <row name>: [<source id>, ...]
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from echo_tune.config.load.loading import read_yaml
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError

ERRATA_DIR = Path(__file__).resolve().parent / "errata"
MODEL_FIELDS = frozenset(f.name for f in fields(ModelSpec)) - {"name"}


@dataclass(frozen=True, kw_only=True)
class Erratum:
    """One source-stated setting, as Megatron-LM flags."""

    flags: str
    """The Megatron-LM flag(s), as on a launch line (``--hidden-dropout 0.0``)."""
    config: tuple[tuple[str, object], ...] = ()
    """Model fields no flag can state, by TransformerConfig name: a field Megatron-LM has no flag for at
    d98e8a64ddf3 (``activation_func_clamp_value``: model providers set it), or a flag's absence (``swiglu: false``)."""
    source: str
    """``owner/repo@commit path`` of the file that states it."""
    quote: str
    """The source's own key(s) and value(s)."""
    note: str = ""
    """How the source's setting maps to the flag, where that is not a plain rename."""
    corrects: tuple[str, ...] = ()
    """CSV columns this setting overrides. Empty for the usual erratum, which only fills fields no column
    sets; a correction is allowed only with a ``reason`` showing the row's own values cannot all hold."""
    reason: str = ""
    """Why the corrected column cannot be what ran."""

    def describe(self) -> str:
        if self.corrects:
            return (f"{self.flags}{self._config_text()} corrects {', '.join(self.corrects)} ({self.source}: {self.quote}; "
                    f"{self.reason})")
        return f"{self.flags}{self._config_text()} ({self.source}: {self.quote})"

    def _config_text(self) -> str:
        return "".join(f" {k}={v}" for k, v in self.config)


def _parse(flags: str):
    """An erratum's flags as a launch line's fields (none for an erratum that only states ``config``)."""
    return parse_megatron_line(flags) if flags.strip() else ({}, {}, None, [])


def errata_path_for(csv_path: str | Path) -> Path | None:
    """The errata file of a runs CSV (by its file name), or None when there is none."""
    path = ERRATA_DIR / f"{Path(csv_path).stem}.yaml"
    return path if path.is_file() else None


def _require(condition: bool, path: Path, message: str) -> None:
    if not condition:
        raise ConfigError(f"errata file {str(path)!r}: {message}")


def _text_keys(table: dict, path: Path, what: str) -> None:
    """Every key of ``table`` is text (a YAML number or boolean key would name no row or source)."""
    for key in table:
        _require(isinstance(key, str), path, f"each {what} must be text, but got {key!r} "
                                             f"({type(key).__name__}); quote it: \"{key}\"")


def load_errata(path: str | Path) -> dict[str, tuple[Erratum, ...]]:
    """Row name -> its errata, read and checked (every flag must be one echo-tune reads)."""
    path = Path(path)
    data = read_yaml(path, "errata")  # bounded (size, depth, aliases) and one line on any fault of the file
    _require(isinstance(data, dict) and isinstance(data.get("sources"), dict) and isinstance(data.get("rows"), dict),
             path, "must map `sources` and `rows`; see echo_tune/validate/errata.py for the format")
    sources: dict[str, tuple[Erratum, ...]] = {}
    _text_keys(data["sources"], path, "source id")
    _text_keys(data["rows"], path, "row name")
    for key, entry in data["sources"].items():
        _require(isinstance(entry, dict) and isinstance(entry.get("source"), str) and "@" in entry["source"]
                 and isinstance(entry.get("settings"), list) and entry["settings"], path,
                 f"source {key!r} needs `source: owner/repo@commit path` and a list of `settings`")
        items = []
        for setting in entry["settings"]:
            _require(isinstance(setting, dict) and isinstance(setting.get("flags"), str)
                     and isinstance(setting.get("quote"), str), path,
                     f"each setting of {key!r} needs `flags` and `quote` (text)")
            # an unknown or malformed flag is a ConfigError here; one that sets no field would be dropped
            model, parallel, precision, ignored = _parse(setting["flags"])
            config = setting.get("config") or {}
            _require(isinstance(config, dict) and all(k in MODEL_FIELDS for k in config), path,
                     f"`config` of {key!r} must map model fields (TransformerConfig names) to values, but got "
                     f"{config!r}")
            _require((model or parallel or config) and precision is None and not ignored, path,
                     f"flags {setting['flags']!r} of {key!r} must set model or layout fields only, but "
                     f"{ignored or 'none'} set nothing")
            model = {**model, **config}
            corrects = setting.get("corrects") or ()
            _require(isinstance(corrects, (str, list, tuple)), path,
                     f"`corrects` of {key!r} must be a field name or a list of them, but got {corrects!r}")
            corrects = (corrects,) if isinstance(corrects, str) else tuple(corrects)
            set_fields = {*model, *parallel}
            _require(all(isinstance(c, str) and c in set_fields for c in corrects), path,
                     f"`corrects` of {key!r} must name fields its flags set ({sorted(set_fields)}), "
                     f"but got {list(corrects)!r}")
            _require(not corrects or (isinstance(setting.get("reason"), str) and setting["reason"].strip()), path,
                     f"a correction of {key!r} ({list(corrects)!r}) needs a `reason`: why the CSV's value "
                     f"cannot be what ran")
            items.append(Erratum(flags=setting["flags"], config=tuple(config.items()), source=entry["source"],
                                 quote=setting["quote"],
                                 note=str(setting.get("note") or ""), corrects=corrects,
                                 reason=str(setting.get("reason") or "")))
        sources[key] = tuple(items)
    rows = {}
    for row, keys in data["rows"].items():
        keys = [keys] if isinstance(keys, str) else keys
        _require(isinstance(keys, list) and all(isinstance(k, str) and k in sources for k in keys), path,
                 f"row {row!r} must list source ids of `sources` (text), but got {keys!r}")
        rows[row] = tuple(e for k in keys for e in sources[k])
    return rows


def errata_settings(errata: tuple[Erratum, ...], taken: set[str]) -> tuple[dict, dict, list[str]]:
    """(model fields, parallel fields, applied errata descriptions) of a row's errata, leaving out every
    field in ``taken`` (set by a CSV column or by the row's assumptions) except those a correction names."""
    model, parallel, applied = {}, {}, []
    for erratum in errata:
        m, p, _, _ = _parse(erratum.flags)
        m = {**m, **dict(erratum.config)}
        m = {k: v for k, v in m.items() if k not in taken or k in erratum.corrects}
        p = {k: v for k, v in p.items() if k not in taken or k in erratum.corrects}
        if m or p:
            model.update(m)
            parallel.update(p)
            applied.append(erratum.describe())
    return model, parallel, applied
