"""Read what NCCL printed with NCCL_DEBUG=INFO: the transport each peer pair really used.

NCCL decides per channel and per peer how data moves (GPU peer-to-peer, host
shared memory, the network) and says so while it sets up a communicator::

    host:1234:1300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read

The wording changed over the releases; all of these are read:

* 2.3/2.4  ``Ring 04 : 3[3] -> 2[2] via P2P/IPC``, ``Ring 00 : 16 -> 32 [receive] via NET/IB/0``
* 2.5-2.8  ``Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA``,
  ``... via direct shared memory`` (later ``SHM/direct/direct``)
* 2.12+    ``Channel 00/0 : ...`` (connection index after the slash), 2.19+ ``P2P/CUMEM/read``,
  net plugins ``NET/IBext_v8/5(2)/GDRDMA``, shared net comms ``NET/Socket/0/Shared``

Text from several ranks may be interleaved, prefixed (``[1,0]<stdout>:``,
timestamps) or fused where two processes wrote to one stream without a newline,
so lines are searched rather than anchored and one line may hold several
connections. Lines not understood are skipped; nothing here raises on odd input.
The summary states only what the log states: nothing is inferred from the
topology, and ranks are communicator ranks as printed (several communicators in
one log are not told apart).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

__all__ = [
    "ChannelConnection", "NcclLogSummary", "PairTransport", "explain", "parse_nccl_info",
    "transport_family", "transport_kind", "version_tuple",
]


@dataclass(frozen=True)
class ChannelConnection:
    """One ``Channel``/``Ring`` line: a directed connection on one channel."""

    channel: int
    src_rank: int
    dst_rank: int
    transport: str  # family: "P2P", "SHM", "NET", "COLLNET", "NVLS", ...
    detail: str  # everything printed after "via", e.g. "NET/IB/0/GDRDMA"
    direction: str | None  # "send" / "receive" where printed (network connections)
    line: int  # 1-based line number in the parsed text


@dataclass(frozen=True)
class PairTransport:
    """All connections printed for one directed rank pair."""

    rank_a: int  # source rank, as printed
    rank_b: int  # destination rank, as printed
    transports: tuple[str, ...]  # distinct detail strings, in order of appearance
    channels: int  # distinct channel ids
    kind: str  # e.g. "P2P (CUMEM)", "SHM (host memory)", "NET/IB (GPUDirect RDMA)"


@dataclass(frozen=True)
class NcclLogSummary:
    nccl_version: str | None  # as printed, e.g. "2.23.4+cuda12.4"
    nranks: int | None  # largest communicator size printed
    ranks_seen: tuple[int, ...]
    pairs: tuple[PairTransport, ...]  # sorted by (rank_a, rank_b)
    network: str | None  # "IB", "Socket", or a plugin's name ("IBext_v8", ...)
    coll_channels: int | None
    p2p_channels: int | None
    env_overrides: Mapping[str, str]  # from "NCCL_X set by environment to V"
    algorithms: tuple[str, ...]  # chosen "Algo/proto", e.g. "Ring/Simple", distinct
    warnings: tuple[str, ...]  # text after "NCCL WARN", distinct, in order
    lines_read: int
    connections: tuple[ChannelConnection, ...] = ()
    notes: tuple[str, ...] = ()  # INFO lines that explain a transport choice, distinct
    source: str = "<log>"


# Digit runs are bounded so that int() never meets a huge number (Python
# refuses to convert strings of more than 4300 digits).
_RANK = r"(\d{1,9})(?:\[[0-9A-Fa-f]{1,16}\])?"
# A transport is "/"-separated words; "(n)" after a NIC index names the proxy
# rank (PXN). Three printed names contain a space and are listed literally.
_TRANSPORT = (
    r"(?:direct shared memory"
    r"|(?:P2P/direct pointer|NET/AWS Libfabric|[A-Za-z][\w.-]*)(?:/[\w.-]+(?:\(\d{1,9}\))?)*)"
)
_CONNECTION = re.compile(
    r"\b(?:Channel|Ring)\s+(\d{1,4})(?:/\d{1,4})?\s*:\s*" + _RANK + r"\s*->\s*" + _RANK
    + r"\s*(?:\[(send|receive)\]\s*)?via\s+(" + _TRANSPORT + ")"
)
# "Channel 00/02 :    0   1" (2.7+) or "Ring 00 :    0   1" (older): the ring order.
_RING_ORDER = re.compile(r"\b(?:Channel|Ring) (\d{1,4})(?:/(\d{1,4}))? :((?:\s+\d{1,9})+)\s*$")
_VERSION = re.compile(r"\bNCCL version (\d{1,3}\.\d{1,3}\.\d{1,3}[\w.+-]{0,40})")
_RANK_NRANKS = re.compile(r"\brank (\d{1,9}) n[Rr]anks (\d{1,9})\b")
_NRANKS_TAG = re.compile(r"\[nranks=(\d{1,9})\]")
_USING_NETWORK = re.compile(r"\bUsing network (\S.{0,60}?)\s*$")
_NET_USING = re.compile(r"\bNET/(IB|Socket) : Using \[\d")
_COLL_CHANNELS = re.compile(r"\b(\d{1,6}) coll channels,")
_P2P_CHANNELS = re.compile(r"\b(\d{1,6}) p2p channels,")
_ENV = re.compile(r"\b(NCCL_[A-Z0-9_]{1,64}) set by environment to ?(.{0,200})$")
_WARN = re.compile(r"\bNCCL WARN (.*\S)")
_ALGO = re.compile(r"\b(\d{1,20}) Bytes -> Algo (\w{1,32}) proto (\w{1,32})")
_NOTE_PATTERNS = (
    re.compile(r"Could not enable P2P between dev \d{1,9}\(=\w{1,16}\) and dev \d{1,9}\(=\w{1,16}\)"),
    re.compile(r"NET/IB : No device found"),
    re.compile(r"GPU Direct RDMA Disabled for HCA \d{1,9} '[^']{0,64}'"),
)

# Before 2.12 index 2 was the single CollNet algorithm; later algorithms were appended.
_ALGO_INDEX_OLD = ("Tree", "Ring", "CollNet")
_ALGO_INDEX_NEW = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
_PROTO_INDEX = ("LL", "LL128", "Simple")
# 2.21+ prints names ("COLLNET_DIRECT", "SIMPLE"); keyed without case or underscores.
_ALGO_NAMES = {n.upper(): n for n in _ALGO_INDEX_OLD + _ALGO_INDEX_NEW}
_PROTO_NAMES = {n.upper(): n for n in _PROTO_INDEX}


def transport_family(detail: str) -> str:
    """Normalized family of a transport text: "P2P", "SHM", "NET", "COLLNET", ..."""
    if detail == "direct shared memory":
        return "SHM"
    return detail.split("/", 1)[0].upper()


def transport_kind(detail: str) -> str:
    """Short human summary of one transport text, e.g. "NET/IB (GPUDirect RDMA)"."""
    family = transport_family(detail)
    parts = detail.split("/")
    if family == "SHM":
        return "SHM (host memory)"
    if family == "P2P":
        mechanism = parts[1] if len(parts) > 1 else ""
        label = next((m for m in ("IPC", "CUMEM", "direct pointer") if mechanism.startswith(m)), None)
        return f"P2P ({label})" if label else "P2P"
    if family in ("NET", "COLLNET") and len(parts) > 1:
        label = "NET" if family == "NET" else "CollNet"
        name = re.sub(r"\(\d+\)", "", parts[1])
        gdr = " (GPUDirect RDMA)" if "GDRDMA" in parts[2:] else ""
        return f"{label}/{name}{gdr}"
    return detail


def version_tuple(version: str | None) -> tuple[int, int, int] | None:
    """(2, 23, 4) for "2.23.4+cuda12.4"; None when absent or unreadable."""
    match = re.match(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", version or "")
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


@dataclass
class _Facts:
    """What has been read so far; turned into an NcclLogSummary at the end."""

    version: str | None = None
    nranks: list[int] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    connections: list[ChannelConnection] = field(default_factory=list)
    using_network: str | None = None
    net_using: list[str] = field(default_factory=list)
    coll: list[int] = field(default_factory=list)
    p2p: list[int] = field(default_factory=list)
    ring_counts: list[int] = field(default_factory=list)  # the "/NN" of ring-order lines
    ring_ids: set[int] = field(default_factory=set)  # ring-order lines without "/NN"
    env: dict[str, str] = field(default_factory=dict)
    algo_raw: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _read_connections(facts: _Facts, line: str, number: int) -> None:
    for m in _CONNECTION.finditer(line):
        channel, src, dst, direction, detail = int(m[1]), int(m[2]), int(m[3]), m[4], m[5]
        facts.connections.append(
            ChannelConnection(channel, src, dst, transport_family(detail), detail, direction, number)
        )
        facts.ranks.update((src, dst))


def _read_counts(facts: _Facts, line: str) -> None:
    if m := _RANK_NRANKS.search(line):
        facts.ranks.add(int(m[1]))
        facts.nranks.append(int(m[2]))
    if m := _NRANKS_TAG.search(line):
        facts.nranks.append(int(m[1]))
    if m := _COLL_CHANNELS.search(line):
        facts.coll.append(int(m[1]))
    if m := _P2P_CHANNELS.search(line):
        facts.p2p.append(int(m[1]))
    if m := _RING_ORDER.search(line):
        if m[2] is not None:
            facts.ring_counts.append(int(m[2]))
        else:
            facts.ring_ids.add(int(m[1]))
        facts.ranks.update(int(r) for r in m[3].split())


def _read_setup(facts: _Facts, line: str) -> None:
    if facts.version is None and (m := _VERSION.search(line)):
        facts.version = m[1]
    if facts.using_network is None and (m := _USING_NETWORK.search(line)):
        facts.using_network = m[1]
    if m := _NET_USING.search(line):
        facts.net_using.append(m[1])
    if m := _ENV.search(line):
        value = m[2].strip()
        facts.env[m[1]] = value[:-1] if value.endswith(".") else value
    if m := _ALGO.search(line):
        facts.algo_raw.append((m[2], m[3]))
    if m := _WARN.search(line):
        facts.warnings.append(m[1])
    for pattern in _NOTE_PATTERNS:
        if m := pattern.search(line):
            facts.notes.append(m[0])


def _read_line(facts: _Facts, line: str, number: int) -> None:
    # Cheap substring checks first: most lines of a long run match nothing.
    if " via " in line or "via\t" in line:
        _read_connections(facts, line, number)
    if "NCCL" in line or "rank" in line or "channels" in line or " : " in line or "Bytes" in line:
        _read_counts(facts, line)
        _read_setup(facts, line)


def _algorithm_name(algo: str, proto: str, version: tuple[int, int, int] | None) -> str:
    if algo.isdigit():
        table = _ALGO_INDEX_NEW if version and version >= (2, 12, 0) else _ALGO_INDEX_OLD
        index = int(algo)
        known = index < 2 or (version is not None and index < len(table))
        algo = table[index] if known else f"Algo{index}"
    else:
        algo = _ALGO_NAMES.get(algo.upper().replace("_", ""), algo)
    if proto.isdigit():
        proto = _PROTO_INDEX[int(proto)] if int(proto) < len(_PROTO_INDEX) else f"Proto{proto}"
    else:
        proto = _PROTO_NAMES.get(proto.upper().replace("_", ""), proto)
    return f"{algo}/{proto}"


def _distinct(items) -> tuple:
    return tuple(dict.fromkeys(items))


def _pairs(connections: list[ChannelConnection]) -> tuple[PairTransport, ...]:
    grouped: dict[tuple[int, int], list[ChannelConnection]] = {}
    for c in connections:
        grouped.setdefault((c.src_rank, c.dst_rank), []).append(c)
    pairs = []
    for (a, b), conns in sorted(grouped.items()):
        details = _distinct(c.detail for c in conns)
        kind = " + ".join(_distinct(transport_kind(d) for d in details))
        pairs.append(PairTransport(a, b, details, len({c.channel for c in conns}), kind))
    return tuple(pairs)


def _network(facts: _Facts) -> str | None:
    if facts.using_network:
        return facts.using_network
    for c in facts.connections:
        if c.transport == "NET" and "/" in c.detail:
            return re.sub(r"\(\d+\)", "", c.detail.split("/")[1])
    for name in ("IB", "Socket"):  # IB is only listed when a device was found
        if name in facts.net_using:
            return name
    return None


def _coll_channels(facts: _Facts) -> int | None:
    # Older releases print no channel summary; the ring-order lines still tell the count.
    counts = facts.coll or facts.ring_counts
    return max(counts) if counts else (len(facts.ring_ids) or None)


def parse_nccl_info(text: str, source: str = "<log>") -> NcclLogSummary:
    """Summarize NCCL_DEBUG=INFO output (one rank or several interleaved). Never raises on odd text."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    lines = str(text).splitlines()
    facts = _Facts()
    for number, line in enumerate(lines, start=1):
        _read_line(facts, line, number)
    version = version_tuple(facts.version)
    return NcclLogSummary(
        nccl_version=facts.version,
        nranks=max(facts.nranks) if facts.nranks else None,
        ranks_seen=tuple(sorted(facts.ranks)),
        pairs=_pairs(facts.connections),
        network=_network(facts),
        coll_channels=_coll_channels(facts),
        p2p_channels=max(facts.p2p) if facts.p2p else None,
        env_overrides=MappingProxyType(dict(facts.env)),
        algorithms=_distinct(_algorithm_name(a, p, version) for a, p in facts.algo_raw),
        warnings=_distinct(facts.warnings),
        lines_read=len(lines),
        connections=tuple(facts.connections),
        notes=_distinct(facts.notes),
        source=source,
    )


