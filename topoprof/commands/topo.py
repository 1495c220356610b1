"""`topoprof topo`: how the node's GPUs, NICs and CPUs are wired, and what each link should carry."""
from __future__ import annotations

import click

from topoprof.jsonio import dumps, envelope
from topoprof.topology.collect import collect_topology
from topoprof.topology.render import render_topology


@click.command()
@click.option("--from-file", "from_file", type=click.Path(dir_okay=False),
              help="Read a saved `nvidia-smi topo -m` output instead of probing this machine.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--no-nvml", is_flag=True, help="Do not query NVML (nvidia-smi text and host only).")
def topo(from_file: str | None, as_json: bool, no_nvml: bool) -> None:
    """Show GPU/NIC/CPU wiring and the nominal bandwidth of every GPU pair.

    The same matrix as `nvidia-smi topo -m`, with what each code means in GB/s, the PCIe
    generation and width and NVLink counts from NVML, P2P status, NUMA and NIC rates.
    """
    topology = collect_topology(from_file, use_nvml=not no_nvml)
    if as_json:
        click.echo(dumps(envelope("topology", {"topology": topology})))
        return

    click.echo(render_topology(topology))
