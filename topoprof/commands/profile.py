"""`topoprof profile`: measure this machine's device (host cost per op, GEMM FLOP/s by shape,
memory-bound bytes/s by kind and size, attention, optimizer) into a device profile file."""
from __future__ import annotations

import os
import re

import click

from topoprof.errors import SavedElsewhere
from topoprof.jsonio import check_writable, check_writable_folder, dumps, write_text
from topoprof.measure.profile import measure_device_profile
from topoprof.model.compute.profile import profile_from_dict, profile_to_json
from topoprof.report.text_profile import render_profile


def default_path(profile) -> str:
    """profile-<device>-<host>-<UTC time>.json in the current folder."""
    host = re.sub(r"[^A-Za-z0-9_.-]+", "_", profile.machine.hostname or "host")
    stamp = re.sub(r"[-:]", "", profile.machine.created_utc or "unknown")
    return f"profile-{profile.machine.kind}-{host}-{stamp}.json"


@click.command()
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default=None,
              help="The device to profile. Default: cuda when torch sees a GPU, else cpu.")
@click.option("--quick", is_flag=True, help="Fewer points: about 15 s on a GPU instead of under a minute.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              help="Write the profile here. Default: profile-<device>-<host>-<UTC time>.json in this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile's JSON instead of the summary.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds the measuring process may go without reporting before it is stopped.")
def profile(device, quick, out_path, as_json, timeout_s):
    """Measure this machine's GPU (or CPU) for the what-if compute model: host cost per op, GEMM
    FLOP/s over a grid of shapes, memory-bound bytes/s by kind and size, SDPA forward + backward
    FLOP/s, the optimizer's bytes/s. Writes a versioned JSON profile and prints a summary."""
    if out_path:
        check_writable(out_path, "--out")
    else:
        check_writable_folder(os.getcwd(), "the current folder (for the profile; or give --out)")
    doc = measure_device_profile(device, quick, timeout_s,
                                 on_progress=lambda line: click.echo(f"  {line}", err=True))
    measured = profile_from_dict(doc, "the profile worker's document")
    text = dumps(profile_to_json(measured)) + "\n"
    path = out_path or default_path(measured)
    moved = write_text(path, text, "--out")
    if as_json:
        click.echo(text, nl=False)
    else:
        click.echo(render_profile(measured))
    if moved:
        if moved.written_to is None and not as_json:
            click.echo(text, nl=False)
        raise SavedElsewhere(moved.message())
    click.echo(f"wrote {path}", err=as_json)
