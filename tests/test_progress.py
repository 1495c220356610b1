"""`topoprof model`'s progress on stderr (topoprof.progress): on a terminal, the stage and
its clock on one line rewritten in place; nothing where stderr is a file or a pipe; the stages a
worker reports (building, tracing, timing) reach it; `--json` keeps stdout to the document."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time

from tests.helpers.shared_fork_server import own_fork_server
from topoprof.progress import LiveProgress

TIED = os.path.join(os.path.dirname(__file__), "fixtures", "user_models", "tied.py") + ":build"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_stage_and_its_clock_are_redrawn_then_cleared():
    out = _Terminal()
    with LiveProgress(out, delay_s=0.0, tick_s=0.05) as progress:
        progress("tracing x on meta")
        time.sleep(0.3)
    text = out.getvalue()
    assert text.startswith("\r\033[K  [") and "s] tracing x on meta" in text
    assert text.count("tracing x on meta") >= 3  # the clock moves while the stage waits
    assert text.endswith("\r\033[K")             # nothing left on the line for what follows


def test_a_stage_shows_its_own_time_once_it_lasts():
    progress = LiveProgress(io.StringIO(), delay_s=0.0)
    progress("building x on meta")
    assert progress.line(progress.stage_start + 1).endswith("building x on meta")
    assert progress.line(progress.stage_start + 40).endswith("building x on meta (40 s)")
    progress.close()


def test_nothing_is_written_off_a_terminal_or_before_the_delay():
    plain = io.StringIO()
    with LiveProgress(plain, delay_s=0.0) as progress:
        progress("x")
    assert plain.getvalue() == ""
    quick = _Terminal()
    with LiveProgress(quick, delay_s=60.0) as progress:
        progress("x")
    assert quick.getvalue() == ""


def test_the_workers_stages_reach_the_command():
    from topoprof.measure.user_model import measure_user_model
    from topoprof.model.inputs.gather import gather
    from topoprof.model.inputs.request import ClusterRequest, ComputeRequest, ModelRequest, WorkloadRequest

    heard: list[str] = []
    gather(ModelRequest(WorkloadRequest(user_model=TIED), ComputeRequest(gpu="h100-sxm"),
                              ClusterRequest(world_size=1)), heard.append)
    assert heard[0].startswith(f"tracing {TIED} on the meta device for h100-sxm")
    assert f"building {TIED} on meta" in heard
    assert any(h.startswith("tracing the forward and backward of") for h in heard)
    timed: list[str] = []
    measure_user_model(TIED, "cpu", 1, timeout_s=120, progress=timed.append)
    assert f"building {TIED}" in timed and f"warm-up pass of {TIED} on cpu" in timed
    assert any(h.startswith("timed pass 1 done") for h in timed)


def test_model_on_a_terminal_shows_progress_on_stderr_and_only_json_on_stdout():
    import pty

    master, follower = pty.openpty()
    with tempfile.TemporaryFile() as out:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        proc = subprocess.Popen([sys.executable, "-m", "topoprof", "model", "--model", "tied.py:build", "--gpu",
                                 "h100-sxm", "--world-size", "1", "--no-sweep", "--json"], stdout=out, stderr=follower,
                                cwd=os.path.dirname(TIED), env=own_fork_server({**os.environ, "PYTHONPATH": root}))
        os.close(follower)
        err = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end closed: the command has ended
                break
            if not chunk:
                break
            err += chunk
        assert proc.wait(timeout=300) == 0, err[-2000:]
        os.close(master)
        out.seek(0)
        doc = json.loads(out.read())
    assert doc["inputs"]["params"]["value"] > 0
    # the first line is drawn after DELAY_S: by then the command's own stage ("tracing ... on the meta
    # device for h100-sxm", while its worker imports torch) may have given way to the worker's. The
    # command starts its own fork server, as a user's does: one shared by the suite's commands has
    # imported torch already, and its worker's stages may all be over before the first line.
    assert b"\x1b[K" in err and (b"] tracing tied.py:build on the meta device for h100-sxm" in err
                                  or b"] tracing tied.py:build on meta" in err)
    assert b"] building tied.py:build on meta" in err


def test_lines_printed_above_the_progress_line_leave_it_below():
    """bench's rows as they come: the line is cleared before them and drawn again after."""
    out = _Terminal()
    with LiveProgress(out, delay_s=0.0, tick_s=60.0) as progress:
        progress("measuring all_reduce 1K ...")
        progress.above(lambda: out.write("row\n"))
    text = out.getvalue()
    assert text.index("row\n") > text.index("measuring") and text.rindex("measuring") > text.index("row\n")
