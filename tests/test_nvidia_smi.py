"""Tests for topoprof.probes.hardware.nvidia_smi against real `nvidia-smi topo -m` outputs in tests/fixtures/topo."""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import glued_fixtures
from tests.helpers.terminal import glued_copy, terminal_copy
from topoprof.errors import InputError, NothingMeasured, ParseError, TopoprofError
from topoprof.probes.hardware.nvidia_smi import (
    PATH_KINDS,
    PathCode,
    SmiTopology,
    parse_topo_matrix,
    read_topo_file,
    run_topo_matrix,
)

TOPO_DIR = Path(__file__).parent / "fixtures" / "topo"
FIXTURES = sorted(
    p.name for p in TOPO_DIR.glob("*.txt") if not p.name.endswith(".nccl-tests.txt")
)
GLUED = {glued.name for glued in glued_fixtures.GLUED}  # derived: glued terminal copies (34-36)


def load_fixture(name: str) -> tuple[str, list[str]]:
    """Return (output as published, header lines): everything up to `# ---` is the header."""
    lines = (TOPO_DIR / name).read_text(encoding="utf-8").split("\n")
    end = lines.index("# ---")
    return "\n".join(lines[end + 1:]), lines[:end + 1]


def readme_counts() -> dict[str, tuple[int, int]]:
    """File -> (GPU count, NIC count) from the table in tests/fixtures/topo/README.md."""
    counts = {}
    for line in (TOPO_DIR / "README.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `([^`]+\.txt)` \| (\d+) \|[^|]*\|[^|]*\| (yes \((\d+)\)|no) \|", line)
        if match:
            counts[match.group(1)] = (int(match.group(2)), int(match.group(4) or 0))
    return counts


def parse_fixture(name: str) -> SmiTopology:
    return parse_topo_matrix(load_fixture(name)[0], name)


def p(code: str) -> PathCode:
    return PathCode.parse(code)


# --- PathCode -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, links", [
    ("X", "X", 0), (" X ", "X", 0), ("NV1", "NV", 1), ("NV18", "NV", 18), ("PIX", "PIX", 0),
    ("PXB", "PXB", 0), ("PHB", "PHB", 0), ("NODE", "NODE", 0), ("SYS", "SYS", 0), ("SOC", "SYS", 0),
])
def test_path_code_parse(text, kind, links):
    code = PathCode.parse(text)
    assert (code.kind, code.nvlinks) == (kind, links)
    assert str(code) == ("SYS" if text == "SOC" else text.strip())


@pytest.mark.parametrize("text", ["NV", "NV0", "NVX", "nv4", "OK", "", "PIX2", "NV12345"])
def test_path_code_rejects_unknown(text):
    with pytest.raises(ValueError):
        PathCode.parse(text)


