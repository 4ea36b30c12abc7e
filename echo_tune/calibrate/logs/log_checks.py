"""Cross-checks of an nccl-tests log against the cluster it is fitted or checked for.

* The node layout: the hosts of the ``# Rank`` lines, the rank count and the cluster's
  ``gpus_per_node`` must agree (more ranks on a host than it has GPUs is refused; hosts that hold
  fewer ranks than they have GPUs give a warning, as a torn host name would).
* The GPU: the name in the ``# Rank`` lines (``A100-SXM4-40GB``, ``NVIDIA H100 80GB HBM3``) must
  name the cluster's GPU (``a100-40gb``, ``h100-sxm``): same model, and the same memory size where
  both name one. A mismatch is refused unless the caller allows it explicitly.
"""

from __future__ import annotations

import re

from echo_tune.calibrate.logs.nccl_tests_log import NcclTestsLog
from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.errors import CalibrationError

_MODEL = re.compile(r"\b(gb\d{3}|[abhlvt]\d{2,3}[a-z]?)\b")
_MEMORY = re.compile(r"\b(\d{2,3})\s*gb\b")


def _gpu_tokens(name: str) -> tuple[str | None, str | None]:
    """(model, memory) named by a GPU string: ("a100", "40") for both A100-SXM4-40GB and a100-40gb."""
    text = name.lower().replace("-", " ").replace("_", " ")
    model = _MODEL.search(text)
    memory = _MEMORY.search(text)
    return (model.group(1) if model else None), (memory.group(1) if memory else None)


def gpu_mismatch(log_gpu: str, cluster_gpu: str) -> str | None:
    """Why the log's GPU is not the cluster's, or None when they agree (or the log names none)."""
    names = [n.strip() for n in log_gpu.split(",") if n.strip() and n.strip() != "unknown"]
    want_model, want_memory = _gpu_tokens(cluster_gpu)
    for name in names:
        model, memory = _gpu_tokens(name)
        if model is None or want_model is None:
            continue
        if model != want_model or (memory and want_memory and memory != want_memory):
            return f"the log's GPU {name!r} is not the cluster's {cluster_gpu!r}"
    return None


def check_log_for_cluster(log: NcclTestsLog, cluster: ClusterSpec, *, allow_gpu_mismatch: bool = False) -> list[str]:
    """Refuse a log that cannot come from this cluster; return warnings for what only looks odd."""
    warnings = list(log.warnings)
    if log.ranks_per_node > cluster.gpus_per_node:
        raise CalibrationError(
            f"{log.path}: `ranks per host <= gpus_per_node` must hold, but got (ranks per host={log.ranks_per_node}, "
            f"gpus_per_node={cluster.gpus_per_node}, hosts={log.num_nodes}, ranks={log.num_gpus}); use the cluster "
            f"the log was measured on")
    expected_nodes = -(-log.num_gpus // cluster.gpus_per_node)
    if log.num_nodes > expected_nodes:
        warnings.append(f"{log.path}: {log.num_gpus} ranks on {log.num_nodes} hosts where {expected_nodes} node(s) of "
                        f"{cluster.gpus_per_node} GPUs would hold them; the hosts are not full (check the host names)")
    reason = gpu_mismatch(log.gpu_name, cluster.gpu.name)
    if reason and not allow_gpu_mismatch:
        raise CalibrationError(f"{log.path}: {reason}; give the cluster the log was measured on (--cluster), or "
                               f"--allow-gpu-mismatch to use it anyway")
    if reason:
        warnings.append(f"{log.path}: {reason} (allowed by --allow-gpu-mismatch)")
    named = [n.strip() for n in log.gpu_name.split(",") if _gpu_tokens(n)[0] is not None]
    if named and _gpu_tokens(cluster.gpu.name)[0] is None:  # nothing to compare: say so, do not pass it silently
        warnings.append(f"{log.path}: the log ran on {named[0]!r}, and the cluster's GPU {cluster.gpu.name!r} names "
                        f"no GPU model to check it against; make sure the log comes from this cluster")
    return warnings


# nccl-tests' key columns tell what a log measured, whatever the file is called: a rooted collective
# (reduce_perf, broadcast_perf) prints a root >= 0, while all_reduce_perf prints no root column (old
# releases) or -1; a collective without a reduction prints redop "none" (or no redop column). Only
# these two contradictions are refused: a rooted name over rows without a root, a reducing name over
# rows whose redop is "none" (the other directions differ between nccl-tests releases).
ROOTED = ("reduce", "broadcast")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def check_rows_match_collective(log: NcclTestsLog) -> None:
    """The rows' root and redop columns must fit the collective the log is read as (issue 10)."""
    row = log.rows[0]
    if log.collective in ROOTED and (row.root is None or row.root < 0):
        root = "no root column" if row.root is None else f"root {row.root}"
        raise CalibrationError(
            f"{log.path}: read as {log.collective}, but its rows have {root}, unlike every rooted collective's "
            f"output; the file name or header names the wrong collective: rename the file after the *_perf "
            f"binary that wrote it")
    if row.redop is not None and row.root is None and log.collective not in REDUCING:
        # nccl-tests before 51af557 (2022-08-19, "Resync with NCCL 2.13") printed a redop column only in the
        # tables of the reducing tests (src/all_reduce.cu, src/reduce_scatter.cu); sendrecv, all_gather and
        # alltoall printed none, broadcast a root; from then on every table has both redop and root columns
        raise CalibrationError(
            f"{log.path}: read as {log.collective}, but its table has a redop column and no root column, the "
            f"layout older nccl-tests printed only for all_reduce and reduce_scatter; the file name or header "
            f"names the wrong collective: rename the file after the *_perf binary that wrote it")
    if (row.redop or "").lower() == "none" and log.collective in REDUCING:
        raise CalibrationError(
            f"{log.path}: read as {log.collective}, but its rows have redop {row.redop!r}; the file name or header "
            f"names the wrong collective: rename the file after the *_perf binary that wrote it")


def check_single_run(log: NcclTestsLog) -> None:
    """One table per file: a size measured twice (same type, op, root) means appended runs (issue 10)."""
    seen: dict[tuple, int] = {}
    for row in log.rows:
        key = (row.size_bytes, row.dtype, row.redop, row.root)
        if key in seen:
            raise CalibrationError(f"{log.path}: size {row.size_bytes} ({row.dtype}) is measured at line {seen[key]} "
                                   f"and again at line {row.line}: the file holds several runs; split it into one "
                                   f"file per run")
        seen[key] = row.line


def check_rank_numbers(ranks, path: str) -> None:
    """Rank lines 0..n-1 with none missing: the GPU count comes from them (issue 10)."""
    numbers = [r.rank for r in ranks]
    missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
    if missing:
        raise CalibrationError(f"{path}: `# Rank` lines for ranks {missing[:8]} are missing ({len(numbers)} of "
                               f"{max(numbers) + 1} ranks listed); the GPU count comes from them, so keep the whole "
                               f"nccl-tests header")
