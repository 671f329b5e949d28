"""Where a rank's identity comes from: torchrun (or any env:// launcher), or Slurm's srun.

A rank of a job needs five things: its rank, the world size, its local rank on its node, its node, and the
rendezvous (``MASTER_ADDR``/``MASTER_PORT``) where rank 0's store listens. torchrun and other env://
launchers set them as ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``. srun sets
none of those; it sets its own: ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` (``SLURM_NTASKS``),
``SLURM_LOCALID``, ``SLURM_NODEID`` and the step's node list (``SLURM_STEP_NODELIST``, in Slurm's hostlist
syntax, ``node[01-04,07]``). Started by srun alone, diag takes them from there, as the tools that run under
srun do (Lightning's and submitit's Slurm environments): the rendezvous address is the step's first node
(where srun puts rank 0), the port is derived from the job and step ids, so every rank computes the same one
without talking to the others, and rank 0 checks that it is free before the store binds it.

``adopt()`` decides once per process and exports the env:// variables torch reads (plus ``DIAG_NODE_NAME``,
Slurm's name of the node), so everything after it (``init_process_group``, the raw transport's store, the
interface of the route to ``MASTER_ADDR``) runs as under torchrun; ``current()`` reads back what was decided.
Under ``srun ... torchrun`` torchrun's variables win: srun started the torchruns, torchrun the ranks. run.json
``launch`` records what came from where (docs/inplace.md, "Slurm").
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
from collections.abc import Mapping, MutableMapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from diag.errors import DiagError

# The port every rank of a Slurm step derives: PORT_BASE + (job id % 1000) * 10 + step id % 10, so steps
# 0..9 of one job differ and jobs 1000 ids apart are the only ones that meet. Below Linux's default
# ephemeral range (32768-60999): no outgoing connection of the node is handed this port by the kernel.
PORT_BASE = 20000
LAUNCH_ENV = "DIAG_LAUNCH"           # the decision, exported by adopt() so that current() reads it back
NODE_NAME_ENV = "DIAG_NODE_NAME"     # diag.inplace.topology's node name hint
SCONTROL_TIMEOUT_S = 10.0
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"   # where Slurm's commands look without SLURM_CONF

# What makes a process one rank of a launch; the ranks diag launches itself must not inherit them (a lab
# started from inside a Slurm step would otherwise read the step's tasks as its own ranks).
OWN_RANK_VARIABLES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", LAUNCH_ENV,
                                "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS"})

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass(frozen=True)
class SlurmStep:
    """The Slurm step a rank runs in (what srun said about it)."""

    job_id: str
    step_id: str
    nodelist: str                     # the step's node list as Slurm wrote it
    nodes: tuple[str, ...]            # expanded, in node id order
    tasks_per_node: tuple[int, ...]   # per node, in the same order
    node_name: str | None             # SLURMD_NODENAME: the node this rank runs on

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "nodes": list(self.nodes), "tasks_per_node": list(self.tasks_per_node)}


@dataclass(frozen=True)
class LaunchEnv:
    """This rank's identity in the job, with where each part came from (``sources``: key -> variable)."""

    launcher: str                     # "slurm", "torchrun" or "env" (another env:// launcher)
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    node_rank: int | None
    master_addr: str | None
    master_port: int | None
    sources: dict[str, str] = field(default_factory=dict)
    slurm: SlurmStep | None = None    # also under srun ... torchrun: the step torchrun runs in
    notes: tuple[str, ...] = ()       # what the launch means for the measurement, one line each

    def to_json(self) -> dict[str, Any]:
        """run.json ``launch``."""
        data = asdict(self)
        data["slurm"] = self.slurm.to_json() if self.slurm else None
        data["notes"] = list(self.notes)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchEnv:
        slurm = data.get("slurm")
        step = SlurmStep(**{**slurm, "nodes": tuple(slurm["nodes"]),
                            "tasks_per_node": tuple(slurm["tasks_per_node"])}) if slurm else None
        return cls(**{**data, "slurm": step, "notes": tuple(data.get("notes") or ())})

    def describe(self) -> str:
        """One line: where this rank's identity came from (rank 0 prints it)."""
        if self.launcher != "slurm":
            return (f"launch: {self.launcher}: rank {self.rank} of {self.world_size} from RANK/WORLD_SIZE"
                    + (f" (torchrun started by srun, Slurm job {self.slurm.job_id} step {self.slurm.step_id})"
                       if self.slurm else ""))
        assert self.slurm is not None
        return (f"launch: Slurm job {self.slurm.job_id} step {self.slurm.step_id}: {self.world_size} tasks on "
                f"{len(self.slurm.nodes)} node(s) ({self.slurm.nodelist}); rendezvous "
                f"{self.master_addr}:{self.master_port} ({self.sources['master_addr']}; port "
                f"{self.sources['master_port']})")


