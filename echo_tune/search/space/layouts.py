"""The one place that draws layouts from a space: the Optuna sampler and the enumerator share it.

Settings are chosen in ``FIELD_ORDER``. A setting that has no effect given the earlier choices (sequence
parallelism at TP=1, interleaving without a pipeline, the recompute method without full recompute, the
distributed optimizer's parameter all-gather without it, gradient-reduce overlap at DP=1) takes its
"off" value whatever was drawn for it. That removes duplicate layouts and spurious rejections.

Validity is ``check_compatible``, the simulator's own rule book, applied three times:

1. after the "shape" settings (GPU count, TP, PP, CP, uneven stages, micro-batch size), with every later
   setting off. Off values never add a rule, so a failure here holds for every completion: the
   enumerator skips the whole subtree, and ``draw`` stops there with that rule;
2. the same after the interleaving settings (``CHECK_AFTER``);
3. on the complete layout.

A layout is valid when all pass. ``enumerate_layouts`` walks every choice; ``draw`` follows one
``choose`` callback (an Optuna trial's suggestions in ``params.suggest_layout``, a stored trial's params
in ``params.layout_of``). Both go through the same ``options`` and ``_check``, so they agree on the
space. How the samplers avoid proposing invalid layouts in the first place is in ``sampler.py``.
"""

from __future__ import annotations

import dataclasses
import functools

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from echo_tune.config.rules.compatibility import Layout, check_compatible
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.rules.schedule_rules import userbuffers_reach_linears
from echo_tune.errors import ConfigError
from echo_tune.search.space.fields import MODEL_LAYOUT_FIELDS, MODULE_SET_FIELDS, module_choice, module_set
from echo_tune.search.space.search_space import FIELD_ORDER, SearchSpace
from echo_tune.search.space.features import FEATURE_FIELDS, feature_applies, model_of
from echo_tune.search.space.pipeline_layouts import layouts_for_pp
from echo_tune.search.space.uneven import SPLIT_FIELDS, consistent_values

# Settings chosen before the first check: they fix the traced shapes and the rank layout.
SHAPE_FIELDS = FIELD_ORDER[:FIELD_ORDER.index("micro_batch_size") + 1]
# After these the partial layout is checked (later settings off): a failure holds for every completion. The
# second, after the interleaving settings, skips the completions of an interleaving the stages' layers do not
# divide into (on the Qwen3-30B-A3B / 256 H100 space 19,440 of 62,634 complete layouts were built and
# rejected one by one for it).
CHECK_AFTER = (SHAPE_FIELDS[-1], "num_layers_per_virtual_pipeline_stage")
OFF = {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
       "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
       "account_for_embedding_in_pipeline_split": False, "account_for_loss_in_pipeline_split": False,
       "virtual_pipeline_model_parallel_size": None, "num_layers_per_virtual_pipeline_stage": None,
       "sequence_parallel": False, "tp_comm_overlap": False, "recompute_granularity": None,
       "recompute_method": None, "recompute_num_layers": None, "use_distributed_optimizer": False,
       "overlap_param_gather": False, "overlap_grad_reduce": False, "fp8_format": None, "fp8_param_gather": False,
       "pipeline_model_parallel_layout": None, "recompute_modules": None,
       "overlap_param_gather_with_optimizer_step": False,
       "fp8_recipe": "delayed", "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False,
       "cuda_graph_impl": "none", "cuda_graph_modules": None}
"""Each ParallelConfig setting's off value (a model setting's off value is the model's own: ``model_off``)."""
PARALLEL_FIELDS = tuple(f for f in FIELD_ORDER[1:] if f not in MODEL_LAYOUT_FIELDS)


class RejectedLayout(Exception):
    """A drawn combination that breaks a rule; ``rule`` is check_compatible's one-line message."""

    def __init__(self, rule: str, config: dict):
        super().__init__(rule)
        self.rule = rule
        self.config = config


TUPLE_FIELDS = tuple(f.name for f in dataclasses.fields(ParallelConfig) if "tuple" in str(f.type))
"""ParallelConfig's settings that hold a tuple (a stored trial's JSON gives them back as lists)."""


def config_key(config: dict) -> tuple:
    """A layout's identity from its settings by name (a candidate's ``config``, or one a trial stored: a module
    set comes back from JSON as a list)."""
    lists = [f for f in TUPLE_FIELDS if type(config.get(f)) is list]  # per field, not per item: 50k keys a search
    if lists:
        config = {**config, **{f: tuple(config[f]) for f in lists}}
    return tuple(sorted(config.items()))


