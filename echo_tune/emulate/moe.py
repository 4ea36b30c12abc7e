"""MoE layers run for real (``emulate``, in-place ``profile``): what the tracer's MoE code asks of a real run.

The MoE layer is the tracer's own (``workload/mlp/moe.py``, built through ``RealShard.tensor``): router, permutation,
the rank's ``num_experts / expert_model_parallel_size`` local experts sharded over ETP, the shared expert. A
real run differs from the trace only where the tracer leaves data undefined, and there it follows what
``simulate`` assumes:

- routing: the router's logits, softmax and top-k run, but the copies go where a balanced router sends
  them (``spread_rows``): each token's ``moe_router_topk`` copies, the experts receiving the balanced share
  (times ``moe_routing_imbalance``) the tracer sizes their GEMMs for;
- dispatch / combine (all-to-all over EP, all-gather / reduce-scatter over ETP or the ETP x EP group): the
  collective is a modelled wait (``Waiter.add_collective``, the same ``cost.comm.collective_time_s`` as
  ``simulate``), its output buffer holds values made once per shape (``receive``), as the other ranks would
  have sent them (the stage's p2p inputs are made the same way, ``build.Stage.received``).

``Waiter`` (``run.py``) adds the modelled waits and times the routed experts (their GEMMs and activation,
forward and backward) as the ``experts`` part. What is not run is refused by name (``moe_problems``).
"""

from __future__ import annotations

import torch

from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig

INIT_STD = 0.02
"""The values of the received buffers: N(0, 0.02^2), as ``build.RealShard`` makes every tensor."""


class TagNothing:
    """``context.tag_backward`` skips nodes already in ``tagged_nodes``; claiming all keeps region
    tagging (a tracing aid) from adding Python work to a real run."""

    def __contains__(self, _node) -> bool:
        return True


class RealMoE:
    """The active object of a real run of MoE layers without waits (in-place ``profile``): received
    buffers and balanced routing; collectives are not waited."""

    region = ""
    subregion = ""

    def __init__(self) -> None:
        self.tagged_nodes = TagNothing()
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._rows: dict[tuple, torch.Tensor] = {}

    def add_collective(self, name: str, group: str, size_bytes: int) -> None:
        pass

    def receive(self, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A collective's output: made once per shape (the warm-up run makes them), then reused."""
        key = (shape, like.dtype, like.device)
        if key not in self._buffers:
            self._buffers[key] = (torch.randn(shape, dtype=torch.float32, device=like.device) * INIT_STD).to(like.dtype)
        return self._buffers[key].detach()

    def spread_rows(self, index: torch.Tensor, source_rows: int) -> torch.Tensor:
        """Balanced routing: ``index.numel()`` copies spread evenly over ``source_rows`` token rows, in token
        order (copy i reads row i * source_rows // copies: each token's copies side by side)."""
        key = (index.numel(), source_rows, index.device)
        if key not in self._rows:
            n = index.numel()
            self._rows[key] = torch.arange(n, device=index.device) * source_rows // max(n, 1)
        return self._rows[key].view(index.shape)


class ExpertTimer:
    """Times the routed experts (the outermost "experts" sub-region, ``workload/mlp/moe.py _experts``) with a
    clock (``emulate/clock.py``): forward from entry to exit, backward from the gradient reaching their
    output to it leaving their input (autograd hooks); the modelled waits inside either are left out."""

    def __init__(self, clock, waited) -> None:
        self.clock, self._waited = clock, waited
        self.expert_s = 0.0
        self._depth = 0
        self._bwd_begin: tuple[float, float] | None = None

    def run_subregion(self, name: str, fn, *args):
        if name != "experts" or self._depth:
            return fn(*args)
        self._depth += 1
        begin, waited = self.clock.now(), self._waited()
        try:
            out = fn(*args)
        finally:
            self._depth -= 1
        self.expert_s += self.clock.now() - begin - (self._waited() - waited)
        x = args[0]
        if out.requires_grad and x.requires_grad:
            out.register_hook(self._backward_begins)
            x.register_hook(self._backward_ends)
        return out

    def _backward_begins(self, _grad) -> None:
        self._bwd_begin = (self.clock.now(), self._waited())

    def _backward_ends(self, _grad) -> None:
        if self._bwd_begin is not None:
            begin, waited = self._bwd_begin
            self.expert_s += self.clock.now() - begin - (self._waited() - waited)
            self._bwd_begin = None


def moe_problems(model: ModelSpec, parallel: ParallelConfig) -> list[str]:
    """What of an MoE model emulate does not run, one line each (empty for a dense model)."""
    if not model.is_moe:
        return []
    problems = []
    kernel = model.moe_dispatcher_kernel
    if model.moe_token_dispatcher_type == "flex":
        problems.append(f"emulate runs the alltoall and allgather dispatchers (NCCL collectives as modelled waits) "
                        f"and cannot run the flex dispatcher's fused {kernel} kernels, but got "
                        f"(moe_token_dispatcher_type=flex, moe_flex_dispatcher_backend={kernel}); use "
                        f"--moe-token-dispatcher-type alltoall, or `echo-tune simulate` for {kernel}")
    fused = [f for f in ("moe_router_fusion", "moe_permute_fusion") if getattr(model, f)]
    if fused:
        problems.append(f"emulate runs the router and the permutation as separate PyTorch kernels and cannot run "
                        f"Transformer Engine's fused ones, but got ({', '.join(f'{f}=True' for f in fused)}); drop "
                        f"{' and '.join('--' + f.replace('_', '-') for f in fused)} to emulate, or use "
                        f"`echo-tune simulate`")
    if model.moe_shared_expert_overlap and model.moe_shared_expert_intermediate_size:
        problems.append("emulate runs the shared expert inline and cannot overlap it with the dispatch on a side "
                        "stream, but got (moe_shared_expert_overlap=True); drop --moe-shared-expert-overlap to "
                        "emulate, or use `echo-tune simulate`")
    if parallel.overlap_moe_expert_parallel_comm:
        problems.append("emulate runs one micro-batch at a time and cannot overlap one's dispatch/combine with "
                        "another's compute, but got (overlap_moe_expert_parallel_comm=True); drop "
                        "--overlap-moe-expert-parallel-comm to emulate, or use `echo-tune simulate`")
    modules = parallel.recompute_modules or () if parallel.recompute_granularity == "selective" else ()
    moe_modules = [m for m in modules if m in ("moe", "moe_act", "shared_experts")]
    if moe_modules:
        problems.append(f"emulate's selective recompute replays core attention only and cannot recompute MoE "
                        f"modules, but got (recompute_modules={','.join(moe_modules)}); drop them from "
                        f"--recompute-modules to emulate, or use `echo-tune simulate`")
    return problems
