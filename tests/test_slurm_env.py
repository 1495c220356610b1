"""SLURM's variables as topoprof reads them (pure: no SLURM needed; the cluster tests in
test_slurm.py check the same against a real srun)."""
from __future__ import annotations

import pytest

from topoprof.errors import InputError
from topoprof.measure import slurm


@pytest.mark.parametrize("text, hosts", [
    ("tpnode[1-2]", ["tpnode1", "tpnode2"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("login1,gpu[8-10]", ["login1", "gpu8", "gpu9", "gpu10"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("node-a,node-b", ["node-a", "node-b"]),
    ("c[098-101]", ["c098", "c099", "c100", "c101"]),
    ("solo", ["solo"]),
])
def test_host_lists_expand_as_scontrol_show_hostnames(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["gpu[1-2", "gpu[a-b]", "gpu[5-3]"])
def test_a_host_list_that_cannot_be_read_is_named(text):
    with pytest.raises(InputError, match=repr(text).replace("[", r"\[")):
        slurm.expand_hostlist(text)


def test_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_tasks_per_node("8") == [8]
    with pytest.raises(InputError):
        slurm.expand_tasks_per_node("2(y3)")


def test_rendezvous_from_the_step_node_list_and_reserved_ports():
    # exactly what srun -N2 -n2 set (real SLURM 22.05, MpiParams=ports=21000-21999)
    env = {"SLURM_STEP_NODELIST": "tpnode[1-2]", "SLURM_JOB_NODELIST": "tpnode[1-2]",
           "SLURM_STEP_RESV_PORTS": "21001-21002", "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"}
    where = slurm.rendezvous(env)
    assert (where.addr, where.port) == ("tpnode1", 21001)
    assert where.source == "first node of SLURM_STEP_NODELIST, first port of SLURM_STEP_RESV_PORTS"


def test_without_reserved_ports_the_port_comes_from_job_and_step():
    env = {"SLURM_JOB_NODELIST": "a[3-4]", "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "2"}
    where = slurm.rendezvous(env)
    assert where.addr == "a3" and where.port == slurm.derived_port(123456, 2)
    assert slurm.DERIVED_PORT_BASE <= where.port < slurm.DERIVED_PORT_BASE + slurm.DERIVED_PORT_SPAN
    # two steps of one job, and two consecutive jobs, do not meet
    assert len({slurm.derived_port(123456, s) for s in range(8)} | {slurm.derived_port(123457, 0)}) == 9


def test_exported_master_address_and_port_win():
    env = {"MASTER_ADDR": "ib-node1", "MASTER_PORT": "29400", "SLURM_STEP_NODELIST": "n[1-2]",
           "SLURM_STEP_RESV_PORTS": "21001-21002"}
    where = slurm.rendezvous(env)
    assert (where.addr, where.port, where.source) == ("ib-node1", 29400, "MASTER_ADDR, MASTER_PORT")


def test_no_node_list_is_a_clear_error():
    with pytest.raises(InputError, match="MASTER_ADDR"):
        slurm.rendezvous({"SLURM_JOB_ID": "1"})
    with pytest.raises(InputError, match="MASTER_PORT"):
        slurm.rendezvous({"SLURM_JOB_NODELIST": "n1"})
