"""TCP's slow start after idle: what it can cost a multi-node job whose traffic rides TCP.

With net.ipv4.tcp_slow_start_after_idle = 1 (Linux's default), a connection idle for longer
than its retransmission timeout restarts from the initial congestion window (RFC 5681 §4.1,
"restart window"). Gradient accumulation makes such gaps: with `no_sync()` the network is silent
for K - 1 micro-batches. The window then regrows by doubling each round trip until it covers
the bandwidth-delay product, so one restart costs at most one round trip per doubling.
"""
from __future__ import annotations

import math

# Linux's initial congestion window: 10 segments (RFC 6928; TCP_INIT_CWND in include/net/tcp.h)
# of one Ethernet MSS (1500 B MTU - 40 B of IPv4 and TCP headers).
INITIAL_WINDOW_BYTES = 10 * 1460
# The smallest retransmission timeout Linux uses (TCP_RTO_MIN = HZ / 5 in include/net/tcp.h): a
# connection idle for less never restarts.
MIN_RTO_S = 0.2


def restart_cost_s(bandwidth_bytes_per_s: float, rtt_s: float) -> float:
    """Upper bound of the time one restart loses: one round trip per doubling of the initial
    window up to the bandwidth-delay product; 0 when the initial window already covers it."""
    bdp = bandwidth_bytes_per_s * rtt_s
    if bdp <= INITIAL_WINDOW_BYTES or rtt_s <= 0:
        return 0.0
    return math.ceil(math.log2(bdp / INITIAL_WINDOW_BYTES)) * rtt_s


def restarts_per_step(micro_batch_s: float, micro_batches_between_syncs: int, syncs_per_step: int) -> int:
    """Syncs that follow a gap longer than the minimum RTO: the compute between two syncs."""
    return syncs_per_step if micro_batch_s * micro_batches_between_syncs > MIN_RTO_S else 0