# --- Slurm's syntaxes -----------------------------------------------------------------------------------

def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax, in its order: ``node[01-03,07],gpu1`` -> node01 node02 node03 node07 gpu1;
    several bracket groups multiply (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2); a range keeps the digits of
    its lower bound (``[08-10]`` -> 08 09 10). What ``scontrol show hostnames`` prints (tests/test_slurm.py
    holds them side by side), without a slurm.conf; text after the last bracket (``n[1-2]-ib``), which
    Slurm 22.05 refuses, is kept as a suffix."""
    names: list[str] = []
    for item in _split_top_level(text.strip(), text):
        names.extend(_expand_item(item, text))
    return names


def _split_top_level(text: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise _bad_hostlist(whole, "nested brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise _bad_hostlist(whole, "']' without '['")
        elif char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise _bad_hostlist(whole, "'[' without ']'")
    items.append(text[start:])
    items = [item for item in items if item]   # "a,,b" is a and b, as Slurm reads it
    if not items:
        raise _bad_hostlist(whole, "no names")
    return items


def _expand_item(item: str, whole: str) -> list[str]:
    head, bracket, rest = item.partition("[")
    if not bracket:
        return [item]
    inside, _, tail = rest.partition("]")
    suffixes = _expand_item(tail, whole) if tail else [""]
    names = []
    for part in inside.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise _bad_hostlist(whole, f"{part!r} is not a number or a range a-b")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise _bad_hostlist(whole, f"range {part} runs backwards")
        width = len(low)
        names.extend(f"{head}{number:0{width}d}{suffix}" for number in range(int(low), int(high) + 1)
                     for suffix in suffixes)
    return names


def _bad_hostlist(text: str, why: str) -> DiagError:
    return DiagError(f"cannot read Slurm's node list {text!r}: {why}; run diag under srun, or set "
                     "MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE yourself")


def expand_counts(text: str) -> list[int]:
    """Slurm's per-node counts (``SLURM_STEP_TASKS_PER_NODE``): ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.split(","):
        match = _COUNT.match(part.strip())
        if not match:
            raise DiagError(f"cannot read Slurm's tasks per node {text!r} ({part!r} is not N or N(xM)); run diag "
                            "under srun, or set RANK and WORLD_SIZE yourself")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def derived_port(job_id: str, step_id: str) -> int:
    """The rendezvous port of a Slurm step: the same on every rank, different for the steps of one job."""
    job = int(job_id) if job_id.isdigit() else sum(job_id.encode())   # array jobs: 1234_5 -> a number still
    step = int(step_id) if step_id.isdigit() else 0
    return PORT_BASE + (job % 1000) * 10 + step % 10


# --- detection ------------------------------------------------------------------------------------------

