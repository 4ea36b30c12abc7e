"""The same ``echo-tune search`` command run again (issue 40): a finished search shows its result again.

A run that ends without being interrupted (and before its ``--timeout``) stores in its study which search it
finished: the sampler, ``--n-trials`` and ``--seed`` (``mark_completed``; the inputs are in the study's content
digest, ``content.py``). The same command run again, without ``--resume`` or ``--overwrite``, finds the study
finished by that search and prints its result again, simulating nothing (``check_rerun`` says so; the outputs
are written again from the stored trials). Any other study of that name (interrupted, begun by another
sampler, seed or trial count) is refused in one line that names ``--resume`` and ``--overwrite``.
"""

from __future__ import annotations

from echo_tune.errors import ConfigError

COMPLETED_ATTR = "completed_by"


def _signature(opts) -> dict:
    return {"sampler": opts.sampler, "n_trials": opts.n_trials, "seed": opts.seed}


def mark_completed(study, opts) -> None:
    """Record that ``opts``' search ran to its end on ``study``."""
    signature = _signature(opts)
    if study.user_attrs.get(COMPLETED_ATTR) != signature:
        study.set_user_attr(COMPLETED_ATTR, signature)


def check_rerun(study, opts, name: str, where: str) -> None:
    """A study found without --resume or --overwrite: returns when ``opts``' own search finished it (its
    result is shown again); refuses anything else in one line."""
    done = study.user_attrs.get(COMPLETED_ATTR)
    if done == _signature(opts):
        return
    if isinstance(done, dict):
        differs = [f"--{k.replace('_', '-')} {done.get(k)!r}" for k in ("sampler", "n_trials", "seed")
                   if done.get(k) != getattr(opts, k)]
        why = f"a search with other options finished it ({', '.join(differs)})"
    else:
        why = ("no search is recorded as having finished it (interrupted, stopped by --timeout, or run by an older "
               "echo-tune)")
    raise ConfigError(f"study {name!r} already exists in {where} and {why}; pass --resume to continue it with "
                      f"these options, --overwrite to start it over, or --study-name to start another")


def rerun_note(name: str, n_trials: int) -> str:
    return (f"study {name!r} was finished by this same search: its result ({n_trials} trials) is shown again and "
            f"nothing was simulated; --overwrite runs it again, --resume --n-trials N continues it")
