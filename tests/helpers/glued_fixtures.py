"""Make the glued terminal copies in tests/fixtures/topo from the real outputs they derive from.

    python -m tests.helpers.glued_fixtures        # rewrite the fixtures
    python -m tests.helpers.glued_fixtures --check  # exit 1 if a fixture differs from what it makes

A glued copy (issue #21: a shell transcript from an 80-column terminal) cuts every line longer
than the terminal at its width and puts the rest on the same physical line after blanks up to a
far column (253 there); see `tests.helpers.terminal.glued_copy`. Each fixture keeps its source's
facts in its `# ` header and names how it was made.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.terminal import FAR_COLUMN, glued_copy

TOPO_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "topo"


@dataclass(frozen=True)
class Glued:
    name: str
    source: str  # the real output it is made from
    width: int
    described: str  # the machine, for the provenance line
    gpu_model: str
    notes: str  # where the cuts fall: what the fixture tests


GLUED = (
    Glued("34_a100-8x-nv12-glued80-transcript.txt", "10_aws-p4d-24xlarge-a100-8x-nv12.txt", 80,
          "8 x A100 SXM4, AWS p4d.24xlarge, two NUMA nodes", "A100-SXM4-40GB (as fixture 10)",
          'the header is cut inside "CPU Affi|nity" and every GPU row inside its CPU list'
          ' ("0-23,48-|71"), as in the transcript; the legend lines are cut the same way'),
    Glued("35_rtx4090-8x-sys-2nic-glued100-transcript.txt", "20_rtx4090-8x-sys-2nic-gpunumaid.txt", 100,
          "8 x RTX 4090, SYS/PHB/PIX, 2 NICs, two NUMA nodes", "GeForce RTX 4090 (as fixture 20)",
          'a width that is no multiple of 8: the cut falls just after "CPU Affinity" and after each'
          ' GPU row\'s CPU list ("0-55,112-167"), so every rest starts with blanks; NIC rows are'
          ' shorter and not cut'),
    Glued("36_h100-sxm-8x-nv18-6nic-glued132-transcript.txt", "18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt",
          132, "8 x H100 SXM, NV18, 6 NICs, empty CPU affinity on GPU0-3", "NVIDIA H100 SXM (as fixture 18)",
          'a width that is no multiple of 8: the header is cut just after "CPU Affinity", the GPU'
          ' rows inside the blanks of an empty field, so the rest of a row is a lone NUMA or N/A field'),
)


def _output(name: str) -> str:
    lines = (TOPO_DIR / name).read_text(encoding="utf-8").split("\n")
    return "\n".join(lines[lines.index("# ---") + 1:])


def _source_line(prefix: str, name: str) -> str:
    lines = (TOPO_DIR / name).read_text(encoding="utf-8").split("\n")
    return next(line for line in lines if line.startswith(prefix))


def fixture_text(glued: Glued) -> str:
    header = [
        f"# source: derived, not published: the output of fixture {glued.source} ({glued.described})"
        f" as a shell transcript from a {glued.width}-column terminal holds it: tabs expanded, every"
        f" line longer than {glued.width} columns cut at column {glued.width} and the rest put on the"
        f" same physical line from column {FAR_COLUMN} after blanks (the form of the transcript in"
        " issue #21); made by `python -m tests.helpers.glued_fixtures`",
        f"# GPU model: {glued.gpu_model}",
        _source_line("# GPU count:", glued.source),
        f"# driver/CUDA: as fixture {glued.source[:2]}",
        f"# format notes: GLUED AT {glued.width} COLUMNS: {glued.notes}; tabs are spaces",
        "# measured all-reduce: none",
        "# ---",
    ]
    return "\n".join(header) + "\n" + glued_copy(_output(glued.source), glued.width)


def main(argv: list[str]) -> int:
    stale = []
    for glued in GLUED:
        path = TOPO_DIR / glued.name
        text = fixture_text(glued)
        if "--check" in argv:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(glued.name)
        else:
            path.write_text(text, encoding="utf-8")
    for name in stale:
        print(f"{TOPO_DIR / name}: differs from what `python -m tests.helpers.glued_fixtures` makes")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