_MAX_PAIR_SENTENCES = 8


def _env_set(summary: NcclLogSummary, name: str) -> bool:
    """True when the variable was set to a non-zero number (how NCCL reads these flags)."""
    value = summary.env_overrides.get(name, "")
    return value.lstrip("-").isdigit() and int(value) != 0


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _overview(s: NcclLogSummary) -> str:
    parts = [f"NCCL {s.nccl_version}" if s.nccl_version else "NCCL version not printed"]
    if s.nranks is not None:
        parts.append(_plural(s.nranks, "rank"))
    if s.network:
        parts.append(f"network {s.network}")
    if s.coll_channels is not None:
        parts.append(_plural(s.coll_channels, "coll channel"))
    if s.p2p_channels is not None:
        parts.append(_plural(s.p2p_channels, "p2p channel"))
    return ", ".join(parts) + f" ({s.source}, {s.lines_read} lines)."


def _why_no_p2p(s: NcclLogSummary) -> list[str]:
    reasons = []
    if _env_set(s, "NCCL_P2P_DISABLE"):
        reasons.append(f"P2P disabled by NCCL_P2P_DISABLE={s.env_overrides['NCCL_P2P_DISABLE']}")
    if "NCCL_P2P_LEVEL" in s.env_overrides:
        reasons.append(f"P2P limited by NCCL_P2P_LEVEL={s.env_overrides['NCCL_P2P_LEVEL']}")
    if any(n.startswith("Could not enable P2P") for n in s.notes):
        reasons.append("NCCL reported it could not enable P2P between the GPUs")
    return reasons


