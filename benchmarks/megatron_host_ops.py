"""Count the host-side operations Megatron-Core's MoE layer (and a dense GPT layer) issues.

What it measures
----------------
Builds Megatron-Core modules from the *local* (non-TransformerEngine) spec on CPU, runs one
training forward and one backward of

  * ``moe``:         a bare ``MoELayer`` (router + alltoall token dispatcher + SequentialMLP
                     experts), input [seq, mb, hidden];
  * ``moe_layer``:   a full GPT ``TransformerLayer`` with that MoE MLP (attention included);
  * ``dense_layer``: a full GPT ``TransformerLayer`` with a dense SwiGLU MLP,

and counts, separately for forward and backward:

  * ``dispatch``: aten ops reaching the dispatcher (``TorchDispatchMode``). The first column
    counts ops that launch a kernel on a GPU (compute, copies, collectives); the ``+`` column
    counts views, ``detach``/``alias`` and bare allocations (``empty``/``new_empty``), which
    cost host time but launch nothing;
  * ``function``: Python-level torch calls (``TorchFunctionMode``): ``torch.*``, ``Tensor.*``
    methods and ``torch.nn.functional`` calls made from Python; the ``+`` column counts tensor
    metadata reads (``.shape``, ``.dtype``, ``.is_cuda``, ``size()``, ``dim()``...). In
    backward only the bodies of Python ``autograd.Function.backward`` show up (the C++
    autograd engine does not go through ``__torch_function__``);
  * ``python``: ``nn.Module`` calls and (``+`` column) ``autograd.Function.apply`` calls in
    forward. These are attributed to the *caller* (the expert MLP modules show up under
    ``experts.fixed`` because SequentialMLP calls them).

Each op is attributed from its Python stack (forward) or from the forward stack recorded by
anomaly mode on the autograd node that runs it (backward) to: router, dispatcher, experts
(``per_expert``: inside one expert's MLP in SequentialMLP's python loop, and ``fixed``),
moe_glue (MoELayer's own code), attention, norm, layer_glue (residual adds etc. in
TransformerLayer), dense_mlp. It also tallies the ops inside the code paths that
``--moe-router-fusion`` and ``--moe-permute-fusion`` replace with TransformerEngine kernels,
so one can estimate the fused count.

Source: Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22), the version
echo-tune cites. Extract it with
``git -C <mirror> archive d98e8a64dd megatron | tar -x -C /tmp/mlm`` and pass
``--megatron /tmp/mlm``.

Usage::

    python benchmarks/megatron_host_ops.py --megatron /tmp/mlm [--ep 1] [--experts 128]
        [--topk 8] [--hidden 256] [--moe-ffn 64] [--seq 128] [--json out.json]

``--ep N`` spawns N gloo processes (EP=N, TP=PP=1) so the EP>1 code paths (token-count
all-gather, all-to-all) run; counts are from rank 0.

Measured (2026-12-04, torch 2.13 CPU; ``--ep 8 --experts 128 --topk 8``, 16 local experts,
hidden 256, moe_ffn 64, seq 128, mb 1; kernel-launching aten ops, forward / backward):
router 25 / 13, alltoall dispatcher 27 / 11, experts 1 / 2 fixed + 6 / 11 per local expert,
attention (qk-norm, unfused RoPE and softmax) 45 / 62, two RMSNorms 12 / 30, residuals 2 / 0;
whole MoE layer 208 / 294, dense layer 64 / 100. The code paths that --moe-router-fusion
replaces hold 18 / 8 of the router's ops, those --moe-permute-fusion replaces 11 / 8 of the
dispatcher's.

Limits (read before quoting the numbers)
----------------------------------------
* CPU, fp32, no TransformerEngine, no apex, no triton, no DeepEP: the real GPU runs use TE
  linears/norms/attention (one C++ call each where this counts the unfused torch ops),
  ``--moe-grouped-gemm`` (TE GroupedLinear: one call per fc, not a Python loop over
  experts), ``--moe-router-fusion`` / ``--moe-permute-fusion`` (TE kernels) and, for the
  Qwen3-30B-A3B row echo-tune models, the *flex* dispatcher with DeepEP, which cannot run on
  CPU; this script runs the alltoall dispatcher instead.
* CUDA-only calls are shimmed: ``torch.cuda.Stream/Event/stream/current_stream`` become
  no-ops, ``torch.cuda.current_device()`` returns ``"cpu"``, the RNG tracker's ``fork`` is a
  no-op (on GPU it does get/set of the CUDA RNG state: host calls that are not aten ops on
  the traced tensors), the router's "move weight to GPU" is skipped, the triton paged-stash
  module is stubbed, the unfused softmax's default causal mask is built on CPU. The
  dispatcher's device-to-host copies of tokens_per_expert / split sizes
  (``.to('cpu', non_blocking=True)`` plus an event sync on GPU) are counted as one ``clone``
  each (``maybe_move_tensor_to_cpu`` is replaced in ``token_dispatcher``).
* One forward and one backward after a warm-up step; no optimizer, no gradient reduction,
  no pipeline schedule, no --overlap-moe-expert-parallel-comm / --delay-wgrad-compute
  (the Qwen3-30B-A3B row uses both).
* aten counts are not kernel counts: CPU and CUDA decompositions differ (e.g. RMSNorm is six
  aten ops here), and ops on tensors that live on the host on a GPU run too (the alltoall
  dispatcher's split sizes after its device-to-host copy) count like the others.
* Autograd engine bookkeeping (e.g. gradient accumulation into a tensor used twice) is
  attributed to the node running at the time or to ``unattributed``.

Not imported by tests; needs the Megatron source tree, torch, numpy, packaging.
"""