@dataclass(frozen=True)
class Candidate:
    """A valid layout of a space: the world size and the Megatron settings."""

    num_gpus: int
    parallel: ParallelConfig
    layout: Layout
    """check_compatible's derived values (DP size, micro-batches, stage layers, schedule)."""
    model: ModelSpec
    """The space's model with the layout's MODEL_LAYOUT_FIELDS settings (the space's own object when they are the
    model's)."""

    @functools.cached_property
    def _config(self) -> dict:
        return {"num_gpus": self.num_gpus, **self.parallel.to_dict(),
                **{f: getattr(self.model, f) for f in MODEL_LAYOUT_FIELDS}}

    @property
    def config(self) -> dict:
        """Every setting by Megatron name, plus the world size (a fresh copy: built once per candidate)."""
        return dict(self._config)

    @property
    def key(self) -> tuple:
        """The layout's identity: every setting by name, sorted (built per call: kept on every layout it cost
        16 MB on a 43k-layout default search and saved no time)."""
        return config_key(self._config)

    @property
    def shape(self) -> tuple:
        """What the tracer caches on: runs of one shape share a trace."""
        p = self.parallel
        return (p.tensor_model_parallel_size, p.context_parallel_size, self.layout.sequence_parallel,
                p.micro_batch_size, p.precision, p.expert_model_parallel_size, p.expert_tensor_size,
                *(getattr(self.model, f) for f in MODEL_LAYOUT_FIELDS))


def setting(candidate: Candidate, field_name: str):
    """A searched setting's value in a layout, as the space lists it (a module set as one word)."""
    if field_name == "num_gpus":
        return candidate.num_gpus
    if field_name in MODEL_LAYOUT_FIELDS:
        return getattr(candidate.model, field_name)
    value = getattr(candidate.parallel, field_name)
    return module_choice(value) if field_name in MODULE_SET_FIELDS else value


def applicable(field_name: str, chosen: dict, model: ModelSpec | None = None) -> bool:
    """Whether ``field_name`` changes the step, given the settings chosen before it (and the model: without it,
    the model's part of the rule is taken to hold)."""
    tp = chosen.get("tensor_model_parallel_size", 1)
    pp = chosen.get("pipeline_model_parallel_size", 1)
    if field_name in SPLIT_FIELDS or field_name in ("virtual_pipeline_model_parallel_size",
                                                    "num_layers_per_virtual_pipeline_stage"):
        return pp > 1 and not chosen.get("pipeline_model_parallel_layout")  # a layout sets stages and chunks itself
    if field_name == "pipeline_model_parallel_layout":
        return pp > 1
    if field_name in FEATURE_FIELDS:
        return feature_applies(field_name, chosen, model)
    if field_name == "sequence_parallel":
        return tp > 1
    if field_name == "tp_comm_overlap":
        return tp > 1 and bool(chosen.get("sequence_parallel"))
    if field_name in ("recompute_method", "recompute_num_layers"):
        return chosen.get("recompute_granularity") == "full"
    if field_name == "overlap_param_gather":  # Megatron asserts it comes with --overlap-grad-reduce (below)
        return bool(chosen.get("use_distributed_optimizer")) and _reduces_gradients(chosen)
    if field_name == "fp8_param_gather":
        return bool(chosen.get("use_distributed_optimizer")) and chosen.get("fp8_format") is not None
    if field_name == "overlap_grad_reduce":
        return _reduces_gradients(chosen)
    return True


def _reduces_gradients(chosen: dict) -> bool:
    """Whether some gradient is reduced over more than one rank: the data-parallel group (times CP) or, for
    routed experts, the expert-data-parallel group (which can exceed one at DP 1: TP4 EP2 ETP1 on 4 GPUs)."""
    tp, pp = chosen.get("tensor_model_parallel_size", 1), chosen.get("pipeline_model_parallel_size", 1)
    per_stage = chosen["num_gpus"] // pp
    if per_stage // (tp * chosen.get("context_parallel_size", 1)) > 1:
        return True
    ep = chosen.get("expert_model_parallel_size", 1)
    etp = chosen.get("expert_tensor_parallel_size") or tp
    return ep > 1 and per_stage // (ep * etp) > 1


def off_value(space: SearchSpace, field_name: str):
    """The value a setting takes where it has no effect: OFF's, or for a model setting the model's own."""
    return getattr(space.model, field_name) if field_name in MODEL_LAYOUT_FIELDS else OFF[field_name]


def options(space: SearchSpace, field_name: str, chosen: dict) -> tuple:
    """The values ``field_name`` may take after ``chosen``: its list, or its off value if it has no effect."""
    if not applicable(field_name, chosen, space.model):
        return (off_value(space, field_name),)
    if field_name == "pipeline_model_parallel_layout" and space.generated_layouts:
        return layouts_for_pp(space.choices[field_name], chosen["pipeline_model_parallel_size"])
    if field_name in SPLIT_FIELDS and space.canonical_splits:
        # `auto` uneven stages: the canonical splits of the chosen PP (uneven.py), not every combination
        return consistent_values(field_name, space.choices[field_name], space.model.num_layers, chosen) \
            or space.choices[field_name][:1]
    if field_name == "expert_tensor_parallel_size":
        # canonical layouts: unset ETP is Megatron's default, ETP = TP, so at the chosen TP one of the two
        # spellings is an alias of the other (EP4 ETP1 and EP4 at TP 1 are one layout): keep the first listed
        tp, seen, kept = chosen.get("tensor_model_parallel_size", 1), set(), []
        for v in space.choices[field_name]:
            if (tp if v is None else v) not in seen:
                seen.add(tp if v is None else v)
                kept.append(v)
        return tuple(kept)
    if field_name == "tp_comm_overlap" and not userbuffers_reach_linears(space.model):
        return (False,)  # Megatron turns it off (MLA models): on would be an alias
    if field_name == "sequence_parallel" and space.model.is_moe and chosen.get("tensor_model_parallel_size", 1) > 1:
        # Megatron-Core's MoE layer refuses TP > 1 without sequence parallelism (moe_layer.py)
        return tuple(v for v in space.choices[field_name] if v) or space.choices[field_name]
    return space.choices[field_name]


