"""`topoprof bench` on gloo ranks: rows, busbw factors, correctness check, failures, import."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers.cli import topoprof as _cli
from tests.helpers.shared_fork_server import own_fork_server
from topoprof.measure.bench import BenchOptions, run_bench
from topoprof.specs.collective_spec import COLLECTIVES, size_sweep

FIXTURE_LOG = os.path.join(os.path.dirname(__file__), "fixtures", "topo", "22_rtx2080ti-2x-pix-autodl.nccl-tests.txt")
SMALL = tuple(size_sweep(1024, 256 * 1024, 4))


@pytest.mark.parametrize("nproc", [2, 3])
def test_every_collective_is_correct_and_scored_with_nccl_tests_factors(nproc):
    opts = BenchOptions(backend="gloo", nproc=nproc, collectives=tuple(COLLECTIVES), sizes=SMALL, iters=2, warmup=1)
    result = run_bench(opts)
    assert result.status == "ok", result.error
    factors = {"all_reduce": 2 * (nproc - 1) / nproc, "all_gather": (nproc - 1) / nproc,
               "reduce_scatter": (nproc - 1) / nproc, "all_to_all": (nproc - 1) / nproc,
               "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0}
    seen = {row.collective for row in result.rows}
    assert seen == set(COLLECTIVES)
    for row in result.rows:
        assert row.wrong == 0, row
        assert len(row.rank_times_us) == nproc
        assert row.algbw_gbps == pytest.approx(row.size_bytes / (row.time_us * 1e3))
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps * factors[row.collective])
        assert row.time_us == pytest.approx(sum(row.rank_times_us) / nproc)  # the 'avg' rule
    assert result.metadata["world_size"] == nproc and len(result.metadata["ranks"]) == nproc


def test_one_rank_times_the_collective_and_gives_no_bandwidth():
    """One rank moves nothing between GPUs: its rows keep their time, and no bandwidth is reported
    in the rows, the footer, the fit or the JSON."""
    proc = _cli("bench", "--nproc", "1", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert rows and all(r[4:6] == ["N/A", "N/A"] and float(r[3]) > 0 for r in rows)
    assert "Bus bandwidth" not in proc.stdout and "Fit all_reduce" not in proc.stdout
    assert "# One rank: nothing crosses a link, so no bandwidth is given" in proc.stdout
    doc = json.loads(_cli("bench", "--nproc", "1", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
                          "--json").stdout)
    assert doc["rows"] and all(r["algbw_gbps"] is None and r["busbw_gbps"] is None for r in doc["rows"])
    assert doc["fit"] == {}


def test_a_corrupted_result_is_counted_as_wrong():
    opts = BenchOptions(backend="gloo", nproc=2, collectives=("all_reduce", "all_gather"), sizes=SMALL[:2],
                        iters=1, warmup=0, corrupt_rank=1)
    result = run_bench(opts)
    assert result.rows and all(row.wrong == 1 for row in result.rows)


def test_cli_json_contract_and_fit():
    # Sizes where the bandwidth term dominates, so the fit has a finite bandwidth even on a noisy machine.
    proc = _cli("bench", "--nproc", "2", "-b", "256K", "-e", "16M", "-f", "4", "-n", "5", "-w", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"schema_version", "kind", "tool", "host", "created_utc", "status", "metadata", "rows", "fit",
            "fit_by_level",
            "slow_ranks", "nccl", "copies", "stopped"} <= set(doc)
    row = doc["rows"][0]
    assert set(row) == {"collective", "size_bytes", "count", "dtype", "time_us", "algbw_gbps", "busbw_gbps",
                        "wrong", "rank_times_us", "level", "group", "ranks"}
    assert [r["size_bytes"] for r in doc["rows"]] == [262144, 1048576, 4194304, 16777216]
    fit = doc["fit"]["all_reduce"]
    assert fit["latency_us"] >= 0 and fit["bandwidth_gbps"] > 0 and fit["r2"] <= 1.0
    meta = doc["metadata"]
    assert meta["backend"] == "gloo" and meta["combine"] == "avg" and meta["torch_version"]


def test_killed_rank_ends_the_cli_with_exit_3_and_keeps_rows(tmp_path):
    out = tmp_path / "bench.json"
    cli = subprocess.Popen([sys.executable, "-m", "topoprof", "bench", "--nproc", "2", "-b", "64K", "-e", "64M",
                            "-n", "20", "-w", "2", "--out", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=own_fork_server(dict(os.environ)))
    lines = []
    for line in cli.stdout:  # wait for the first measured rows, then kill rank 1
        lines.append(line)
        if sum(1 for ln in lines if ln.strip() and not ln.startswith("#")) >= 2:
            break
    # each rank is forked from the CLI's own fork server, and named for its rank
    ranks = [p for p in psutil.Process(cli.pid).children(recursive=True) if p.name().startswith("topoprof-rank")]
    victim = next(p for p in ranks if p.name() == "topoprof-rank1")
    victim.send_signal(signal.SIGKILL)
    rest, err = cli.communicate(timeout=120)
    assert cli.returncode == 3, err
    assert err.count("\n") == 1 and "rank 1" in err and "SIGKILL" in err and "Traceback" not in err, err
    doc = json.loads(out.read_text())
    assert doc["status"] == "error" and "rank 1" in doc["error"]
    assert len(doc["rows"]) >= 2
    time.sleep(0.5)
    assert not [p for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_nccl_tests_import_gives_rows_and_fit():
    proc = _cli("bench", "--from-nccl-tests", FIXTURE_LOG, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert len(doc["rows"]) == 28
    peak = max(doc["rows"], key=lambda r: r["busbw_gbps"])
    assert peak["busbw_gbps"] == pytest.approx(4.0) and peak["size_bytes"] == 134217728
    assert doc["fit"]["all_reduce"]["bandwidth_gbps"] == pytest.approx(4.0, rel=0.05)


@pytest.mark.parametrize("args, code, text", [
    (["bench", "-b", "12Q"], 2, "bad size"),
    (["bench", "--collectives", "allreduce_typo"], 2, "unknown collective"),
    (["bench", "-b", "1M", "-e", "1K"], 2, "min size"),
    (["bench", "--backend", "nccl"], 1, "needs a CUDA GPU"),
    (["bench", "--from-nccl-tests", "/nonexistent/log.txt"], 2, "cannot read"),
])
def test_bad_input_gives_one_line_and_exit_code(args, code, text):
    proc = _cli(*args)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert text in proc.stderr and "Traceback" not in proc.stderr


def test_copies_are_skipped_with_a_reason_without_gpu():
    proc = _cli("bench", "--nproc", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--copies", "--json")
    assert proc.returncode == 0, proc.stderr
    copies = json.loads(proc.stdout)["copies"]
    assert copies["status"] == "unsupported" and "CUDA GPU" in copies["detail"]


def test_uneven_nodes_get_rows_from_their_own_group_sizes(tmp_path):
    """Three ranks as a torchrun job over two "nodes" (2 + 1 ranks): per-level rows, right factors."""
    from topoprof.measure.launch import free_port

    port = str(free_port())
    procs = []
    for rank, (node, local, local_world) in enumerate([(0, 0, 2), (0, 1, 2), (1, 0, 1)]):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": "3",
               "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(node),
               "GLOO_SOCKET_IFNAME": "lo"}
        procs.append(subprocess.Popen([sys.executable, "-m", "topoprof", "bench", "--backend", "gloo",
                                       "--collectives", "all_reduce,all_gather,sendrecv", "-b", "1K", "-e", "4K",
                                       "-n", "2", "-w", "1", "--json"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:  # a rank that timed out must not outlive the test
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert not outs[1][0].strip() and not outs[2][0].strip()  # only rank 0 prints
    doc = json.loads(outs[0][0])
    rows = doc["rows"]
    assert {(r["level"], tuple(r["ranks"])) for r in rows} == {("intra", (0, 1)), ("intra", (2,)), ("inter", (0, 2)),
                                                              ("job", (0, 1, 2))}
    for r in rows:
        if r["collective"] == "all_reduce" and r["ranks"] == [2]:
            assert r["busbw_gbps"] is None and r["algbw_gbps"] is None  # one rank: nothing crosses a link
        if r["collective"] == "all_gather" and r["level"] == "job":
            assert r["size_bytes"] % 48 == 0  # 16-byte chunks x 3 ranks, not rank 0's 2-rank rounding
    assert not any(r["collective"] == "sendrecv" and len(r["ranks"]) < 2 for r in rows)  # needs a peer
    assert all(r["wrong"] == 0 for r in rows)


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_expected_values_are_the_same_in_chunks(name, monkeypatch):
    import torch

    import topoprof.probes.ranks.collective_timing as pc
    from topoprof.specs.collective_spec import get_collective

    spec, world = get_collective(name), 3
    send_n, recv_n = spec.counts(3 * 4096, world, 4)
    for rank in range(world):
        op = pc._Op(torch, None, name, send_n, recv_n, torch.float32, "cpu", rank, world)
        whole = op.expected(0, recv_n)
        monkeypatch.setattr(pc, "CHECK_CHUNK", 1000)  # chunk edges inside rank chunks
        parts = [op.expected(s, min(1000, recv_n - s)) for s in range(0, recv_n, 1000)]
        monkeypatch.undo()
        if whole is None:
            assert name == "reduce" and rank != 0
            continue
        assert torch.equal(torch.cat(parts), whole)


def test_a_sweep_that_stopped_is_said_after_the_rows_and_kept_in_the_json():
    from topoprof.jsonio import dumps, envelope
    from topoprof.measure.bench import BenchResult, add_stopped, bench_payload
    from topoprof.report.text_bench import summary_lines
    from topoprof.specs.messages import CollectiveStopped

    result = BenchResult(status="ok", rows=[], metadata={"world_size": 2})
    add_stopped(result, CollectiveStopped("all_gather", "job", "stopped at 8 B: out of memory"))
    assert "# all_gather: stopped at 8 B: out of memory" in summary_lines(result)
    assert json.loads(dumps(envelope("bench", bench_payload(result))))["stopped"] == [
        {"collective": "all_gather", "reason": "stopped at 8 B: out of memory"}]