import argparse
import collections
import contextlib
import json
import os
import sys
import types

CATEGORIES = (
    "router",
    "dispatcher",
    "experts.fixed",
    "experts.per_expert",
    "moe_glue",
    "attention",
    "norm",
    "dense_mlp",
    "layer_glue",
    "unattributed",
)

# Tensor metadata reads: host-side but not dispatched work; listed apart.
_META_NAMES = {
    "__get__",
    "size",
    "dim",
    "numel",
    "stride",
    "is_contiguous",
    "element_size",
    "nelement",
    "data_ptr",
    "get_device",
    "is_floating_point",
    "is_complex",
    "__len__",
    "__hash__",
    "__eq__",
    "__bool__",
    "is_tensor",
    "__format__",
    "__repr__",
    "_has_compatible_shallow_copy_type",
    "is_grad_enabled",
    "are_deterministic_algorithms_enabled",
}

# aten ops that launch no kernel on a GPU (besides view ops, which are detected by is_view)
_NO_KERNEL_OPS = {
    "empty",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "empty_like",
    "detach",
    "alias",
    "_unsafe_view",
    "lift_fresh",
}

# Code paths that TE fusions replace (moe_utils.py function names).
ROUTER_FUSION_FUNCS = {
    "topk_routing_with_score_function",  # -> TE fused_topk_with_score_function
    "compute_routing_scores_for_aux_loss",  # -> TE fused_compute_score_for_moe_aux_loss
    "switch_load_balancing_loss_func",  # -> TE fused_moe_aux_loss
}
PERMUTE_FUSION_FUNCS = {
    "permute",  # -> TE moe_permute_with_probs
    "unpermute",  # -> TE moe_unpermute
    "sort_chunks_by_idxs",  # -> TE moe_sort_chunks_by_index(_with_probs)
}


# ----------------------------------------------------------------------------- CPU shims
def install_shims():
    import torch

    # triton kernels for the paged stash (imported by moe_layer's import chain)
    stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
    stub.GLOBAL_BLOCK_SIZE = 1024

    def _no_triton(*a, **k):
        raise RuntimeError("paged-stash triton kernel is stubbed on CPU")

    stub.paged_stash_copy_kernel = _no_triton
    stub.paged_stash_pop_kernel = _no_triton
    stub.__all__ = ["GLOBAL_BLOCK_SIZE", "paged_stash_copy_kernel", "paged_stash_pop_kernel"]
    sys.modules[stub.__name__] = stub

    class _Event:
        def __init__(self, *a, **k):
            pass

        def record(self, *a, **k):
            pass

        def synchronize(self):
            pass

        def wait(self, *a, **k):
            pass

        def query(self):
            return True

    class _Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, *a, **k):
            pass

        def wait_event(self, *a, **k):
            pass

        def record_event(self, *a, **k):
            return _Event()

        def synchronize(self):
            pass

    _default = _Stream()
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda *a, **k: _default
    torch.cuda.default_stream = lambda *a, **k: _default
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None


