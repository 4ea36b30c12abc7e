"""The run lease (``run_lease.py``): one exhaustive/auto run of a study at a time on a journal, released when
its holder is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from echo_tune.search.storage.study_storage import open_storage
    from echo_tune.search.storage.run_lease import run_lease
    store = open_storage(Path(sys.argv[1]), None)
    started = time.monotonic()
    with run_lease(store, sys.argv[2]) as waited:
        print(f"{sys.argv[2]} {time.monotonic() - started:.2f} {waited} {time.time():.3f}", flush=True)
        time.sleep(float(sys.argv[3]))
""")


def _hold(folder: Path, name: str, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD, str(folder), name, str(seconds)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_second_run_waits_for_the_first_and_a_killed_holder_releases(tmp_path):
    first = _hold(tmp_path, "a", 600)
    assert first.stdout.readline().split()[2] == "False"  # it holds the lease now
    other = _hold(tmp_path, "b", 0)  # another study of the same journal: not held up
    out, _ = other.communicate(timeout=60)
    assert out.split()[2] == "False"
    second = _hold(tmp_path, "a", 0)
    time.sleep(1.5)
    assert second.poll() is None  # waiting
    killed_at = time.time()
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    out, err = second.communicate(timeout=60)
    # it got the lease only once the holder was killed (a wall-clock stamp: its own wait can be short when a loaded
    # machine starts it late)
    assert second.returncode == 0 and out.split()[2] == "True" and float(out.split()[3]) >= killed_at
    assert "another run of study 'a'" in err and "waiting" in err
