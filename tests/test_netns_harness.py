"""Tests for the shaped-link harness in tests/helpers/netns.py.

The harness joins two network namespaces with a tbf-shaped veth pair so that
multi-"node" tests can run one rank per namespace over a link of known rate.
These tests check that the link is set up and torn down correctly and that
it really delivers the configured rate, both to plain TCP and to a 2-rank
torch.distributed gloo all-reduce.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

try:
    from helpers.netns import (
        IFNAMSIZ,
        PairTimeout,
        ShapedLink,
        kernel_hz,
        run_pair,
        shaped_link,
        tbf_params,
        unavailable_reason,
    )
except ModuleNotFoundError:  # tests/ imported as a package
    from tests.helpers.netns import (  # type: ignore[no-redef]
        IFNAMSIZ,
        PairTimeout,
        ShapedLink,
        kernel_hz,
        run_pair,
        shaped_link,
        tbf_params,
        unavailable_reason,
    )


@pytest.fixture
def netns_ok() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def _netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    # lines look like "name" or "name (id: 3)"
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _in_ns(link: ShapedLink, side: str, *argv: str) -> str:
    return subprocess.run(
        link.exec_argv(side, list(argv)), capture_output=True, text=True, check=True
    ).stdout


# ---------------------------------------------------------------- no root needed


@pytest.mark.parametrize("rate_mbit", [1, 10, 200, 1000, 10000, 100000])
def test_tbf_params_bounds(rate_mbit: float) -> None:
    p = tbf_params(rate_mbit)
    rate_bytes = rate_mbit * 1e6 / 8
    assert p["burst"] >= rate_bytes / kernel_hz()  # one timer tick of tokens
    assert p["burst"] >= 65536 + 14  # a whole GSO super-packet + Ethernet header
    assert p["limit"] >= p["burst"] + (1 << 20)  # queue well above one super-packet
    assert p["limit"] >= rate_bytes * 0.020


def test_exec_argv_and_sides() -> None:
    link = ShapedLink("nsA", "nsB", "ifA", "ifB", "10.0.0.1", "10.0.0.2", 100.0)
    assert link.exec_argv("a", ["python", "-V"]) == ["ip", "netns", "exec", "nsA", "python", "-V"]
    assert link.exec_argv("b", ["true"]) == ["ip", "netns", "exec", "nsB", "true"]
    assert link.rate_bytes_per_s == pytest.approx(12.5e6)
    with pytest.raises(ValueError):
        link.exec_argv("c", ["true"])


# ---------------------------------------------------------------- set-up / tear-down


def test_link_setup_names_addresses_and_qdisc(netns_ok: None) -> None:
    long_prefix = "averyverylongprefix"
    with shaped_link(200, prefix=long_prefix) as link, shaped_link(None) as other:
        # unique, IFNAMSIZ-safe names
        names = {link.ns_a, link.ns_b, other.ns_a, other.ns_b}
        assert len(names) == 4
        for name in (link.if_a, link.if_b, other.if_a, other.if_b):
            assert 0 < len(name) <= IFNAMSIZ
        assert str(os.getpid()) in link.ns_a
        assert names <= _netns_list()

        # the /30 and lo exist only inside the namespaces
        for side in "ab":
            addrs = _in_ns(link, side, "ip", "-4", "-o", "addr", "show")
            assert f"{link.addr(side)}/30" in addrs
            assert "127.0.0.1/8" in addrs  # lo is up
            assert link.addr(side) not in subprocess.run(
                ["ip", "-o", "addr", "show"], capture_output=True, text=True
            ).stdout
            qdisc = _in_ns(link, side, "tc", "qdisc", "show", "dev", link.ifname(side))
            assert "tbf" in qdisc and "rate 200Mbit" in qdisc, qdisc
            assert "tbf" not in _in_ns(other, side, "tc", "qdisc", "show", "dev", other.ifname(side))


def test_cleanup_after_normal_exit_and_exception(netns_ok: None) -> None:
    seen: list[ShapedLink] = []
    with shaped_link(None) as link:
        seen.append(link)
        # a process left running inside must be killed by the clean-up
        sleeper = subprocess.Popen(link.exec_argv("b", ["sleep", "60"]), start_new_session=True)
        time.sleep(0.2)
    assert sleeper.wait(timeout=10) == -signal.SIGKILL

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with shaped_link(100) as link:
            seen.append(link)
            raise Boom

    left = _netns_list()
    for link in seen:
        assert link.ns_a not in left and link.ns_b not in left


def test_run_pair_timeout_and_failure(netns_ok: None) -> None:
    with shaped_link(None) as link:
        t0 = time.monotonic()
        with pytest.raises(PairTimeout) as exc:
            run_pair(link, ["sh", "-c", "echo started-a; sleep 30"], ["sleep", "30"], None, None, 1.0)
        assert time.monotonic() - t0 < 10
        res_a, res_b = exc.value.results
        assert res_a.returncode == res_b.returncode == -signal.SIGKILL
        assert "started-a" in res_a.stdout

        # one side fails: the other is killed after a short grace period
        t0 = time.monotonic()
        res_a, res_b = run_pair(
            link, ["sh", "-c", "echo oops >&2; exit 3"], ["sleep", "30"],
            {"X": "1"}, None, 20.0,
        )
        assert time.monotonic() - t0 < 10
        assert res_a.returncode == 3 and "oops" in res_a.stderr
        assert res_b.returncode == -signal.SIGKILL

        # env overlays and the namespace each side runs in
        res_a, res_b = run_pair(
            link,
            ["sh", "-c", "echo $TP_SIDE; ip -4 -o addr show"],
            ["sh", "-c", "echo $TP_SIDE; ip -4 -o addr show"],
            {"TP_SIDE": "A"}, {"TP_SIDE": "B"}, 20.0,
        )
        assert res_a.returncode == res_b.returncode == 0
        assert res_a.stdout.startswith("A\n") and link.addr_a in res_a.stdout
        assert res_b.stdout.startswith("B\n") and link.addr_b in res_b.stdout


# ---------------------------------------------------------------- does the link deliver the rate?

TCP_TOOL = textwrap.dedent(
    """
    import json, socket, sys, time

    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "recv":
        warmup_s, measure_s = float(sys.argv[4]), float(sys.argv[5])
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((addr, port))
        ls.listen(1)
        ls.settimeout(15)
        conn, _ = ls.accept()
        conn.settimeout(15)
        buf = memoryview(bytearray(1 << 20))
        total = conn.recv_into(buf)
        t_first = time.perf_counter()
        t_start = bytes_at_start = None
        while True:
            n = conn.recv_into(buf)
            if n == 0:
                break
            total += n
            now = time.perf_counter()
            if t_start is None and now - t_first >= warmup_s:
                t_start, bytes_at_start = now, total
            elif t_start is not None and now - t_start >= measure_s:
                break
        t_end = time.perf_counter()
        conn.close()
        print(json.dumps({"bytes": total - bytes_at_start, "secs": t_end - t_start}), flush=True)
    else:
        deadline = time.monotonic() + 15
        while True:
            try:
                s = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        data = b"\\0" * (1 << 20)
        try:
            while time.monotonic() < deadline:
                s.sendall(data)
        except OSError:  # receiver closed: done
            pass
    """
)


@pytest.mark.parametrize("rate_mbit", [200, 1000])
def test_tcp_goodput_matches_shaped_rate(netns_ok: None, tmp_path: Path, rate_mbit: float) -> None:
    tool = tmp_path / "tcp_tool.py"
    tool.write_text(TCP_TOOL)
    with shaped_link(rate_mbit) as link:
        port = "5201"
        # Skip the first 0.25 s (slow start, and the initially full token
        # bucket lets one `burst` through at line rate), then measure 1.25 s.
        snd, rcv = run_pair(
            link,
            [sys.executable, str(tool), "send", link.addr_b, port],
            [sys.executable, str(tool), "recv", link.addr_b, port, "0.25", "1.25"],
            None, None, 30.0,
        )
        stats = _in_ns(link, "a", "tc", "-s", "qdisc", "show", "dev", link.if_a)
    assert rcv.returncode == 0, rcv.stderr
    r = json.loads(rcv.stdout.strip().splitlines()[-1])
    goodput_bits = r["bytes"] * 8 / r["secs"]
    ratio = goodput_bits / (rate_mbit * 1e6)
    print(f"\nTCP goodput over {rate_mbit} Mbit tbf link: {goodput_bits / 1e6:.1f} Mbit/s "
          f"= {ratio:.1%} of the shaped rate\n{stats.strip()}")
    # tbf counts whole Ethernet frames: a full segment carries 1448 payload
    # bytes in 1514 on the wire (14 Ethernet + 20 IP + 20 TCP + 12 TCP
    # timestamp option), so the best possible goodput is 1448/1514 = 95.6 %
    # of the rate (~3-5 % header overhead).  80 % leaves room for a busy
    # 2-core machine; above 105 % would mean the shaping does not work.
    assert 0.80 <= ratio <= 1.05


GLOO_TOOL = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import torch.distributed as dist

    rank, addr, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    nbytes, iters = int(sys.argv[4]), int(sys.argv[5])
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(x)  # warm-up: gloo connection set-up, TCP window growth
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    # an iteration lasts until the slower rank is done
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ok = bool((x == 2.0 ** (iters + 1)).all())
    print(json.dumps({"rank": rank, "times": t.tolist(), "ok": ok}), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_gloo_allreduce_busbw_reaches_shaped_rate(netns_ok: None, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed not available")
    rate_mbit, nbytes, iters = 200, 16 << 20, 4
    tool = tmp_path / "gloo_tool.py"
    tool.write_text(GLOO_TOOL)
    with shaped_link(rate_mbit) as link:
        port = "29500"  # namespaces are private: no clash with anything else
        argv = lambda rank: [sys.executable, str(tool), str(rank), link.addr_a, port, str(nbytes), str(iters)]  # noqa: E731
        env = lambda side: {"GLOO_SOCKET_IFNAME": link.ifname(side), "MASTER_ADDR": link.addr_a,  # noqa: E731
                            "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        res0, res1 = run_pair(link, argv(0), argv(1), env("a"), env("b"), 50.0)
    assert res0.returncode == 0 and res1.returncode == 0, res0.stderr + res1.stderr
    r = json.loads(res0.stdout.strip().splitlines()[-1])
    assert r["ok"]
    n = 2
    t = sum(r["times"]) / len(r["times"])
    busbw = 2 * (n - 1) / n * nbytes / t  # = S/t for two ranks
    rate_bytes = rate_mbit * 1e6 / 8
    ratio = busbw / rate_bytes
    print(f"\ngloo all_reduce {nbytes >> 20} MiB over {rate_mbit} Mbit tbf link: "
          f"per-iteration {[round(x, 3) for x in r['times']]} s, busbw {busbw / 1e6:.2f} MB/s "
          f"= {ratio:.1%} of the shaped rate")
    # For two ranks gloo's ring sends S bytes each way per all-reduce over a
    # single TCP connection; like plain TCP it can reach ~95.6 % (headers). How
    # close it gets is a benchmark (tests/benchmarks/bench_shaped_link.py); the
    # test holds what only a broken link or timing crosses: the rate is there,
    # and nothing beats it by more than one tbf bucket.
    assert 0.5 <= ratio <= 1.1
