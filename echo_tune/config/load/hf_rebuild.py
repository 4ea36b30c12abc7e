"""The config.json settings a Megatron launch line needs to rebuild the model (config/specs/rebuild_fields.py).

Mapped to Megatron-LM d98e8a64ddf3 flags: ``rope_theta`` (``rotary_emb_base`` for GPT-NeoX) to
``--rotary-base``; ``rms_norm_eps`` / ``layer_norm_epsilon`` / ``layer_norm_eps`` to ``--norm-epsilon``;
Qwen2's q/k/v biases (``Qwen2Attention``: bias on q_proj, k_proj, v_proj only) to ``--add-qkv-bias``;
Llama 3.1's ``rope_scaling`` (rope_type llama3) to ``--use-rope-scaling --rope-scaling-factor``; DeepSeek's
YaRN ``rope_scaling`` to ``--rotary-scaling-factor --mscale --mscale-all-dim``; ``max_position_embeddings``
to ``--max-position-embeddings``. What Megatron cannot express is named in a note (and so in the header of
every command): e.g. Llama 3.1 scaling with factors other than the ones Megatron fixes
(core/models/common/embeddings/rotary_pos_embedding.py ``_apply_scaling``: low_freq_factor 1,
high_freq_factor 4, original_max_position_embeddings 8192).
"""

from __future__ import annotations

from echo_tune.config.load.hf_values import HFValues

# transformers' class defaults where a config.json leaves the epsilon out
_EPS = {"llama": ("rms_norm_eps", 1e-6), "mistral": ("rms_norm_eps", 1e-6), "mixtral": ("rms_norm_eps", 1e-5),
        "qwen2": ("rms_norm_eps", 1e-6), "qwen3": ("rms_norm_eps", 1e-6), "qwen3_moe": ("rms_norm_eps", 1e-6),
        "deepseek_v2": ("rms_norm_eps", 1e-6), "deepseek_v3": ("rms_norm_eps", 1e-6),
        "gpt2": ("layer_norm_epsilon", 1e-5), "gpt_neox": ("layer_norm_eps", 1e-5)}
_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# YaRN settings Megatron's MLA config fixes (core/transformer/transformer_config.py MLATransformerConfig)
_MLA_YARN_FIXED = {"beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096}


def _number(cfg: HFValues, scaling: dict, key: str, default: float) -> float:
    return cfg.number(key, default, where=scaling, name=f"rope_scaling.{key}")


def rebuild_fields(cfg: HFValues, model_type: str, seq: int, notes: list[str]) -> dict:
    key, default = _EPS[model_type]
    out: dict = {"norm_epsilon": cfg.number(key, default)}
    if model_type != "gpt2":
        theta = cfg.number("rotary_emb_base" if model_type == "gpt_neox" else "rope_theta", 10000.0)
        if theta == int(theta):
            out["rotary_base"] = int(theta)
        else:
            notes.append(f"rope_theta {theta} is not written: Megatron-LM's --rotary-base is an integer")
    if model_type == "qwen2":
        out["add_qkv_bias"] = True
    if model_type in ("qwen3_moe", "deepseek_v2") and not cfg.flag("norm_topk_prob", False):
        # transformers' default is False for both: softmax over every expert, the top-k weights not renormalised;
        # Megatron's router renormalises unless --moe-router-pre-softmax
        notes.append("norm_topk_prob false (the top-k routing weights are not renormalised): add "
                     "--moe-router-pre-softmax to the launch line (router numerics, not written: they do not "
                     "change the simulated step)")
    if model_type.startswith("deepseek"):
        router = {k: cfg[k] for k in ("scoring_func", "routed_scaling_factor", "n_group", "topk_group", "topk_method",
                                      "norm_topk_prob")
                  if cfg.get(k) is not None}
        if router:  # router numerics (--moe-router-score-function, --moe-router-topk-scaling-factor, ...)
            notes.append(f"router settings {router} are not written to the launch line (echo-tune does not read "
                         f"them: they change routing numerics, not the simulated step); add their Megatron flags")
    longest = cfg.integer("n_positions" if model_type == "gpt2" else "max_position_embeddings", None)
    if longest is not None and longest > seq:  # (equal: the default, None)
        out["max_position_embeddings"] = longest
    elif longest is not None and longest < seq:
        notes.append(f"max_position_embeddings {longest} < seq_length {seq}: written as --max-position-embeddings "
                     f"{seq} (Megatron-LM asserts max_position_embeddings >= seq_length)")
    scaling = cfg.mapping("rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type"))
    if not scaling or kind in (None, "default"):
        return out
    if kind == "llama3" and model_type not in ("deepseek_v2", "deepseek_v3"):
        out.update(use_rope_scaling=True, rope_scaling_factor=_number(cfg, scaling, "factor", 8.0))
        fixed = {k: scaling.get(k) for k, v in _LLAMA3_FIXED.items() if scaling.get(k) not in (None, v)}
        if fixed:
            notes.append(f"rope_scaling {fixed} cannot be written: Megatron-LM's --use-rope-scaling fixes "
                         f"{_LLAMA3_FIXED}")
    elif kind == "yarn" and model_type.startswith("deepseek"):
        out.update(rotary_scaling_factor=_number(cfg, scaling, "factor", 1.0),
                   mscale=_number(cfg, scaling, "mscale", 1.0), mscale_all_dim=_number(cfg, scaling, "mscale_all_dim", 0.0))
        fixed = {k: scaling.get(k) for k, v in _MLA_YARN_FIXED.items() if scaling.get(k) not in (None, v)}
        if fixed:
            notes.append(f"rope_scaling {fixed} cannot be written: Megatron-LM's multi-latent attention fixes "
                         f"{_MLA_YARN_FIXED}")
    else:
        notes.append(f"rope_scaling of type {kind!r} is not written to the launch line (no Megatron-LM flag of "
                     f"d98e8a64ddf3 maps it for model_type {model_type!r}); it does not change the simulated step")
    return out