def _why_network(s: NcclLogSummary, kind: str) -> list[str]:
    reasons = []
    # Sockets never use GPUDirect RDMA, so saying so would add nothing.
    if kind.startswith("NET/") and not kind.startswith("NET/Socket") and "GPUDirect RDMA" not in kind:
        reasons.append("GPUDirect RDMA was not used")
    if kind.startswith("NET/Socket"):
        if _env_set(s, "NCCL_IB_DISABLE"):
            value = s.env_overrides["NCCL_IB_DISABLE"]
            reasons.append(f"InfiniBand disabled by NCCL_IB_DISABLE={value}")
        elif "NET/IB : No device found" in s.notes:
            reasons.append("NCCL found no InfiniBand device")
    return reasons


def _reasons(s: NcclLogSummary, kind: str) -> str:
    reasons = []
    if kind.startswith("SHM") and "P2P" not in kind:
        reasons = ["GPU peer-to-peer was not used", *_why_no_p2p(s)]
    elif kind.startswith("NET") or kind.startswith("CollNet"):
        reasons = _why_network(s, kind)
    return (": " + "; ".join(reasons)) if reasons else ""


def _pair_groups(s: NcclLogSummary) -> list[tuple[str, str, int]]:
    """(ranks text, kind, channels) per unordered pair; one entry when both directions agree."""
    by_pair = {(p.rank_a, p.rank_b): p for p in s.pairs}
    groups, done = [], set()
    for (a, b), p in by_pair.items():
        if (a, b) in done:
            continue
        back = by_pair.get((b, a))
        if back is not None and back.kind == p.kind and a != b:
            ids = {c.channel for c in s.connections if {c.src_rank, c.dst_rank} == {a, b}}
            groups.append((f"{a}<->{b}", p.kind, len(ids) or max(p.channels, back.channels)))
            done.update({(a, b), (b, a)})
        else:
            groups.append((f"{a}->{b}", p.kind, p.channels))
            done.add((a, b))
    return groups


