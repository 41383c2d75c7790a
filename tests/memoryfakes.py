"""Fault injection for memory: plugin backends the real worker loads ("tests.memoryfakes:NAME") that take more
memory than a point's matrices at one size, or die by a SIGKILL that is not the OOM killer's."""

from __future__ import annotations

import os
import signal

from crossover_monitor.measure.contract import RunBlock
from crossover_monitor.model import DeviceInfo, Mode
from tests.fakes import CpuOnlyBackend

GREEDY_SIZE = 64  # the size at which these backends misbehave; the smaller ones are timed as usual
GREEDY_BYTES = 1 << 30  # what the greedy backend takes there: far more than the test's cgroup allows


class GreedyBackend(CpuOnlyBackend):
    """A CPU whose framework takes a GiB at n = 64 (a workspace, say), past what its 64x64 matrices need."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if size == GREEDY_SIZE:
            hog = bytearray(GREEDY_BYTES)
            for page in range(0, GREEDY_BYTES, 4096):  # touched, so the pages are really taken
                hog[page] = 1
        return super().prepare(device, size, dtype, mode)


class KilledBackend(CpuOnlyBackend):
    """A CPU whose worker gets a SIGKILL at n = 64 from someone other than the OOM killer (an operator, say)."""

    def prepare(self, device: DeviceInfo, size: int, dtype: str, mode: Mode) -> RunBlock:
        if size == GREEDY_SIZE:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().prepare(device, size, dtype, mode)


greedy = GreedyBackend
killed = KilledBackend
