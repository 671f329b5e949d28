"""An arm of an interleaved trial that is a program: one block = the arm's command started once on every rank
of the trial (each lab host, each rank of the in-place job) and timed by what it prints.

The trial (diag/trial.py) owns the rounds, the seeded order, the CPU samples, the decisions and the stop;
this module only runs one block of a command arm on this rank and, on the trial's rank 0, turns what the
ranks printed into one record through the arm's adapter (diag.external.adapters). The ranks meet through the
trial's own process group (the block's port and prefix, every rank's result) and its store (a rank whose
command failed tells the others, which stop theirs at once instead of waiting out the block's timeout).
What travels between ranks is data (diag.transports.messages: JSON, never a pickle), checked on arrival:
what rank 0 says goes into a shell command only as an address, a port or a name of letters and digits, and
what the other ranks printed reaches rank 0 as text for the adapter.

The command is the user's own shell command (``/bin/sh -c``), run in the directory ``diag trial`` was started
from, with these placeholders filled in (unknown braces are left alone) and the same values in the
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them, and DIAG_* for the rest):

  {rank} {world}           this rank and the world size of the trial
  {address} {master}       this host's address on the job's interface; rank 0's
  {addresses}              every rank's address, comma-separated, in rank order
  {iface}                  the job's interface (GLOO_SOCKET_IFNAME's first entry)
  {port} {prefix}          a free port on rank 0's host and a name, both new for every block
  {shared}                 a directory every host sees (the run directory's shared/, or --shared-dir)
  {output}                 a file of this rank's own for the program to write (read by file adapters)
  {bytes} {elements}       the per-rank size of this block, in bytes and in elements (--element-bytes)
  {total_bytes} {volume}   the op's total (nccl-tests' size) and the per-device volume D
  {iters} {warmup}         the trial's iterations and warm-up per block
  {arm} {round}            the arm's name and the round (from 0)
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.external import COMMAND_BACKEND
from diag.external.adapters import ProgramRow, adapter
from diag.units import human_bytes

OUTPUT_LIMIT = 256 << 10             # bytes of each stream a rank keeps (the tail) and sends to rank 0
RESULT_LIMIT = 8 << 20               # one rank's result message: three tails, JSON-escaped at worst 6 bytes a byte
RESULT_TAG = 0x7D1A                  # the point-to-point tag of a block's results on the trial's control group
STATUSES = ("ok", "exit", "timeout", "stopped")
_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,200}")
POLL_S = 0.05
CPU_SAMPLE_S = 0.25
KILL_GRACE_S = 2.0
PLACEHOLDERS = ("rank", "world", "address", "master", "addresses", "iface", "port", "prefix", "shared", "output",
                "bytes", "elements", "total_bytes", "volume", "iters", "warmup", "arm", "round")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


class ArmFailed(DiagError):
    """A block of an arm failed on some rank: the arm leaves the trial (every rank raises it alike)."""


@dataclass(frozen=True)
class CommandSettings:
    """What a command arm's knobs hold (TrialArm.knobs): the command and how to read and run it."""

    command: str
    adapter: str
    cwd: str = "/"
    shared_dir: str = ""
    outputs_dir: str = ""             # rank 0 writes every block's outputs here ("" where it is not shared)
    block_timeout_s: float = 600.0
    element_bytes: int = 4

    @classmethod
    def of(cls, knobs: Mapping[str, Any]) -> CommandSettings:
        return cls(**{k: v for k, v in knobs.items() if k in cls.__dataclass_fields__})


def expand(template: str, values: Mapping[str, Any]) -> str:
    """The command with its placeholders filled in; any other brace stays as it is (awk '{print $1}')."""
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def interface_address(iface: str | None) -> str:
    """This host's IPv4 address on ``iface`` (the job's interface), else the loopback address."""
    if not iface:
        return "127.0.0.1"
    import psutil

    for entry in psutil.net_if_addrs().get(iface, []):
        if entry.family.name == "AF_INET":
            return str(entry.address)
    return "127.0.0.1"