def _pair_sentences(s: NcclLogSummary) -> list[str]:
    groups = _pair_groups(s)
    if len(groups) <= _MAX_PAIR_SENTENCES:
        return [f"ranks {r} used {k} on {_plural(n, 'channel')}{_reasons(s, k)}" for r, k, n in groups]
    by_kind: dict[str, list[str]] = {}
    for ranks, kind, _ in groups:
        by_kind.setdefault(kind, []).append(ranks)
    sentences = []
    for kind, rank_list in by_kind.items():
        shown = ", ".join(rank_list[:6]) + (", ..." if len(rank_list) > 6 else "")
        count = _plural(len(rank_list), "rank pair")
        sentences.append(f"{count} used {kind} ({shown}){_reasons(s, kind)}")
    return sentences


def explain(summary: NcclLogSummary) -> list[str]:
    """Short plain sentences about what the log shows; nothing beyond what it printed."""
    s = summary
    sentences = [_overview(s)]
    if s.pairs:
        sentences += _pair_sentences(s)
    else:
        sentences.append(
            "no per-channel transport lines were found, "
            "so the log does not show which transport each rank pair used"
        )
    if s.env_overrides:
        settings = ", ".join(f"{k}={v}" for k, v in s.env_overrides.items())
        sentences.append(f"set by environment: {settings}")
    if s.algorithms:
        sentences.append("algorithm/protocol chosen: " + ", ".join(s.algorithms))
    if s.warnings:
        count = _plural(len(s.warnings), "distinct warning")
        sentences.append(f"NCCL printed {count}, first: {s.warnings[0]}")
    return sentences
