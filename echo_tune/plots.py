"""Figures with matplotlib (the optional ``plot`` extra: ``pip install -e '.[plot]'``), labelled and with legends.

- ``plot_pareto``: every feasible layout and the Pareto front of the first two objectives (``pareto.png`` of
  a multi-objective search);
- ``plot_breakdowns``: the step-time breakdown of several layouts as stacked bars, one colour per part
  (``breakdowns.png`` of a search: its best layouts; ``echo-tune plan --plot``: the winner beside the best of
  each other TP x PP x CP family).

Without matplotlib these return None and the outputs that need it are skipped (the search still writes its
dependency-free ``pareto.svg``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
import textwrap
from echo_tune.io import atomic_path


def available() -> bool:
    """Whether matplotlib is installed: found, not imported (importing it took 0.44 s of every search's
    process, where a worker draws the plot)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # ValueError: blocked with sys.modules["matplotlib"] = None
        return False


def _format(path: str | Path) -> str:
    """The image format the path's suffix names (PNG for none: ``-``, ``/dev/stdout``, a FIFO), not the suffix
    of the temporary file it is drawn into."""
    return Path(path).suffix.lstrip(".").lower() or "png"


def load_pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported on first use: it takes about a second)."""
    # lazy: loads matplotlib (~0.6 s), which importing plots does not
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    # lazy: loads matplotlib (~0.6 s), which importing plots does not
    import matplotlib.pyplot as plt

    return plt


def plot_pareto(points: list[tuple[float, float]], front: list[tuple[float, float]], labels: list[str],
                path: str | Path, *, title: str = "", front_labels: list[str] | None = None) -> Path | None:
    """Every feasible layout (grey) and the Pareto front (red staircase). With ``front_labels`` (one per
    front point, in the order of ``front``) each front point gets a ray to a text box naming its layout."""
    if not available():
        return None

    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.6))
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=12, c="0.65", label="feasible layouts")
    named = sorted(zip(front, front_labels or [None] * len(front)), key=lambda pl: pl[0])
    front = [p for p, _ in named]
    ax.plot([p[0] for p in front], [p[1] for p in front], "o-", color="tab:red", ms=5, drawstyle="steps-post",
            label="Pareto front")
    for k, (p, name) in enumerate(named[:12]):  # rays to the layouts' names, alternately above and below
        if name:
            ax.annotate(textwrap.fill(name, 30), xy=p, xytext=(18, 28 if k % 2 == 0 else -34),
                        textcoords="offset points", fontsize=7, ha="left",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "tab:red", "alpha": 0.85},
                        arrowprops={"arrowstyle": "-", "color": "tab:red", "lw": 0.8})
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()

    with atomic_path(path, "plot") as tmp:  # atomically, never through a symlink; a device or stream in place
        fig.savefig(tmp, dpi=120, format=_format(path))
    plt.close(fig)
    return Path(path)


def plot_breakdowns(layouts: list[dict], path: str | Path, *, title: str = "") -> Path | None:
    """``layouts``: dicts with ``label`` and ``breakdown_s`` (part -> seconds); parts that are zero everywhere
    are left out of the legend."""
    if not available() or not layouts:
        return None
    plt = load_pyplot()
    parts = [p for p in layouts[0]["breakdown_s"] if any(abs(l["breakdown_s"].get(p, 0.0)) > 1e-12 for l in layouts)]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.55 * len(layouts)))
    left = [0.0] * len(layouts)
    ys = list(range(len(layouts)))[::-1]
    cmap = plt.get_cmap("tab10")
    for i, part in enumerate(parts):
        widths = [max(0.0, l["breakdown_s"].get(part, 0.0)) for l in layouts]
        ax.barh(ys, widths, left=left, color=cmap(i % 10), label=part)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, [l["label"] for l in layouts], fontsize=8)
    ax.set_xlabel("seconds per step")
    ax.set_title(title)
    ax.legend(ncol=min(5, len(parts)), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25 - 0.1 / len(layouts)))
    fig.tight_layout()

    with atomic_path(path, "plot") as tmp:  # atomically, never through a symlink; a device or stream in place
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format=_format(path))
    plt.close(fig)
    return Path(path)
