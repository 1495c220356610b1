"""`topoprof topo`: how the node's GPUs, NICs and CPUs are wired, and what each link should carry."""
from __future__ import annotations

import click

from topoprof.errors import NothingMeasured


def collect_topology(from_file: str | None = None, use_nvml: bool = True):
    """Gather the sources and build a Topology.

    With `from_file`, the saved `nvidia-smi topo -m` text is the only source: it usually comes
    from another machine, so this machine's NVML and host facts would be wrong beside it.
    """
    from probes import nvidia_smi
    from topoprof.topology import build_topology

    if from_file is not None:
        return build_topology(smi=nvidia_smi.read_topo_file(from_file))
    notes: list[str] = []
    smi = nvml = None
    try:
        smi = nvidia_smi.parse_topo_matrix(nvidia_smi.run_topo_matrix(), source="nvidia-smi topo -m")
    except NothingMeasured as err:
        notes.append(f"nvidia-smi: {err}")
    if use_nvml:
        from probes import nvml as nvml_probe

        try:
            nvml = nvml_probe.query_nvml()
        except NothingMeasured as err:
            notes.append(f"NVML: {err}")
    from probes.host import query_host

    return build_topology(smi=smi, nvml=nvml, host=query_host(), notes=tuple(notes))


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
        from topoprof.jsonio import dumps, envelope

        click.echo(dumps(envelope("topology", {"topology": topology})))
        return
    from topoprof.render_topology import render_topology

    click.echo(render_topology(topology))
