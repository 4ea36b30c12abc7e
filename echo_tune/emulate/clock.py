"""The emulator's clock: how task times are measured and how a modelled wait passes.

- ``WallClock`` (CUDA, or CPU with several intra-op threads): the host clock; every reading is
  preceded by a device synchronize, and a wait is a busy-wait (the device idles, as on a collective).
- ``ThreadClock`` (CPU with one intra-op thread): the thread's CPU time, which other processes on a
  shared machine do not inflate; a wait advances the clock by its duration without idling. This is
  the same clock ``echo-tune profile`` times single-threaded CPU ops with (``optime/measure.py``).
"""

from __future__ import annotations

import time

import torch


class WallClock:
    kind = "wall-clock"

    def __init__(self, device: str) -> None:
        self._sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def now(self) -> float:
        self._sync()
        return time.perf_counter()

    def wait(self, seconds: float) -> None:
        deadline = self.now() + seconds
        while time.perf_counter() < deadline:
            pass

    def wait_until(self, deadline: float) -> None:
        while time.perf_counter() < deadline:
            pass


class ThreadClock:
    kind = "thread-cpu-time"

    def __init__(self) -> None:
        self._offset = 0.0

    def now(self) -> float:
        return time.thread_time() + self._offset

    def wait(self, seconds: float) -> None:
        self._offset += seconds

    def wait_until(self, deadline: float) -> None:
        self._offset += max(0.0, deadline - self.now())


def clock_for(device: str) -> WallClock | ThreadClock:
    """The clock ``emulate`` and ``profile`` use on ``device``."""
    if device.startswith("cpu") and torch.get_num_threads() == 1:
        return ThreadClock()
    return WallClock(device)
