"""The `topoprof` command line: the root only registers commands and turns errors into exit codes.

Exit codes: 0 success; 1 nothing could be measured; 2 bad usage or bad input; 3 a run failed
part-way (results measured before the failure are kept). See topoprof/errors.py.
"""
from __future__ import annotations

import sys

import click

from topoprof import __version__
from topoprof.commands import bench, model, profile, report, scan, topo, validate
from topoprof.errors import TopoprofError


class _Root(click.Group):
    """Runs a command; a TopoprofError becomes one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TopoprofError as err:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"topoprof: error: {err}", err=True)
            if err.detail_text:
                click.echo(err.detail_text.rstrip("\n"), err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt:
            click.echo("topoprof: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="topoprof")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """GPU topology and interconnect profiler for multi-GPU PyTorch training."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    main.add_command(topo.topo)
    main.add_command(bench.bench)
    main.add_command(model.model)
    main.add_command(validate.validate)
    main.add_command(scan.scan)
    main.add_command(report.report)
    main.add_command(profile.profile)


_register()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
