"""The study driver: one Optuna study per search, stored under ``results/<name>/``, resumable.

Samplers come from the registry in ``sampler.py`` (wrapped to propose valid layouts only); the exhaustive
"sampler" is ``exhaustive.py``, the default ("auto", structure first) ``auto.py``, the others' trial loop
``sampling_run.py``.

``run_search(space, SearchOptions(...))`` runs (or continues) one Optuna study whose objective is the
simulator and writes the output files. ``--n-trials`` is the study's total: a resumed study runs only
the trials still missing. With ``n_jobs == 1`` a fixed seed gives the same study every time.

Every layout is stored once (issue 41): the exhaustive and ``auto`` searches off a database hold the study's run
lease (``run_lease.py``: a second run waits, then continues with what is left); on a database the exhaustive
workers claim tickets whose dead claimants' claims are re-issued (``tickets.py``); a sampling run fails a killed
run's RUNNING trials and asks their layouts again (``accounting.py``, ``sampling_run.py``); the summary counts
distinct layouts and names duplicates and missing ones. The same search run again without ``--resume`` shows
its result again when it finished (``rerun.py``, issue 40).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import optuna

from echo_tune.errors import ConfigError
from echo_tune.io import ensure_dir
from echo_tune.search.outputs import results as res
from echo_tune.search.outputs.results import SearchResult
from echo_tune.search.engines.auto import AUTO_BUDGET, run_auto
from echo_tune.search.engines.feature_level import FEATURE_TOP
from echo_tune.search.engines.feature_variants import core_space, has_features
from echo_tune.search.engines.exhaustive import run_exhaustive
from echo_tune.search.engines.workers import start_workers, worker_pool
from echo_tune.search.engines.gc_pause import gc_paused
from echo_tune.search.outputs.trials_csv import TrialsCsv
from echo_tune.search.space.layouts import config_key
from echo_tune.search.space.space_check import check_space
from echo_tune.search.storage.resume import resume_notes, with_stored_best
from echo_tune.search.options import SearchOptions, check_options
from echo_tune.search.engines.sampler import DEFAULT_N_TRIALS, make_sampler
from echo_tune.search.engines.sampling_run import run_sampling
from echo_tune.search.engines.shared import shares_work
from echo_tune.search.engines.tickets import run_shared_exhaustive
from echo_tune.search.storage.run_lease import LEASE_SUFFIX, run_lease
from echo_tune.search.storage.rerun import check_rerun, mark_completed, rerun_note
from echo_tune.search.engines import sliced
from echo_tune.search.space.search_space import SearchSpace, space_profile
from echo_tune.search.outputs.summary import summarize
from echo_tune.search.outputs.structure_coverage import short_search_note
from echo_tune.search.storage.study_storage import JOURNAL_NAME, StudyStorage, open_storage
from echo_tune.search.storage.storage_checks import storage_error
from echo_tune.search.storage.content import CONTENT_ATTR, check_content, check_names, content_parts, create_or_check
from echo_tune.search.outputs.write import check_outputs
from echo_tune.search.storage.manifest import kept_note, record, remove_written
from echo_tune.sim.step_setup import clock_note_for

__all__ = ["DEFAULT_N_TRIALS", "SearchOptions", "SearchResult", "clock_notes", "run_search"]



def _open_study(space: SearchSpace, opts: SearchOptions, name: str, out_dir: Path) -> tuple[StudyStorage, bool]:
    """Open (or create) the study's storage; returns (storage, whether the study already existed). What
    --overwrite kept of the user's files is in the storage's ``notes``. A study that exists, without --resume or
    --overwrite, is checked by ``rerun.check_rerun`` (in ``_run_study``): the same search finished is shown
    again, anything else is refused in one line."""
    store = open_storage(out_dir, opts.storage)
    exists = name in optuna.get_all_study_names(store.storage)
    if exists and opts.overwrite:
        if opts.storage is None:  # our own results folder: start it over, removing only what the study wrote
            _, kept = remove_written(out_dir)
            store = open_storage(out_dir, None)
            store.notes = kept_note(kept)
        else:
            optuna.delete_study(study_name=name, storage=store.storage)
        exists = False
    if opts.storage is None:
        record(out_dir, [out_dir / JOURNAL_NAME, out_dir / (JOURNAL_NAME + ".flock"),
                         out_dir / (JOURNAL_NAME + LEASE_SUFFIX)])
    return store, exists


def _exhaustive_phase(space, study, store, opts, valid, done_before, deadline, profile, progress, shapes=None,
                      built=None):
    """Run the exhaustive search over ``valid``, or over the layouts of ``shapes`` (a fresh study:
    ``sliced.shapes_to_slice``), enumerated as the search runs: then returns the space's ``Tally`` (and
    ``built``, a ``TrialsCsv``, holds trials.csv's rows)."""
    count = [0]

    def on_trials(n: int, best: dict | None = None) -> None:
        count[0] += n
        if progress is not None:
            progress(count[0], None if shapes is not None else len(todo), best)
    if shapes is not None:
        with gc_paused():  # this process holds every stored trial (gc_pause.py)
            return sliced.run_sliced(space, shapes, study, store, n_jobs=opts.n_jobs, profile=profile,
                                     on_trials=on_trials, built=built)
    stored = {config_key(t.user_attrs.get("record", t.user_attrs).get("config", {}))
              for t in study.get_trials(deepcopy=False, states=res.FINISHED)}
    target = min(len(valid), opts.n_trials or len(valid))
    todo = [c for c in valid if not stored or c.key not in stored][:max(0, target - done_before)]
    if shares_work(opts.storage):  # a database: this process is one of possibly many workers
        run_shared_exhaustive(space, study, store, valid, todo, n_jobs=opts.n_jobs, profile=profile,
                              deadline=deadline, on_trials=on_trials)
    else:
        run_exhaustive(space, study, store, todo, n_jobs=opts.n_jobs, profile=profile, deadline=deadline,
                       on_trials=on_trials)


