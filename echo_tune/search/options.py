"""The options of a search run (sampler, budget, storage, resume / overwrite) and their one-line checks.
search/study.py runs a search with them; search/engines/sampling_run.py hands them to its worker processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from echo_tune.errors import ConfigError
from echo_tune.search.engines.sampler import SAMPLERS


@dataclass
class SearchOptions:
    sampler: str = "auto"
    n_trials: int | None = None
    """Total finished trials the study should hold (default: auto 3000 layouts at most, the Optuna samplers 200;
    exhaustive: every valid layout)."""
    timeout: float | None = None
    """Stop starting trials after this many seconds (finished trials are kept)."""
    seed: int | None = 0
    n_jobs: int = 1
    study_name: str | None = None
    results_dir: str | Path = "results"
    storage: str | None = None
    """An Optuna storage URL or a journal file path; default ``results_dir/study_name/journal.log``."""
    resume: bool = False
    overwrite: bool = False
    baselines: bool = True
    write_files: bool = True


def check_options(opts: SearchOptions) -> None:
    """One-line errors for options no search can run with."""
    if opts.sampler not in SAMPLERS:
        raise ConfigError(f"`--sampler` must be one of {sorted(SAMPLERS)}, but got ({opts.sampler!r})")
    if opts.n_trials is not None and opts.n_trials < 1:
        raise ConfigError(f"`--n-trials >= 1` must hold, but got (n_trials={opts.n_trials})")
    if opts.timeout is not None and opts.timeout <= 0:
        raise ConfigError(f"`--timeout > 0` must hold, but got (timeout={opts.timeout})")
    if opts.n_jobs < 1:
        raise ConfigError(f"`--n-jobs >= 1` must hold, but got (n_jobs={opts.n_jobs})")
    if opts.resume and opts.overwrite:
        raise ConfigError("--resume and --overwrite exclude each other; continue the study or start it over")
