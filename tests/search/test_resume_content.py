"""A resumed study is checked by content, not names (issue 20): a model, cluster or profile file edited in
place, a changed memory limit, or a different search started together on the same name is refused in
one line instead of mixing two searches' trials."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.cost.profile import default_profile, save_profile
from echo_tune.config.load.loading import load_cluster
from echo_tune.errors import ConfigError
from echo_tune.search import SearchOptions, load_space, run_search
from echo_tune.search import study as study_module
from echo_tune.search.space.search_space import with_overrides
from echo_tune.search.storage.study_storage import open_storage

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def tiny(tmp_path):
    """The tiny CPU space with its model and cluster files (and a profile) copied beside it, to edit."""
    for name in ("tiny-space.yaml", "tiny-llama.yaml", "cpu-cluster.yaml"):
        shutil.copy(DATA / name, tmp_path / name)
    save_profile(default_profile(load_cluster(str(tmp_path / "cpu-cluster.yaml"))), tmp_path / "profile.yaml")
    space = yaml.safe_load((tmp_path / "tiny-space.yaml").read_text())
    space["profile"] = "profile.yaml"
    (tmp_path / "tiny-space.yaml").write_text(yaml.safe_dump(space))
    return tmp_path


def _edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))


def _opts(root: Path, **kw) -> SearchOptions:
    return SearchOptions(sampler="exhaustive", results_dir=root / "results", study_name="t", write_files=False, **kw)


@pytest.mark.parametrize("file,change,part", [
    ("tiny-llama.yaml", lambda d: d.update(hidden_size=512), "model"),
    ("cpu-cluster.yaml", lambda d: d.update(gpus_per_node=d["gpus_per_node"] * 2), "cluster"),
    ("profile.yaml", lambda d: d["compute"].update(kernel_launch_overhead_s=2 * d["compute"]
                                                   ["kernel_launch_overhead_s"]), "profile"),
])
def test_resume_refuses_a_file_edited_in_place(tiny, file, change, part):
    first = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny))
    assert first.n_trials > 0
    _edit(tiny / file, change)
    with pytest.raises(ConfigError, match=f"different search space \\(changed: {part}[;,]"):
        run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True))
    # nothing was added: the study still holds the first search's trials only
    study = optuna.load_study(study_name="t", storage=open_storage(tiny / "results" / "t").storage)
    assert len(study.get_trials()) == first.n_trials


def test_unchanged_inputs_resume(tiny):
    first = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=3))
    again = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True))
    assert first.n_trials == 3 and again.n_trials > 3 and again.new_trials == again.n_trials - 3


def test_changed_memory_headroom_is_refused_on_resume(tiny, capsys):
    """Which stored layouts fit depends on the memory limit: a resumed study must not write a best.json
    chosen under another one."""
    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny))
    with pytest.raises(ConfigError, match="memory_headroom_gib"):
        run_search(with_overrides(load_space(tiny / "tiny-space.yaml"), memory_headroom_gib=30),
                   _opts(tiny, resume=True))
    results = tiny / "cli"
    argv = ["search", str(tiny / "tiny-space.yaml"), "--sampler", "exhaustive", "--results-dir", str(results)]
    assert main(argv + ["--json"]) == 0
    best = (results / "tiny-cpu" / "best.json").read_text()
    capsys.readouterr()
    assert main(argv + ["--resume", "--memory-headroom-gib", "30"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--memory-headroom-gib" in err and "Traceback" not in err, err
    assert (results / "tiny-cpu" / "best.json").read_text() == best  # no best.json that does not fit


def test_a_different_search_started_together_is_refused(tiny, monkeypatch):
    """Both searches saw no study when they started (the race of two processes launched together); the
    one that creates it second must find the first one's content digest and stop, not merge."""
    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=2))
    _edit(tiny / "tiny-llama.yaml", lambda d: d.update(num_layers=8))
    real_open = study_module._open_study

    def saw_no_study(space, opts, name, out_dir):  # as if it had looked before the other one created it
        store, _ = real_open(space, opts, name, out_dir)
        return store, False
    monkeypatch.setattr(study_module, "_open_study", saw_no_study)
    with pytest.raises(ConfigError, match="changed: model"):
        run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True))
    study = optuna.load_study(study_name="t", storage=open_storage(tiny / "results" / "t").storage)
    assert len(study.get_trials()) == 2  # the other model's trials were not added