def test_path_code_rank_follows_path_kinds():
    assert [PathCode.parse(c).rank for c in ("X", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS")] == list(
        range(len(PATH_KINDS)))


# --- every real fixture -----------------------------------------------------------------------


def test_every_fixture_is_in_readme():
    assert set(FIXTURES) == set(readme_counts())


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_counts_match_readme(name):
    topo = parse_fixture(name)
    assert (len(topo.gpus), len(topo.nics)) == readme_counts()[name]
    assert [g.index for g in topo.gpus] == list(range(len(topo.gpus)))
    assert [n.index for n in topo.nics] == list(range(len(topo.nics)))


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_matrix_square_symmetric_with_x_diagonal(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an asymmetry warning fails the test
        topo = parse_fixture(name)
    size = len(topo.gpus) + len(topo.nics)
    assert len(topo.matrix) == size and all(len(row) == size for row in topo.matrix)
    for i in range(size):
        for j in range(size):
            assert topo.matrix[i][j] == topo.matrix[j][i]
            assert (topo.matrix[i][j].kind == "X") == (i == j)


@pytest.mark.parametrize("name", FIXTURES)
def test_read_topo_file_skips_fixture_header(name):
    # The `# ` lines before the output act as a preamble; the table is found after them.
    topo = read_topo_file(str(TOPO_DIR / name))
    assert topo.source == str(TOPO_DIR / name)
    assert topo.matrix == parse_fixture(name).matrix
    assert topo.gpus == parse_fixture(name).gpus


def test_01_dgx1_raw_mlx5_columns():
    topo = parse_fixture("01_dgx1-v100-8x-nv1nv2-4mlx5-oldfmt.txt")
    assert topo.gpu_path(0, 1) == p("NV1")
    assert topo.gpu_path(0, 3) == p("NV2")
    assert topo.gpu_path(0, 4) == p("NV2")  # DGX-1 hybrid cube-mesh: GPU0 links to GPU1-4
    assert topo.gpu_path(0, 5) == p("SYS")
    assert topo.gpu_path(2, 2) == p("X")
    assert [n.label for n in topo.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    assert [n.device for n in topo.nics] == ["mlx5_0", "mlx5_2", "mlx5_1", "mlx5_3"]
    assert topo.gpu_nic_path(0, 0) == p("PIX")
    assert topo.gpu_nic_path(0, 2) == p("PHB")
    assert topo.gpu_nic_path(4, 1) == p("PIX")
    gpu0 = topo.gpus[0]
    assert gpu0.cpu_affinity_text == "0-19,40-59"
    assert gpu0.cpu_affinity == tuple(range(20)) + tuple(range(40, 60))
    assert gpu0.numa_affinity is None and gpu0.gpu_numa_id is None
    assert topo.gpus[7].cpu_affinity == tuple(range(20, 40)) + tuple(range(60, 80))


def test_03_nic_legend_and_gpu_numa_id():
    topo = parse_fixture("03_v100-sxm2-8x-nv1nv2-nic0-gpunumaid.txt")
    assert [(n.label, n.device) for n in topo.nics] == [("NIC0", "mlx5_2")]
    assert topo.gpu_nic_path(0, 0) == p("NODE")
    assert topo.gpu_nic_path(4, 0) == p("SYS")
    assert topo.gpu_path(0, 3) == p("NV2")
    assert [g.numa_affinity for g in topo.gpus] == [(0,)] * 4 + [(1,)] * 4
    assert all(g.gpu_numa_id is None for g in topo.gpus)


def test_05_power9_nv3_numa_8():
    topo = parse_fixture("05_power9-traverse-v100-4x-nv3-4mlx5-numa8.txt")
    assert topo.gpu_path(0, 1) == p("NV3")
    assert topo.gpu_path(0, 2) == p("SYS")
    assert [g.numa_affinity for g in topo.gpus] == [(0,), (0,), (8,), (8,)]
    assert topo.gpus[2].cpu_affinity == tuple(range(64, 128))
    assert topo.gpu_nic_path(2, 2) == p("NODE")


def test_07_dgx_a100_twelve_raw_nics():
    topo = parse_fixture("07_dgx-a100-8x-nv12-12mlx5-rawnames.txt")
    assert all(topo.gpu_path(a, b) == p("NV12") for a in range(8) for b in range(8) if a != b)
    assert [n.label for n in topo.nics][-2:] == ["mlx5_10", "mlx5_11"]
    assert topo.gpu_nic_path(0, 0) == p("PXB")
    assert topo.gpu_nic_path(6, 8) == p("PXB")
    assert topo.gpu_nic_path(0, 11) == p("SYS")
    assert [g.numa_affinity for g in topo.gpus] == [(3,), (3,), (1,), (1,), (7,), (7,), (5,), (5,)]


def test_10_aws_space_aligned_gpu_numa_id():
    topo = parse_fixture("10_aws-p4d-24xlarge-a100-8x-nv12.txt")
    assert topo.gpu_path(3, 6) == p("NV12")
    assert topo.gpus[0].cpu_affinity == tuple(range(24)) + tuple(range(48, 72))
    assert [g.numa_affinity for g in topo.gpus] == [(0,)] * 4 + [(1,)] * 4
    assert topo.gpus[0].gpu_numa_id is None


def test_11_all_node():
    topo = parse_fixture("11_aws-g6e-12xlarge-l40s-4x-node.txt")
    assert all(topo.gpu_path(a, b) == p("NODE") for a in range(4) for b in range(4) if a != b)
    assert topo.gpus[3].cpu_affinity == tuple(range(48))
    assert topo.gpus[3].numa_affinity == (0,)


def test_13_numa_out_of_order():
    topo = parse_fixture("13_hgx-a100-4x-nv4-2mlx5-numa-1032.txt")
    assert [g.numa_affinity for g in topo.gpus] == [(1,), (0,), (3,), (2,)]
    assert topo.gpu_path(0, 3) == p("NV4")
    assert topo.gpu_nic_path(1, 0) == p("PIX")
    assert topo.gpu_nic_path(2, 1) == p("PIX")
    assert topo.gpu_nic_path(0, 0) == p("SYS")


def test_15_blank_affinity_space_aligned():
    topo = parse_fixture("15_2gpu-nv12-8nic-blank-affinity-vllm.txt")
    assert topo.gpu_path(0, 1) == p("NV12")
    assert topo.gpu_nic_path(0, 6) == p("PXB")
    assert topo.gpu_nic_path(1, 0) == p("SYS")
    for gpu in topo.gpus:
        assert gpu.cpu_affinity is None and gpu.cpu_affinity_text is None
        assert gpu.numa_affinity is None and gpu.gpu_numa_id is None
    assert [n.device for n in topo.nics] == [f"NIC{i}" for i in range(8)]  # no legend captured


def test_18_h100_blank_cpu_affinity():
    topo = parse_fixture("18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt")
    assert all(topo.gpu_path(a, b) == p("NV18") for a in range(8) for b in range(8) if a != b)
    for gpu in topo.gpus[:4]:
        assert gpu.cpu_affinity is None and gpu.cpu_affinity_text is None
        assert gpu.numa_affinity == (0,)
    for gpu in topo.gpus[4:]:
        assert gpu.cpu_affinity == (1,) and gpu.numa_affinity == (1,)
    assert [n.device for n in topo.nics] == [f"mlx5_{i}" for i in range(6)]
    assert topo.gpu_nic_path(0, 0) == p("PIX")
    assert topo.gpu_nic_path(3, 2) == p("PIX")
    assert topo.gpu_nic_path(1, 0) == p("NODE")


def test_20_all_sys():
    topo = parse_fixture("20_rtx4090-8x-sys-2nic-gpunumaid.txt")
    assert all(topo.gpu_path(a, b) == p("SYS") for a in range(8) for b in range(8) if a != b)
    assert topo.gpu_nic_path(6, 0) == p("PHB")
    assert topo.gpu_nic_path(0, 1) == p("SYS")
    assert topo.gpus[4].cpu_affinity_text == "56-111,168-223"
    assert topo.gpus[4].numa_affinity == (1,)


def test_22_pix():
    topo = parse_fixture("22_rtx2080ti-2x-pix-autodl.txt")
    assert topo.gpu_path(0, 1) == p("PIX") and topo.gpu_path(1, 0) == p("PIX")
    assert topo.gpus[1].numa_affinity == (1,)
    assert topo.nics == ()


def test_24_phb():
    topo = parse_fixture("24_rtx5090-2x-phb-threadripper.txt")
    assert topo.gpu_path(0, 1) == p("PHB")
    assert topo.gpus[0].cpu_affinity == tuple(range(64))


def test_26_no_numa_column():
    topo = parse_fixture("26_tesla-t4-4x-sys-node-no-numa-col.txt")
    assert topo.gpu_path(0, 1) == p("SYS")
    assert topo.gpu_path(1, 2) == p("NODE")
    assert all(g.numa_affinity is None and g.gpu_numa_id is None for g in topo.gpus)
    assert topo.gpus[1].cpu_affinity_text == "16-31,48-63"


def test_28_h100_raw_driver_bytes_with_ansi_underline():
    # The bytes driver 580 wrote to a file: ESC[4m ... ESC[0m around the header, one GPU.
    text = load_fixture("28_h100-1x-vm-driver580-ansi-raw.txt")[0]
    assert "\x1b[4m" in text
    topo = parse_topo_matrix(text, "28")
    assert [g.label for g in topo.gpus] == ["GPU0"] and topo.nics == ()
    assert topo.matrix == ((p("X"),),)
    gpu = topo.gpus[0]
    assert (gpu.cpu_affinity, gpu.numa_affinity, gpu.gpu_numa_id) == (tuple(range(16)), (0,), None)
    assert topo.notes == ()


@pytest.mark.parametrize("name", ["30_h100-sxm-8x-nv18-6nic-wrapped80-tmux.txt",
                                  "31_h100-sxm-8x-nv18-6nic-joined80-tmux.txt"])
def test_30_31_terminal_copies_read_as_the_original(name):
    original = parse_fixture("18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt")
    copied = parse_fixture(name)
    assert (copied.matrix, copied.gpus, copied.nics) == (original.matrix, original.gpus, original.nics)


def test_30_says_the_table_was_rejoined():
    topo = parse_fixture("30_h100-sxm-8x-nv18-6nic-wrapped80-tmux.txt")
    assert topo.notes == ("30_h100-sxm-8x-nv18-6nic-wrapped80-tmux.txt:1: the table was wrapped at 80 columns"
                          " (a terminal copy); its lines were joined back",)


def test_glued_fixtures_are_what_their_script_makes():
    assert glued_fixtures.main(["--check"]) == 0
    assert GLUED <= set(FIXTURES)


def test_34_glued_at_80_reads_as_the_transcript_should():
    # The transcript of issue #21 in form: "CPU Affi<173 blanks>nity", "0-23,48-<173 blanks>71".
    name = "34_a100-8x-nv12-glued80-transcript.txt"
    text = load_fixture(name)[0]
    assert "CPU Affi" + " " * 173 + "nity    NUMA Affinity" in text
    topo = parse_fixture(name)
    assert all(topo.gpu_path(a, b) == p("NV12") for a in range(8) for b in range(8) if a != b)
    low, high = tuple(range(24)) + tuple(range(48, 72)), tuple(range(24, 48)) + tuple(range(72, 96))
    assert [(g.cpu_affinity_text, g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) for g in topo.gpus] == (
        [("0-23,48-71", low, (0,), None)] * 4 + [("24-47,72-95", high, (1,), None)] * 4)
    assert topo.nics == ()
    assert topo.notes == (f"{name}:1: 9 line(s) of the table were wrapped at 80 columns with the rest put on the"
                          " same line after 173 blanks (a terminal copy); they were joined back",)


def test_35_glued_at_100_every_rest_starting_with_blanks():
    name = "35_rtx4090-8x-sys-2nic-glued100-transcript.txt"
    topo = parse_fixture(name)
    assert all(topo.gpu_path(a, b) == p("SYS") for a in range(8) for b in range(8) if a != b)
    assert ([str(topo.gpu_nic_path(g, n)) for g in range(8) for n in range(2)]
            == ["SYS"] * 12 + ["PHB"] * 2 + ["SYS"] * 2)
    assert str(topo.matrix[8][9]) == "PIX"  # NIC0 - NIC1
    low, high = tuple(range(56)) + tuple(range(112, 168)), tuple(range(56, 112)) + tuple(range(168, 224))
    assert [(g.cpu_affinity_text, g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) for g in topo.gpus] == (
        [("0-55,112-167", low, (0,), None)] * 4 + [("56-111,168-223", high, (1,), None)] * 4)
    assert [n.label for n in topo.nics] == ["NIC0", "NIC1"]
    assert "wrapped at 100 columns with the rest put on the same line after 153 blanks" in topo.notes[0]


def test_36_glued_at_132_inside_an_empty_field():
    name = "36_h100-sxm-8x-nv18-6nic-glued132-transcript.txt"
    topo = parse_fixture(name)
    assert all(topo.gpu_path(a, b) == p("NV18") for a in range(8) for b in range(8) if a != b)
    assert [[str(topo.gpu_nic_path(g, n)) for n in range(6)] for g in (0, 3, 4, 6)] == [
        ["PIX", "PIX", "NODE", "NODE", "NODE", "NODE"], ["NODE", "NODE", "PIX", "NODE", "NODE", "NODE"],
        ["NODE", "NODE", "NODE", "PIX", "PIX", "NODE"], ["NODE", "NODE", "NODE", "NODE", "NODE", "PIX"]]
    assert [(g.cpu_affinity_text, g.numa_affinity, g.gpu_numa_id) for g in topo.gpus] == (
        [(None, (0,), None)] * 4 + [("1", (1,), None)] * 4)
    assert [n.device for n in topo.nics] == [f"mlx5_{i}" for i in range(6)]
    # Every cut falls on blanks here, so the width is not certain: the note says only what is.
    assert "wrapped by the terminal with the rest put on the same line after 121 blanks" in topo.notes[0]


@pytest.mark.parametrize("glued", glued_fixtures.GLUED, ids=lambda g: g.name[:2])
def test_glued_fixtures_read_as_their_source(glued):
    source, copied = parse_fixture(glued.source), parse_fixture(glued.name)
    assert (copied.matrix, copied.gpus, copied.nics) == (source.matrix, source.gpus, source.nics)
    assert note_texts(copied)[1:] == note_texts(source)


def test_32_escapes_inside_cells():
    colored = parse_fixture("32_v100-sxm2-8x-ansi-in-cells-grep-color.txt")
    plain = parse_fixture("03_v100-sxm2-8x-nv1nv2-nic0-gpunumaid.txt")
    assert (colored.matrix, colored.gpus, colored.nics, colored.notes) == (plain.matrix, plain.gpus, plain.nics, ())


def test_33_affinity_variants_row_by_row():
    name = "33_rtx4090-8x-affinity-variants-edited.txt"
    topo = parse_fixture(name)
    low, high = tuple(range(56)) + tuple(range(112, 168)), tuple(range(56, 112)) + tuple(range(168, 224))
    got = [(g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) for g in topo.gpus]
    assert got == [
        (low, (0,), None),      # an empty field before NUMA Affinity as well as before GPU NUMA ID
        (None, None, None),     # N/A everywhere
        (low, (0,), None),      # one tab stop late
        (None, None, None),     # one field too many: unknown, with a note
        (None, (1,), None),     # a cut CPU list: that field unknown, with a note
        (high, None, None),     # N/A under NUMA Affinity only
        (high, (1,), None),
        (high, (1,), None),
    ]
    assert all(topo.gpu_path(a, b) == p("SYS") for a in range(8) for b in range(8) if a != b)
    assert [n.split(": ", 1)[0] for n in topo.notes] == [f"{name}:5", f"{name}:6"]  # lines of the output
    assert "row GPU3: the fields after the path cells ('0-55,112-167', '0', 'N/A', '0') do not fit" in topo.notes[0]
    assert "row GPU4: cannot read CPU Affinity '56-111,168-'" in topo.notes[1]


def test_doubled_empty_fields_of_a_single_tesla_p4():
    # The field pattern a single Tesla P4 printed (Project-HAMi/HAMi PR #99).
    topo = parse_topo_matrix("\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-7\t\tN/A\t\tN/A\n")
    gpu = topo.gpus[0]
    assert (gpu.cpu_affinity, gpu.numa_affinity, gpu.gpu_numa_id, topo.notes) == (tuple(range(8)), None, None, ())


def test_an_extra_field_on_one_row_only():
    text = load_fixture("22_rtx2080ti-2x-pix-autodl.txt")[0].split("\n")
    row = next(i for i, line in enumerate(text) if line.lstrip().startswith("GPU1"))
    text[row] += "        7"
    topo = parse_topo_matrix("\n".join(text), "t.txt")
    assert topo.gpu_path(0, 1) == p("PIX") and topo.gpus[0] == parse_fixture("22_rtx2080ti-2x-pix-autodl.txt").gpus[0]
    assert topo.gpus[1].numa_affinity is None and "row GPU1" in topo.notes[0]


def test_lookup_of_missing_devices():
    topo = parse_fixture("24_rtx5090-2x-phb-threadripper.txt")
    with pytest.raises(IndexError):
        topo.gpu_path(0, 2)
    with pytest.raises(IndexError):
        topo.gpu_nic_path(0, 0)


# --- the same outputs as people paste them -------------------------------------------------------


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.split("\n"))


VARIANTS = {
    "indented": lambda t: _indent(t),
    "quoted": lambda t: _indent(t, "> "),
    "fenced": lambda t: "Topology:\n```text\n" + t + "\n```\nthanks",
    "fenced-in-list": lambda t: "1. run it:\n\n   ```\n" + _indent(t, "   ") + "\n   ```",
    "prompt": lambda t: "user@node:~$ nvidia-smi topo -m\n" + t,
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "soc": lambda t: re.sub(r"\bSYS\b", "SOC", t),
    "tabs-expanded": lambda t: "\n".join(line.expandtabs(8) for line in t.split("\n")),
    "expanded-indented": lambda t: _indent("\n".join(line.expandtabs(8) for line in t.split("\n"))),
    "trailing-blanks": lambda t: "\n".join(line + "  " for line in t.split("\n")),
    # Colour and underline escapes around every word and at line ends, as a colouring pager or
    # a terminal log keeps them; they take no column on a terminal.
    "ansi-everywhere": lambda t: "\n".join(re.sub(r"(\S+)", "\x1b[1;32m\\1\x1b[0m", line) + "\x1b[K"
                                           for line in t.split("\n")),
}


def without_notes(topo: SmiTopology) -> SmiTopology:
    return dataclasses.replace(topo, notes=())


def note_texts(topo: SmiTopology) -> list[str]:
    """The notes without their FILE:LINE, which move when a paste adds lines."""
    return [re.sub(r"^[^:]*:\d+: ", "", note) for note in topo.notes]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("name", FIXTURES)
def test_pasted_variants_parse_identically(name, variant):
    text = load_fixture(name)[0]
    original = parse_topo_matrix(text, name)
    pasted = parse_topo_matrix(VARIANTS[variant](text), name)
    assert without_notes(pasted) == without_notes(original)
    assert note_texts(pasted) == note_texts(original)


TERMINALS = {"80": (80, False), "80-joined": (80, True), "120": (120, False), "120-joined": (120, True)}


@pytest.mark.parametrize("terminal", sorted(TERMINALS))
@pytest.mark.parametrize("name", FIXTURES)
def test_terminal_copies_keep_the_matrix_and_never_invent_affinity(name, terminal):
    if name in GLUED and not TERMINALS[terminal][1]:
        pytest.skip("a glued copy hard-wrapped again shows its pad as blank screen lines inside the table")
    # A copy from a terminal narrower than the table, hard-wrapped or joined back (tmux's rules,
    # checked against the real captures 30 and 31). The path matrix must come out the same; an
    # affinity field the wrap made ambiguous may become unknown, with a note, never wrong.
    text = load_fixture(name)[0].replace("\x1b", "")  # a terminal shows escapes, it does not print them
    original = parse_topo_matrix(load_fixture(name)[0], name)
    width, join = TERMINALS[terminal]
    copied = parse_topo_matrix(terminal_copy(re.sub(r"\[[0-9;]*[mK]", "", text), width, join), name)
    assert copied.matrix == original.matrix and copied.nics == original.nics
    for before, after in zip(original.gpus, copied.gpus):
        if after != before:
            assert (after.cpu_affinity, after.numa_affinity, after.gpu_numa_id) == (None, None, None), after
            assert any(f"row {after.label}:" in note for note in copied.notes), copied.notes


GLUE_WIDTHS = (80, 97, 100, 132)  # 97, 100 and 132 are no multiples of a tab's 8 columns


@pytest.mark.parametrize("far", ["253", "near"])
@pytest.mark.parametrize("width", GLUE_WIDTHS)
@pytest.mark.parametrize("name", [name for name in FIXTURES if name not in GLUED])
def test_glued_copies_read_as_the_original(name, width, far):
    # A terminal that cuts each longer line at its width and puts the rest on the same line far
    # to the right (issue #21): paths, affinities and notes come out as from the original.
    text = re.sub(r"\x1b\[[0-9;]*[mK]", "", load_fixture(name)[0])  # a terminal shows escapes
    original = parse_topo_matrix(text, name)
    copied = parse_topo_matrix(glued_copy(text, width, 253 if far == "253" else width + 40), name)
    assert (copied.matrix, copied.gpus, copied.nics) == (original.matrix, original.gpus, original.nics)
    glue_notes = [n for n in note_texts(copied) if "with the rest put on the same line" in n]
    assert [n for n in note_texts(copied) if n not in glue_notes] == note_texts(original)
    cut_rows = [line for line in text.expandtabs(8).split("\n")
                if len(line.rstrip()) > width and re.match(r"\s*(GPU|NIC|mlx5_)[0-9]", line)]
    assert len(glue_notes) == (1 if cut_rows else 0)
    assert all(f"wrapped at {width} columns" in n or "wrapped by the terminal" in n for n in glue_notes)


def test_a_glue_too_narrow_to_see_leaves_affinity_unknown_not_wrong():
    # Rests only a few blanks beyond the cut look like fields; the header no longer reads as the
    # affinity headings, so the matrix is read and the affinity is unknown, with a note.
    name = "10_aws-p4d-24xlarge-a100-8x-nv12.txt"
    text = glued_copy(load_fixture(name)[0], 80, 100)
    topo = parse_topo_matrix(text, "t.txt")
    assert topo.matrix == parse_fixture(name).matrix
    assert all((g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) == (None, None, None) for g in topo.gpus)
    assert topo.notes == ("t.txt:1: the header's words after the device labels ('CPU', 'Affi', 'nity', 'NUMA',"
                          " 'Affinity', 'GPU', 'NUMA', 'ID') are not the headings CPU Affinity, NUMA Affinity,"
                          " GPU NUMA ID; CPU and NUMA affinity are unknown",)


def test_terminal_emulation_reproduces_real_tmux_captures():
    source = load_fixture("18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt")[0]
    hard = load_fixture("30_h100-sxm-8x-nv18-6nic-wrapped80-tmux.txt")[0]
    joined = load_fixture("31_h100-sxm-8x-nv18-6nic-joined80-tmux.txt")[0]

    def lines(text):
        return [line.rstrip() for line in text.rstrip("\n").split("\n")]

    assert lines(terminal_copy(source, 80)) == lines(hard)
    assert lines(terminal_copy(source, 80, join=True)) == lines(joined)


def test_p2p_table_before_the_real_one_is_skipped():
    p2p = "\tGPU0\tGPU1\nGPU0\tX\tOK\nGPU1\tOK\tX\n\nLegend: ...\n\n"
    text = load_fixture("24_rtx5090-2x-phb-threadripper.txt")[0]
    assert parse_topo_matrix(p2p + text).gpu_path(0, 1) == p("PHB")


def test_single_space_separated_table():
    text = "GPU0 GPU1 CPU Affinity NUMA Affinity\nGPU0 X NV2 0-7 0\nGPU1 NV2 X 8-15 1\n"
    topo = parse_topo_matrix(text)
    assert topo.gpu_path(1, 0) == p("NV2")
    assert [g.numa_affinity for g in topo.gpus] == [(0,), (1,)]
    assert topo.gpus[1].cpu_affinity == tuple(range(8, 16))


def _columns(*cells: tuple[int, str]) -> str:
    """A line with each text placed at the given column."""
    line = ""
    for column, text in cells:
        line = line.ljust(column) + text
    return line


def test_hand_aligned_table_off_tab_stops():
    # Re-aligned by hand: words are off the 8-column tab stops, the data rows are indented
    # differently from the header, and a `topo -p2p` table follows.
    text = "\n".join([
        _columns((9, "GPU0"), (14, "GPU1"), (21, "CPU Affinity"), (36, "NUMA Affinity"), (52, "GPU NUMA ID")),
        _columns((2, "GPU0"), (9, "X"), (14, "PHB"), (21, "0-7"), (36, "0"), (52, "N/A")),
        _columns((2, "GPU1"), (9, "PHB"), (14, "X"), (21, "8-15"), (36, "1"), (52, "N/A")),
        "",
        _columns((9, "GPU0"), (14, "GPU1")),
        _columns((2, "GPU0"), (9, "X"), (14, "NS")),
    ])
    topo = parse_topo_matrix(text)
    assert topo.gpu_path(0, 1) == p("PHB")
    assert [(g.cpu_affinity_text, g.numa_affinity) for g in topo.gpus] == [("0-7", (0,)), ("8-15", (1,))]


def test_hand_aligned_blank_field_goes_to_nearest_heading():
    text = "\n".join([
        _columns((7, "GPU0"), (14, "GPU1"), (21, "CPU Affinity"), (37, "NUMA Affinity")),
        _columns((0, "GPU0"), (7, "X"), (14, "NV2"), (37, "0")),
        _columns((0, "GPU1"), (7, "NV2"), (14, "X"), (21, "8-15"), (37, "1")),
    ])
    topo = parse_topo_matrix(text)
    assert topo.gpus[0].cpu_affinity is None and topo.gpus[0].numa_affinity == (0,)
    assert topo.gpus[1].cpu_affinity == tuple(range(8, 16)) and topo.gpus[1].numa_affinity == (1,)


def test_asymmetric_matrix_warns():
    text = "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV2\t X \n"
    with pytest.warns(UserWarning, match=r"<text>:3: GPU1->GPU0 is NV2 but GPU0->GPU1 is NV1"):
        parse_topo_matrix(text)


# --- refusals -----------------------------------------------------------------------------------


def _error(text: str, source: str = "topo.txt") -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_topo_matrix(text, source)
    return info.value


@pytest.mark.parametrize("text", ["", "\n\n", "Legend:\n  X = Self\n", "GPU 0: NVIDIA H100 (UUID: GPU-1)"])
def test_no_table(text):
    err = _error(text)
    assert err.line is None and "no `nvidia-smi topo -m` table found" in str(err)
    assert str(err).startswith("topo.txt: ")


def test_truncated_table_names_the_missing_row():
    lines = load_fixture("24_rtx5090-2x-phb-threadripper.txt")[0].split("\n")
    del lines[2]  # the GPU1 row; a blank line follows in its place
    err = _error("$ nvidia-smi topo -m\n" + "\n".join(lines))
    assert err.line == 4
    assert "table ends after 1 of 2 rows: expected the row for GPU1" in str(err)
    assert str(err).startswith("topo.txt:4: ")


@pytest.mark.parametrize("ending", ["", "\n", "\n\n  \n"])
def test_truncated_at_end_of_input(ending):
    text = "\n".join(load_fixture("22_rtx2080ti-2x-pix-autodl.txt")[0].split("\n")[:2]) + ending
    err = _error(text)
    assert err.line == 3
    assert err.detail == "table ends after 1 of 2 rows: expected the row for GPU1, the input ends"


def test_unknown_code_is_quoted():
    lines = load_fixture("01_dgx1-v100-8x-nv1nv2-4mlx5-oldfmt.txt")[0].split("\n")
    lines[3] = lines[3].replace("NV2", "NVX", 1)  # GPU2 row
    err = _error("\n".join(lines))
    assert err.line == 4
    assert "row GPU2: unknown path code 'NVX'" in err.detail


def test_row_missing_a_cell():
    lines = load_fixture("13_hgx-a100-4x-nv4-2mlx5-numa-1032.txt")[0].split("\n")
    lines[4] = lines[4].replace("\tSYS", "", 1)  # GPU3 row loses one cell
    err = _error("\n".join(lines))
    assert err.line == 5
    assert err.detail == "row GPU3: expected 6 path cells, got 5"


def test_row_with_an_extra_cell():
    text = "\tGPU0\tGPU1\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \n"
    assert _error(text).detail == "row GPU0: expected 2 path cells, got 3"


def test_line_numbers_count_the_preamble_in_the_user_file(tmp_path):
    header, body = "# saved from node17\n\n", load_fixture("10_aws-p4d-24xlarge-a100-8x-nv12.txt")[0]
    body = body.replace("GPU4    NV12", "GPU4    NV1X", 1)
    path = tmp_path / "topo.txt"
    path.write_text(header + body)
    with pytest.raises(ParseError) as info:
        read_topo_file(str(path))
    assert str(info.value).startswith(f"{path}:8: row GPU4: unknown path code 'NV1X'")


@pytest.mark.parametrize("text, line, message", [
    ("\tGPU0\tGPU1\nGPU0\tPIX\tPIX\nGPU1\tPIX\t X \n", 2, "row GPU0: the cell for itself must be X, got PIX"),
    ("\tGPU0\tGPU1\nGPU0\t X \tX\nGPU1\tPIX\t X \n", 2, "row GPU0: the cell for GPU1 is X"),
    ("\tGPU0\tGPU0\nGPU0\t X \tPIX\nGPU0\tPIX\t X \n", 1, "column GPU0 appears twice in the header"),
    ("\tGPU0\tmlx5_0\tGPU1\n", 1, "column GPU1 comes after NIC columns"),
    ("\tGPU0\tGPU1\nGPU1\tPIX\t X \nGPU0\t X \tPIX\n", 2, "expected the row for GPU0, found 'GPU1'"),
])
def test_malformed_tables(text, line, message):
    err = _error(text)
    assert err.line == line and message in err.detail


@pytest.mark.parametrize("text, message", [
    ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3,9-x\n",
     "row GPU0: cannot read CPU Affinity '0-3,9-x' ('9-x' is not a number or a range)"),
    ("\tGPU0\tCPU Affinity\nGPU0\t X \t5-2\n", "'5-2' is not a plausible range"),
    ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-999999\n", "'0-999999' is not a plausible range"),
    ("\tGPU0\tCPU Affinity\nGPU0\t X \t0-3\t4-7\n", "do not fit the header columns (CPU Affinity)"),
    ("\tGPU0\tGPU NUMA ID\nGPU0\t X \t0-1\n", "'0-1' is not one NUMA node"),
])
def test_unreadable_affinity_is_unknown_with_a_note(text, message):
    # The path matrix is what matters: an affinity field that cannot be read does not refuse the file.
    topo = parse_topo_matrix(text, "topo.txt")
    assert topo.gpu_path(0, 0) == p("X")
    gpu = topo.gpus[0]
    assert (gpu.cpu_affinity, gpu.numa_affinity, gpu.gpu_numa_id) == (None, None, None)
    assert len(topo.notes) == 1 and topo.notes[0].startswith("topo.txt:2: ") and message in topo.notes[0]


@pytest.mark.parametrize("heading", ["CPU Affinity\tFoo", "CPU Affinity\tCPU Affinity", "CPU\tAffi"])
def test_unreadable_headings_leave_the_matrix_read_and_affinity_unknown(heading):
    text = f"\tGPU0\tGPU1\t{heading}\nGPU0\t X \tPIX\t0-7\t1\nGPU1\tPIX\t X \t8-15\t2\n"
    topo = parse_topo_matrix(text, "topo.txt")
    assert topo.gpu_path(0, 1) == p("PIX")
    assert all((g.cpu_affinity, g.numa_affinity, g.gpu_numa_id) == (None, None, None) for g in topo.gpus)
    words = ", ".join(repr(w) for w in heading.split())
    assert topo.notes == (f"topo.txt:1: the header's words after the device labels ({words}) are not the headings"
                          " CPU Affinity, NUMA Affinity, GPU NUMA ID; CPU and NUMA affinity are unknown",)


def test_text_folded_at_80_characters_reads_the_same():
    # `fold -w 80` (or an editor's hard wrap) cuts the tab-expanded text every 80 characters.
    text = load_fixture("07_dgx-a100-8x-nv12-12mlx5-rawnames.txt")[0].expandtabs(8)
    folded = "\n".join(line[i:i + 80] for line in text.split("\n") for i in range(0, max(len(line), 1), 80))
    assert without_notes(parse_topo_matrix(folded)) == without_notes(parse_topo_matrix(text))


def test_read_topo_file_errors(tmp_path):
    with pytest.raises(InputError, match=r"missing\.txt: cannot read: No such file"):
        read_topo_file(str(tmp_path / "missing.txt"))
    with pytest.raises(InputError, match=r": cannot read: Is a directory"):
        read_topo_file(str(tmp_path))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"GPU0 \x80\x81")
    with pytest.raises(InputError, match=r"bad\.txt: cannot read: not UTF-8 text"):
        read_topo_file(str(bad))


