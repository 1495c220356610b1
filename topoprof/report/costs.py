"""A strategy's cost part by part, as the text and report.md show it (the model's JSON:
`ddp_costs` for ddp_synced, `fsdp_costs` for fsdp_full_shard): the share of a step the parts
take, and their rows."""
from __future__ import annotations

from collections.abc import Callable

from topoprof.model.strategies.model_report import ModelReport
from topoprof.model.strategies.results import PartCost


def cost_share(report: ModelReport, costs: dict[str, PartCost], strategy: str, inside_another: tuple[str, ...] = ()
               ) -> tuple[float, float, float] | None:
    """(nominal, low, high) % of a `strategy` step that the parts `costs` take, those inside
    another part left out; None where there are none or no step."""
    chosen = report.result(strategy)
    k = report.value("accumulation_steps")
    if not costs or chosen is None or not chosen.step_time_s:
        return None
    step = chosen.step_time_s
    counted = [c for name, c in costs.items() if name not in inside_another]
    total = sum(c.seconds for c in counted)
    low = sum((c.range_s or (c.seconds, c.seconds))[0] for c in counted)
    high = sum((c.range_s or (c.seconds, c.seconds))[1] for c in counted)
    steps = chosen.range.step_time_s if chosen.range is not None else (step, step)
    # each part's low end and the step's low end come from the same end of the what-if (its fast
    # one), and so do the high ends; the share can still be larger at either
    shares = (100 * k * low / steps[0], 100 * k * high / steps[1])
    return 100 * k * total / step, min(shares), max(shares)


def share_span(low: float, high: float, dash: str = "-") -> str:
    """' (range low-high %)', or nothing where both ends print alike."""
    return "" if f"{low:.1f}" == f"{high:.1f}" else f" (range {low:.1f}{dash}{high:.1f} %)"


def part_rows(costs: dict[str, PartCost], ms: Callable[[float], str], span: Callable[[tuple[float, float]], str],
              none: str = "-") -> list[tuple[str, str, str, PartCost]]:
    """(name, ms, range ms or `none`, the part) per part: `ms` formats seconds, `span` a range."""
    return [(name, ms(c.seconds), none if c.range_s is None else span(c.range_s), c)
            for name, c in costs.items()]