def _address(said: Any, rank: int) -> str:
    """A rank's address as another rank received it: an IP address, or the block cannot be run."""
    try:
        return str(ipaddress.ip_address(str(said)))
    except ValueError:
        raise DiagError(f"rank {rank} sent {str(said)[:60]!r} as its address: is every rank running the same "
                        "diag?") from None


def _block(said: Any) -> dict[str, Any]:
    """Rank 0's port and prefix of a block, checked before either reaches a shell command."""
    port = said.get("port") if isinstance(said, dict) else None
    prefix = said.get("prefix") if isinstance(said, dict) else None
    if (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
            or not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix)):
        raise DiagError("rank 0 sent a block's port and prefix that are not a port and a name; refused: is every "
                        "rank running the same diag?")
    return {"port": port, "prefix": prefix}


def _result(said: Any, rank: int) -> dict[str, Any]:
    """What rank ``rank`` says its command did, as rank 0 received it: known fields of known types (its rank is
    the one it was received from); anything else is a failed block naming it."""
    if not isinstance(said, dict):
        said = {}

    def text(key: str) -> str | None:
        value = said.get(key)
        return value[-OUTPUT_LIMIT:] if isinstance(value, str) else None

    def number(key: str, kind: type) -> Any:
        value = said.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(value, kind) \
            else None

    status = said.get("status") if said.get("status") in STATUSES else None
    return {"rank": rank, "host": str(said.get("host") or "?")[:64], "status": status or "exit",
            "rc": number("rc", int), "stdout": text("stdout") or "",
            "stderr": text("stderr") if status else "sent a result that is not diag's",
            "output": text("output"), "t_start_ns": number("t_start_ns", int) or 0,
            "t_end_ns": number("t_end_ns", int) or 0, "wall_s": float(number("wall_s", (int, float)) or 0.0),
            "busiest_thread": number("busiest_thread", (int, float))}


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - OUTPUT_LIMIT))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    """A program's last line as a failure line quotes it: control characters shown as escapes."""
    from diag.textsafe import visible

    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return visible(lines[-1][:200]) if lines else ""


