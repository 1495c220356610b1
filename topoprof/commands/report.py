"""`topoprof report PATH/report.json`: render the Markdown and charts again from a saved scan."""
from __future__ import annotations

import os

import click

from topoprof.errors import InputError
from topoprof.jsonio import check_writable_folder
from topoprof.report.files import load_report, write_report


@click.command()
@click.argument("report_json", type=click.Path(dir_okay=False))
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write here instead of beside the JSON.")
def report(report_json: str, out_dir: str | None) -> None:
    """Re-render report.md and the PNG charts from a scan's report.json."""
    doc = load_report(report_json)
    target = out_dir or os.path.dirname(os.path.abspath(report_json))
    option = "--out" if out_dir else "the report's folder"
    check_writable_folder(target, option)
    try:
        written = write_report(doc, target)
    except OSError as err:  # nothing is lost: report.json is the source and stays where it was
        raise InputError(f"{option} {target}: cannot write: {err.strerror or err}") from None
    click.echo(f"wrote {', '.join(written.values())} in {target}")
