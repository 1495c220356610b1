"""Emulated slow "inter-node" links built from Linux network namespaces.

Two fresh network namespaces are joined by a veth pair; optionally both
ends are shaped with a token-bucket (``tbf``) qdisc so that a process
running in each namespace sees a point-to-point link of a known rate.
This lets tests run one torch.distributed rank per "node" and compare
measured bandwidth against the configured rate.

Everything here only ever sends traffic to addresses that live inside the
namespaces created by this module; nothing is configured in the caller's
namespace, and only namespaces created here are ever deleted.

Requires root, ``ip`` and ``tc`` (iproute2) and kernel support for network
namespaces, veth and the tbf qdisc; :func:`unavailable_reason` tells
whether that is the case (tests use it for ``pytest.skip``).
"""

from __future__ import annotations

import atexit
import functools
import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

__all__ = [
    "IFNAMSIZ",
    "PairTimeout",
    "ShapedLink",
    "run_pair",
    "shaped_link",
    "kernel_hz",
    "tbf_params",
    "unavailable_reason",
]

IFNAMSIZ = 15  # longest interface name the kernel accepts (16 incl. NUL)
_MTU = 1500
# Largest GSO/TSO super-packet a veth hands to its qdisc (GSO_LEGACY_MAX_SIZE)
# plus the Ethernet header, which tbf counts too.
_GSO_MAX_BYTES = 65536 + 14
# When CONFIG_HZ cannot be read assume the lowest common value: it gives the
# largest (safe) bucket.
_FALLBACK_HZ = 100

_counter = itertools.count()
_counter_lock = threading.Lock()
# Namespaces created by this process and not yet deleted; removed again at
# interpreter exit if a caller never let the context manager finish.
_live_namespaces: set[str] = set()


# --------------------------------------------------------------------------
# small subprocess wrappers


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"command failed (rc={proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}"
        )
    return proc