def test_read_topo_file_utf16_and_bom(tmp_path):
    text = load_fixture("22_rtx2080ti-2x-pix-autodl.txt")[0]
    for encoding in ("utf-16", "utf-8-sig"):
        path = tmp_path / f"topo-{encoding}.txt"
        path.write_bytes(text.encode(encoding))
        assert read_topo_file(str(path)).gpu_path(0, 1) == p("PIX")


# --- robustness: random and mutated inputs ----------------------------------------------------------


def _check_outcome(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            topo = parse_topo_matrix(text, "fuzz.txt")
        except ParseError as err:
            assert str(err).startswith("fuzz.txt")
            return
    size = len(topo.gpus) + len(topo.nics)
    assert size > 0 and len(topo.matrix) == size
    assert all(len(row) == size for row in topo.matrix)
    assert all(topo.matrix[i][i].kind == "X" for i in range(size))
    assert all(note.startswith("fuzz.txt:") for note in topo.notes)


FIXTURE_TEXTS = [load_fixture(name)[0] for name in FIXTURES]
TOKENS = ["X", " X ", "NV12", "NVX", "SOC", "SYS", "PIX", "N/A", "GPU0", "GPU1", "NIC0", "mlx5_0",
          "0-23,48-71", "CPU Affinity", "\t", "\t\t", "  ", "", "NIC0: mlx5_3", "```", "99999999-0",
          "\x1b[4m", "\x1b[0m", "\x1b[01;31m\x1b[K", "\x1b]0;title\x07", "\x1b", "GPU NUMA ID"]


@st.composite
def mutated_fixture(draw):
    lines = draw(st.sampled_from(FIXTURE_TEXTS)).split("\n")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "cut", "insert", "token", "shift", "wrap"]))
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if op == "delete" and len(lines) > 1:
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "cut" and line:
            k = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:k] + line[k + draw(st.integers(1, 8)):]
        elif op == "insert":
            k = draw(st.integers(0, len(line)))
            lines[i] = line[:k] + draw(st.sampled_from(TOKENS + ["\n", "\r", " "]) | st.text(max_size=4)) + line[k:]
        elif op == "token":
            words = re.split(r"(\s+)", line)
            k = draw(st.integers(0, len(words) - 1))
            words[k] = draw(st.sampled_from(TOKENS))
            lines[i] = "".join(words)
        elif op == "shift" and "\t" in line:  # affinity (or path) columns one tab stop off
            k = draw(st.sampled_from([m.start() for m in re.finditer("\t", line)]))
            lines[i] = line[:k] + draw(st.sampled_from(["\t", ""])) + line[k:]
        elif op == "wrap":  # the whole copy through a terminal of some width, hard or joined
            return terminal_copy("\n".join(lines), draw(st.integers(20, 140)), draw(st.booleans()))
    return "\n".join(lines)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("GPUNICX0123456789 \t\n\r-,/:ANVSYSOCmlx_\x1b[")) | st.characters(),
               max_size=300))