def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """srun started this process: a step's task (a batch script has SLURM_JOB_ID and SLURM_PROCID=0 too,
    but no step id and no step task count)."""
    return all(environ.get(name) for name in ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"))


def detect(environ: Mapping[str, str] | None = None, resolve: bool = True) -> LaunchEnv | None:
    """This rank's identity, or None where no launcher started ranks (diag then launches its own).

    Precedence: what adopt() decided earlier in this process; torchrun/env:// (``RANK`` and ``WORLD_SIZE``),
    under srun too; then a Slurm step of two or more tasks (one task is a shell, not a job of ranks).
    ``resolve``: look up the step's first node's address (False in tests of the syntax alone). A launch whose
    parts disagree raises one line that says what to do."""
    env = os.environ if environ is None else environ
    if env.get("RANK") is not None:
        adopted = _adopted(env)
        if adopted is not None:
            return adopted
        return _from_env(env)
    if in_slurm_step(env) and _int(env, "SLURM_STEP_NUM_TASKS") > 1:
        return _from_slurm(env, resolve)
    return None


def current() -> LaunchEnv | None:
    """What adopt() decided (or what torchrun set), without looking anything up again."""
    return detect(resolve=False)


def adopt(iface: str | None = None, environ: MutableMapping[str, str] | None = None) -> LaunchEnv | None:
    """Detect the launch and, for Slurm, export the env:// variables (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and DIAG_NODE_NAME, so that torch and the rest of
    diag run as under torchrun. Rank 0 checks that a derived port is free. ``iface``: --iface, where given
    (then a first node that resolves to loopback here is no error). None: no launcher started ranks."""
    env = os.environ if environ is None else environ
    launch = detect(env)
    if launch is None or launch.launcher != "slurm" or LAUNCH_ENV in env:
        return launch
    if launch.master_addr and _is_loopback(launch.master_addr) and not (iface or env.get("GLOO_SOCKET_IFNAME")):
        raise DiagError(f"the step's first node resolves to {launch.master_addr} (loopback) on this host, an "
                        "address the other nodes cannot reach: pass --iface IFACE (the job's network "
                        "interface), or export MASTER_ADDR=<its address on the job's network> before srun")
    if launch.rank == 0 and launch.sources.get("master_port", "").startswith("derived"):
        _check_port_free(launch)
    assert launch.master_addr is not None and launch.master_port is not None
    exported = {"RANK": launch.rank, "WORLD_SIZE": launch.world_size, "LOCAL_RANK": launch.local_rank,
                "LOCAL_WORLD_SIZE": launch.local_world_size, "GROUP_RANK": launch.node_rank,
                "MASTER_ADDR": launch.master_addr, "MASTER_PORT": launch.master_port}
    env.update({name: str(value) for name, value in exported.items() if value is not None})
    if launch.slurm is not None and launch.slurm.node_name and not env.get(NODE_NAME_ENV):
        env[NODE_NAME_ENV] = launch.slurm.node_name
    if not (iface or env.get("GLOO_SOCKET_IFNAME")):
        # gloo binds the address its host name resolves to, which on a node may be 127.0.1.1 or nothing: bind
        # the interface diag measures and captures on, the route to the rendezvous, as --iface would.
        from diag.envinfo import interface_for

        chosen = interface_for(launch.master_addr)
        if chosen:
            env["GLOO_SOCKET_IFNAME"] = chosen
            launch = replace(launch, sources={**launch.sources,
                                              "iface": f"GLOO_SOCKET_IFNAME={chosen}: the route to MASTER_ADDR"})
    env[LAUNCH_ENV] = json.dumps(launch.to_json())
    return launch


def refuse_batch_script(command: str, environ: Mapping[str, str] | None = None) -> None:
    """Inside a Slurm job of several nodes but outside any srun step (its batch script, an salloc shell),
    diag would start ranks of its own on this one node and leave the others idle: one line instead."""
    env = os.environ if environ is None else environ
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    if env.get("SLURM_JOB_ID") and not in_slurm_step(env) and nodes.isdigit() and int(nodes) > 1:
        raise DiagError(f"{command} runs in Slurm job {env['SLURM_JOB_ID']} of {nodes} nodes but outside srun: start "
                        f"it with srun --ntasks-per-node 1 {command} ... (one rank per node)")


def launch_json() -> dict[str, Any] | None:
    """run.json ``launch``: this rank's launch (rank 0's, where rank 0 writes it)."""
    launch = current()
    return launch.to_json() if launch is not None else None


def _adopted(env: Mapping[str, str]) -> LaunchEnv | None:
    text = env.get(LAUNCH_ENV)
    if not text:
        return None
    try:
        launch = LaunchEnv.from_json(json.loads(text))
    except (TypeError, ValueError, KeyError):
        return None
    # A child that inherited the decision but was given another rank (a launcher of its own) is not it.
    return launch if str(launch.rank) == env.get("RANK") else None


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None or value == "":
        if default is not None:
            return default
        raise DiagError(f"{name} is not set; start diag with srun or torchrun (or set it)")
    try:
        return int(value)
    except ValueError:
        raise DiagError(f"{name}={value!r} is not a whole number; start diag with srun or torchrun") from None


def _slurm_step(env: Mapping[str, str]) -> SlurmStep | None:
    if not in_slurm_step(env):
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    counts = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    if not nodelist:
        raise DiagError("srun set no node list (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST); start diag with srun, "
                        "or set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE yourself")
    return SlurmStep(job_id=env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "",
                     step_id=env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "",
                     nodelist=nodelist, nodes=tuple(expand_hostlist(nodelist)),
                     tasks_per_node=tuple(expand_counts(counts)) if counts else (),
                     node_name=env.get("SLURMD_NODENAME") or None)


def _from_env(env: Mapping[str, str]) -> LaunchEnv:
    """torchrun (or any env:// launcher); under srun, check that srun started one torchrun per torchrun node."""
    launcher = "torchrun" if env.get("TORCHELASTIC_RUN_ID") else "env"
    rank, world_size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if not 0 <= rank < world_size:
        raise DiagError(f"RANK={rank} is outside WORLD_SIZE={world_size}; check the launcher's settings")
    sources = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
               "master_addr": "MASTER_ADDR", "master_port": "MASTER_PORT"}
    node_rank = _int(env, "GROUP_RANK") if env.get("GROUP_RANK") else None
    if node_rank is not None:
        sources["node_rank"] = "GROUP_RANK"
    slurm = _slurm_step(env)
    agents = env.get("GROUP_WORLD_SIZE")
    if slurm is not None and launcher == "torchrun" and agents and agents.isdigit():
        tasks = _int(env, "SLURM_STEP_NUM_TASKS")
        if tasks != int(agents):
            per_node = _per_node_text(slurm)
            raise DiagError(f"srun started {tasks} torchruns ({per_node}) but torchrun's job has {agents} nodes "
                            f"(--nnodes {agents}): start one torchrun per node, srun --nodes {agents} "
                            "--ntasks-per-node 1 torchrun --nnodes ...")
    port = env.get("MASTER_PORT")
    return LaunchEnv(launcher=launcher, rank=rank, world_size=world_size, local_rank=_int(env, "LOCAL_RANK", 0),
                     local_world_size=_int(env, "LOCAL_WORLD_SIZE") if env.get("LOCAL_WORLD_SIZE") else None,
                     node_rank=node_rank, master_addr=env.get("MASTER_ADDR") or None,
                     master_port=int(port) if port and port.isdigit() else None, sources=sources, slurm=slurm)