def _ns_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def _kill_ns_processes(ns: str) -> None:
    """SIGKILL every process still running inside namespace ``ns``."""
    for _ in range(5):
        proc = _run(["ip", "netns", "pids", ns], check=False)
        pids = [int(p) for p in proc.stdout.split() if p.strip().isdigit()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete_ns(ns: str) -> None:
    """Kill what runs in ``ns`` and delete it (its veth end goes with it)."""
    try:
        if _ns_exists(ns):
            _kill_ns_processes(ns)
            _run(["ip", "netns", "del", ns], check=False)
    finally:
        _live_namespaces.discard(ns)


@atexit.register
def _cleanup_leftovers() -> None:
    for ns in list(_live_namespaces):
        _delete_ns(ns)


# --------------------------------------------------------------------------
# tbf sizing


@functools.lru_cache(maxsize=1)
def kernel_hz() -> int:
    """CONFIG_HZ of the running kernel (``_FALLBACK_HZ`` when unknown)."""
    import gzip
    import platform

    candidates = [f"/boot/config-{platform.release()}", "/proc/config.gz"]
    for path in candidates:
        try:
            opener = gzip.open if path.endswith(".gz") else open
            with opener(path, "rt") as fh:
                for line in fh:
                    if line.startswith("CONFIG_HZ="):
                        return int(line.split("=", 1)[1])
        except (OSError, ValueError):
            continue
    return _FALLBACK_HZ


def tbf_params(rate_mbit: float) -> dict[str, int]:
    """tbf ``burst`` and ``limit`` in bytes for a link of ``rate_mbit``."""
    rate_bytes = rate_mbit * 1e6 / 8
    # burst (bucket size), the largest of:
    #  * rate/HZ -- tc-tbf(8): the bucket must hold at least one timer tick
    #    of tokens or the configured rate cannot be reached.  Too small a
    #    bucket really does cost rate here: at 1000 Mbit a 3000-byte bucket
    #    gave only ~70 % of the rate in TCP goodput.
    #  * one whole GSO super-packet (64 KiB + Ethernet header).  veth has
    #    TSO/GSO on, so TCP hands the qdisc skbs of up to 64 KiB.  The
    #    alternative, switching segmentation off so every skb is one MTU
    #    frame (``ip link set dev X gso_max_segs 1``; ethtool may not be
    #    installed), makes per-packet CPU cost the bottleneck: on a 2-core
    #    machine 1000 Mbit then reached only ~89 % of the rate, with a
    #    64 KiB+ bucket and offloads left on it reaches the full rate.
    #  * one MTU-sized frame -- implied by the GSO bound.
    burst = max(int(rate_bytes / kernel_hz()), _GSO_MAX_BYTES)
    # limit (bytes that may wait in the queue; tc derives ``latency`` from
    # it).  It must exceed one GSO super-packet: a 30 kB limit dropped every
    # 64 KiB skb and TCP stalled at ~0 % of the rate.  With no added delay
    # (netem is not available) the bandwidth-delay product is tiny, so a
    # few hundred kB already keep one flow at the rate, but they still drop
    # packets whenever a sender bursts several super-packets at once (TCP
    # small queues lets up to ~1 ms of the pacing rate, capped by
    # tcp_limit_output_bytes, sit in the qdisc per socket; with gloo, data
    # of one direction also shares the queue with ACKs of the other).
    # ~20 ms of queue at the shaped rate, and at least 1 MiB, measured
    # drop-free for TCP and gloo all-reduce at 200 and 1000 Mbit while
    # keeping the queueing delay of a loaded link bounded (~45 ms at
    # 200 Mbit, ~24 ms at 1000 Mbit).
    limit = burst + max(int(rate_bytes * 0.020), 1 << 20)
    return {"burst": burst, "limit": limit}


# --------------------------------------------------------------------------
# availability


def _probe() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "`ip` not found"
    if shutil.which("tc") is None:
        return "`tc` not found"
    ns = ""
    for _attempt in range(20):
        ns = _next_names("tpprobe")[0]
        if not _ns_exists(ns):
            break
    proc = _run(["ip", "netns", "add", ns], check=False)
    if proc.returncode != 0:
        return f"cannot create network namespaces: {proc.stderr.strip()}"
    _live_namespaces.add(ns)
    try:
        proc = _run(["ip", "-n", ns, "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"],
                    check=False)
        if proc.returncode != 0:
            return f"cannot create veth pair: {proc.stderr.strip()}"
        proc = _run(
            ["tc", "-n", ns, "qdisc", "replace", "dev", "pv0", "root",
             "tbf", "rate", "100mbit", "burst", "64kb", "limit", "1mb"],
            check=False,
        )
        if proc.returncode != 0:
            return f"tbf qdisc unavailable: {proc.stderr.strip()}"
        return None
    finally:
        _delete_ns(ns)


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """``None`` if shaped links can be made here, else why not.

    Actually creates (and deletes) a namespace with a tbf-shaped veth once
    per process; the answer is cached.
    """
    try:
        return _probe()
    except Exception as exc:  # e.g. timeout of a hung `ip`
        return f"cannot create network namespaces: {exc!r}"


# --------------------------------------------------------------------------
# the link


@dataclass(frozen=True)
class ShapedLink:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    addr_a: str
    addr_b: str
    rate_mbit: float | None

    def _side(self, side: str) -> tuple[str, str, str]:
        if side in ("a", "A"):
            return self.ns_a, self.if_a, self.addr_a
        if side in ("b", "B"):
            return self.ns_b, self.if_b, self.addr_b
        raise ValueError(f"side must be 'a' or 'b', not {side!r}")

    def ns(self, side: str) -> str:
        return self._side(side)[0]

    def ifname(self, side: str) -> str:
        return self._side(side)[1]

    def addr(self, side: str) -> str:
        return self._side(side)[2]

    @property
    def rate_bytes_per_s(self) -> float | None:
        return None if self.rate_mbit is None else self.rate_mbit * 1e6 / 8

    def exec_argv(self, side: str, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside the namespace of ``side``."""
        return ["ip", "netns", "exec", self.ns(side), *argv]


def _next_names(prefix: str) -> tuple[str, int]:
    with _counter_lock:
        n = next(_counter)
    # "<prefix><pid>x<n>" + "a"/"b" must fit IFNAMSIZ; trim the prefix
    # rather than the unique part.
    unique = f"{os.getpid()}x{n}"
    room = IFNAMSIZ - 1 - len(unique)
    if room < 0:
        unique = unique[-(IFNAMSIZ - 1):]
        room = 0
    return prefix[:room] + unique, n


def _addresses(n: int) -> tuple[str, str]:
    # A /30 out of 10.254.0.0/16: 16384 subnets, picked by the per-process
    # counter.  The addresses only exist inside the two namespaces (each has
    # its own routing table), so they cannot clash with the host or with
    # another process's links.
    n %= 16384
    base = n * 4
    third, fourth = divmod(base, 256)
    return f"10.254.{third}.{fourth + 1}", f"10.254.{third}.{fourth + 2}"


@contextmanager
def shaped_link(rate_mbit: float | None, prefix: str = "tp") -> Iterator[ShapedLink]:
    """Two namespaces joined by a veth pair, shaped to ``rate_mbit`` each way.

    ``rate_mbit=None`` leaves the veth unshaped.  On exit (normal, exception
    or KeyboardInterrupt) every process still running in either namespace is
    killed and both namespaces are deleted, which also removes the veth.
    """
    if rate_mbit is not None and not rate_mbit > 0:
        raise ValueError(f"rate_mbit must be positive or None, got {rate_mbit!r}")
    created: list[str] = []
    try:
        for _attempt in range(20):
            base, n = _next_names(prefix)
            ns_a, ns_b = base + "a", base + "b"
            # Never reuse (and later delete) a namespace someone else owns.
            if not (_ns_exists(ns_a) or _ns_exists(ns_b)):
                break
        else:
            raise RuntimeError("could not find unused namespace names")
        if_a, if_b = ns_a, ns_b
        addr_a, addr_b = _addresses(n)
        for ns in (ns_a, ns_b):
            _run(["ip", "netns", "add", ns])
            created.append(ns)
            _live_namespaces.add(ns)
            # No IPv6 on the link: keeps DAD / router solicitation / MLD
            # packets off it during measurements.  Best effort.
            _run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                  "net.ipv6.conf.default.disable_ipv6=1",
                  "net.ipv6.conf.all.disable_ipv6=1"], check=False)
        # Create the pair inside ns A with the peer placed straight into ns B,
        # so no interface ever appears in the caller's namespace.
        _run(["ip", "-n", ns_a, "link", "add", if_a, "mtu", str(_MTU), "type", "veth",
              "peer", "name", if_b, "netns", ns_b])
        for ns, ifname, addr in ((ns_a, if_a, addr_a), (ns_b, if_b, addr_b)):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", ifname])
            _run(["ip", "-n", ns, "link", "set", "dev", ifname, "up"])
            _run(["ip", "-n", ns, "link", "set", "dev", "lo", "up"])
            if rate_mbit is not None:
                p = tbf_params(rate_mbit)
                _run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf",
                      "rate", f"{rate_mbit}mbit",
                      "burst", str(p["burst"]),
                      "limit", str(p["limit"])])
        yield ShapedLink(ns_a, ns_b, if_a, if_b, addr_a, addr_b, rate_mbit)
    finally:
        for ns in created:
            _delete_ns(ns)


# --------------------------------------------------------------------------
# running one process per side


class PairTimeout(subprocess.TimeoutExpired):
    """Raised by :func:`run_pair` on timeout; ``results`` holds both sides."""

    def __init__(self, timeout: float, results: tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]):
        a, b = results
        super().__init__(
            cmd=[a.args, b.args],
            timeout=timeout,
            output=f"--- side a stdout ---\n{a.stdout}\n--- side b stdout ---\n{b.stdout}",
            stderr=f"--- side a stderr ---\n{a.stderr}\n--- side b stderr ---\n{b.stderr}",
        )
        self.results = results

    def __str__(self) -> str:
        return f"run_pair timed out after {self.timeout} s\n{self.output}\n{self.stderr}"


def _killpg(proc: subprocess.Popen) -> None:
    # Also when the leader has exited: children it left behind in its group
    # would otherwise keep the output pipes open.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_pair(
    link: ShapedLink,
    argv_a: Sequence[str],
    argv_b: Sequence[str],
    env_a: Mapping[str, str] | None = None,
    env_b: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    failure_grace_s: float = 2.0,
) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Run ``argv_a`` in namespace A and ``argv_b`` in B concurrently.

    ``env_a``/``env_b`` are laid over ``os.environ``.  Each side runs in its
    own process group.  If one side exits non-zero the other gets
    ``failure_grace_s`` to finish before its group is killed (a peer left
    alone usually waits forever).  On timeout both groups are killed and
    :class:`PairTimeout` is raised carrying both outputs.  Returns the two
    ``CompletedProcess`` objects (text stdout/stderr) otherwise.
    """
    procs: list[subprocess.Popen] = []
    outs: list[list[str]] = [["", ""], ["", ""]]
    threads: list[threading.Thread] = []
    try:
        for i, (side, argv, env) in enumerate((("a", argv_a, env_a), ("b", argv_b, env_b))):
            full_env = dict(os.environ)
            if env:
                full_env.update(env)
            p = subprocess.Popen(
                link.exec_argv(side, argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=full_env,
                start_new_session=True,
            )
            procs.append(p)

            def _drain(p: subprocess.Popen = p, i: int = i) -> None:
                out, err = p.communicate()
                outs[i] = [out or "", err or ""]

            t = threading.Thread(target=_drain, daemon=True)
            t.start()
            threads.append(t)

        deadline = time.monotonic() + timeout_s
        fail_deadline: float | None = None
        timed_out = False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if fail_deadline is None and any(p.poll() not in (None, 0) for p in procs):
                fail_deadline = now + failure_grace_s
            if fail_deadline is not None and now >= fail_deadline:
                break
            time.sleep(0.02)
    finally:
        for p in procs:
            _killpg(p)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for t in threads:
            t.join(timeout=10)

    results = tuple(
        subprocess.CompletedProcess(p.args, p.returncode, outs[i][0], outs[i][1])
        for i, p in enumerate(procs)
    )
    if timed_out:
        raise PairTimeout(timeout_s, results)  # type: ignore[arg-type]
    return results  # type: ignore[return-value]