def test_random_text_parses_or_is_refused(text):
    _check_outcome(text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_fixture())
def test_mutated_fixtures_parse_or_are_refused(text):
    _check_outcome(text)


# --- running nvidia-smi ------------------------------------------------------------------------------


def _fake_smi(tmp_path: Path, monkeypatch, script: str) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_run_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NothingMeasured, match="nvidia-smi not found on PATH"):
        run_topo_matrix()


def test_run_failing_nvidia_smi_reports_stderr(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "echo 'Failed to initialize NVML: Driver/library version mismatch' >&2\n"
                                     "echo 'second line' >&2\nexit 1\n")
    with pytest.raises(TopoprofError, match=r"\(exit 1\): Failed to initialize NVML: Driver/library version mismatch$"):
        run_topo_matrix()


def test_run_failing_nvidia_smi_reports_stdout_when_stderr_is_empty(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "echo \"NVIDIA-SMI has failed because it couldn't communicate\"\nexit 9\n")
    with pytest.raises(TopoprofError, match=r"\(exit 9\): NVIDIA-SMI has failed"):
        run_topo_matrix()


def test_run_hanging_nvidia_smi_times_out(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "exec sleep 30\n")
    with pytest.raises(TopoprofError, match=r"did not finish within 0.5 s"):
        run_topo_matrix(timeout_s=0.5)


def test_run_returns_output_that_parses(tmp_path, monkeypatch):
    fixture = TOPO_DIR / "18_h100-sxm-8x-nv18-6nic-blank-cpu-affinity.txt"
    _fake_smi(tmp_path, monkeypatch, f"test \"$1 $2\" = 'topo -m' || exit 3\nsed '1,/^# ---$/d' '{fixture}'\n")
    out = run_topo_matrix()
    assert out == load_fixture(fixture.name)[0]
    assert parse_topo_matrix(out, fixture.name) == parse_fixture(fixture.name)


def test_readings_of_a_mangled_row_stay_bounded():
    # Every word at a tab stop's margin and every break open: 3^40 x 2^20 ways to read the row if
    # nothing bounds them (a randomly mangled copy once took minutes and 14 GB here).
    import time

    from topoprof.probes.hardware.smi_text import _MAX_READINGS, tail_readings

    words = [(7 + 16 * k, "ab1") for k in range(40)]
    either = {k: 1 for k in range(0, 40, 2)}
    start = time.monotonic()
    readings = tail_readings(words, 0, either)
    assert len(readings) <= _MAX_READINGS ** 2
    assert time.monotonic() - start < 60  # bounded work; unbounded, this never ends
