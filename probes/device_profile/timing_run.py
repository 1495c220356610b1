"""One profile's run (`probes/device_profile/profile_worker.py`): the device, the plan, the clock, the time budget
shared out over the sections (`SHARES`), the points skipped, and the progress lines."""
from __future__ import annotations

import time
from typing import Callable

from topoprof.probes.device_profile.clock import HOST_BLOCK_S, Clock, autorange
from topoprof.probes.device_profile.points import Plan

HOST_MAX_CALLS = 5000  # host-cost blocks stop here: a tiny op's block is long enough by then

# a section's share of what is left of the budget when it starts, over the shares still to come
SHARES = {"host_costs": 0.10, "gemm": 0.45, "memory": 0.15, "sdpa": 0.15, "optimizer": 0.05, "cpu": 0.10}


class ProfileRun:
    """The state of one profile: device, plan, time budget, skipped points, progress."""

    def __init__(self, torch, device: str, plan: Plan, on_progress: Callable[[str], None]):
        self.torch, self.device, self.plan = torch, device, plan
        self.cuda = device.startswith("cuda")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.clock = Clock(device)
        self.on_progress = on_progress
        self.started = time.perf_counter()
        self.deadline = self.started + plan.budget_s
        self.section_end = self.deadline
        self.skipped: list[dict] = []
        self.measured_here = 0     # points the current section has measured
        self.behind = 0            # device points where the host did not stay ahead (clock.py)
        self.seconds: dict[str, float] = {}

    def section(self, name: str, fn: Callable[["ProfileRun", dict], str], order: list[str], out: dict) -> None:
        start = time.perf_counter()
        rest = order[order.index(name):]
        self.section_end = start + max(0.0, self.deadline - start) * SHARES[name] / sum(SHARES[s] for s in rest)
        self.measured_here = 0
        detail = fn(self, out)
        self.clock.release()
        self.seconds[name] = time.perf_counter() - start
        self.on_progress(f"{name}: {detail} in {self.seconds[name]:.1f} s ({time.perf_counter() - self.started:.1f} s "
                         "in all)")

    def point(self, section: str, what: str, fn: Callable[[], object], counts: bool = True, budgeted: bool = True):
        """fn's result, or None with the point skipped: past the section's time (once the section has
        one point: every section measures at least one; never where not `budgeted`), or failed (out
        of memory)."""
        if budgeted and self.measured_here and time.perf_counter() > self.section_end:
            self.skipped.append({"section": section, "what": what,
                                 "reason": f"time budget: the section's share of {self.plan.budget_s:g} s was spent"})
            return None
        try:
            result = fn()
            self.measured_here += counts
            return result
        except RuntimeError as err:  # torch.OutOfMemoryError is one; the section goes on
            reason = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
        # released once the error (whose traceback holds the point's tensors) is gone
        self.skipped.append({"section": section, "what": what, "reason": reason})
        self.clock.release()
        return None

    def device_time(self, fn: Callable[[], object]) -> float:
        left = max(0.0, self.section_end - time.perf_counter())
        timing = autorange(self.clock.device_block(fn), self.plan.block_s, min(self.plan.point_s, left))
        self.behind += timing.host_ahead is False
        return self.pick(timing)

    def host_time(self, fn: Callable[[], object]) -> float:
        """A host cost, given its ten blocks whatever the section's budget left, as every host kind
        is measured (sections.py): at most 10 x HOST_BLOCK_S."""
        return self.pick(autorange(self.clock.host_block(fn), HOST_BLOCK_S, 10 * HOST_BLOCK_S,
                                   max_calls=HOST_MAX_CALLS))

    def pick(self, timing) -> float:
        """A GPU's median block (as shared/gpu-facts' opbench); a CPU's fastest, the one the machine's
        other work disturbed least (as probes/device_profile/device_costs.py: a CPU shares its cores, a GPU is its
        own)."""
        return timing.fastest if not self.cuda else timing.seconds

    def randn(self, *shape, dtype=None, grad: bool = False):
        return self.torch.randn(*shape, device=self.device, dtype=dtype or self.dtype, requires_grad=grad)
