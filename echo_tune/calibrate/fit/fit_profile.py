"""``echo-tune calibrate fit``: a ClusterProfile from bench output and/or nccl-tests logs.

Every coefficient a source measures is fitted; the rest keep the cluster's datasheet-derived
values (``default_profile``), and the profile's provenance says which is which, which files were
used (with their SHA-256), when, on what hardware, and every fit's residual summary.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
import csv

from echo_tune.calibrate.fit import fit_comm
from echo_tune.calibrate.fit import fit_compute
from echo_tune.calibrate.bench import raw
from echo_tune.calibrate.fit.check import on_fabric
from echo_tune.calibrate.fit.fit_comm import CommSample
from echo_tune.calibrate.logs.log_checks import check_log_for_cluster
from echo_tune.calibrate.logs.nccl_tests import NcclTestsLog, parse_nccl_tests
from echo_tune.calibrate.fit.results import FitResult
from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.profile import ClusterProfile, LinkCoefficients, default_profile
from echo_tune.errors import CalibrationError
from echo_tune.io import atomic_path


@dataclass(kw_only=True)
class FitOutcome:
    profile: ClusterProfile
    results: list[FitResult]
    sources: list[dict] = field(default_factory=list)
    input_warnings: list[str] = field(default_factory=list)
    """Warnings about the inputs themselves (truncated logs, refused rows, odd host layouts)."""

    @property
    def warnings(self) -> list[str]:
        return self.input_warnings + [w for r in self.results for w in r.warnings]


def _sig(value: float, digits: int = 5) -> float:
    return float(f"{value:.{digits}g}")


def _round_link(link: LinkCoefficients) -> LinkCoefficients:
    return LinkCoefficients(latency_s=_sig(link.latency_s), bus_bandwidth_gbyte_s=_sig(link.bus_bandwidth_gbyte_s),
                            base_latency_s=_sig(link.base_latency_s), tree_efficiency=_sig(link.tree_efficiency),
                            protocols={n: _round_link(t) for n, t in link.protocols.items()})


def rounded_profile(profile: ClusterProfile) -> ClusterProfile:
    """Coefficients to 5 significant digits, for a readable YAML (far below the fits' residuals)."""
    floats = {f.name: _sig(getattr(profile, f.name)) for f in dataclasses.fields(profile)
              if isinstance(getattr(profile, f.name), float)}
    comm = {scope: {c: _round_link(link) for c, link in table.items()} for scope, table in profile.comm.items()}
    return dataclasses.replace(profile, comm=comm, **floats)


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _log_samples(log: NcclTestsLog) -> list[CommSample]:
    place = log.placement()
    return [CommSample(collective=log.collective, size_bytes=row.size_bytes, time_s=row.time_us * 1e-6,
                       place=place, source=f"{Path(log.path).name} line {row.line}")
            for row in log.rows if row.size_bytes > 0]


def _bench_samples(rows: list[dict]) -> list[CommSample]:
    return [CommSample(collective=r["collective"], size_bytes=r["size_bytes"], time_s=r["time_us"] * 1e-6,
                       place=GroupPlacement(size=r["group_size"], ranks_per_node=r["ranks_per_node"],
                                            num_nodes=r["num_nodes"]), source=r["_source"]) for r in rows]


def _fit_collective(samples: list[CommSample], cluster: ClusterSpec, base: ClusterProfile,
                    max_tiers: int | None) -> tuple[LinkCoefficients, LinkCoefficients, list[FitResult]]:
    collective = samples[0].collective
    intra_samples = [s for s in samples if not s.place.crosses_nodes]
    inter_samples = [s for s in samples if s.place.crosses_nodes]
    results = []
    if intra_samples:
        intra, result = fit_comm.fit_intra(intra_samples, base, max_tiers)
        results.append(result)
    else:
        intra = base.link("intra_node", collective)
        results.append(FitResult(quantity=f"{collective} intra_node", method="datasheet", params={},
                                 warnings=[f"{collective} intra_node: no single-node measurement; "
                                           f"datasheet values kept"]))
    if inter_samples:
        inter, result = fit_comm.fit_inter(inter_samples, intra, cluster, base)
    else:
        inter, result = fit_comm.derive_inter(intra, cluster, collective)
    return intra, inter, results + [result]


def fit_comm_table(samples: list[CommSample], cluster: ClusterSpec, base: ClusterProfile,
                   max_tiers: int | None = None) -> tuple[dict, list[FitResult]]:
    """The profile's comm table: one fitted entry per measured collective, all_reduce's as the default."""
    table = {"intra_node": dict(base.comm["intra_node"]), "inter_node": dict(base.comm["inter_node"])}
    results: list[FitResult] = []
    collectives = list(dict.fromkeys(s.collective for s in samples))
    for collective in collectives:
        intra, inter, fits = _fit_collective([s for s in samples if s.collective == collective], cluster, base,
                                             max_tiers)
        table["intra_node"][collective], table["inter_node"][collective] = intra, inter
        results += fits
    if collectives:
        default = "all_reduce" if "all_reduce" in collectives else collectives[0]
        for scope in table:
            table[scope]["default"] = table[scope][default]
        results[-1].notes.append(f"collectives not measured use the {default} coefficients (comm.*.default)")
    return table, results


def _memory_from_single_gpu_logs(logs: list[NcclTestsLog]) -> list[dict]:
    """A 1-GPU all_reduce is a device-to-device copy: it reads and writes the buffer once each."""
    return [{"bytes_moved": 2 * row.size_bytes, "time_us": row.time_us, "size_bytes": row.size_bytes,
             "_source": f"{Path(log.path).name} line {row.line}"}
            for log in logs if log.num_gpus == 1 for row in log.rows if row.size_bytes > 0]


def _fit_compute(profile: ClusterProfile, cluster: ClusterSpec, bench: dict, logs: list[NcclTestsLog]):
    results = []
    gpu = cluster.gpu
    if bench.get("memory"):
        profile, result = fit_compute.fit_memory(bench["memory"], profile, gpu)
        results.append(result)
    elif _memory_from_single_gpu_logs(logs):
        fitted, result = fit_compute.fit_memory(_memory_from_single_gpu_logs(logs), profile, gpu)
        profile = dataclasses.replace(profile, memory_bandwidth_gbyte_s=fitted.memory_bandwidth_gbyte_s)
        result.notes.append("from 1-GPU all_reduce logs (a D2D copy); its intercept is NCCL's launch cost and "
                            "is not used as the compute kernel launch overhead")
        results.append(result)
    if bench.get("gemm"):
        dtypes = [d for d in ("bf16", "fp16", "fp32") if any(r["dtype"] == d for r in bench["gemm"])]
        for dtype in dtypes:
            fitted, result = fit_compute.fit_gemm(bench["gemm"], profile, gpu, dtype)
            if dtype == dtypes[0]:
                profile = fitted
                result.notes.append(f"{dtype} sets the profile's GEMM surface")
            results.append(result)
    if bench.get("attention"):
        profile, result = fit_compute.fit_attention(bench["attention"], profile, gpu)
        results.append(result)
    if bench.get("interference"):
        profile, fits = fit_compute.fit_interference(bench["interference"], profile)
        results += fits
    return profile, results


def _read_bench(bench_dir: str | Path | None) -> tuple[dict, dict, Path | None]:
    if bench_dir is None:
        return {}, {}, None
    directory = raw.resolve_bench_dir(bench_dir)
    env = raw.read_env(directory)
    tables = {kind: raw.read_csv(directory, kind) for kind in raw.COLUMNS}
    if not any(tables.values()):
        raise CalibrationError(f"{directory}: no raw CSV files; run `echo-tune bench` first")
    return tables, env, directory


def _sources(logs: list[NcclTestsLog], bench_dir: Path | None, bench_env: dict) -> list[dict]:
    sources = [{"kind": "nccl-tests", "path": log.path, "sha256": _sha256(log.path), "collective": log.collective,
                "num_gpus": log.num_gpus, "num_nodes": log.num_nodes, "gpu": log.gpu_name,
                "ignored_lines": len(log.ignored_lines)} for log in logs]
    if bench_dir is not None:
        files = sorted(p for p in bench_dir.iterdir() if p.suffix in (".csv", ".json"))
        sources.append({"kind": "echo-tune bench", "path": str(bench_dir),
                        "files": {p.name: _sha256(p) for p in files},
                        "hardware": {k: bench_env.get(k) for k in ("device", "gpu_name", "cpu", "world_size",
                                                                    "num_nodes", "torch", "cuda", "nccl")}})
    return sources


def _coverage(samples: list[CommSample]) -> dict:
    if not samples:
        return {}
    return {"group_sizes": sorted({s.place.size for s in samples}),
            "num_nodes": sorted({s.place.num_nodes for s in samples}),
            "size_range_bytes": [int(min(s.size_bytes for s in samples)), int(max(s.size_bytes for s in samples))]}


def _measured_on(logs: list[NcclTestsLog], bench_env: dict, cluster: ClusterSpec, allow_cpu_bench: bool) -> dict:
    """Backend, device and GPU of the measurements; a CPU bench for a GPU cluster needs the override."""
    backends = (["nccl-tests"] if logs else []) + ([bench_env.get("backend") or "torch"] if bench_env else [])
    devices = (["cuda"] if logs else []) + ([bench_env.get("device") or "unknown"] if bench_env else [])
    gpus = sorted({log.gpu_name for log in logs} | ({bench_env.get("gpu_name")} if bench_env.get("gpu_name") else set()))
    measured_on = {"backend": "+".join(dict.fromkeys(backends)), "device": "cpu" if "cpu" in devices else
                   "+".join(dict.fromkeys(devices)), "gpu": ", ".join(gpus) or "none"}
    if measured_on["device"] == "cpu":
        if not allow_cpu_bench:
            raise CalibrationError(f"the bench was run on CPU ({bench_env.get('backend', 'gloo')}) but cluster "
                                   f"{cluster.name!r} has {cluster.gpu.name} GPUs: CPU timings say nothing about them; "
                                   f"bench on the GPUs, or pass --allow-cpu-bench (every report then says so)")
        measured_on["cpu_override"] = True
    return measured_on


def fit_profile(cluster: ClusterSpec, *, nccl_logs: list[str | Path] = (), bench_dir: str | Path | None = None,
                name: str | None = None, max_tiers: int | None = None, allow_gpu_mismatch: bool = False,
                allow_cpu_bench: bool = False) -> FitOutcome:
    """Fit every coefficient the inputs measure; the others keep the cluster's datasheet-derived values."""
    if not nccl_logs and bench_dir is None:
        raise CalibrationError("nothing to fit: give --nccl-tests LOG... and/or --bench DIR")
    logs = [parse_nccl_tests(path) for path in nccl_logs]
    input_warnings = [w for log in logs for w in check_log_for_cluster(log, cluster,
                                                                       allow_gpu_mismatch=allow_gpu_mismatch)]
    input_warnings += [f"{log.path} line {line}: row refused: {reason}" for log in logs
                       for line, reason in log.refused_rows]
    bench, bench_env, bench_path = _read_bench(bench_dir)
    measured_on = _measured_on(logs, bench_env, cluster, allow_cpu_bench)
    base = default_profile(cluster)
    samples = [dataclasses.replace(s, place=on_fabric(s.place, cluster)) for s in
               [s for log in logs for s in _log_samples(log) if s.place.size > 1] +
               _bench_samples(bench.get("collectives", []))]
    results: list[FitResult] = []
    comm = base.comm
    if samples:
        comm, results = fit_comm_table(samples, cluster, base, max_tiers)
    profile, compute_results = _fit_compute(dataclasses.replace(base, comm=comm), cluster, bench, logs)
    results += compute_results
    measured = [r.quantity for r in results if r.method in ("least squares", "median")]
    sources = _sources(logs, bench_path, bench_env)
    provenance = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tool": "echo-tune calibrate fit", "cluster": cluster.name, "sources": sources,
        "hardware": sorted({s.get("gpu") or (s.get("hardware") or {}).get("gpu_name") or
                            (s.get("hardware") or {}).get("cpu") or "unknown" for s in sources}),
        "coverage": _coverage(samples), "measured": measured,
        "not_measured": "every coefficient not fitted above keeps the datasheet-derived value of "
                        f"default_profile({cluster.name}) (cost/datasheet_efficiencies.py)",
        "fits": {r.quantity: r.summary() for r in results}}
    profile = dataclasses.replace(rounded_profile(profile), name=name or f"{cluster.name}-fitted",
                                  measured=bool(measured), provenance=provenance, measured_on=measured_on)
    return FitOutcome(profile=profile, results=results, sources=sources, input_warnings=input_warnings)


def write_residuals(results: list[FitResult], path: str | Path) -> Path:
    """Every point's measured and predicted value, one CSV row each."""
    path = Path(path)
    with atomic_path(path, "residuals file") as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["quantity", "source", "point", "unit", "measured", "predicted", "relative_error"])
        for result in results:
            for p in result.points:
                writer.writerow([p.quantity, p.source, p.label, p.unit, f"{p.measured:.6g}", f"{p.predicted:.6g}",
                                 f"{p.relative_error:.4f}"])
    return path