def run_search(space: SearchSpace, opts: SearchOptions | None = None, *,
               progress: Callable[[int, int | None, dict | None], None] | None = None) -> SearchResult:
    """Run or continue a study over ``space``; ``progress(done, total, record)`` after each trial."""
    opts = opts or SearchOptions()
    check_options(opts)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    deadline = None if opts.timeout is None else started + opts.timeout
    if opts.study_name is not None and not opts.study_name.strip():  # an empty name was replaced silently
        raise ConfigError(f"`--study-name` must name the study, but got ({opts.study_name!r}); give a name or leave "
                          f"--study-name out (the space's name)")
    name = opts.study_name or space.name
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"the study name must be a plain folder name, but got ({name!r}); use --study-name")
    if opts.sampler == "exhaustive" and not shares_work(opts.storage):
        start_workers(opts.n_jobs)  # their start-up overlaps the enumeration below
    shapes = _shapes_to_slice(space, opts)
    # with shapes, a fresh study's layouts are enumerated as the search runs (sliced.py)
    valid, notes = _enumerated(space, opts) if shapes is None else (None, [])
    out_dir = Path(opts.results_dir) / name
    if opts.write_files or opts.storage is None:  # a file or read-only folder: one line, not a traceback
        ensure_dir(out_dir, "results folder (--results-dir)")
    if opts.write_files:
        check_outputs(out_dir)  # a symlink where an output goes: refused before any work
    profile = space_profile(space)
    parts = content_parts(space, profile)
    notes = notes + clock_notes(space, profile)
    try:
        # one pause from the run to the summary: re-enabled between them, the collector's first pass scanned
        # everything the run had made (0.66 s after a Qwen3-30B-A3B exhaustive search, gc.callbacks)
        with gc_paused():
            return _run_study(space, opts, name, out_dir, valid, shapes, notes, profile, parts, started, deadline,
                              progress)
    except optuna.exceptions.StorageInternalError as exc:  # e.g. SQLite's "database or disk is full"
        raise storage_error(exc, opts.storage or str(out_dir)) from None


def clock_notes(space: SearchSpace, profile=None) -> list[str]:
    """The space's GPU at the clock its peak is specified at for want of a sustained one, or at a derived one
    (``clock_note``): the search's notes say so once (``profile``: the space's own, ``space_profile``)."""
    if profile is not None and profile.op_times is not None:  # measured op times hold the clock they ran at
        return []
    note = clock_note_for(space.cluster, profile)
    return [note] if note else []


def _enumerated(space: SearchSpace, opts) -> tuple[list, list[str]]:
    """The layouts a search draws from: for the default (auto) search of a space with recipe features, those of
    its first level (feature_variants.core_space: the features at their lead values), said in a note."""
    if opts.sampler != "auto" or not has_features(space):
        return check_space(space)
    valid, notes = check_space(core_space(space))
    return valid, notes + [f"recipe features: the {len(valid)} layouts counted have them at their lead values "
                           f"(search/engines/feature_variants.py); their combinations are searched for the best "
                           f"{FEATURE_TOP} structures"]


def _counted(space: SearchSpace) -> tuple[int, list[str]]:
    valid, notes = check_space(space)
    return len(valid), notes


def _shapes_to_slice(space: SearchSpace, opts: SearchOptions) -> list[dict] | None:
    """The shapes of the space when a fresh study of this search is enumerated as it runs (``sliced.py``)."""
    if opts.sampler != "exhaustive":
        return None
    return sliced.shapes_to_slice(space, n_jobs=opts.n_jobs, shared=shares_work(opts.storage),
                                  every_layout=opts.n_trials is None and opts.timeout is None)


