"""What a Chrome-trace event carries in ``args``: stage, micro-batch, chunk, FLOPs and bytes.

``chunk_work`` sums, per (stage, chunk) and pass, the traced ops of the pieces the chunk holds (its dense,
MoE and sliding-window layers, the embedding on the first chunk, the output layer and loss on the last):
``flops`` (the ops' FLOPs on one GPU for one micro-batch, a multiply-add counting 2), ``hbm_bytes`` (bytes the
compute ops read and write) and ``collective_bytes`` (message sizes of the TP/CP/EP collectives inside the
pass, nccl-tests' convention). ``span_args`` gives every timeline span its ``args`` from its track, its name
and that table; the trace writer (``trace_export.py``) attaches them to the events.
"""

from __future__ import annotations

import bisect
import re

from echo_tune.sim.outputs.trace_tracks import COMM_TRACK, DP_TRACK, P2P_TRACK, TRANSFER_TRACK

_PASS = re.compile(r"^(?P<dir>[FB])(?P<mb>\d+)(?:\.(?P<chunk>\d+))?$")
_TRANSFER = re.compile(r"^(?:activation|gradient) (?P<dir>[FB])(?P<mb>\d+)(?:\.(?P<chunk>\d+))?: "
                       r"stage (?P<src>\d+) -> (?P<dst>\d+)")
_BUCKET = re.compile(r"gradient bucket")


def _ops_work(ops) -> dict:
    return {"flops": sum(op.flops for op in ops if op.kind != "collective"),
            "hbm_bytes": sum(op.bytes for op in ops if op.kind != "collective"),
            "collective_bytes": sum(op.size_bytes for op in ops if op.kind == "collective")}


def _add(total: dict, work: dict, times: int) -> None:
    for key, value in work.items():
        total[key] = total.get(key, 0) + times * value


def chunk_work(pieces: dict, layout, mix, windows) -> dict[tuple[int, int], dict[str, dict]]:
    """(stage, chunk) -> {"forward": work, "backward": work} (work: flops, hbm_bytes, collective_bytes)."""
    per_piece = {name: {"forward": _ops_work(t.forward), "backward": _ops_work(t.backward)}
                 for name, t in pieces.items() if hasattr(t, "forward")}
    out = {}
    for s, row in enumerate(layout.chunk_contents):
        for c, contents in enumerate(row):
            dense, moe = mix[s][c]
            w_dense, w_moe = windows[s][c]
            counts = {"layer": dense - (w_dense if "window_layer" in per_piece else 0),
                      "window_layer": w_dense, "moe_layer": moe - (w_moe if "moe_window_layer" in per_piece else 0),
                      "moe_window_layer": w_moe, "embedding": int(bool(contents.embedding)),
                      "output": int(bool(contents.loss))}
            work = {"forward": {}, "backward": {}}
            for name, n in counts.items():
                if n and name in per_piece:
                    for direction in work:
                        _add(work[direction], per_piece[name][direction], n)
            out[(s, c)] = work
    return out


def p2p_message_bytes(pieces: dict, layout) -> int:
    """Bytes one rank sends a neighbouring stage per micro-batch, as ``simulate.p2p_time_s`` times it (1/TP of
    its activation with ``--scatter-gather-tensors-in-pipeline``)."""
    size = pieces["layer"].output_bytes
    return int(size / layout.groups["tp"].size if layout.p2p_scatter_gather else size)


def _pass_args(match, stage: int, work: dict | None) -> dict:
    chunk = int(match["chunk"] or 0)
    args = {"stage": stage, "micro_batch": int(match["mb"]), "chunk": chunk,
            "pass": "forward" if match["dir"] == "F" else "backward"}
    if work is not None and (stage, chunk) in work:
        args.update(work[(stage, chunk)][args["pass"]])
    return args


def span_args(timeline: list, work: dict | None = None, p2p_bytes: int | None = None,
              bucket_bytes_per_param: float | None = None) -> list[dict]:
    """``args`` of every span of ``timeline``, in its order."""
    passes: dict[int, list[tuple[float, float, dict]]] = {}
    out = []
    for tid, name, category, start, end in timeline:
        stage = tid % COMM_TRACK
        args = {"stage": stage, "category": category}
        match = _PASS.match(name) if tid < COMM_TRACK else None
        if match:
            args = {**args, **_pass_args(match, stage, work)}
            passes.setdefault(stage, []).append((start, end, args))
        elif tid >= TRANSFER_TRACK or P2P_TRACK <= tid < P2P_TRACK + COMM_TRACK:
            t = _TRANSFER.match(name)
            if t:
                args.update(micro_batch=int(t["mb"]), chunk=int(t["chunk"] or 0), source_stage=int(t["src"]),
                            destination_stage=int(t["dst"]))
            if p2p_bytes is not None:
                args["bytes"] = p2p_bytes
        elif DP_TRACK <= tid < DP_TRACK + COMM_TRACK and _BUCKET.match(name):
            params = re.search(r"\(([\d,]+) params\)", name)
            if params:
                args["params"] = int(params[1].replace(",", ""))
                if bucket_bytes_per_param is not None:
                    args["bytes"] = int(args["params"] * bucket_bytes_per_param)
        out.append(args)
    # a communication, interference or recompute block lies at the end of its pass: the pass that holds it
    # (one stage runs one pass at a time: its passes sorted by start, the last one starting before the block)
    starts = {}
    for stage, spans in passes.items():
        spans.sort(key=lambda p: p[0])
        starts[stage] = [p[0] for p in spans]
    for (tid, name, category, start, end), args in zip(timeline, out):
        if COMM_TRACK <= tid < DP_TRACK and tid % COMM_TRACK in passes:
            mid = (start + end) / 2
            stage = tid % COMM_TRACK
            k = bisect.bisect_right(starts[stage], mid) - 1
            owner = passes[stage][k][2] if k >= 0 and passes[stage][k][1] >= mid else None
            if owner is not None:
                args.update({k: owner[k] for k in ("micro_batch", "chunk", "pass")})
                if category in ("tp_cp_comm", "ep_comm") and "collective_bytes" in owner:
                    args["collective_bytes_of_pass"] = owner["collective_bytes"]
    return out
