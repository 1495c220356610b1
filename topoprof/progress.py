"""What a long command is doing, on stderr: its stage (what it waits for), the time since the
command began and, after a few seconds, since the stage began, on one line rewritten in place
every half second, so that a worker that imports torch, builds a model or hangs in it shows its
clock moving. The one progress reporter of every command: model, scan, bench and validate.

Only when stderr is a terminal: where stderr is a file
or a pipe (a log, a test, the documented examples), what a command prints must not depend on how
fast the machine ran it, and a hang still ends at the worker's timeout with the stage it was in.
A command that ends within `DELAY_S` prints nothing.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import Callable

DELAY_S = 1.0   # nothing shown before this: a quick command stays quiet
TICK_S = 0.5    # the clock redrawn this often while a stage waits
STAGE_S = 5.0   # a stage's own time shown once it has lasted this long


class LiveProgress:
    """Call it with a stage's text; `close()` (or leaving a `with` block) clears the line."""

    def __init__(self, stream=None, show: bool | None = None, delay_s: float = DELAY_S, tick_s: float = TICK_S):
        self.stream = stream if stream is not None else sys.stderr
        self.show = self.stream.isatty() if show is None else show
        self.delay_s, self.tick_s = delay_s, tick_s
        self.start = self.stage_start = time.monotonic()
        self._text: str | None = None
        self._drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if self.show:
            self._thread = threading.Thread(target=self._tick, name="topoprof-progress", daemon=True)
            self._thread.start()

    def __call__(self, text: str) -> None:
        with self._lock:
            self._text, self.stage_start = text, time.monotonic()
        self._draw()

    def line(self, now: float) -> str | None:
        """The line as drawn at `now`; None before the delay or the first stage."""
        if self._text is None or now - self.start < self.delay_s:
            return None
        stage = now - self.stage_start
        own = f" ({stage:.0f} s)" if stage >= STAGE_S else ""
        return f"  [{now - self.start:5.1f}s] {self._text}{own}"

    def above(self, write: Callable[[], None]) -> None:
        """Run `write`, which prints lines of the command's own, with the progress line cleared
        first and drawn again below them (bench's rows as they come)."""
        with self._lock:
            if self._drawn:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._drawn = False
            write()
        self._draw()

    def _draw(self) -> None:
        if not self.show:
            return
        with self._lock:
            text = self.line(time.monotonic())
            if text is None:
                return
            width = shutil.get_terminal_size((100, 24)).columns - 1  # a wrapped line cannot be rewritten
            self.stream.write("\r\033[K" + (text if len(text) <= width else text[:max(0, width - 3)] + "..."))
            self.stream.flush()
            self._drawn = True

    def _tick(self) -> None:
        while not self._stop.wait(self.tick_s):
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._drawn:
                self.stream.write("\r\033[K")
                self.stream.flush()
                self._drawn = False

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
