"""A real Slurm on the lab: slurmctld and one slurmd per namespace host, and the main job submitted through it.

Every lab host becomes a Slurm node: its namespace is the node's network (its address on the lab bridge is the
node's ``NodeAddr``), a UTS namespace of its own gives it its hostname (``h0``, ``h1``, ...: slurmctld and
slurmd find their node by it), and ``/etc/netns/<namespace>/hosts`` (which ``ip netns exec`` mounts over
/etc/hosts) resolves the nodes' names as a cluster's DNS does. munged runs on the machine (its socket is a
path, reachable from every namespace); slurmctld runs on h0, which is also the login node srun and sbatch run
on. What does not work inside a namespace, and what replaces it (docs/inplace.md, "Slurm"):

- slurmd's cgroup plugin autodetects the cgroup version from /sys/fs/cgroup, which ``ip netns exec`` hides
  under a fresh /sys ("No filesystem mounted on /sys/fs/cgroup ... slurmd initialization failed"):
  ``cgroup.conf`` names the version (``CgroupPlugin=cgroup/v1`` or ``cgroup/v2``, what the machine mounts)
  and no plugin uses cgroups (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
  ``JobAcctGatherType=jobacct_gather/none``);
- slurmctld refuses a host whose name is not ``SlurmctldHost`` ("This host (vm/vm) not a valid
  controller"): the UTS namespaces;
- munged wants its socket's directory reachable by everyone (mode 0755), its key's closed (0700).

Daemons run in the foreground (``-D``, ``-F``) as children of this process and are stopped by their PIDs;
state, spool, logs and the key live in one temporary directory, removed at the end.

    python -m bench.slurm_lab [--hosts 4] [--rate 200mbit] [--out DIR] [--plan "--quick"] [--rounds 1]

runs the same plan three ways on one lab and one Slurm: one torchrun per node started by hand (the in-place
run of tests/test_inplace.py), ``srun diag reproduce`` (Slurm's variables) and ``srun torchrun ... -m diag
reproduce`` (torchrun's), the last two through the sbatch scripts of docs/inplace.md; it prints each one's
wall time and verdicts side by side (tests/test_slurm.py runs the two Slurm forms on a smaller plan).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diag
from diag.lifeline import CHILD_CWD, child_env

# The docs of the tree this diag comes from (wherever this module lives: the sbatch scripts are the docs').
DOCS = Path(diag.__file__).resolve().parents[1] / "docs" / "inplace.md"
DAEMONS = ("munged", "slurmctld", "slurmd")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
NETNS_ETC = Path("/etc/netns")
# The apt packages this needs (.ci/setup --test installs them): the daemons, srun/sbatch/scontrol, munge.
APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")


def missing_tools() -> list[str]:
    """What this machine lacks to run a Slurm on the lab (empty: it can)."""
    tools = {"munged": "/usr/sbin/munged", "mungekey": "/usr/sbin/mungekey", "slurmctld": "/usr/sbin/slurmctld",
             "slurmd": "/usr/sbin/slurmd"}
    missing = [name for name, path in tools.items() if not (shutil.which(name) or os.access(path, os.X_OK))]
    missing += [name for name in ("srun", "sbatch", "scontrol", "sinfo", "unshare") if not shutil.which(name)]
    return missing


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def cgroup_plugin() -> str:
    """The cgroup version the machine mounts, named for cgroup.conf (slurmd cannot see it in a namespace)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mounts = handle.read()
    if re.search(r" /sys/fs/cgroup \S+ .* - cgroup2 ", mounts):
        return "cgroup/v2"
    return "cgroup/v1"


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class SlurmCluster:
    """A Slurm whose nodes are the lab's hosts. ``submit`` runs a command on h0, the login node."""

    lab: Any
    directory: Path
    daemons: list[Daemon] = field(default_factory=list)
    hosts_files: list[Path] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    def node_prefix(self, index: int) -> list[str]:
        """argv prefix that runs a command on node ``index``: its namespace, its hostname."""
        host = self.lab.hosts[index]
        return [*self.lab.exec_prefix(host), _tool("unshare"), "--uts", "/bin/sh", "-c",
                'hostname "$0" && exec "$@"', host.name]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What srun and sbatch pass to the job's tasks (Slurm's default --export=ALL): this diag first on
        PYTHONPATH, the cluster's slurm.conf."""
        return child_env({**os.environ, "SLURM_CONF": str(self.conf), "OMP_NUM_THREADS": "1",
                          "TORCH_CPP_LOG_LEVEL": "ERROR", **(extra or {})})

    def submit(self, argv: Sequence[str], log: Path, timeout_s: float, cwd: str = CHILD_CWD,
               env: Mapping[str, str] | None = None) -> tuple[int, float]:
        """Run ``argv`` (srun, sbatch --wait, ...) on the login node; its exit status and wall seconds. Past
        the timeout it is killed and the cluster's jobs cancelled."""
        started = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen([*self.node_prefix(0), *argv], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(env), cwd=cwd, start_new_session=True)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.scontrol_quiet(["scancel", "--full", "--user", "root"])
                code = -9
        return code, time.monotonic() - started

    def scontrol_quiet(self, argv: Sequence[str]) -> str:
        done = subprocess.run([*self.node_prefix(0), *argv], capture_output=True, text=True, env=self.env(),
                              timeout=30, check=False)
        return done.stdout

    def idle_nodes(self) -> list[str]:
        out = self.scontrol_quiet(["sinfo", "-h", "-N", "-o", "%N %T"])
        return [line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]]


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def slurm_conf(lab: Any, directory: Path, cpus: int) -> str:
    """One controller on h0, every host a node at its lab address; nothing that needs cgroups."""
    d = directory
    head = lab.hosts[0]
    lines = [
        f"ClusterName={lab.name.lower()}",
        f"SlurmctldHost={head.name}({head.address})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={d}/run/munge.sock", "CredType=cred/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none", "SwitchType=switch/none",
        "MpiDefault=none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MailProg=/bin/true",
        f"StateSaveLocation={d}/ctld", f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdSpoolDir={d}/spool/%n", f"SlurmdPidFile={d}/run/slurmd-%n.pid", f"SlurmdLogFile={d}/log/slurmd-%n.log",
        "ReturnToService=2", "SlurmctldDebug=info", "SlurmdDebug=info",
        # sbatch --wait polls the job after 2 s, then 4x longer each time (8, 32, 32 s) while the wait is under
        # half of MinJobAge (default 300): tests/test_slurm.py's 3-node job returned at 74 s, 52 s with 0 (job
        # records kept), where it polls every 2 s, so a submission's wall time is the job's.
        "MinJobAge=0",
        *(f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN" for h in lab.hosts),
        "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def slurm_cluster(lab: Any) -> Iterator[SlurmCluster]:
    """munged, slurmctld on h0 and a slurmd on every host, up and idle; everything stopped and removed after,
    on every path."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"Slurm is not installed here (missing {', '.join(missing)}): apt-get install "
                           + " ".join(APT_PACKAGES))
    directory = Path(tempfile.mkdtemp(prefix="diag-slurm-"))
    cluster = SlurmCluster(lab, directory)
    try:
        _start(cluster)
        yield cluster
    finally:
        _stop(cluster)


def _start(cluster: SlurmCluster) -> None:
    lab, d = cluster.lab, cluster.directory
    d.chmod(0o755)   # munged: every directory above its socket must be searchable by everyone
    for sub, mode in (("munge", 0o700), ("run", 0o755), ("ctld", 0o700), ("log", 0o755), ("spool", 0o755)):
        (d / sub).mkdir(mode=mode)
        (d / sub).chmod(mode)
    # The nodes' names resolve in every namespace, as on a cluster (ip netns exec mounts these over /etc/hosts).
    hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in lab.hosts)
    for host in lab.hosts:
        folder = NETNS_ETC / host.netns
        folder.mkdir(parents=True, exist_ok=False)
        cluster.hosts_files.append(folder)
        _write(folder / "hosts", hosts)
    subprocess.run([_tool("mungekey"), "--create", "--keyfile", str(d / "munge" / "munge.key")], check=True,
                   capture_output=True)
    _write(d / "slurm.conf", slurm_conf(lab, d, os.cpu_count() or 1))
    _write(d / "cgroup.conf", f"CgroupPlugin={cgroup_plugin()}\nCgroupAutomount=no\n")
    _daemon(cluster, "munged", [_tool("munged"), "-F", f"--key-file={d}/munge/munge.key",
                                f"--socket={d}/run/munge.sock", f"--pid-file={d}/run/munged.pid",
                                f"--seed-file={d}/munge/seed", f"--log-file={d}/log/munged.log"])
    _wait(lambda: (d / "run" / "munge.sock").exists(), "munged's socket", cluster)
    _daemon(cluster, "slurmctld", [*cluster.node_prefix(0), _tool("slurmctld"), "-D"])
    _wait(lambda: "UP" in cluster.scontrol_quiet(["scontrol", "ping"]), "slurmctld answering scontrol ping",
          cluster)
    for index, host in enumerate(lab.hosts):
        _daemon(cluster, f"slurmd-{host.name}", [*cluster.node_prefix(index), _tool("slurmd"), "-D"])
    _wait(lambda: len(cluster.idle_nodes()) == len(lab.hosts), "every slurmd registered and idle", cluster)


def _daemon(cluster: SlurmCluster, name: str, argv: list[str]) -> None:
    log = cluster.directory / "log" / f"{name}.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=cluster.env(), cwd=CHILD_CWD, start_new_session=True)
    cluster.daemons.append(Daemon(name, proc, log))


def _wait(ready: Any, what: str, cluster: SlurmCluster) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [d for d in cluster.daemons if d.proc.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited with status {dead[0].proc.returncode} while waiting for "
                               f"{what}: {_tail(dead[0].log)} {_tail(cluster.directory / 'log' / (dead[0].name + '.log'))}")
        if ready():
            return
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {START_TIMEOUT_S:.0f} s waiting for {what}; "
                       + " ".join(_tail(p) for p in sorted((cluster.directory / "log").glob("*.log"))))


def _tail(path: Path, chars: int = 600) -> str:
    try:
        return f"[{path.name}: {path.read_text(errors='replace')[-chars:].strip()}]"
    except OSError:
        return ""


def _stop(cluster: SlurmCluster) -> None:
    """Stop the daemons this process started, by their PIDs, the nodes first; then remove what was written."""
    for daemon in reversed(cluster.daemons):
        if daemon.proc.poll() is None:
            daemon.proc.terminate()
    for daemon in reversed(cluster.daemons):
        try:
            daemon.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait()
    for folder in cluster.hosts_files:
        shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(cluster.directory, ignore_errors=True)


# --- the docs' sbatch scripts ---------------------------------------------------------------------------

def docs_script(name: str) -> str:
    """The sbatch script ``name`` of docs/inplace.md (the fenced block whose first comment line names it)."""
    text = DOCS.read_text()
    for block in re.findall(r"```sh\n(#!/bin/bash\n.*?)```", text, flags=re.S):
        if re.search(rf"^# {re.escape(name)}\b", block, flags=re.M):
            return block
    raise LookupError(f"docs/inplace.md has no sbatch script named {name}")


def write_script(directory: Path, name: str) -> Path:
    path = directory / name
    _write(path, docs_script(name), 0o755)
    return path


def diag_on_path(directory: Path) -> str:
    """A ``diag`` command for the nodes that runs this tree's diag (an installed diag's script does the same)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    _write(bin_dir / "diag", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m diag "$@"\n', 0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def sbatch(cluster: SlurmCluster, script: Path, nodes: int, args: Sequence[str], log: Path, timeout_s: float,
           env: Mapping[str, str] | None = None) -> tuple[int, float]:
    """Submit ``script`` on ``nodes`` nodes and wait for it (sbatch --wait); the job's output in ``log``."""
    return cluster.submit([_tool("sbatch"), "--wait", "--nodes", str(nodes), "--output", str(log),
                           str(script), *args], log.with_suffix(".sbatch"), timeout_s, cwd=str(script.parent),
                          env=env)


# --- the A/B command ------------------------------------------------------------------------------------

FORMS = ("torchrun by hand", "srun diag", "srun torchrun")
SCRIPTS = {"srun diag": "diag-srun.sbatch", "srun torchrun": "diag-torchrun.sbatch"}


def run_form(form: str, lab: Any, cluster: SlurmCluster, plan: list[str], out: Path, work: Path,
             timeout_s: float) -> dict[str, Any]:
    """One run of the plan, started one of the three ways; its wall time, exit status, run directory, load."""
    from bench.inplace_lab import start_nodes

    load = os.getloadavg()[0]
    if form == "torchrun by hand":
        run = start_nodes(lab, [*plan, "--iface", lab.hosts[0].iface, "--out", str(out)], out.with_suffix(".logs"))
        codes = run.wait(timeout_s)
        seconds, code = time.monotonic() - run.started, max(codes.values(), key=abs)
    else:
        script = write_script(work, SCRIPTS[form])
        code, seconds = sbatch(cluster, script, len(lab.hosts), [*plan, "--out", str(out)],
                               out.with_suffix(".log"), timeout_s, env={"PATH": diag_on_path(work)})
    return {"form": form, "seconds": seconds, "rc": code, "dir": out, "load": (load, os.getloadavg()[0])}


def main(argv: Sequence[str] | None = None) -> int:
    from bench.inplace_lab import verdicts
    from diag.lab import LabConfig, lab_session

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/slurm-ab-{os.getpid()}"))
    parser.add_argument("--plan", default="--quick", help="diag reproduce's plan options, as one string")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each form; the order rotates every round, so load falls on all of them")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    plan = [*shlex.split(args.plan), "--max-n", str(args.hosts)]
    args.out.mkdir(parents=True, exist_ok=True)
    args.out.chmod(0o755)
    rows: list[dict[str, Any]] = []
    with lab_session(LabConfig(name=f"sl{os.getpid() % 100000}", hosts=args.hosts, rate=args.rate)) as lab, \
            slurm_cluster(lab) as cluster:
        for round_index in range(args.rounds):
            order = FORMS[round_index % 3:] + FORMS[:round_index % 3]
            for form in order:
                out = args.out / f"r{round_index + 1}-{form.replace(' ', '-')}"
                rows.append(run_form(form, lab, cluster, plan, out, args.out, args.timeout))
                print(f"{out.name}: {rows[-1]['seconds']:.1f} s rc={rows[-1]['rc']}", flush=True)
    for row in rows:
        found = verdicts(row["dir"]) if (row["dir"] / "report" / "findings.json").exists() else {}
        print(f"{row['dir'].name:26s} {row['seconds'] / 60:5.2f} min (load {row['load'][0]:.1f} -> "
              f"{row['load'][1]:.1f}) rc={row['rc']} dip={found.get('dip')} mechanism={found.get('mechanism')} "
              f"{','.join(found.get('mechanism_names', []))} workarounds="
              + ", ".join(f"{k} {v:.2f}x" for k, v in (found.get("speedups") or {}).items() if v))
    mean = {form: sum(r["seconds"] for r in rows if r["form"] == form) / args.rounds for form in FORMS}
    for form in FORMS[1:]:
        print(f"{form} / torchrun by hand wall time: {mean[form] / mean[FORMS[0]]:.2f}")
    return 0 if all(row["rc"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