def patch_megatron():
    """Post-import patches of GPU-only bits on Megatron objects."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import router as mrouter
    from megatron.core.transformer.moe.moe_utils import router_gating_linear

    tracker = mrandom.get_cuda_rng_tracker()
    tracker.fork = lambda *a, **k: contextlib.nullcontext()

    def gating(self, input):  # Router.gating minus the "move weight to GPU" lines
        router_dtype = input.dtype
        if self.config.moe_router_dtype == "fp32":
            router_dtype = torch.float32
        elif self.config.moe_router_dtype == "fp64":
            router_dtype = torch.float64
        return router_gating_linear(input, self.weight, self.bias, router_dtype)

    mrouter.Router.gating = gating

    from megatron.core.fusions import fused_softmax

    def get_default_causal_mask(sq):  # same ops as Megatron's, on CPU instead of "cuda"
        return torch.triu(torch.ones(sq, sq), diagonal=1).bool()

    fused_softmax.get_default_causal_mask = get_default_causal_mask

    from megatron.core.transformer.moe import token_dispatcher

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        # On GPU this is tensor.to("cpu", non_blocking=True) (one D2H copy launch) and
        # .numpy() for the all-to-all split sizes; here the tensors already live on the CPU,
        # so a clone stands in for the copy to keep the op count.
        if torch.is_tensor(tensor):
            tensor = tensor.clone()
            if as_numpy:
                tensor = tensor.numpy()
        return tensor

    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


# ----------------------------------------------------------------------------- attribution
def _norm(path):
    return path.replace(os.sep, "/")


def classify(frames):
    """frames: list of (file, func), outermost first. Returns (category, fusion_tag, owner)."""
    mf = [(_norm(f), fn) for f, fn in frames if "/megatron/" in _norm(f)]
    if not mf:
        return "unattributed", None, None

    def idx(sub):
        for i in range(len(mf) - 1, -1, -1):
            if sub in mf[i][0]:
                return i
        return -1

    fusion = None
    for f, fn in mf:
        if f.endswith("moe/moe_utils.py"):
            if fn in ROUTER_FUSION_FUNCS:
                fusion = "router_fusion:" + fn
            elif fn in PERMUTE_FUSION_FUNCS:
                fusion = "permute_fusion:" + fn
    # innermost megatron function, for the breakdown
    owner = None
    i_exp = idx("transformer/moe/experts.py")
    if i_exp >= 0:
        cat = (
            "experts.per_expert"
            if any("transformer/mlp.py" in f for f, _ in mf[i_exp + 1 :])
            else "experts.fixed"
        )
        base = i_exp
    elif idx("transformer/moe/token_dispatcher.py") >= 0:
        cat, base = "dispatcher", idx("transformer/moe/token_dispatcher.py")
    elif idx("transformer/moe/router.py") >= 0:
        cat, base = "router", idx("transformer/moe/router.py")
    elif idx("transformer/moe/moe_layer.py") >= 0:
        cat, base = "moe_glue", idx("transformer/moe/moe_layer.py")
    elif (
        idx("transformer/attention.py") >= 0
        or idx("dot_product_attention") >= 0
        or idx("rope_utils") >= 0
    ):
        cat = "attention"
        base = max(idx("transformer/attention.py"), idx("dot_product_attention"), idx("rope_utils"))
        # qk-norm inside attention counts as attention (echo-tune puts it under qkv)
    elif idx("transformer/mlp.py") >= 0:
        cat, base = "dense_mlp", idx("transformer/mlp.py")
    elif any(_norm(f).endswith("nn/modules/normalization.py") for f, _ in frames) or (
        idx("torch_norm") >= 0 or idx("fused_layer_norm") >= 0
    ):
        # input_layernorm / pre_mlp_layernorm (torch.nn.RMSNorm via WrappedTorchNorm)
        cat, base = "norm", idx("transformer_layer.py")
    elif idx("transformer_layer.py") >= 0:
        cat, base = "layer_glue", idx("transformer_layer.py")
    else:
        return "unattributed", fusion, mf[-1][1]
    # name the first megatron function called below the owning file (or the owner itself)
    below = mf[base + 1 :]
    owner = below[0][1] if below else mf[base][1]
    if cat == "experts.per_expert":
        owner = mf[-1][1]
    return cat, fusion, mf[-1][0].split("/megatron/core/")[-1] + ":" + owner


def _live_frames():
    f = sys._getframe(2)
    out = []
    while f is not None:
        out.append((f.f_code.co_filename, f.f_code.co_name))
        f = f.f_back
    out.reverse()
    return out


def _tb_frames(tb_lines):
    """Parse anomaly-mode traceback strings into (file, func) pairs, outermost first."""
    out = []
    for chunk in tb_lines:
        for line in chunk.splitlines():
            line = line.strip()
            if line.startswith('File "'):
                try:
                    file = line.split('"')[1]
                    func = line.rsplit(" in ", 1)[1]
                except IndexError:
                    continue
                out.append((file, func))
    return out


class Recorder:
    def __init__(self, param_cats):
        self.phase = None
        self.rows = collections.Counter()  # (mode, phase, cat, kind, name, fusion, owner)
        self.param_cats = param_cats  # id(param) -> category
        self._node_cache = {}

    def where(self):
        import torch

        if self.phase == "backward":
            node = torch._C._current_autograd_node()
            if node is None:
                return "unattributed", None, None
            key = id(node)
            hit = self._node_cache.get(key)
            if hit is not None and hit[0] is node:
                return hit[1]
            var = getattr(node, "variable", None)
            if var is not None:  # AccumulateGrad
                res = (self.param_cats.get(id(var), "unattributed"), None, "AccumulateGrad")
            else:
                tb = node.metadata.get("traceback_") if hasattr(node, "metadata") else None
                res = classify(_tb_frames(tb)) if tb else ("unattributed", None, node.name())
            self._node_cache[key] = (node, res)
            return res
        return classify(_live_frames())

    def add(self, mode, kind, name):
        if self.phase is None:
            return
        cat, fusion, owner = self.where()
        self.rows[(mode, self.phase, cat, kind, name, fusion, owner)] += 1


def make_modes(rec):
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class FnMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", None) or str(func)
            qual = getattr(func, "__qualname__", name)
            kind = "meta" if name in _META_NAMES else "call"
            rec.add("function", kind, qual)
            return func(*args, **(kwargs or {}))

    class DispMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            base = func.__name__.split(".")[0]
            # views, detach/alias and bare allocations launch no kernel on a GPU
            no_kernel = func.is_view or base in _NO_KERNEL_OPS
            rec.add("dispatch", "view" if no_kernel else "op", func.__name__)
            return func(*args, **(kwargs or {}))

    return FnMode, DispMode


# ----------------------------------------------------------------------------- model
def build_config(a, moe):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(
        num_layers=2,
        hidden_size=a.hidden,
        num_attention_heads=a.heads,
        num_query_groups=a.query_groups,
        kv_channels=a.hidden // a.heads,
        ffn_hidden_size=a.dense_ffn,
        use_cpu_initialization=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=False,
        normalization="RMSNorm",
        qk_layernorm=True,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
        params_dtype=torch.float32,
    )
    if moe:
        kw.update(
            num_moe_experts=a.experts,
            moe_router_topk=a.topk,
            moe_ffn_hidden_size=a.moe_ffn,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3,
            moe_router_force_load_balancing=True,
            moe_token_dispatcher_type="alltoall",
            moe_grouped_gemm=False,
            moe_router_fusion=False,
            moe_permute_fusion=False,
            moe_router_score_function="softmax",
            expert_model_parallel_size=a.ep,
        )
    return TransformerConfig(**kw)


def run_one(a, which, rank):
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module

    moe = which in ("moe", "moe_layer")
    cfg = build_config(a, moe)
    torch.manual_seed(1234 + rank)
    spec = get_gpt_layer_local_spec(
        num_experts=a.experts if moe else None,
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
    )
    if which == "moe":
        from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

        module = spec.submodules.mlp(
            config=cfg, pg_collection=get_default_pg_collection(), is_mtp_layer=False
        )
        module.set_layer_number(1)
    else:
        module = build_module(spec, config=cfg, layer_number=1)
    module.train()
    moe_mod = module if which == "moe" else getattr(module, "mlp", None)
    if rank == 0:
        from megatron.core import parallel_state

        print(
            f"[{which}] EP world size {parallel_state.get_expert_model_parallel_world_size()}, "
            f"local experts {getattr(moe_mod, 'num_local_experts', 0)}",
            file=sys.stderr,
            flush=True,
        )

    param_cats = {}
    for n, p in module.named_parameters():
        if ".router." in "." + n or n.startswith("router."):
            c = "router"
        elif "experts" in n:
            c = "experts.per_expert" if "local_experts" in n else "experts.fixed"
        elif "self_attention" in n:
            c = "attention"
        elif "layernorm" in n or "norm" in n:
            c = "norm"
        elif "mlp" in n:
            c = "dense_mlp"
        else:
            c = "layer_glue"
        param_cats[id(p)] = c

    s, b, h = a.seq, a.mb, a.hidden
    x = torch.randn(s, b, h, requires_grad=True)
    rope = RotaryEmbedding(kv_channels=cfg.kv_channels, rotary_percent=1.0)
    rotary_pos_emb = rope(s)
    grad = torch.randn(s, b, h)

    rec = Recorder(param_cats)
    FnMode, DispMode = make_modes(rec)

    def fwd():
        if which == "moe":
            out, _ = module(x)
        else:
            out, _ = module(x, attention_mask=None, rotary_pos_emb=rotary_pos_emb)
        return out

    # warm-up step (lazy allocations such as the aux-loss metric buffers, the aux-loss
    # backward scale tensor, the rng tracker happen once per run, not per step)
    with torch.autograd.set_detect_anomaly(True, check_nan=False):
        out = fwd()
    out.backward(grad)
    module.zero_grad(set_to_none=True)
    x.grad = None

    # nn.Module calls and autograd.Function.apply calls (Python host work that neither
    # mode above sees as a torch call)
    def pre_hook(mod, args):
        rec.add("python", "module_call", type(mod).__name__)

    fn_apply = torch.autograd.Function.__dict__["apply"].__func__

    def counted_apply(cls, *args, **kwargs):
        rec.add("python", "autograd_apply", cls.__name__)
        return fn_apply(cls, *args, **kwargs)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    torch.autograd.Function.apply = classmethod(counted_apply)
    try:
        with torch.autograd.set_detect_anomaly(True, check_nan=False):
            with FnMode(), DispMode():
                rec.phase = "forward"
                out = fwd()
                rec.phase = None
    finally:
        handle.remove()
        torch.autograd.Function.apply = classmethod(fn_apply)
    # The autograd engine does not carry the torch-function mode stack into backward; the
    # only Python-level torch calls in backward are the bodies of custom
    # autograd.Function.backward, so enter the function mode around each of them.
    bcf = torch.autograd.function.BackwardCFunction
    orig_apply = bcf.apply

    def apply_with_mode(self, *args):
        with FnMode():
            return orig_apply(self, *args)

    bcf.apply = apply_with_mode
    try:
        with DispMode():
            rec.phase = "backward"
            out.backward(grad)
            rec.phase = None
    finally:
        bcf.apply = orig_apply
    return rec.rows


# ----------------------------------------------------------------------------- reporting
def summarize(rows):
    """rows: Counter over (mode, phase, cat, kind, name, fusion, owner) -> nested dict."""
    out = {}
    for (mode, phase, cat, kind, name, fusion, owner), n in rows.items():
        d = out.setdefault(mode, {}).setdefault(phase, {})
        t = d.setdefault("by_cat", {}).setdefault(cat, collections.Counter())
        t[kind] += n
        d.setdefault("total", collections.Counter())[kind] += n
        if fusion:
            d.setdefault("fusion", {}).setdefault(fusion, collections.Counter())[kind] += n
        d.setdefault("owners", {}).setdefault(cat, collections.Counter())[
            f"{owner} :: {name} [{kind}]"
        ] += n
    return out


def print_summary(title, s, n_local_experts, detail):
    print(f"\n=== {title} (local experts in this run: {n_local_experts}) ===")
    for mode, kinds in (
        ("dispatch", ("op", "view")),
        ("function", ("call", "meta")),
        ("python", ("module_call", "autograd_apply")),
    ):
        if mode not in s:
            continue
        label = {
            "dispatch": "view/alloc/detach, no kernel",
            "function": "tensor metadata reads",
            "python": "autograd.Function.apply calls",
        }[mode]
        print(f"-- {mode} mode: {kinds[0]}s (+{kinds[1]}: {label})")
        print(f"   {'category':22s} {'forward':>16s} {'backward':>16s}")
        for cat in CATEGORIES + ("total",):
            vals = []
            for ph in ("forward", "backward"):
                d = s[mode].get(ph, {})
                c = d.get("total") if cat == "total" else d.get("by_cat", {}).get(cat)
                c = c or collections.Counter()
                vals.append(f"{c[kinds[0]]:6d} (+{c[kinds[1]]:5d})")
            if cat != "total" and all(v.startswith("     0 (+    0)") for v in vals):
                continue
            print(f"   {cat:22s} {vals[0]:>16s} {vals[1]:>16s}")
            if cat == "experts.per_expert" and n_local_experts:
                per = []
                for ph in ("forward", "backward"):
                    c = s[mode].get(ph, {}).get("by_cat", {}).get(cat) or collections.Counter()
                    per.append(
                        f"{c[kinds[0]] / n_local_experts:6.2f} (+{c[kinds[1]] / n_local_experts:5.2f})"
                    )
                print(f"   {'  ... per expert':22s} {per[0]:>16s} {per[1]:>16s}")
        for ph in ("forward", "backward"):
            fus = s[mode].get(ph, {}).get("fusion", {})
            for k in sorted(fus):
                c = fus[k]
                print(f"   {ph:8s} in {k:50s} {c[kinds[0]]:6d} (+{c[kinds[1]]:5d})")
        if detail:
            for ph in ("forward", "backward"):
                for cat, cnt in sorted(s[mode].get(ph, {}).get("owners", {}).items()):
                    print(f"   [{mode} {ph} {cat}]  (function that issued it :: op)")
                    for k, v in sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0])):
                        print(f"      {v:6d}  {k}")


def _worker(rank, a, result_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    sys.path.insert(0, a.megatron)
    install_shims()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ep)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        expert_model_parallel_size=a.ep,
    )
    patch_megatron()
    res = {}
    for which in a.which.split(","):
        res[which] = run_one(a, which, rank)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump({w: [[list(k), v] for k, v in r.items()] for w, r in res.items()}, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megatron", required=True, help="path holding the extracted megatron/ dir")
    p.add_argument("--which", default="moe,moe_layer,dense_layer")
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--query-groups", type=int, default=2)
    p.add_argument("--moe-ffn", type=int, default=64)
    p.add_argument("--dense-ffn", type=int, default=512)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--mb", type=int, default=1)
    p.add_argument("--port", type=int, default=29511)
    p.add_argument("--detail", action="store_true", help="print per-function breakdown")
    p.add_argument("--json", help="write the summary here")
    a = p.parse_args(argv)
    a.megatron = os.path.abspath(a.megatron)
    import tempfile

    fd, result_path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    if a.ep == 1:
        _worker(0, a, result_path)
    else:
        import torch.multiprocessing as mp

        mp.spawn(_worker, args=(a, result_path), nprocs=a.ep, join=True)
    with open(result_path) as f:
        raw = json.load(f)
    os.unlink(result_path)
    summaries = {}
    for which, rows in raw.items():
        c = collections.Counter({tuple(k): v for k, v in rows})
        s = summarize(c)
        summaries[which] = s
        nle = a.experts // a.ep if which != "dense_layer" else 0
        print_summary(which, s, nle, a.detail)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {
                    "args": vars(a),
                    "summaries": json.loads(json.dumps(summaries, default=dict)),
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
