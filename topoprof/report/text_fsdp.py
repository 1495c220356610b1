"""FSDP2's lines of the `topoprof model` text: how HSDP's two levels are priced, and where FSDP's
own cost goes per synced micro-batch of `fsdp_full_shard` (its JSON: `fsdp_costs`, `hsdp`)."""
from __future__ import annotations

from topoprof.model.strategies.fsdp_costs import COST_STRATEGY, INSIDE_ANOTHER
from topoprof.model.strategies.model_report import ModelReport
from topoprof.report.costs import cost_share, part_rows, share_span


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def _range_ms(pair: tuple[float, float]) -> str:
    return f"{_ms(pair[0])}-{_ms(pair[1])}"


def hsdp_line(report: ModelReport) -> list[str]:
    """HSDP's levels: the shard group inside a node, the all-reduce across the replicas."""
    h = report.hsdp
    if h is None:
        return []
    if h.shard_bus_bandwidth_gbps is None:  # one GPU per node: nothing sharded, every group replicated
        inside = "one GPU per node, so nothing is sharded inside a node; each group's gradients all-reduced across"
    else:
        inside = (f"all-gathers and reduce-scatters over the {h.shard_gpus} GPUs of a node "
                  f"({h.shard_bus_bandwidth_gbps:g} GB/s ring), then each group's reduced shard all-reduced across")
    return [f"hsdp: {inside} the {h.replicas} nodes, the node's {h.shard_gpus} shard rank(s) at once through its "
            f"NICs ({h.replicate_bus_bandwidth_gbps:g} GB/s per node): {h.all_reduces} all-reduces taking "
            f"{_ms(h.all_reduce_s)} ms alone per synced micro-batch on a stream of their own (all-gathers "
            f"{_ms(h.all_gather_s)} ms, reduce-scatters {_ms(h.reduce_scatter_s)} ms); "
            f"{_ms(h.exposed_s)} ms left exposed"]


def fsdp_cost_share(report: ModelReport) -> tuple[float, float, float] | None:
    """(nominal, low, high) % of an fsdp_full_shard step that FSDP's parts take; None where none."""
    return cost_share(report, report.fsdp_costs, COST_STRATEGY, INSIDE_ANOTHER)


def fsdp_cost_rows(report: ModelReport) -> list[str]:
    """Where FSDP's cost goes, per synced micro-batch of fsdp_full_shard, part by part."""
    share = fsdp_cost_share(report)
    if share is None:
        return []
    fits = report.fitting(COST_STRATEGY) is not None
    out = ["", f"Where FSDP's cost goes in {COST_STRATEGY}, per synced micro-batch (a range where nothing measured "
               "the part)" + ("" if fits else f"; {COST_STRATEGY} does not fit in memory as asked: its parts as priced")
           + ":", f"  {'part':<24}{'ms':>8}  {'range ms':<14}scales with"]
    for name, ms, rng, c in part_rows(report.fsdp_costs, _ms, _range_ms):
        out.append(f"  {name:<24}{ms:>8}  {rng:<14}{c.scales_with}")
    nominal, low, high = share
    span = share_span(low, high)
    inside = ", ".join(INSIDE_ANOTHER)
    out.append(f"  FSDP takes {nominal:.1f} % of an {COST_STRATEGY} step{span}; {inside} runs on the all-gather's "
               "stream and counts inside exposed_comm.")
    return out