def _parallel(space: SearchSpace, chosen: dict) -> ParallelConfig:
    fields = {f: chosen.get(f, OFF.get(f)) for f in PARALLEL_FIELDS}
    for f in MODULE_SET_FIELDS:
        fields[f] = module_set(fields[f])
    if "sequence_parallel" not in chosen and space.model.is_moe:
        fields["sequence_parallel"] = True  # not drawn yet: the shape check must not reject MoE with TP > 1
    return ParallelConfig(global_batch_size=space.global_batch_size, precision=space.precision, **fields)


def _checked(space: SearchSpace, chosen: dict) -> tuple[ParallelConfig, Layout]:
    """check_compatible on ``chosen`` (fields not chosen yet are off): the settings and their derived values;
    raises RejectedLayout."""
    try:
        parallel, model = _parallel(space, chosen), model_of(space, chosen)
        return parallel, check_compatible(model, space.cluster, chosen["num_gpus"], parallel), model
    except ConfigError as exc:
        raise RejectedLayout(str(exc), dict(chosen)) from None


def _check(space: SearchSpace, chosen: dict) -> Layout:
    return _checked(space, chosen)[1]


def _candidate(space: SearchSpace, chosen: dict) -> Candidate:
    """The complete layout ``chosen``, checked; raises RejectedLayout."""
    parallel, layout, model = _checked(space, chosen)
    return Candidate(num_gpus=chosen["num_gpus"], parallel=parallel, layout=layout, model=model)


def draw(space: SearchSpace, choose: Callable[[str, tuple], object]) -> Candidate:
    """Draw one layout: ``choose(field, values)`` picks each setting that has several possible values.

    Raises RejectedLayout (with the broken rule) as soon as the drawn settings cannot be valid.
    """
    chosen: dict = {}
    for field_name in FIELD_ORDER:
        values = options(space, field_name, chosen)
        chosen[field_name] = values[0] if len(values) == 1 else choose(field_name, values)
        if field_name in MODULE_SET_FIELDS:  # a stored layout's list of names, as the space lists it
            chosen[field_name] = module_choice(chosen[field_name])
        if field_name in SPLIT_FIELDS and chosen[field_name] not in values:
            raise RejectedLayout(f"`{field_name}` must be one of the canonical uneven splits of this PP "
                                 f"(search/space/uneven.py), but got ({field_name}={chosen[field_name]!r}, allowed "
                                 f"{list(values)})", dict(chosen))
        if field_name in CHECK_AFTER:
            _check(space, chosen)
    return _candidate(space, chosen)


def _chosen(space: SearchSpace, chosen: dict, index: int, stop: int, stats: Counter | None) -> Iterator[dict]:
    """The settings of ``FIELD_ORDER[index:stop]`` added to ``chosen``, every way that passes the partial checks
    (``CHECK_AFTER``), in drawing order."""
    if index == stop:
        yield chosen
        return
    field_name = FIELD_ORDER[index]
    for value in options(space, field_name, chosen):
        nxt = {**chosen, field_name: value}
        if field_name in CHECK_AFTER:
            try:
                _check(space, nxt)
            except RejectedLayout as exc:
                if stats is not None:  # one count for the whole subtree
                    stats[exc.rule] += 1
                continue
        yield from _chosen(space, nxt, index + 1, stop, stats)


def _walk(space: SearchSpace, chosen: dict, index: int, stats: Counter | None) -> Iterator[Candidate]:
    for complete in _chosen(space, chosen, index, len(FIELD_ORDER), stats):
        try:
            yield _candidate(space, complete)
        except RejectedLayout as exc:
            if stats is not None:
                stats[exc.rule] += 1


def enumerate_layouts(space: SearchSpace, stats: Counter | None = None) -> Iterator[Candidate]:
    """Every valid layout of the space, in drawing order.

    ``stats`` counts rejections by rule: a rejected shape counts once for all its completions.
    """
    yield from _walk(space, {}, 0, stats)


def shape_prefixes(space: SearchSpace, stats: Counter | None = None) -> Iterator[dict]:
    """The shapes that pass the first check (``SHAPE_FIELDS`` chosen), in drawing order: the layouts of the
    space are their ``completions`` in this order (``enumerate_layouts``, cut at the first check)."""
    yield from _chosen(space, {}, 0, len(SHAPE_FIELDS), stats)


def completions(space: SearchSpace, prefix: dict, stats: Counter | None = None) -> Iterator[Candidate]:
    """The valid layouts that complete a ``shape_prefixes`` shape, in drawing order."""
    yield from _walk(space, prefix, len(SHAPE_FIELDS), stats)
