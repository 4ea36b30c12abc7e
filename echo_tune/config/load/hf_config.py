"""Read a Hugging Face ``config.json`` as a ModelSpec (Megatron-LM argument names).

Supported ``model_type`` values: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, deepseek_v2, deepseek_v3,
gpt2, gpt_neox. Each key of the file is either *mapped* to a Megatron argument, *harmless* (it does not
change a training step's compute, memory or communication: token ids, initialisation, RoPE base and
scaling, cache flags, ...), or *refused by name*: a step-shaping setting echo-tune does not model
(a Qwen2 sliding window shorter than the sequence on some layers, config/load/hf_window.py; a parallel residual, dense MLP layers
mixed into a Qwen MoE, ...), and an unknown key is refused too, as echo-tune cannot tell whether it shapes
the step. Field meanings: the transformers configuration classes (``LlamaConfig``, ``MixtralConfig``,
``Qwen2Config``, ``Qwen3MoeConfig``, ``DeepseekV3Config``, ``GPT2Config``, ``GPTNeoXConfig``); Megatron
names as in ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM d98e8a64ddf3.

The training sequence length is not in most config.json files (``max_position_embeddings`` is the longest
context the model supports, 131072 for Llama 3.1 and Qwen2.5, 40960 for Qwen3): it is taken from
``seq_length`` when given, else from a key that states the pre-training length --
``rope_scaling.original_max_position_embeddings`` (a context-extended model) or, for GPT-2's learned
absolute position table, ``n_positions`` -- and otherwise ``--seq-length`` is required (a one-line error
says so). The choice is stated in the returned notes. Values are read with their types checked
(config/load/hf_values.py) and every problem of a file is reported at once.
"""

from __future__ import annotations

from pathlib import Path

from echo_tune.config.load.spec_build import build
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.config.load.hf_rebuild import rebuild_fields
from echo_tune.config.load.hf_values import HFValues
from echo_tune.config.load.hf_window import check_sliding_window, sliding_layers
from echo_tune.errors import ConfigError, raise_problems
from echo_tune.io import read_text
from echo_tune.limits import LIMITS
from echo_tune.safe_yaml import load_json

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
             "gpt2", "gpt_neox")

# Keys that do not shape a training step (ids, initialisation, numerics constants, inference settings).
HARMLESS = frozenset("""architectures model_type _name_or_path transformers_version torch_dtype dtype use_cache
    bos_token_id eos_token_id pad_token_id initializer_range rms_norm_eps layer_norm_eps layer_norm_epsilon
    rope_theta rope_scaling rotary_emb_base pretraining_tp tie_word_embeddings max_position_embeddings
    attention_dropout hidden_dropout resid_pdrop attn_pdrop embd_pdrop summary_activation summary_first_dropout
    summary_proj_to_labels summary_type summary_use_proj task_specific_params scale_attn_weights
    reorder_and_upcast_attn scale_attn_by_inverse_layer_idx n_ctx output_router_logits router_aux_loss_coef
    router_jitter_noise norm_topk_prob aux_loss_alpha seq_aux topk_method scoring_func routed_scaling_factor
    n_group topk_group ep_size moe_layer_freq max_window_layers use_sliding_window sliding_window layer_types
    quantization_config auto_map rope_interleave classifier_dropout use_mrope hidden_act head_dim
    attention_bias mlp_bias intermediate_size num_key_value_heads seq_length""".split())
"""Read where they matter (hidden_act, sliding_window, attention_bias, ...) and otherwise harmless."""

_STEP_SHAPING = {  # HF key -> (Megatron flag, rule: the values echo-tune models)
    "rotary_pct": "--rotary-percent", "partial_rotary_factor": "--rotary-percent",
    "use_parallel_residual": "parallel attention + MLP residual",
    "mlp_only_layers": "dense MLP layers inside an MoE model (Qwen mlp_only_layers)",
    "decoder_sparse_step": "--moe-layer-freq", "shared_expert_intermediate_size":
        "a gated shared expert (Qwen2-MoE)", "moe_shared_expert_overlap": "--moe-shared-expert-overlap",
}


def _refuse(key: str, value, why: str) -> None:
    raise UnmodelledError(f"config.json key {key!r} ({key}={value!r}) shapes the step ({why}) but is not "
                          f"modelled by echo-tune; use a model whose config does not need it")


def _need(cfg: HFValues, key: str, model_type: str) -> int:
    return cfg.integer(key)


def _gated(cfg: dict, model_type: str) -> bool:
    act = str(cfg.get("hidden_act", "silu"))
    if act in ("silu", "swish"):
        return True
    raise ConfigError(f"config.json: `hidden_act` of a {model_type} model must be silu (SwiGLU), but got "
                      f"(hidden_act={act!r})")


