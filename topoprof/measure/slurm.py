"""What SLURM tells each task of a job step, read from its own variables (pure; no SLURM needed).

Under `srun` every task gets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID and the
step's node list and tasks per node. That is enough to join the ranks without a batch script
exporting MASTER_ADDR/MASTER_PORT:

- the address is the first node of the step's node list: srun's block distribution (its default)
  puts task 0 there, and node names resolve on the cluster's own network;
- the port is the first of the ports SLURM reserved for this step (SLURM_STEP_RESV_PORTS, set when
  slurm.conf has MpiParams=ports=LOW-HIGH), which no other step on the node is given; without a
  reservation it is derived from the job and step IDs, so that two steps on one node rarely meet.

Exported MASTER_ADDR/MASTER_PORT still win: the user may know better (a separate fabric name).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from topoprof.errors import InputError

# Ports derived from job and step IDs stay in [10000, 30000): above the registered services most
# clusters run and below Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999),
# where outgoing connections would take them.
DERIVED_PORT_BASE = 10000
DERIVED_PORT_SPAN = 20000
# A step's ID is small (0, 1, ... per srun in a job; SLURM's batch and extern steps are not srun
# steps): 64 steps per job before two IDs give the same port.
STEPS_PER_JOB = 64


@dataclass(frozen=True)
class Rendezvous:
    addr: str
    port: int
    source: str           # which variables gave them, for the report


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list ("gpu[01-03,07],login1", "r[1-2]n[1-2]") as host names, in order."""
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        if item:
            hosts.extend(_expand_item(item, text))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def _expand_item(item: str, whole: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise InputError(f"SLURM host list {whole!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    return [head + value + rest for value in _expand_ranges(match.group(1), whole)
            for rest in _expand_item(tail, whole)]


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m is None:
            raise InputError(f"SLURM host list {whole!r}: cannot read the range {part!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise InputError(f"SLURM host list {whole!r}: range {part!r} runs backwards")
        width = len(low)  # "01-10" keeps the leading zero
        values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return values


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE ("2(x3),1") as one count per node of the step, in node order."""
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise InputError(f"SLURM tasks per node {text!r}: cannot read {part!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def node_list(env: Mapping[str, str]) -> list[str]:
    """The step's nodes (SLURM_STEP_NODELIST), else the job's (SLURM_JOB_NODELIST, SLURM_NODELIST)."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            return expand_hostlist(env[name])
    return []


def tasks_on_this_node(env: Mapping[str, str]) -> int:
    """How many tasks of the step share this task's node."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name):
            counts = expand_tasks_per_node(env[name])
            node = int(env.get("SLURM_NODEID", "0"))
            if 0 <= node < len(counts):
                return counts[node]
    return int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])


def nodes_in_step(env: Mapping[str, str]) -> int:
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        if env.get(name):
            return int(env[name])
    return max(1, len(node_list(env)))


def rendezvous(env: Mapping[str, str]) -> Rendezvous:
    """Where rank 0 listens: exported MASTER_ADDR/PORT, else SLURM's node list and reserved ports."""
    sources = []
    addr = env.get("MASTER_ADDR")
    if addr:
        sources.append("MASTER_ADDR")
    else:
        nodes = node_list(env)
        if not nodes:
            raise InputError("a SLURM task without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: cannot tell where "
                             "rank 0 runs (export MASTER_ADDR)")
        addr = nodes[0]
        sources.append("first node of SLURM_STEP_NODELIST" if env.get("SLURM_STEP_NODELIST") else
                       "first node of SLURM_JOB_NODELIST")
    if env.get("MASTER_PORT"):
        port = int(env["MASTER_PORT"])
        sources.append("MASTER_PORT")
    elif env.get("SLURM_STEP_RESV_PORTS"):
        port = int(re.split(r"[-,]", env["SLURM_STEP_RESV_PORTS"])[0])
        sources.append("first port of SLURM_STEP_RESV_PORTS")
    elif env.get("SLURM_JOB_ID"):
        port = derived_port(int(env["SLURM_JOB_ID"]), int(env.get("SLURM_STEP_ID", "0") or 0))
        sources.append("port derived from SLURM_JOB_ID and SLURM_STEP_ID")
    else:
        raise InputError("a SLURM task without SLURM_JOB_ID or SLURM_STEP_RESV_PORTS: cannot choose the rendezvous "
                         "port (export MASTER_PORT)")
    return Rendezvous(addr, port, ", ".join(sources))


def derived_port(job_id: int, step_id: int) -> int:
    return DERIVED_PORT_BASE + (job_id * STEPS_PER_JOB + step_id % STEPS_PER_JOB) % DERIVED_PORT_SPAN
