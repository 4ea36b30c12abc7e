"""docs/accuracy.md and the README's accuracy table are what `python benchmarks/accuracy_table.py --write` writes from
the current code (one page that is the truth; rerun that command after a change that moves a prediction)."""

from pathlib import Path

from echo_tune.validate.accuracy_page import README_END, README_START, Row, collect_rows, page, readme_table

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_and_readme_table_are_the_generated_ones():
    rows, refused = collect_rows()
    assert (REPO / "docs" / "accuracy.md").read_text() == page(rows, refused), \
        "rerun: python benchmarks/accuracy_table.py --write"
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index(README_START) + len(README_START):readme.index(README_END)].strip()
    assert block == "\n".join(readme_table(rows)), "rerun: python benchmarks/accuracy_table.py --write"


def test_tables_by_hand():
    rows = [Row(dataset="a.csv", name="x", family="h100-sxm dense", in_sample_pct=-4.0, out_of_sample_pct=-6.0,
                fits_memory=True, gpu_side_pct=-10.0),
            Row(dataset="a.csv", name="y", family="h100-sxm dense", in_sample_pct=2.0, out_of_sample_pct=2.0,
                fits_memory=False, gpu_side_pct=0.0)]
    assert readme_table(rows)[2] == "| h100-sxm dense | 2 | -2.0% | 4.0% | -6.0% (x) | 1 |"
    text = page(rows, [("a.csv", "z", "refused: --foo")])
    assert "| h100-sxm dense | 2 | -1.0% | 3.0% | -4.0% | -2.0% | 4.0% | -6.0% | -5.0% | 1 |" in text
    assert "| a.csv | x | h100-sxm dense | -4.0% | -6.0% | -10.0% | yes |" in text
    assert "1 rows that host time was fitted on" in text and "- a.csv z: refused: --foo" in text
