"""matplotlib figures: labelled, with legends (skipped where matplotlib is not installed)."""

from pathlib import Path

import pytest

from echo_tune.cli.main import main

pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[2]


def _legend_and_labels(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_draw_labelled_axes_and_legends(tmp_path):
    import matplotlib.pyplot as plt

    from echo_tune import plots

    seen = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, *a, **kw):
        ax = fig.axes[0]
        name = Path(path).name  # written atomically: ".p.png.<random>.tmp.png", then renamed to p.png
        seen[name[1:].rsplit(".", 3)[0] if name.endswith(".tmp" + Path(name).suffix) else name] = (ax.get_xlabel(), ax.get_legend() is not None,
                                 [t.get_text() for t in ax.get_legend().get_texts()])
        return real_savefig(fig, path, *a, **kw)
    plt.Figure.savefig = spy
    try:
        plots.plot_pareto([(1, 3), (2, 2), (3, 3)], [(1, 3), (2, 2)], ["step time (s)", "cost"], tmp_path / "p.png")
        plots.plot_breakdowns([{"label": "A", "breakdown_s": {"compute": 1.0, "pp_bubble": 0.2, "ep_comm": 0.0}},
                               {"label": "B", "breakdown_s": {"compute": 0.9, "pp_bubble": 0.4, "ep_comm": 0.0}}],
                              tmp_path / "b.png")
    finally:
        plt.Figure.savefig = real_savefig
    assert seen["p.png"] == ("step time (s)", True, ["feasible layouts", "Pareto front"])
    assert seen["b.png"] == ("seconds per step", True, ["compute", "pp_bubble"])  # all-zero parts left out
    _legend_and_labels(tmp_path / "p.png")
    _legend_and_labels(tmp_path / "b.png")


def test_search_writes_breakdowns_png(tmp_path, capsys):
    space = REPO / "search_spaces" / "small-gpt7b-16xa100.yaml"
    assert main(["search", str(space), "--n-trials", "20", "--results-dir", str(tmp_path), "--json",
                 "--no-explain"]) == 0
    _legend_and_labels(tmp_path / "small-gpt7b-16xa100" / "breakdowns.png")


def test_pareto_png_labels_its_front_with_rays_and_the_cost_axis_with_currency(tmp_path):
    import matplotlib.pyplot as plt

    from echo_tune import plots
    from echo_tune.search.engines.objective import objective_label

    labels = [objective_label("step_time"), objective_label("cost", 2.49, "EUR")]
    assert labels[1] == "cost per step (EUR)"
    assert objective_label("cost") == "cost per step (GPU-hours)"  # no price: GPU-hours, not a currency
    seen = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, *a, **kw):
        ax = fig.axes[0]
        seen["ylabel"] = ax.get_ylabel()
        seen["notes"] = [(t.get_text(), t.xy, t.arrow_patch is not None) for t in ax.texts]
        return real_savefig(fig, path, *a, **kw)
    plt.Figure.savefig = spy
    try:
        plots.plot_pareto([(1, 3), (2, 2), (3, 3)], [(2, 2), (1, 3)], labels, tmp_path / "p.png",
                          front_labels=["TP2 PP1 mbs1", "TP1 PP2 mbs1"])
    finally:
        plt.Figure.savefig = real_savefig
    assert seen["ylabel"] == "cost per step (EUR)"
    assert sorted(seen["notes"]) == [("TP1 PP2 mbs1", (1, 3), True), ("TP2 PP1 mbs1", (2, 2), True)]
    _legend_and_labels(tmp_path / "p.png")