def _check_refused(cfg: HFValues, model_type: str, seq_length: int) -> None:
    for key, why in _STEP_SHAPING.items():
        if key not in cfg or key in ("rotary_pct", "partial_rotary_factor"):  # mapped to --rotary-percent
            continue
        value = cfg[key]
        neutral = {"rotary_pct": 1.0, "partial_rotary_factor": 1.0, "use_parallel_residual": False,
                   "mlp_only_layers": [], "decoder_sparse_step": 1, "moe_shared_expert_overlap": False}
        if key in neutral and value == neutral[key]:
            continue
        if key == "shared_expert_intermediate_size" and model_type != "qwen2_moe":
            continue
        _refuse(key, value, why)
    if model_type.startswith("deepseek") and cfg.get("moe_layer_freq", 1) != 1:
        _refuse("moe_layer_freq", cfg["moe_layer_freq"], "MoE layers every few layers after the dense ones, "
                                                         "not mapped to --moe-layer-freq by echo-tune")
    layers = cfg.integer("num_hidden_layers", None) or cfg.integer("n_layer", 1)
    check_sliding_window(cfg, model_type, seq_length, layers)  # layer_types / max_window_layers: config/load/hf_window.py
    attention_bias, mlp_bias = cfg.flag("attention_bias", False), cfg.flag("mlp_bias", False)
    if attention_bias and (model_type in ("qwen3", "qwen3_moe") or (model_type in ("llama", "mistral")
                                                                    and not mlp_bias)):
        # Qwen3Attention / LlamaAttention: bias on q, k, v and o; --add-qkv-bias covers q, k, v only and
        # --add-bias-linear adds the MLP's too
        _refuse("attention_bias", True, "biases on the attention linears only")
    if mlp_bias and not attention_bias and model_type in ("llama", "mistral"):
        _refuse("mlp_bias", True, "biases on the MLP linears only")
    if model_type == "gpt_neox" and "use_parallel_residual" not in cfg:  # GPTNeoXConfig's default is True
        _refuse("use_parallel_residual", True, _STEP_SHAPING["use_parallel_residual"] + " (transformers' default "
                "for a file that leaves the key out)")


def _seq_length(cfg: HFValues, model_type: str, seq_length: int | None, notes: list[str]) -> int:
    scaling = cfg.mapping("rope_scaling")  # read (and type-checked) even when the length is given
    original = cfg.integer("original_max_position_embeddings", None, where=scaling,
                           name="rope_scaling.original_max_position_embeddings")
    stated = cfg.integer("seq_length", None)  # a file that states its training length (read and type-checked)
    if seq_length is not None:
        return seq_length
    if stated is not None:
        notes.append(f"seq_length {stated} from the file's seq_length key; set --seq-length for another")
        return stated
    if original is not None:
        notes.append(f"seq_length {original} from rope_scaling.original_max_position_embeddings (the pre-training "
                     f"length); set --seq-length for another")
        return original
    if model_type == "gpt2" and cfg.get("n_positions") is not None:  # a learned table of that many positions
        value = cfg.integer("n_positions")
        notes.append(f"seq_length {value} from n_positions (GPT-2's learned position table, the length it was "
                     f"trained at); set --seq-length for another")
        return value
    longest = cfg.get("max_position_embeddings")
    cfg.problems.append(ConfigError(
        f"config.json states no pre-training sequence length (no rope_scaling.original_max_position_embeddings; "
        f"max_position_embeddings={longest!r} is the longest context the model supports, not the length it "
        f"trains at); give the training length with --seq-length N (e.g. --seq-length 4096; in a space or rank "
        f"file, model: {{from: <config.json>, seq_length: N}})"))
    return 1


def _common(cfg: HFValues, model_type: str, seq: int) -> dict:
    h, a = cfg.integer("hidden_size"), cfg.integer("num_attention_heads")
    out = {"num_layers": cfg.integer("num_hidden_layers"), "hidden_size": h,
           "num_attention_heads": a, "seq_length": seq, "vocab_size": cfg.integer("vocab_size"),
           "normalization": "RMSNorm", "position_embedding_type": "rope", "add_bias_linear": False,
           "untie_embeddings_and_output_weights": not cfg.flag("tie_word_embeddings", False),
           "hidden_dropout": 0.0, "attention_dropout": cfg.number("attention_dropout", 0.0),
           "attention_backend": "auto"}
    groups = cfg.integer("num_key_value_heads", None)
    if groups is not None and groups != a:
        out["num_query_groups"] = groups
    # GPTNeoXConfig's rotary_pct defaults to 0.25 (the others rotate the whole head)
    rotary = cfg.number("partial_rotary_factor", cfg.number("rotary_pct", 0.25 if model_type == "gpt_neox" else 1.0))
    if rotary != 1.0:  # RoPE on that fraction of each head (--rotary-percent)
        out["rotary_percent"] = rotary
    # Qwen3Config's head_dim defaults to 128 (not hidden / heads: Qwen3-4B is 2560 / 32 heads of 128)
    head_dim = cfg.integer("head_dim", 128 if model_type == "qwen3" else None)
    if head_dim is not None and head_dim * a != h:
        out["kv_channels"] = head_dim
    return out