def _run_study(space, opts, name, out_dir, valid, shapes, notes, profile, parts, started, deadline, progress):
    store, existed = _open_study(space, opts, name, out_dir)
    notes = notes + store.notes
    before = optuna.load_study(study_name=name, storage=store.storage) if existed else None
    if before is not None:  # by content (inputs edited in place), and by names for studies of older versions
        check_content(name, before.user_attrs.get(CONTENT_ATTR), parts)
        check_names(space, before)
    rerun = before is not None and not opts.resume  # the same command again: shown again if it finished
    if rerun:
        check_rerun(before, opts, name, store.where)
    n_before = len(before.get_trials(deepcopy=False)) if before is not None else 0
    seed = None if opts.seed is None else opts.seed + n_before  # a resumed sampler must not replay its draws
    if valid is None and rerun:
        (valid, notes), shapes = _enumerated(space, opts), None
    sampler = make_sampler(opts.sampler, space, valid, seed, opts.n_trials, opts.n_jobs)
    # created (with its content digest) or checked under the storage's lock: two different searches started
    # together on one name cannot both pass
    study, created = create_or_check(store, name, sampler, ["minimize"] * len(space.objectives), parts,
                                     {"space": space.describe(), "sampler": opts.sampler, "seed": opts.seed})
    existed = not created
    interrupted, tally = False, None
    # auto and exhaustive off a database compute their work from the stored trials: one run at a time
    leased = opts.sampler == "auto" or (opts.sampler == "exhaustive" and not shares_work(opts.storage))
    with (run_lease(store, name) if leased and not rerun else contextlib.nullcontext()):
        done_before = res.finished_count(study)
        if valid is None and done_before:  # resumed: the layouts not stored yet are the ones to run
            (valid, notes), shapes = _enumerated(space, opts), None
        if existed and done_before and not rerun:  # what a resumed run changed, said; progress from the stored best
            notes = notes + resume_notes(study, opts.sampler, opts.seed, done_before)
            progress = with_stored_best(progress, res.best_feasible(space, study.get_trials(deepcopy=False)))
        # trials.csv's rows built while the workers simulate (a fresh study whose layouts the tasks enumerate)
        built = TrialsCsv(space) if shapes is not None and opts.write_files and not done_before else None
        try:
            if rerun:
                notes = notes + [rerun_note(name, done_before)]
            elif opts.sampler == "auto":
                run_auto(space, study, store, valid, opts.n_trials or AUTO_BUDGET, n_jobs=opts.n_jobs,
                         profile=profile, deadline=deadline, progress=progress)
            elif opts.sampler == "exhaustive":
                tally = _exhaustive_phase(space, study, store, opts, valid, done_before, deadline, profile,
                                          progress, shapes=shapes, built=built)
            else:
                run_sampling(space, study, store, opts, name, out_dir, valid, seed, existed, done_before, deadline,
                             profile, progress)
        except KeyboardInterrupt:
            interrupted = True
        except BrokenProcessPool as exc:  # a worker killed from outside (loky's TerminatedWorkerError): keep what is stored
            interrupted = True
            notes = notes + [f"a worker process died ({str(exc).splitlines()[0][:120]}); the stored trials are kept"]
    timed_out = deadline is not None and time.monotonic() >= deadline
    if valid is None:  # the space as the tasks enumerated it; interrupted, enumerated here
        space_size, space_notes = (tally.size, tally.notes(space)) if tally is not None else _counted(space)
        notes = space_notes + notes
    else:
        space_size = len(valid)
    if opts.sampler not in ("auto", "exhaustive") and valid:
        short = short_search_note(space, study.get_trials(deepcopy=False), valid)
        notes = ([short] if short else []) + notes
    # exhaustive: the pool's idle worker draws the plot (it loaded matplotlib as the run ended)
    pool = worker_pool(opts.n_jobs) if (opts.sampler == "exhaustive" and opts.n_jobs > 1 and not interrupted
                                         and not shares_work(opts.storage)) else None
    with gc_paused():  # reads back every trial (gc_pause.py)
        result = summarize(space, study, sampler=opts.sampler, name=name, out_dir=out_dir, where=store.where,
                           started=started, space_size=space_size, notes=notes, done_before=done_before,
                           interrupted=interrupted, write_files=opts.write_files, profile=profile, pool=pool,
                           built_rows=built, valid=valid,
                           expect_all=_expects_all(opts, space_size) and not timed_out and not rerun)
    if not result.interrupted and not timed_out and not rerun:
        mark_completed(study, opts)
    return result


def _expects_all(opts: SearchOptions, space_size: int) -> bool:
    """Whether the run should end with every valid layout of the space stored (else it names the missing)."""
    if opts.timeout is not None:
        return False
    if opts.sampler == "exhaustive":
        return opts.n_trials is None or opts.n_trials >= space_size
    if opts.sampler == "auto":
        return False  # its budget decides, and rounds may stop early (auto.py)
    return (opts.n_trials or DEFAULT_N_TRIALS) >= space_size
