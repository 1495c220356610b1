"""How the device profile (`probes/device_profile/profile_worker.py`) times things: blocks of calls, their count chosen
from a first timing so that every point costs a bounded time, as torch.utils.benchmark's
`Timer.blocked_autorange` does (warm-up, then blocks of n calls, each block one clock reading).

Two clocks, the same on a CPU and a GPU except where marked:
- host time (`host_block`): the wall clock around n calls issued back to back on tiny tensors,
  after and before a device synchronization. The GPU runs each tiny kernel faster than the host
  issues the next one, so this is the host's cost per call (dispatch, autograd, launch), as
  shared/gpu-facts/opbench.py's `timed` measures it (there with CUDA events around the same
  loop, which on an idle-waiting GPU read the same).
- device time (`device_block`): on a GPU, CUDA events on the current stream around n calls that
  were queued behind a sleep kernel (`torch.cuda._sleep`) long enough for the host to issue them
  all first, so that the events see the kernels run back to back and not the host's cost of
  issuing them (which `host_block` measures). Where the host did not get ahead in time (its
  issue took longer than the sleep) the reading is an upper bound on the device time, and the
  timing says so (`host_ahead` False). On a CPU the ops run on the calling thread: the wall clock.

Check a point by hand with `python -m torch.utils.benchmark` or `nsys profile` (kernel times).
"""
from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable

# A device point's block: at most MAX_CALLS calls (the CUDA launch queue holds about a thousand
# pending launches; past it the host blocks, which is harmless but slow). Its length is the plan's
# (probes/device_profile/points.py); a host block lasts about HOST_BLOCK_S.
HOST_BLOCK_S = 20e-3
MAX_CALLS = 200
ROUNDS = 3
# The sleep kernel must outlast the host's issue of the block: this many times its first-timed
# issue, plus a margin, at most MAX_SLEEP_S.
SLEEP_MARGIN = 1.5
MAX_SLEEP_S = 0.2


@dataclass(frozen=True)
class Timing:
    seconds: float              # per call: the median over blocks
    fastest: float              # per call: the fastest block
    calls: int                  # per block
    blocks: int
    host_ahead: bool | None     # GPU device time: the host issued every block before the sleep ended


class Clock:
    """The timer for one device ("cuda", "cuda:N" or "cpu")."""

    def __init__(self, device: str):
        import torch  # lazy: torch, loaded only inside the worker process that measures

        self.torch = torch
        self.device = device
        self.cuda = device.startswith("cuda")
        self._sleep_cycles_per_s: float | None = None

    def sync(self) -> None:
        if self.cuda:  # GPU only
            self.torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Free what the caching allocator holds between sections (a GPU's; a CPU's is glibc's)."""
        gc.collect()
        if self.cuda:  # GPU only
            self.torch.cuda.empty_cache()

    # ---- blocks: each returns the seconds n calls took -------------------------------------

    def host_block(self, fn: Callable[[], object]) -> Callable[[int], float]:
        def block(n: int) -> float:
            self.sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            self.sync()
            return time.perf_counter() - t0
        return block

    def device_block(self, fn: Callable[[], object]) -> "_DeviceBlock":
        return _DeviceBlock(self, fn)

    def _cycles_per_s(self) -> float:
        """The sleep kernel's clock, timed once: cycles per second of `torch.cuda._sleep`."""
        if self._sleep_cycles_per_s is None:  # GPU only
            torch = self.torch
            cycles = 10_000_000
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            self._sleep_cycles_per_s = cycles / (start.elapsed_time(end) / 1e3)
        return self._sleep_cycles_per_s


class _DeviceBlock:
    """n calls of fn timed as the device runs them (see the module's docstring)."""

    def __init__(self, clock: Clock, fn: Callable[[], object]):
        self.clock, self.fn = clock, fn
        self.issue_s_per_call: float | None = None   # the host's issue cost, from the last block
        self.host_ahead = True

    def __call__(self, n: int) -> float:
        if not self.clock.cuda:
            t0 = time.perf_counter()
            for _ in range(n):
                self.fn()
            return time.perf_counter() - t0
        return self._cuda(n)

    def _cuda(self, n: int) -> float:  # GPU only
        torch = self.clock.torch
        self.clock.sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sleep_s = 0.0
        if self.issue_s_per_call is not None:  # the first block learns the issue cost: no sleep
            sleep_s = min(MAX_SLEEP_S, SLEEP_MARGIN * n * self.issue_s_per_call + 50e-6)
            torch.cuda._sleep(int(sleep_s * self.clock._cycles_per_s()))
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            self.fn()
        issue = time.perf_counter() - t0
        end.record()
        end.synchronize()
        if self.issue_s_per_call is not None and issue > sleep_s:
            self.host_ahead = False
        self.issue_s_per_call = issue / n
        return start.elapsed_time(end) / 1e3


def autorange(block: Callable[[int], float], target_block_s: float, budget_s: float,
              rounds: int = ROUNDS, max_calls: int = MAX_CALLS) -> Timing:
    """One warm-up call, one timed call to size the blocks (n calls of about target_block_s, at
    most max_calls), then up to `rounds` blocks while the point's time is within budget_s (at
    least one): the median block's time per call, and the fastest's."""
    started = time.perf_counter()
    block(1)
    first = block(1)
    n = max(1, min(max_calls, int(target_block_s / max(first, 1e-9))))
    per_call: list[float] = []
    while len(per_call) < rounds and (not per_call or time.perf_counter() - started < budget_s):
        per_call.append(block(n) / n)
    ahead = block.host_ahead if isinstance(block, _DeviceBlock) and block.clock.cuda else None
    return Timing(statistics.median(per_call), min(per_call), n, len(per_call), ahead)