def _llama_like(cfg: HFValues, model_type: str, seq: int, notes: list[str]) -> dict:
    out = _common(cfg, model_type, seq)
    out["swiglu"] = _gated(cfg, model_type)
    out["ffn_hidden_size"] = cfg.integer("intermediate_size")
    if cfg.flag("mlp_bias", False) and cfg.flag("attention_bias", False):
        out["add_bias_linear"] = True
    window = cfg.integer("sliding_window", None)
    if model_type == "mistral" and window is not None and window < seq and all(sliding_layers(cfg, model_type,
                                                                                              out["num_layers"])):
        # every layer windowed, (w, 0) as Megatron-Bridge converts an HF sliding_window (GPT-OSS: 128 -> (128, 0))
        out["window_size"] = (window, 0)
        notes.append(f"sliding_window {window} as --window-size {window},0 on every layer")
    if model_type == "qwen2":  # Qwen2Attention: q/k/v projections with bias, the others without
        notes.append("Qwen2's QKV bias as --add-qkv-bias ((a+2g)·d parameters per layer, added in the QKV GEMM's "
                     "epilogue: not timed separately)")
    if model_type in ("qwen3", "qwen3_moe"):  # Qwen3Attention: RMSNorm on each query and key head
        out["qk_layernorm"] = True
    if model_type in ("mixtral", "qwen3_moe"):
        # Expert-dispatch choices are not in a config.json: the all-to-all dispatcher with grouped GEMMs, as
        # Megatron-LM's examples/mixtral script and the Qwen3 MoE conf of d98e8a64ddf3 launch them.
        out.update(moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True)
        if model_type == "mixtral":
            out.update(num_experts=cfg.integer("num_local_experts"), moe_router_topk=cfg.integer("num_experts_per_tok"))
        else:
            out.update(num_experts=cfg.integer("num_experts"), moe_router_topk=cfg.integer("num_experts_per_tok"),
                       moe_ffn_hidden_size=cfg.integer("moe_intermediate_size"), moe_router_dtype="fp32")
        notes.append("MoE dispatch assumed as Megatron-LM's examples launch it: --moe-token-dispatcher-type "
                     "alltoall --moe-grouped-gemm")
    return out


def _deepseek(cfg: HFValues, model_type: str, seq: int, notes: list[str]) -> dict:
    out = _common(cfg, model_type, seq)
    out.pop("num_query_groups", None)
    out.pop("kv_channels", None)
    out["swiglu"] = _gated(cfg, model_type)
    layers = out["num_layers"]
    dense = cfg.integer("first_k_dense_replace", 0)
    if not 0 <= dense <= min(layers, LIMITS["num_layers"].high):  # before the pattern string is built
        cfg.problems.append(ConfigError(f"`0 <= first_k_dense_replace <= num_hidden_layers` must hold, but got "
                                        f"(first_k_dense_replace={dense}, num_hidden_layers={layers}); fix the file"))
        dense = 0
    moe_ffn = cfg.integer("moe_intermediate_size")
    shared = cfg.integer("n_shared_experts", 0) * moe_ffn
    q_lora = cfg.integer("q_lora_rank", None)
    out.update(ffn_hidden_size=cfg.integer("intermediate_size"), num_experts=cfg.integer("n_routed_experts"),
               moe_router_topk=cfg.integer("num_experts_per_tok"), moe_ffn_hidden_size=moe_ffn,
               moe_shared_expert_intermediate_size=shared or None,
               moe_layer_freq=f"([0]*{dense}+[1]*{layers - dense})" if dense else 1,
               moe_router_load_balancing_type="seq_aux_loss", moe_token_dispatcher_type="alltoall",
               moe_grouped_gemm=True, moe_router_dtype="fp32", multi_latent_attention=True,
               q_lora_rank=q_lora or None, kv_lora_rank=cfg.integer("kv_lora_rank"),
               qk_head_dim=cfg.integer("qk_nope_head_dim"), qk_pos_emb_head_dim=cfg.integer("qk_rope_head_dim"),
               v_head_dim=cfg.integer("v_head_dim"), qk_layernorm=True)
    mtp = cfg.integer("num_nextn_predict_layers", 0)
    if mtp:
        out["mtp_num_layers"] = mtp
    notes.append("MLA latent norms as --qk-layernorm, dispatch as Megatron-LM's DeepSeek examples launch it "
                 "(alltoall, grouped GEMM, fp32 router)")
    return out