class _ThreadCpu:
    """The busiest thread of a process tree, as CPU seconds, sampled while it runs (a lower bound: the last
    CPU_SAMPLE_S before it exits is not seen)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.busiest_s = 0.0
        self._next = 0.0

    def sample(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + CPU_SAMPLE_S
        import psutil

        try:
            root = psutil.Process(self.pid)
            for process in (root, *root.children(recursive=True)):
                for thread in process.threads():
                    self.busiest_s = max(self.busiest_s, thread.user_time + thread.system_time)
        except psutil.Error:
            pass


class CommandArm:
    """One command arm on one rank of a trial: ``measure`` runs one block (every rank calls it together)."""

    def __init__(self, arm: Any, rank: int, world: int, group: Any, trial: str) -> None:
        import torch.distributed as dist

        from diag.transports import messages

        self.arm = arm
        self.name = arm.name
        self.settings = CommandSettings.of(arm.knobs)
        self.adapter = adapter(self.settings.adapter)
        self.rank, self.world = rank, world
        self.trial = trial
        self.pg = group.control if group is not None else None
        self.leader = group.global_rank(0) if group is not None else 0
        self.store = group.store if group is not None else dist.distributed_c10d._get_default_store()
        self.iface = (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")[0]
        self.address = interface_address(self.iface)
        self.addresses = [_address(a, r) for r, a in enumerate(messages.all_gather(self.address, group=self.pg))]
        self.tmp = Path(tempfile.mkdtemp(prefix="diag-arm-"))
        self.cpu: dict[str, float | None] = {}   # this rank's last block: merged into the trial's CPU sample

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- one block ------------------------------------------------------------------------------------
    def measure(self, size: int, size_index: int, round_index: int, op: str, iters: int, warmup: int,
                run_id: str, heartbeat: Callable[[], None] | None = None) -> Any:
        """Run the block on this rank; the Record on rank 0, None elsewhere; ArmFailed on every rank where
        any rank's command failed, timed out or printed nothing its adapter reads."""
        from diag.collectives import make_collective
        from diag.transports import messages

        collective = make_collective(op)
        said = None
        if self.rank == 0:
            from diag.launch import free_port

            said = {"port": free_port(self.address),
                    "prefix": f"diag-{self.trial}-{self.name}-s{size_index}-r{round_index}-{os.urandom(3).hex()}"}
        block = _block(messages.broadcast(said, src=0, group=self.pg))
        output = self.tmp / f"{block['prefix']}.out"
        values = {"rank": self.rank, "world": self.world, "address": self.address, "master": self.addresses[0],
                  "addresses": ",".join(self.addresses), "iface": self.iface or "lo", "port": block["port"],
                  "prefix": block["prefix"], "shared": self.settings.shared_dir or str(self.tmp),
                  "output": output, "bytes": size, "elements": size // self.settings.element_bytes,
                  "total_bytes": collective.total_bytes(size, self.world),
                  "volume": collective.volume_bytes(size, self.world), "iters": iters, "warmup": warmup,
                  "arm": self.name, "round": round_index}
        command = expand(self.settings.command, values)
        result = self._run(command, values, block["prefix"], heartbeat)
        result["output"] = _tail(output) if output.exists() else None
        output.unlink(missing_ok=True)
        self.cpu = {"busiest_thread": result["busiest_thread"]} if result["busiest_thread"] is not None else {}
        record, failure = None, ""
        if self.rank == 0:
            results = [result, *(_result(messages.recv(r, RESULT_TAG, group=self.pg, limit=RESULT_LIMIT), r)
                                 for r in range(1, self.world))]
            record, failure = self._outcome(results, size, round_index, op, collective, command, run_id)
        else:
            messages.send(result, 0, RESULT_TAG, group=self.pg, limit=RESULT_LIMIT)
        verdict = messages.broadcast(failure, src=0, group=self.pg)
        if verdict:
            raise ArmFailed(str(verdict)[:2000])
        return record

    def _environment(self, values: Mapping[str, Any]) -> dict[str, str]:
        # torchrun's agent variables would send a torch program in the command to the agent's store (its
        # TORCHELASTIC_USE_AGENT_STORE): the command's own rendezvous is {master}:{port}, new every block.
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_") and k != "PYTHONSAFEPATH"}
        env.update({"RANK": str(values["rank"]), "WORLD_SIZE": str(values["world"]),
                    "MASTER_ADDR": str(values["master"]), "MASTER_PORT": str(values["port"])})
        env.update({f"DIAG_{key.upper()}": str(values[key]) for key in PLACEHOLDERS})
        return env

    def _run(self, command: str, values: Mapping[str, Any], prefix: str,
             heartbeat: Callable[[], None] | None) -> dict[str, Any]:
        failed_key = f"diag_arm/{prefix}/failed"
        out_path, err_path = self.tmp / f"{prefix}.stdout", self.tmp / f"{prefix}.stderr"
        started_ns = time.time_ns()
        started = time.monotonic()
        status, rc = "ok", None
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                process = subprocess.Popen(
                    guarded(command), cwd=self.settings.cwd, env=self._environment(values), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, start_new_session=True)
            except OSError as exc:
                self.store.set(failed_key, "1")
                return {"rank": self.rank, "host": self.address, "status": "exit", "rc": None,
                        "stdout": "", "stderr": f"cannot start the command: {exc}", "t_start_ns": started_ns,
                        "t_end_ns": time.time_ns(), "wall_s": 0.0, "busiest_thread": None}
            cpu = _ThreadCpu(process.pid)
            while True:
                rc = process.poll()
                if rc is not None:
                    break
                now = time.monotonic()
                cpu.sample(now)
                if now - started > self.settings.block_timeout_s:
                    status = "timeout"
                    self.store.set(failed_key, "1")
                    rc = _stop(process)
                    break
                if self.store.check([failed_key]):
                    status = "stopped"          # another rank's command failed: ours cannot finish alone
                    rc = _stop(process)
                    break
                if heartbeat is not None:
                    heartbeat()
                time.sleep(POLL_S)
        wall = time.monotonic() - started
        if status == "ok" and rc != 0:
            status = "exit"
            self.store.set(failed_key, "1")
        result = {"rank": self.rank, "host": self.address, "status": status, "rc": rc,
                  "stdout": _tail(out_path), "stderr": _tail(err_path), "t_start_ns": started_ns,
                  "t_end_ns": time.time_ns(), "wall_s": wall,
                  "busiest_thread": cpu.busiest_s / wall if cpu.busiest_s and wall > 0 else None}
        out_path.unlink(missing_ok=True)
        err_path.unlink(missing_ok=True)
        return result

    # --- rank 0: what the block measured ----------------------------------------------------------------
    def _outcome(self, results: list[dict[str, Any]], size: int, round_index: int, op: str, collective: Any,
                 command: str, run_id: str) -> tuple[Any, str]:
        where = f"arm {self.name} ({human_bytes(size)}, round {round_index + 1})"
        self._keep_outputs(results, size, round_index, command)
        failures = sorted((r for r in results if r["status"] != "ok"), key=lambda r: (r["status"] == "stopped", r["rank"]))
        if failures:
            first = failures[0]
            if first["status"] == "timeout":
                why = f"no end after {self.settings.block_timeout_s:g} s (--block-timeout)"
            elif first["status"] == "stopped":
                why = "stopped"
            else:
                why = f"exit {first['rc']}"
            said = _last_line(first["stderr"]) or _last_line(first["stdout"])
            return None, f"{where}: rank {first['rank']} on {first['host']}: {why}" + (f": {said}" if said else "")
        total = collective.total_bytes(size, self.world)
        found: list[tuple[int, ProgramRow]] = []
        printed: list[ProgramRow] = []
        for r in results:
            text = r["output"] if self.adapter.reads == "output" and r["output"] is not None else r["stdout"]
            rows = self.adapter.parse(text)
            printed.extend(rows)
            row = pick_row(rows, size, total)
            if row is not None:
                found.append((r["rank"], row))
        if not found:
            if printed:
                sizes = sorted({s for p in printed for s in (p.size_bytes, p.total_bytes) if s is not None})
                return None, (f"{where}: the program printed rows of {', '.join(map(str, sizes[:6]))} B but none of "
                              f"{size} B per rank ({total} B total): does the command pass {{bytes}} or {{elements}}?")
            said = _last_line(results[0]["stdout"]) or _last_line(results[0]["stderr"])
            return None, (f"{where}: printed nothing the adapter {self.adapter.name} reads"
                          + (f" (rank 0's last line: {said})" if said else " (no output)"))
        return self._record(results, found, size, op, collective, command, run_id), ""

    def _keep_outputs(self, results: list[dict[str, Any]], size: int, round_index: int, command: str) -> None:
        if not self.settings.outputs_dir:
            return
        from diag import safefs

        folder = Path(self.settings.outputs_dir) / f"n{self.world}" / self.name
        safefs.private_dir(folder)
        parts = [f"# diag trial {self.trial}, arm {self.name}, {size} B per rank, round {round_index + 1}\n"
                 f"# command (rank 0): {command}\n"]
        for r in results:
            parts.append(f"\n## rank {r['rank']} on {r['host']}: {r['status']}, exit {r['rc']}, {r['wall_s']:.3f} s\n"
                         f"### stdout\n{r['stdout']}### stderr\n{r['stderr']}")
            if r["output"] is not None:
                parts.append(f"### {{output}}\n{r['output']}")
        safefs.write_file(folder / f"{size}B-round{round_index + 1:03d}.txt", "".join(parts))

    def _record(self, results: list[dict[str, Any]], found: list[tuple[int, ProgramRow]], size: int, op: str,
                collective: Any, command: str, run_id: str) -> Any:
        from diag.records import Record
        from diag.stats import summarize

        # time = max over ranks, as the harness's: the rank that reported the slowest mean
        rank, row = max(found, key=lambda item: sum(item[1].times_s) / len(item[1].times_s))
        times = list(row.times_s)
        summary = summarize(times)
        total = collective.total_bytes(size, self.world)
        algbw = total / summary.median if summary.median > 0 else 0.0
        warnings = [] if row.statistic != "p50" else [
            "each block's time is the program's p50 (its output has no mean per iteration)"]
        return Record(
            backend=COMMAND_BACKEND, algo=self.name, op=op, world_size=self.world, size_bytes=size,
            total_bytes=total, volume_bytes=collective.volume_bytes(size, self.world),
            dtype=f"{self.settings.element_bytes}-byte elements", count=size // self.settings.element_bytes,
            iters=len(times), warmup=0, times_s=times, time_s=summary.median, min_s=summary.min,
            max_s=summary.max, mean_s=summary.mean, p95_s=summary.p95, stdev_s=summary.stdev, algbw_Bps=algbw,
            busbw_Bps=algbw * collective.bus_factor(self.world),
            nwrong=row.nwrong if row.nwrong is not None else -1,
            t_start_ns=min(r["t_start_ns"] for r in results), t_end_ns=max(r["t_end_ns"] for r in results),
            rank0_times_s=times if rank == 0 else [],
            knobs={"command": self.settings.command, "adapter": self.adapter.name},
            hosts=list(self.addresses),
            extra={"program": {"statistic": row.statistic, "reported_by_rank": rank, "row": row.fields,
                               "command": command, "wall_s": [round(r["wall_s"], 4) for r in results]}},
            run_id=run_id, warnings=warnings)


