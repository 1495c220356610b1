"""The torch threads each CPU rank of `validate` and `scan` takes (`cpu_threads_per_rank`): its
share of the cores this process may run on, at most OMP_NUM_THREADS where it is set."""
from __future__ import annotations

import os

import pytest

from topoprof.model.validate.run import cpu_threads_per_rank


def test_each_rank_gets_its_share_of_the_cores_this_process_may_run_on(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # a CPU set of 8 on a 64-core node: 8 are this job's
    assert [cpu_threads_per_rank(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


@pytest.mark.parametrize("given, threads", [("1", 1), ("2", 2), ("16", 4), ("", 4), ("0", 4), ("two", 4)])
def test_omp_num_threads_caps_the_share_where_it_is_set(monkeypatch, given, threads):
    monkeypatch.setenv("OMP_NUM_THREADS", given)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert cpu_threads_per_rank(2) == threads
