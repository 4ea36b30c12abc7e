"""Which layers of a Hugging Face ``config.json`` run the sliding window, read as transformers reads them.

transformers' ``Qwen2Config`` / ``Qwen3Config`` / ``Qwen3MoeConfig`` (v4.53+): ``sliding_window`` counts only when
``use_sliding_window`` is true; without an explicit ``layer_types``, layer ``i`` is ``"sliding_attention"`` when
``i >= max_window_layers`` (default 28), else ``"full_attention"``; the attention of a layer takes the window only
when its ``layer_types`` entry is ``"sliding_attention"``. ``MistralConfig`` windows every layer. So a file whose
``layer_types`` are all ``full_attention``, or whose ``max_window_layers`` is the layer count, trains full
attention on every layer, whatever its ``sliding_window`` says.

Every layer windowed is what echo-tune maps (Mistral: ``--window-size W,0``); a window that covers the sequence
is full attention; some layers windowed and others not is refused by name (``UnmodelledError``).
"""

from __future__ import annotations

from echo_tune.config.load.hf_values import HFValues
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError

LAYER_TYPES = ("full_attention", "sliding_attention")
_QWEN = ("qwen2", "qwen3", "qwen3_moe")
_MAX_WINDOW_LAYERS_DEFAULT = 28  # Qwen2Config / Qwen3Config / Qwen3MoeConfig


def sliding_layers(cfg: HFValues, model_type: str, layers: int) -> list[bool]:
    """Per layer, whether the file asks for the sliding window (before comparing it with the sequence)."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
            bad = [t for t in types if t not in LAYER_TYPES][:1] if isinstance(types, list) else [types]
            got = f"{len(types)} entries" if isinstance(types, list) and not bad else f"{bad[0]!r}"
            shown = got if len(got) <= 80 else got[:77] + "..."
            raise ConfigError(f"config.json key 'layer_types' must list one of {list(LAYER_TYPES)} per layer "
                              f"(num_hidden_layers={layers}), but got ({shown}); fix the file")
        return [t == "sliding_attention" for t in types]
    if model_type in _QWEN:
        first = cfg.integer("max_window_layers", None)
        first = _MAX_WINDOW_LAYERS_DEFAULT if first is None else first
        if first < 0:
            raise ConfigError(f"`max_window_layers >= 0` must hold (layers from it on run the window), but got "
                              f"(max_window_layers={first}); fix the file")
        return [i >= first for i in range(layers)]
    return [True] * layers


def check_sliding_window(cfg: HFValues, model_type: str, seq_length: int, layers: int) -> None:
    """Refuse (by name) a window shorter than the sequence on some layers but not all, or on any layer of a
    model_type whose window echo-tune does not map; accept full attention however the file spells it."""
    window = cfg.integer("sliding_window", None)
    on = model_type == "mistral" or cfg.flag("use_sliding_window", False)  # Qwen: no window unless turned on
    windowed = sliding_layers(cfg, model_type, layers)
    if window is None or not on or window >= seq_length or not any(windowed):
        if cfg.get("layer_types") is not None and any(windowed) and model_type not in (*_QWEN, "mistral"):
            raise UnmodelledError(f"config.json key 'layer_types' asks for sliding_attention layers of model_type "
                                  f"{model_type!r}, whose window echo-tune does not map; use full_attention")
        return
    if model_type == "mistral" and all(windowed):
        return  # every layer windowed: --window-size W,0 (hf_config._llama_like)
    where = f"{sum(windowed)} of {layers} layers" if not all(windowed) else "every layer"
    key = "layer_types" if cfg.get("layer_types") is not None else "max_window_layers"
    raise UnmodelledError(f"config.json key 'sliding_window' (sliding_window={window}) is shorter than the sequence "
                          f"(seq_length={seq_length}) on {where} ({key}) of model_type {model_type!r}, and echo-tune "
                          f"maps a window on every layer of a mistral model only; train with seq_length <= {window}")