def guarded(command: str) -> list[str]:
    """``/bin/sh -c COMMAND`` that dies with this rank however the rank ends (the parent-death signal):
    through util-linux's setpriv, which costs no interpreter start per block (a second or more on a loaded
    machine), else through diag.lifeline."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, "--pdeathsig", "TERM", "--", "/bin/sh", "-c", command]
    from diag.lifeline import python_command

    return python_command("-m", "diag.lifeline", str(os.getpid()), "--", "/bin/sh", "-c", command)


def pick_row(rows: list[ProgramRow], size: int, total: int) -> ProgramRow | None:
    """The row of this block's size: the one whose per-rank or total size matches; rows without a size are
    this block's samples together; None where the program printed only other sizes."""
    sized = [r for r in rows if r.size_bytes == size or r.total_bytes == total]
    if sized:
        return sized[-1]
    unsized = [r for r in rows if r.size_bytes is None and r.total_bytes is None]
    if not unsized:
        return None
    times = tuple(t for r in unsized for t in r.times_s)
    wrong = [r.nwrong for r in unsized if r.nwrong is not None]
    return ProgramRow(times, unsized[0].statistic if len(unsized) == 1 else "samples",
                      nwrong=sum(wrong) if wrong else None, fields=unsized[-1].fields)


def _stop(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM to the command's process group, SIGKILL after a grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            return process.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
    try:
        return process.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        print(f"diag trial: the command (pid {process.pid}) did not stop", file=sys.stderr)
        return None


__all__ = ["COMMAND_BACKEND", "PLACEHOLDERS", "ArmFailed", "CommandArm", "CommandSettings", "expand", "guarded",
           "interface_address", "pick_row"]