def test_two_different_searches_started_together_never_merge(tiny):
    """Two processes, two versions of the model, one study name, both with --resume, launched at once:
    whichever creates the study first wins; the other stops with one line (and adds no trial)."""
    import os
    import subprocess
    import sys

    other = tiny / "other"
    other.mkdir()
    for name in ("tiny-space.yaml", "tiny-llama.yaml", "cpu-cluster.yaml", "profile.yaml"):
        shutil.copy(tiny / name, other / name)
    _edit(other / "tiny-llama.yaml", lambda d: d.update(hidden_size=512))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-m", "echo_tune.cli.main", "search", str(folder / "tiny-space.yaml"),
                               "--sampler", "exhaustive", "--resume", "--study-name", "race", "--results-dir",
                               str(tiny / "results"), "--json"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for folder in (tiny, other)]
    done = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in done)
    assert codes == [0, 2], done
    loser = next(err for code, _, err in done if code == 2)
    assert "changed: model" in loser and "Traceback" not in loser, loser
    winner = json.loads(next(out for code, out, _ in done if code == 0))
    study = optuna.load_study(study_name="race", storage=open_storage(tiny / "results" / "race").storage)
    assert len(study.get_trials()) == winner["n_trials"] == winner["space_size"]


def test_changed_price_is_refused_on_resume_and_older_studies_still_resume(tiny):
    # every stored trial holds its cost per step at the price it ran with: a resume at another price mixed two
    # prices in one column (0.1503 beside 0.05132 for one layout family)
    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=3))
    with pytest.raises(ConfigError, match="changed: gpu_hour_cost.*--gpu-hour-cost"):
        run_search(with_overrides(load_space(tiny / "tiny-space.yaml"), gpu_hour_cost=3.0),
                   _opts(tiny, n_trials=5, resume=True))
    # a study stored before the price was a part of its content (no "gpu_hour_cost" key) still resumes
    from echo_tune.search.storage.content import CONTENT_ATTR

    storage = open_storage(tiny / "results" / "t").storage
    study = optuna.load_study(study_name="t", storage=storage)
    old = {k: v for k, v in study.user_attrs[CONTENT_ATTR].items() if k != "gpu_hour_cost"}
    old["sha256"] = "an older digest"
    study.set_user_attr(CONTENT_ATTR, old)
    again = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=5, resume=True))
    assert again.n_trials == 5


def test_a_resume_with_another_sampler_says_so(tiny):
    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=3))
    again = run_search(load_space(tiny / "tiny-space.yaml"),
                       SearchOptions(sampler="random", results_dir=tiny / "results", study_name="t",
                                     write_files=False, n_trials=5, resume=True))
    assert any("came from the 'exhaustive' sampler" in n and "'random'" in n for n in again.notes)
    same = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=6, resume=True))
    assert not any("sampler" in n for n in same.notes)  # the study's first sampler again: nothing to say


def test_a_resume_at_another_seed_says_so_where_the_sampler_draws(tiny):
    def opts(sampler, seed, n):
        return SearchOptions(sampler=sampler, results_dir=tiny / "results", study_name=sampler, seed=seed,
                             write_files=False, n_trials=n, resume=True)
    run_search(load_space(tiny / "tiny-space.yaml"), opts("random", 0, 3))
    again = run_search(load_space(tiny / "tiny-space.yaml"), opts("random", 7, 5))
    assert any("--seed 0 at --seed 7" in n for n in again.notes)
    same = run_search(load_space(tiny / "tiny-space.yaml"), opts("random", 0, 6))
    assert not any("--seed" in n for n in same.notes)
    run_search(load_space(tiny / "tiny-space.yaml"), opts("exhaustive", 0, 3))  # no random draw: nothing to say
    exhaustive = run_search(load_space(tiny / "tiny-space.yaml"), opts("exhaustive", 7, 5))
    assert not any("--seed" in n for n in exhaustive.notes)


def test_progress_of_a_resumed_search_starts_from_the_stored_best(tiny):
    first = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=6))
    seen = []
    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, n_trials=8, resume=True),
               progress=lambda done, total, record: seen.append(record))
    stored_best = first.best["step_time_s"]
    assert seen[0] is not None and seen[0]["step_time_s"] == stored_best  # shown before the new trials' own
    assert len(seen) > 1


def test_resume_refuses_a_study_simulated_by_other_code(tiny, monkeypatch):
    """An upgrade or a local edit of echo-tune changes the simulator: its trials must not be mixed with the
    stored ones (the study's ``code`` part, code_version.sources_sha256)."""
    from echo_tune.search.storage import content

    first = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny))
    assert first.n_trials > 0
    again = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True))  # same code: resumes
    assert again.new_trials == 0
    monkeypatch.setattr(content, "sources_sha256", lambda: "f" * 64)
    with pytest.raises(ConfigError, match=r"simulated by another version of echo-tune .*--overwrite"):
        run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True))
    fresh = run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, overwrite=True))
    assert fresh.new_trials == first.n_trials


def test_a_study_stored_before_the_code_part_still_resumes(tiny):
    from echo_tune.search.storage.content import CONTENT_ATTR

    run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny))
    store = open_storage(tiny / "results" / "t", None)
    study = optuna.load_study(study_name="t", storage=store.storage)
    older = {k: v for k, v in study.user_attrs[CONTENT_ATTR].items() if k != "code"}
    older["sha256"] = "0" * 64  # an older version's digest of fewer parts
    study.set_user_attr(CONTENT_ATTR, older)
    assert run_search(load_space(tiny / "tiny-space.yaml"), _opts(tiny, resume=True)).new_trials == 0
