"""The files a study wrote in its folder, so ``search --overwrite`` removes those and nothing else (issue 41).

``results/<study>/.echo-tune-files.json`` lists, by plain name, every file the study's searches created there:
the journal and its lock, ``trials.csv``, ``best.json``, the plots, ... ``--overwrite`` removes exactly those
(never a folder, never through a link: ``unlink`` relative to the folder's descriptor removes a link itself)
and keeps the user's own notes, scripts and sub-folders, saying what it kept. A study written by an older
version has no list: then only the names echo-tune writes (``OWN_NAMES``) are removed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from echo_tune.search.storage.study_storage import JOURNAL_NAME
from echo_tune.io import write_text

MANIFEST_NAME = ".echo-tune-files.json"
OUTPUT_NAMES = ("trials.csv", "best.json", "megatron_args.txt", "best_trace.json", "pareto.csv", "pareto.svg",
                "pareto.png", "breakdowns.png")
"""The files search/outputs/write.py writes in a study's folder."""


def own_names() -> tuple[str, ...]:
    """Every name a study of this version may write in its folder."""
    return (JOURNAL_NAME, JOURNAL_NAME + ".flock") + OUTPUT_NAMES


def _plain(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def recorded(study_dir: Path) -> set[str] | None:
    """The names the manifest lists (plain names only: a planted ``../x`` is ignored), or None without one."""
    path = Path(study_dir) / MANIFEST_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    names = data.get("files") if isinstance(data, dict) else None
    return {n for n in names if _plain(n)} if isinstance(names, list) else None


def record(study_dir: Path, paths) -> None:
    """Add ``paths`` (files in ``study_dir``) to its manifest, written atomically and never through a link."""
    study_dir = Path(study_dir)
    names = set(recorded(study_dir) or ())
    for p in paths:
        p = Path(p)
        if p.parent == study_dir and _plain(p.name) and p.name != MANIFEST_NAME:
            names.add(p.name)
    text = json.dumps({"written_by": "echo-tune search", "files": sorted(names)}, indent=1) + "\n"
    write_text(study_dir / MANIFEST_NAME, text, "study file list")


def remove_written(study_dir: Path) -> tuple[list[str], list[str]]:
    """Remove the files the study wrote (the manifest's names, else ``own_names``) and the manifest; returns
    (removed, kept) names. Folders are always kept; a listed name that is now a folder is kept too."""
    study_dir = Path(study_dir)
    listed = recorded(study_dir)
    ours = (listed if listed is not None else set(own_names())) | {MANIFEST_NAME}

    ours |= {JOURNAL_NAME, JOURNAL_NAME + ".flock"}  # the storage the study is started over in
    removed, kept = [], []
    dir_fd = os.open(study_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in sorted(os.listdir(dir_fd)):
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
            if name in ours and not stat.S_ISDIR(mode):
                os.unlink(name, dir_fd=dir_fd)  # a link is removed itself, its target untouched
                removed.append(name)
            else:
                kept.append(name + ("/" if stat.S_ISDIR(mode) else ""))
    finally:
        os.close(dir_fd)
    return removed, kept


def kept_note(kept: list[str]) -> list[str]:
    """The note ``--overwrite`` prints when it left files of the user's in the study folder."""
    if not kept:
        return []
    shown = ", ".join(kept[:8]) + (f" and {len(kept) - 8} more" if len(kept) > 8 else "")
    return [f"--overwrite removed only the files echo-tune wrote; kept {len(kept)} of yours in the study folder: "
            f"{shown}"]
