"""Help lines for the Megatron flags, from the spec dataclasses' field docstrings (one source of truth), with
the allowed values where a field has a fixed set of them."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from echo_tune.config.specs import model as model_mod
from echo_tune.config.specs import layer_fields
from echo_tune.config.specs import moe_fields
from echo_tune.config.specs import parallel as parallel_mod
from echo_tune.config.specs import precision_fields


@functools.cache
def field_docs() -> dict[str, str]:
    """Field name -> its docstring (the string literal right after the annotated field)."""
    docs: dict[str, str] = {}
    # each spec and the field groups it is built from (ParallelConfig's precision, schedule, FSDP, optimizer rooms)
    classes = [c for spec in (model_mod.ModelSpec, parallel_mod.ParallelConfig) for c in spec.__mro__
               if c.__module__.startswith("echo_tune.") and "__dataclass_fields__" in vars(c)]
    for cls in classes:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs.setdefault(node.target.id, " ".join(nxt.value.value.split()))
    return docs


CHOICES = {
    "normalization": model_mod.NORMALIZATIONS, "attention_backend": model_mod.ATTENTION_BACKENDS,
    "position_embedding_type": model_mod.POSITION_EMBEDDING_TYPES,
    "moe_token_dispatcher_type": moe_fields.DISPATCHERS, "moe_router_load_balancing_type": moe_fields.LOAD_BALANCING,
    "moe_router_dtype": tuple(c for c in moe_fields.ROUTER_DTYPES if c),
    "moe_flex_dispatcher_backend": moe_fields.FLEX_BACKENDS,
    "recompute_granularity": tuple(c for c in parallel_mod.RECOMPUTE_GRANULARITIES if c),
    "recompute_method": tuple(c for c in parallel_mod.RECOMPUTE_METHODS if c),
    "fp8_format": tuple(c for c in precision_fields.FP8_FORMATS if c), "fp8_recipe": precision_fields.FP8_RECIPES,
    "softmax_type": layer_fields.SOFTMAX_TYPES, "cross_entropy_fusion_impl": layer_fields.CROSS_ENTROPY_FUSION_IMPLS,
    "transformer_impl": layer_fields.TRANSFORMER_IMPLS,
}


def choices_of(field: str) -> tuple[str, ...] | None:
    """The allowed values of a text field (None if any text, or for numbers and switches)."""
    return tuple(CHOICES[field]) if field in CHOICES else None


def help_for(field: str, flag: str) -> str:
    doc = field_docs().get(field, "")
    text = doc.split("``: ", 1)[1] if doc.startswith("``") and "``: " in doc else (doc or f"Megatron-LM {flag}")
    return text.replace("%", "%%")
