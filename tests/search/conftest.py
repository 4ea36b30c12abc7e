"""The small example's searches, run once per session (the 200-trial TPE check is in tests/cli), and a
PostgreSQL server for the multi-worker tests.

PostgreSQL's ``initdb`` and ``pg_ctl`` come from the distribution's packages (``.ci/run`` installs them);
the tests skip, saying why, only where no server can be started. The server refuses to run as root, so
as root it runs as the ``postgres`` user the package creates.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from echo_tune.search import SearchOptions, load_space, run_search

REPO = Path(__file__).resolve().parents[2]
SPACES = REPO / "search_spaces"
SMALL = SPACES / "small-gpt7b-16xa100.yaml"


@pytest.fixture(scope="session")
def small_space():
    return load_space(SMALL)


@pytest.fixture(scope="session")
def results_root(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def small_exhaustive(small_space, results_root):
    return run_search(small_space, SearchOptions(sampler="exhaustive", results_dir=results_root,
                                                 study_name="exhaustive"))


@pytest.fixture(scope="session")
def small_tpe(small_space, results_root):
    return run_search(small_space, SearchOptions(sampler="tpe", n_trials=60, seed=0, results_dir=results_root,
                                                 study_name="tpe"))


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (psycopg) is not installed: pip install -e '.[test]'")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server here (initdb/pg_ctl not found; Debian: apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="echo-tune-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    steps = [[initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
             [pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
              "-o", f"-p {port} -k {root} -h 127.0.0.1 -F", "start"]]
    for step in steps:
        done = subprocess.run(as_user + step, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"cannot start a PostgreSQL server: {Path(step[0]).name} said "
                        f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