def _per_node_text(slurm: SlurmStep) -> str:
    counts = set(slurm.tasks_per_node)
    if len(counts) == 1:
        return f"{counts.pop()} per node on {len(slurm.nodes)} node(s)"
    return f"{','.join(map(str, slurm.tasks_per_node))} per node on {len(slurm.nodes)} nodes"


def _from_slurm(env: Mapping[str, str], resolve: bool) -> LaunchEnv:
    slurm = _slurm_step(env)
    assert slurm is not None
    rank, world_size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
    local_rank, node_rank = _int(env, "SLURM_LOCALID", 0), _int(env, "SLURM_NODEID", 0)
    _check_slurm(env, slurm, rank, world_size, local_rank, node_rank)
    sources = {"rank": "SLURM_PROCID", "world_size": "SLURM_STEP_NUM_TASKS", "local_rank": "SLURM_LOCALID",
               "node_rank": "SLURM_NODEID",
               "node_name": f"SLURM_NODEID {node_rank} of the step's node list "
                            f"({'SLURM_STEP_NODELIST' if env.get('SLURM_STEP_NODELIST') else 'SLURM_JOB_NODELIST'})"}
    local_world_size = slurm.tasks_per_node[node_rank] if slurm.tasks_per_node else None
    if local_world_size is not None:
        sources["local_world_size"] = "SLURM_STEP_TASKS_PER_NODE"
    if env.get("MASTER_ADDR"):
        master_addr: str | None = env["MASTER_ADDR"]
        sources["master_addr"] = "MASTER_ADDR (set before srun)"
    else:
        first = slurm.nodes[0]
        master_addr, how = resolve_node(first, env) if resolve else (first, "not resolved")
        sources["master_addr"] = f"the step's first node {first}, {how}"
    if env.get("MASTER_PORT"):
        master_port = _int(env, "MASTER_PORT")
        sources["master_port"] = "MASTER_PORT (set before srun)"
    else:
        master_port = derived_port(slurm.job_id, slurm.step_id)
        sources["master_port"] = (f"derived from SLURM_JOB_ID {slurm.job_id} and SLURM_STEP_ID {slurm.step_id}: "
                                  f"{PORT_BASE} + (job % 1000) * 10 + step % 10")
    notes = []
    if max(slurm.tasks_per_node or (1,)) > 1:
        notes.append(f"srun started {_per_node_text(slurm)}: ranks of one node share its host, so an N above "
                     f"{len(slurm.nodes)} is not N hosts; srun --ntasks-per-node 1 measures hosts")
    return LaunchEnv(launcher="slurm", rank=rank, world_size=world_size, local_rank=local_rank,
                     local_world_size=local_world_size, node_rank=node_rank, master_addr=master_addr,
                     master_port=master_port, sources=sources, slurm=slurm, notes=tuple(notes))


