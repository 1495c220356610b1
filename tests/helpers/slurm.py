"""A real SLURM cluster on one machine: slurmctld and two slurmd nodes in network namespaces.

Debian's `slurm-wlm` and `munge` run for real; nothing about SLURM is imitated:

- `munged` runs with its own key and socket in a private directory (never the system's);
- node 1 is network namespace A, node 2 is namespace B, joined by a veth pair shaped with tc tbf
  (`helpers.netns.shaped_link`, as the torchrun tests use), so traffic between the nodes crosses
  a link of a known rate;
- every daemon and client runs in a UTS and mount namespace of its own, with its own host name and
  a private /etc/hosts (bind-mounted) that names the two nodes and the controller: node names
  resolve as DNS would resolve them on a real cluster, without touching the machine's files;
- `slurmctld` runs in namespace A under the controller's name (a head node that is also node 1).

Clients (`sbatch`, `srun`, `scancel`, `squeue`, `scontrol`) run through `SlurmCluster.client`,
in namespace A with SLURM_CONF set. Everything is removed on exit: daemons killed, namespaces and
the private directory deleted. `unavailable_reason()` says why it cannot run here (not root, no
packages, no namespaces); `ensure_packages()` installs the Debian packages where apt can.

The same cluster can be brought up by hand: `python tests/helpers/slurm.py` prints the commands
and keeps it running until Enter is pressed (docs/multi-node.md, "A real SLURM cluster on one machine").
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

if __package__ in (None, ""):  # run as a script: make `helpers` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.netns import ShapedLink, shaped_link
from helpers.netns import unavailable_reason as netns_unavailable_reason

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "scancel", "squeue", "scontrol", "sinfo", "munge")
CONTROLLER = "tpctl"
NODES = ("tpnode1", "tpnode2")        # a node list SLURM writes as tpnode[1-2]
PARTITION = "tp"
CPUS_PER_NODE = 2                     # the machine's 2 cores, declared on each node
# SLURM reserves a port range per job step for the step's own use (MpiParams=ports, slurm.conf(5));
# srun then exports SLURM_STEP_RESV_PORTS, which topoprof takes for its rendezvous.
RESV_PORTS = "21000-21999"
CTLD_PORT = 6817                      # slurm.conf(5) defaults; each namespace has its own ports
SLURMD_PORT = 6818


def missing_programs() -> list[str]:
    return [p for p in (*DAEMONS, *CLIENTS, "nsenter", "unshare", "mount") if shutil.which(p) is None]


def ensure_packages() -> str | None:
    """Install slurm-wlm and munge from Debian's packages when they are missing and apt can;
    returns why not, or None when every program is there."""
    if not missing_programs():
        return None
    if os.geteuid() != 0:
        return "not root: cannot install slurm-wlm and munge"
    if shutil.which("apt-get") is None:
        return "slurm-wlm and munge are missing and there is no apt-get to install them"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=env, timeout=600)
        proc = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
                              capture_output=True, text=True, env=env, timeout=600)
    missing = missing_programs()
    if missing:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return f"could not install {' '.join(PACKAGES)} ({', '.join(missing)} missing): {tail[0]}"
    return None


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """None when a cluster can be made here, else why not (for pytest.skip)."""
    reason = netns_unavailable_reason()
    if reason:
        return f"network namespaces unavailable: {reason}"
    missing = missing_programs()
    if missing:
        return f"SLURM packages missing ({', '.join(missing)}); .ci/run installs slurm-wlm and munge"
    return None


@dataclass
class SlurmCluster:
    link: ShapedLink
    root: str                       # private directory: config, key, logs, spool, state
    conf: str                       # slurm.conf
    hosts: str                      # the /etc/hosts every member sees

    @property
    def nodes(self) -> tuple[str, str]:
        return NODES

    @property
    def partition(self) -> str:
        return PARTITION

    def node_addr(self, node: str) -> str:
        return self.link.addr_a if node == NODES[0] else self.link.addr_b

    def node_ns(self, node: str) -> str:
        return self.link.ns_a if node == NODES[0] else self.link.ns_b

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "GLOO_"))}
        env.pop("RANK", None)
        env.pop("WORLD_SIZE", None)
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def client(self, argv: Sequence[str]) -> list[str]:
        """`argv` as a client on the head node (namespace A, host name of the controller)."""
        return _in_node(self.link.ns_a, CONTROLLER, self.hosts, argv)

    def run(self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(self.client(argv), capture_output=True, text=True, timeout=timeout,
                              env=self.env(env), cwd=cwd)

    def log(self, name: str) -> str:
        """The tail of a daemon's log (slurmctld, or a node's slurmd), for failure messages."""
        path = os.path.join(self.root, f"{name}.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-40:])
        except OSError:
            return f"(no {path})"

    def node_processes(self, node: str, pattern: str) -> list[int]:
        """Pids of processes running in `node`'s namespace whose command line contains `pattern`."""
        out = subprocess.run(["ip", "netns", "pids", self.node_ns(node)], capture_output=True, text=True).stdout
        found = []
        for pid in (int(p) for p in out.split()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if pattern in cmd:
                found.append(pid)
        return found


def _in_node(ns: str, hostname: str, hosts: str, argv: Sequence[str]) -> list[str]:
    """`argv` in network namespace `ns`, in a UTS and mount namespace of its own named `hostname`
    with `hosts` as its /etc/hosts."""
    # nsenter, not `ip netns exec`: the latter mounts a fresh /sys without the cgroup hierarchy
    # that slurmd reads at start.
    script = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
    return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", hosts, hostname, *argv]


def _slurm_conf(root: str, link: ShapedLink) -> str:
    return "\n".join([
        "# written by tests/helpers/slurm.py: a two-node cluster in network namespaces",
        "ClusterName=topoprof",
        f"SlurmctldHost={CONTROLLER}({link.addr_a})",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.sock",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        f"MpiParams=ports={RESV_PORTS}",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "SlurmdTimeout=30",
        "KillWait=10",
        "MinJobAge=300",
        *(f"NodeName={n} NodeHostname={n} NodeAddr={a} CPUs={CPUS_PER_NODE} State=UNKNOWN"
          for n, a in zip(NODES, (link.addr_a, link.addr_b))),
        f"PartitionName={PARTITION} Nodes={NODES[0][:-1]}[1-2] Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def _start(argv: Sequence[str], log_path: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _wait_idle(cluster: SlurmCluster, daemons: list[subprocess.Popen], timeout_s: float) -> None:
    """Until both nodes have registered with the controller and are idle."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for proc in daemons:
            if proc.poll() is not None:
                raise RuntimeError(f"a SLURM daemon exited ({proc.args[-3:]}, rc {proc.returncode})\n"
                                   f"{cluster.log('slurmctld')}\n{cluster.log('slurmd.' + NODES[0])}")
        proc = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20)
        last = (proc.stdout + proc.stderr).strip()
        states = dict(line.split()[:2] for line in proc.stdout.splitlines() if len(line.split()) >= 2)
        if proc.returncode == 0 and all(states.get(n) == "idle" for n in NODES):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the nodes did not become idle in {timeout_s:g} s: {last}\n{cluster.log('slurmctld')}")


@contextmanager
def slurm_cluster(rate_mbit: float | None, start_timeout_s: float = 60.0) -> Iterator[SlurmCluster]:
    """A running two-node cluster whose nodes are joined by a link shaped to `rate_mbit`."""
    root = tempfile.mkdtemp(prefix="topoprof-slurm-")
    os.chmod(root, 0o711)             # munged wants its socket's directory searchable by all
    daemons: list[subprocess.Popen] = []
    try:
        with shaped_link(rate_mbit, prefix="tpsl") as link:
            for sub in ("state", "spool", *(f"spool/{n}" for n in NODES)):
                os.makedirs(os.path.join(root, sub), mode=0o700, exist_ok=True)
            key = os.path.join(root, "munge.key")
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
            os.chmod(key, 0o400)
            hosts = os.path.join(root, "hosts")
            with open(hosts, "w") as f:
                f.write(f"127.0.0.1 localhost\n{link.addr_a} {NODES[0]} {CONTROLLER}\n{link.addr_b} {NODES[1]}\n")
            os.chmod(hosts, 0o644)
            conf = os.path.join(root, "slurm.conf")
            with open(conf, "w") as f:
                f.write(_slurm_conf(root, link))
            cluster = SlurmCluster(link, root, conf, hosts)

            daemons.append(_start(["munged", "-F", "--force", f"--socket={root}/munge.sock",
                                   f"--key-file={key}", f"--pid-file={root}/munged.pid",
                                   f"--seed-file={root}/munged.seed", f"--log-file={root}/munged.log"],
                                  os.path.join(root, "munged.out")))
            _wait_for(lambda: os.path.exists(f"{root}/munge.sock"), 10, "munged did not create its socket")
            daemons.append(_start(_in_node(link.ns_a, CONTROLLER, hosts, ["slurmctld", "-D", "-i", "-f", conf]),
                                  os.path.join(root, "slurmctld.out")))
            for node in NODES:
                ns = cluster.node_ns(node)
                daemons.append(_start(_in_node(ns, node, hosts, ["slurmd", "-D", "-f", conf]),
                                      os.path.join(root, f"slurmd.{node}.out")))
            _wait_idle(cluster, daemons, start_timeout_s)
            yield cluster
    finally:
        for proc in reversed(daemons):
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(ready, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(what)
        time.sleep(0.05)


def main(argv: Sequence[str]) -> int:  # pragma: no cover - by hand and from .ci/run
    if "--install" in argv:
        reason = ensure_packages()
        print(f"SLURM packages: {reason or 'installed'}")
        return 1 if reason else 0
    reason = ensure_packages() or unavailable_reason()
    if reason:
        print(f"cannot start a cluster here: {reason}", file=sys.stderr)
        return 1
    rate = float(argv[0]) if argv else 1000.0
    with slurm_cluster(rate) as cluster:
        print(f"cluster up: nodes {', '.join(NODES)} at {cluster.link.addr_a}, {cluster.link.addr_b}; link shaped to "
              f"{rate:g} Mbit/s; partition {PARTITION}; config, logs and spool in {cluster.root}")
        print(f"clients run on the head node, for example:\n  SLURM_CONF={cluster.conf} "
              f"{shlex.join(cluster.client(['sinfo']))}")
        try:
            input("press Enter to stop the cluster ")
        except (EOFError, KeyboardInterrupt):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