def _gpt2(cfg: HFValues, seq: int) -> dict:
    act = str(cfg.get("activation_function", "gelu_new"))
    if not act.startswith("gelu"):
        raise ConfigError(f"config.json: `activation_function` of a gpt2 model must be a GeLU, but got ({act!r})")
    h = cfg.integer("n_embd")
    return {"num_layers": cfg.integer("n_layer"), "hidden_size": h, "num_attention_heads": cfg.integer("n_head"),
            "ffn_hidden_size": cfg.integer("n_inner", None) or 4 * h, "seq_length": seq,
            "vocab_size": cfg.integer("vocab_size"), "normalization": "LayerNorm",
            "position_embedding_type": "learned_absolute", "add_bias_linear": True,
            "untie_embeddings_and_output_weights": not cfg.flag("tie_word_embeddings", True),
            "hidden_dropout": cfg.number("resid_pdrop", 0.1), "attention_dropout": cfg.number("attn_pdrop", 0.1)}


def _neox(cfg: HFValues, seq: int) -> dict:
    act = str(cfg.get("hidden_act", "gelu"))
    if not act.startswith("gelu"):
        raise ConfigError(f"config.json: `hidden_act` of a gpt_neox model must be a GeLU, but got ({act!r})")
    out = _common(cfg, "gpt_neox", seq)
    out.update(ffn_hidden_size=cfg.integer("intermediate_size"), normalization="LayerNorm",
               add_bias_linear=True, hidden_dropout=cfg.number("hidden_dropout", 0.0))
    return out


_EXTRA_KEYS = {  # model-type keys that are mapped (beyond the common ones)
    "mixtral": "num_local_experts num_experts_per_tok", "qwen3_moe": "num_experts num_experts_per_tok "
    "moe_intermediate_size", "deepseek_v2": "first_k_dense_replace n_shared_experts moe_intermediate_size "
    "n_routed_experts num_experts_per_tok q_lora_rank kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim",
    "gpt2": "n_embd n_layer n_head n_inner n_positions activation_function",
}
_EXTRA_KEYS["deepseek_v3"] = _EXTRA_KEYS["deepseek_v2"] + " num_nextn_predict_layers"
_COMMON = frozenset("hidden_size num_attention_heads num_hidden_layers vocab_size".split())


def model_fields_from_hf(cfg: dict, *, seq_length: int | None = None) -> tuple[dict, list[str]]:
    """Megatron ModelSpec fields of a parsed config.json, and notes on what was assumed."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config.json must hold a JSON object, but got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED:
        raise ConfigError(f"config.json `model_type` must be one of {list(SUPPORTED)}, but got "
                          f"(model_type={model_type!r}); describe the model in a YAML file instead")
    known = HARMLESS | _COMMON | set(_STEP_SHAPING) | set(_EXTRA_KEYS.get(model_type, "").split())
    unknown = sorted(k for k in cfg if k not in known)
    if unknown:
        raise UnmodelledError(f"config.json key(s) {unknown} are not known to echo-tune (neither mapped to a "
                              f"Megatron setting nor listed as harmless in config/load/hf_config.py), so it cannot "
                              f"tell whether they shape the step; remove them")
    notes: list[str] = []
    cfg = HFValues(cfg, model_type)
    seq = _seq_length(cfg, model_type, seq_length, notes)
    if model_type == "gpt2":
        fields = _gpt2(cfg, seq)
    elif model_type == "gpt_neox":
        fields = _neox(cfg, seq)
    elif model_type.startswith("deepseek"):
        fields = _deepseek(cfg, model_type, seq, notes)
    else:
        fields = _llama_like(cfg, model_type, seq, notes)
    fields.update(rebuild_fields(cfg, model_type, seq, notes))
    raise_problems(cfg.problems, "config.json")  # every wrong value at once, before any check that uses them
    _check_refused(cfg, model_type, seq)
    return fields, notes


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"model file {str(path)!r} does not exist; give a preset name, a YAML file or a "
                          f"Hugging Face config.json")
    try:
        return load_json(read_text(path, "model file"), f"model file {str(path)!r}")
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"model file {str(path)!r} is not valid JSON: {exc}") from None


def load_hf_config(path: str | Path, *, seq_length: int | None = None, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (see the module docstring)."""
    path = Path(path)
    cfg = _read(path)
    fields, _ = model_fields_from_hf(cfg, seq_length=seq_length)
    named = str(cfg.get("_name_or_path") or "").rstrip("/").split("/")[-1]
    default = path.stem if path.stem != "config" else (named or path.resolve().parent.name or "config")
    return build(ModelSpec, {"name": name or default, **fields}, f"model of {path}")


def hf_notes(path: str | Path, *, seq_length: int | None = None) -> list[str]:
    """The assumptions ``load_hf_config`` makes for this file (for reports)."""
    return model_fields_from_hf(_read(Path(path)), seq_length=seq_length)[1]