def _check_slurm(env: Mapping[str, str], slurm: SlurmStep, rank: int, world_size: int, local_rank: int,
                 node_rank: int) -> None:
    """srun's variables must describe one step; a process that inherited another step's or job's environment
    (or a user's export) does not."""
    fix = "start diag with srun directly (not from inside another step's environment), or under torchrun"
    ntasks = env.get("SLURM_NTASKS")
    if ntasks and ntasks.isdigit() and int(ntasks) != world_size:
        raise DiagError(f"Slurm's variables disagree: SLURM_NTASKS={ntasks} but SLURM_STEP_NUM_TASKS={world_size}; "
                        + fix)
    nodes = len(slurm.nodes)
    step_nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES")
    if step_nodes and step_nodes.isdigit() and int(step_nodes) != nodes:
        raise DiagError(f"Slurm's variables disagree: the node list {slurm.nodelist} holds {nodes} node(s) but "
                        f"SLURM_STEP_NUM_NODES={step_nodes}; " + fix)
    if slurm.tasks_per_node and (len(slurm.tasks_per_node) != nodes or sum(slurm.tasks_per_node) != world_size):
        raise DiagError(f"Slurm's variables disagree: tasks per node {','.join(map(str, slurm.tasks_per_node))} "
                        f"on the node list {slurm.nodelist} ({nodes} node(s)) do not make "
                        f"SLURM_NTASKS={world_size} tasks; " + fix)
    if not 0 <= rank < world_size:
        raise DiagError(f"SLURM_PROCID={rank} is outside the step's {world_size} tasks; " + fix)
    if not 0 <= node_rank < nodes:
        raise DiagError(f"SLURM_NODEID={node_rank} is outside the step's {nodes} node(s) ({slurm.nodelist}); " + fix)
    if slurm.tasks_per_node and not 0 <= local_rank < slurm.tasks_per_node[node_rank]:
        raise DiagError(f"SLURM_LOCALID={local_rank} is outside the {slurm.tasks_per_node[node_rank]} task(s) of "
                        f"node {slurm.nodes[node_rank]}; " + fix)
    if slurm.node_name and slurm.node_name != slurm.nodes[node_rank]:
        raise DiagError(f"Slurm's variables disagree: SLURMD_NODENAME={slurm.node_name} but SLURM_NODEID="
                        f"{node_rank} is {slurm.nodes[node_rank]} in {slurm.nodelist}; " + fix)
    if rank == 0 and node_rank != 0:
        raise DiagError(f"task 0 runs on {slurm.nodes[node_rank]}, not on the step's first node "
                        f"{slurm.nodes[0]} (a distribution such as -m arbitrary): export MASTER_ADDR=<address of "
                        "task 0's node> before srun")


# --- the rendezvous -------------------------------------------------------------------------------------

def resolve_node(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """A Slurm node's address and how it was found: Slurm's own NodeAddr (``scontrol show node``: the address
    Slurm reaches the node at, the same answer on every rank), else the name through the resolver, a
    non-loopback address first (Debian maps a host's own name to 127.0.1.1). DiagError where neither gives
    one. scontrol is asked only where a slurm.conf is found (without one it retries for a minute)."""
    env = os.environ if environ is None else environ
    node_addr = _scontrol_node_addr(name) if _slurm_config(env) else None
    if node_addr and node_addr != name:
        if _is_address(node_addr):
            return node_addr, f"NodeAddr {node_addr} from scontrol show node"
        name = node_addr
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise DiagError(f"cannot resolve the step's first node {name!r} ({exc.strerror or exc}) and scontrol "
                        "gave no NodeAddr: export MASTER_ADDR=<its address> before srun") from None
    addresses = [str(info[4][0]) for info in infos]
    ordered = sorted(addresses, key=lambda a: (_is_loopback(a), ":" in a))
    return ordered[0], f"resolved to {ordered[0]}"


def _slurm_config(env: Mapping[str, str]) -> bool:
    return any(os.path.isfile(path) for path in (env.get("SLURM_CONF") or "", DEFAULT_SLURM_CONF))


def _scontrol_node_addr(name: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bNodeAddr=(\S+)", out.stdout) if out.returncode == 0 else None
    return match.group(1) if match else None


def _is_address(text: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in text else socket.AF_INET, text)
    except OSError:
        return False
    return True


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address == "::1"


def _check_port_free(launch: LaunchEnv) -> None:
    """Rank 0: the derived port must be free here, where the store will listen on it (every address, as
    torch's TCPStore does; SO_REUSEADDR as it does too, so a closed connection's TIME_WAIT is no clash)."""
    assert launch.master_port is not None
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind((address, launch.master_port))
                probe.listen(1)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    continue
                raise DiagError(f"the rendezvous port {launch.master_port} ({launch.sources['master_port']}) is in "
                                f"use on {socket.gethostname()}: export MASTER_PORT=<a free port> before srun"
                                ) from None
            return


__all__ = ["PORT_BASE", "LaunchEnv", "SlurmStep", "adopt", "current", "derived_port", "detect",
           "expand_counts", "expand_hostlist", "in_slurm_step", "launch_json", "refuse_batch_script", "resolve_node"]
