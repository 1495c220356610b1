"""What a launcher and a shared fork server (`topoprof.probes.ranks.fork_server --listen`) must
agree on before the server may fork the launcher's ranks.

A rank forked from a server runs the Python, the project and the modules the server imported,
which read part of their environment once, as they are imported: OpenMP's and MKL's thread
settings, torch's and CUDA's switches, Python's own paths. It also runs where the server runs: in
its namespaces, control groups, CPUs and limits. A launcher that differs in any of these would get
ranks that are not what a server of its own would have started, so the two compare
`import_fingerprint`s and the launcher starts its own server when they differ. Everything else in
a rank's environment is set after the fork, from the launcher's request.
"""
from __future__ import annotations

import os
import resource
import sys

import topoprof

# the environment variable that names a shared server's socket to every launcher that inherits it
SHARED_SERVER_VAR = "TOPOPROF_FORK_SERVER"

# variables read when Python, torch (OpenMP, MKL, CUDA) or the project are imported, not later
_READ_AT_IMPORT = ("PYTHON", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA", "LD_")
# the limits a job's processes are held to (SLURM propagates the submitting shell's by default)
_LIMITS = ("RLIMIT_NOFILE", "RLIMIT_MEMLOCK", "RLIMIT_STACK", "RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_NPROC")

# Not compared: PYTHONUNBUFFERED, set by the launcher for its server alone (its log is read while
# it is written); TORCHINDUCTOR_CACHE_DIR, which torch itself sets to its default where it is unset
# (torch/_inductor/runtime/cache_dir_utils.py) and reads as it compiles, in the rank, after the fork.
_NOT_COMPARED = frozenset({"PYTHONUNBUFFERED", "TORCHINDUCTOR_CACHE_DIR"})


def project_root() -> str:
    """The folder the running topoprof is imported from: a server must import the same one."""
    return os.path.dirname(os.path.dirname(os.path.abspath(topoprof.__file__)))


def server_env(env: dict) -> dict:
    """`env` as a fork server started for it gets it: the project's root first on PYTHONPATH, so
    that the server imports the same topoprof as its launcher, wherever it runs from."""
    return dict(env, PYTHONUNBUFFERED="1", PYTHONPATH=project_root() + os.pathsep + env.get("PYTHONPATH", ""))


def import_fingerprint(env: dict) -> dict:
    """What a server started here with `env` (as `server_env` gives it) has imported from, and where
    its forks run: equal fingerprints, equal ranks."""
    read = {k: v for k, v in env.items() if k.startswith(_READ_AT_IMPORT) and k not in _NOT_COMPARED}
    if "PYTHONPATH" in read:
        read["PYTHONPATH"] = _search_path(read["PYTHONPATH"])
    return {"python": sys.executable, "root": project_root(), "env": dict(sorted(read.items())),
            "process": _where_it_runs()}


def _where_it_runs() -> dict:
    """What a fork inherits from its parent and not from whoever asked for it: the namespaces (a
    SLURM node made of network and UTS namespaces is another host), the control groups, CPUs and
    limits a job is confined to, and the user."""
    found: dict = {"ids": [os.getuid(), os.getgid()]}
    for ns in ("net", "uts", "mnt", "pid", "ipc", "user", "cgroup"):
        try:
            found[f"{ns} namespace"] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError:  # not Linux, or no /proc: nothing to tell apart
            pass
    try:
        with open("/proc/self/cgroup") as f:
            found["cgroups"] = f.read()
    except OSError:
        pass
    if hasattr(os, "sched_getaffinity"):
        found["cpus"] = sorted(os.sched_getaffinity(0))
    found["limits"] = {name: list(resource.getrlimit(getattr(resource, name))) for name in _LIMITS
                       if hasattr(resource, name)}
    return found


def _search_path(pythonpath: str) -> str:
    """PYTHONPATH as the folders Python searches for it: each once, at its first place (site.py's
    removeduppaths), without the empty entries, which name the working directory that `python -m`
    searches first anyway."""
    return os.pathsep.join(dict.fromkeys(p for p in pythonpath.split(os.pathsep) if p))


def how_they_differ(ours: dict, theirs: dict) -> str | None:
    """What differs between two fingerprints, in words; None where nothing does."""
    for key in ("python", "root"):
        if ours.get(key) != theirs.get(key):
            return f"its {key} is {theirs.get(key)!r}, not {ours.get(key)!r}"
    for part in ("env", "process"):
        mine, yours = ours.get(part, {}), theirs.get(part, {})
        for name in sorted(set(mine) | set(yours)):
            if mine.get(name) != yours.get(name):
                return f"its {name} is {yours.get(name)!r}, not {mine.get(name)!r}"
    return None
