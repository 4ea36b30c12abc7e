"""``load_results(dir)``: a search's trials as a pandas DataFrame, for notebooks.

One row per finished trial of the study stored in ``dir`` (a results folder holding ``journal.log``, or the
journal file itself): the trial number and state, every layout setting by Megatron name, the derived sizes,
the step report's numbers, the breakdown parts (``<part>_s``) and

- ``feasible``: simulated and fits in memory with the space's headroom (False for out-of-memory,
  rule-breaking and dominated, not simulated, layouts);
- ``headroom_gib``: memory left under the limit (HBM minus the required headroom) at the peak stage;
  negative = over by that much;
- ``rejected_rule``: the rule a layout broke ("" otherwise);
- ``dominated_by``: why a layout was not simulated, another layout of the space being at least as good
  ("recompute_granularity=none": the same layout without recompute fits; "peak>capacity": over memory by more
  than the memory model's error, its memory given but its step not simulated; search/space/dominance.py), ""
  otherwise.

Word-valued settings keep their words: recompute, its method and the FP8 format read ``none`` when unset
(as in a space file), never NaN. ``pd.read_csv(dir / "trials.csv", keep_default_na=False)`` reads the same
way from the CSV file.

Rows are sorted feasible first, fastest first, so ``df.iloc[0]`` is the best layout.
"""

from __future__ import annotations

from pathlib import Path
from echo_tune.errors import ConfigError

GIB = 2**30


def load_results(path: str | Path, study_name: str | None = None):
    """The trials of the study in ``path`` as a DataFrame (see the module docstring)."""
    # lazy: loads optuna (~0.3 s), which importing results_api does not
    import optuna
    # lazy: loads pandas (~0.5 s), which importing results_api does not
    import pandas as pd

    # lazy: loads optuna (~0.3 s), which importing results_api does not
    from echo_tune.search.outputs.trials_csv import spell_none
    # lazy: loads optuna (~0.3 s), which importing results_api does not
    from echo_tune.search.outputs.results import trial_record, untimed_record
    # lazy: loads optuna (~0.3 s), which importing results_api does not
    from echo_tune.search.storage.study_storage import JOURNAL_NAME, open_storage

    path = Path(path)
    folder = path.parent if path.name == JOURNAL_NAME else path
    if not (folder / JOURNAL_NAME).is_file():
        raise ConfigError(f"{str(folder)!r} holds no {JOURNAL_NAME}; give a results folder written by echo-tune "
                          f"search or plan")
    store = open_storage(folder, None)
    names = optuna.get_all_study_names(store.storage)
    name = study_name or (folder.name if folder.name in names else (names[0] if len(names) == 1 else None))
    if name not in names:
        raise ConfigError(f"choose the study with study_name=, one of {names}")
    study = optuna.load_study(study_name=name, storage=store.storage)
    rows = []
    for t in study.get_trials(deepcopy=False):
        if not t.state.is_finished():
            continue
        record = trial_record(t)
        memory = None if record else untimed_record(t)  # over memory beyond the band: its memory, no step
        row = {"trial": t.number, "state": t.state.name, "rejected_rule": t.user_attrs.get("rejected_rule", ""),
               "dominated_by": t.user_attrs.get("dominated_by", "")}
        config = record["config"] if record else t.user_attrs.get("config", dict(t.params))
        row.update(config)
        if record:
            row.update(record["derived"])
            for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
                        "fits_memory", "cost_per_step", "critical_stage", "worst_stage"):
                row[key] = record[key]
            row["headroom_gib"] = (record["memory_capacity_bytes"] - record["peak_memory_bytes"]) / GIB
            row.update({f"{part}_s": seconds for part, seconds in record["breakdown_s"].items()})
        elif memory:
            row.update(memory["derived"])
            row.update(peak_memory_gib=memory["peak_memory_gib"], fits_memory=False, worst_stage=memory["worst_stage"],
                       headroom_gib=(memory["memory_capacity_bytes"] - memory["peak_memory_bytes"]) / GIB)
        row["feasible"] = bool(record and record["fits_memory"])
        rows.append(row)
    df = pd.DataFrame([spell_none(r) for r in rows])  # recompute "none" stays the word, not NaN
    if df.empty:
        return df
    return df.sort_values(["feasible", "step_time_s", "trial"], ascending=[False, True, True],
                          na_position="last").reset_index(drop=True)
