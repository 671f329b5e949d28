"""The run directory where it is not shared: the run's records to every node's leader, and every node's files
to rank 0, one file at a time in bounded chunks over the job's group (docs/inplace.md, "Trust model").

What a node sends is data. Rank 0 names each node's folder from the rank it receives from (the node's
leader in rank 0's own topology), never from the message; it takes only relative paths of the shapes a node
writes (``fingerprint.json``, ``captures/``, ``analysis/``, ``observe/``, ``tcpinfo/`` with plain file
names; nodes/<node>/records/ are the run's own records, never taken back), refuses anything else by name,
and writes what it takes below its own handle of ``nodes/<node>/`` (diag.safefs.Dir), so no name can reach
outside it. A node reads what it sends without following symlinks and only from regular files. Every file
has a size the node announced before a byte of it moved; rank 0 takes a file only while it fits in what one
node (``SHIP_NODE_BYTES``) and the whole run (``SHIP_TOTAL_BYTES``) may send, results before captures, and
holds one chunk (``CHUNK_BYTES``) of it in memory at a time. What does not fit stays on its node, and
run.json's ``left_on_nodes`` says where (the node's own copy of the run directory, at the same path).

The records go the other way by broadcast: rank 0 announces their names and sizes, every rank checks them
(plain ``*.jsonl`` names, sizes within ``RECORDS_TOTAL_BYTES``) before a byte moves, and each node's leader
writes them below its own handle of ``nodes/<node>/records/``.

One exchange per node, between rank 0 and that node's leader only (the other ranks wait in the job's
barrier):

1. the leader sends its manifest: ``{"files": [[path, bytes], ...], "skipped": [[path, why], ...]}``;
2. rank 0 answers ``{"take": [index, ...]}`` (what it checked and has room for, in its order);
3. the leader sends each file taken, in chunks of ``CHUNK_BYTES`` (the last one shorter), exactly the bytes it
   announced (a file that shrank meanwhile is padded and named), then ``{"changed": [index, ...]}``; rank 0
   keeps a file only when it arrived whole and unchanged, renamed into place from a temporary name.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diag import safefs
from diag.errors import DiagError
from diag.units import human_bytes

if TYPE_CHECKING:
    from diag.inplace.world import World

CHUNK_BYTES = 4 << 20            # what rank 0 holds of a node's file at once (and each leader of the records)
SHIP_NODE_BYTES = 1 << 30        # what one node may send rank 0
SHIP_TOTAL_BYTES = 8 << 30       # what all nodes together may send rank 0 (its disk)
RECORDS_TOTAL_BYTES = 1 << 30    # the run's records, to every node (the analysis cuts captures by them)
MAX_FILES_PER_NODE = 20_000
MAX_NAME_CHARS = 200

_NAME = rf"[A-Za-z0-9][A-Za-z0-9._,=+-]{{0,{MAX_NAME_CHARS - 1}}}"
# The shapes of what a node writes into nodes/<node>/ (diag.inplace.node): anything else is refused by name.
NODE_FILE = re.compile(rf"fingerprint\.json|captures/{_NAME}\.(?:pcap|capture\.json)|analysis/{_NAME}\.json"
                       rf"|observe/{_NAME}\.jsonl|tcpinfo/{_NAME}\.jsonl")
RECORD_NAME = re.compile(rf"{_NAME}\.jsonl")
NODE_SUBDIRS = ("captures", "analysis", "observe", "tcpinfo")
_TEMPORARY = re.compile(r"\..*\.tmp")    # safefs's own temporary files, never results


def node_file_problem(relative: Any, keep_pcaps: bool) -> str | None:
    """Why rank 0 does not take a file a node offers under this name (None: the name is one it takes)."""
    if not isinstance(relative, str) or not NODE_FILE.fullmatch(relative) or ".." in relative:
        return "not a path of a node's results (fingerprint.json, captures/, analysis/, observe/, tcpinfo/)"
    if relative.endswith(".pcap") and not keep_pcaps:
        return "a capture, kept on its node without --keep-pcaps"
    return None


def record_name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not RECORD_NAME.fullmatch(name) or ".." in name:
        return "not a plain records file name (*.jsonl)"
    return None


@dataclass
class Outgoing:
    """A file a node offers: its path below nodes/<node>/, its size, and the descriptor it was measured on."""

    relative: str
    size: int
    fd: int


@dataclass
class Left:
    """A file that stays on its node: where, how big, why."""

    path: str
    size: int | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.size, "why": self.why}


@dataclass
class Budget:
    """What the nodes may still send rank 0 in this run."""

    total: int = SHIP_TOTAL_BYTES
    per_node: int = SHIP_NODE_BYTES


@dataclass
class NodeShipment:
    """What rank 0 took from one node and what stayed there."""

    node: str
    written: list[str] = field(default_factory=list)
    bytes: int = 0
    left: list[Left] = field(default_factory=list)


def _close_all(files: Sequence[Outgoing]) -> None:
    for f in files:
        with contextlib.suppress(OSError):
            os.close(f.fd)


# --- the node's side ------------------------------------------------------------------------------------

def list_node_files(directory: safefs.Dir, keep_pcaps: bool) -> tuple[list[Outgoing], list[Left]]:
    """The node's files to offer rank 0 (results first, then captures; each opened once, without following
    a symlink, and measured on that descriptor) and what it will not offer, with why. The caller closes
    the descriptors (:func:`send_node_files` does)."""
    offered: list[Outgoing] = []
    skipped: list[Left] = []
    candidates: list[tuple[str, safefs.Dir]] = []
    handles: list[safefs.Dir] = []
    try:
        for name, info in directory.entries():
            if stat.S_ISREG(info.st_mode):
                candidates.append((name, directory))
            elif name in NODE_SUBDIRS and stat.S_ISDIR(info.st_mode):
                sub = directory.open_dir(name)
                handles.append(sub)
                for child, child_info in sub.entries():
                    if stat.S_ISREG(child_info.st_mode):
                        candidates.append((f"{name}/{child}", sub))
                    elif not stat.S_ISDIR(child_info.st_mode):
                        skipped.append(Left(f"{name}/{child}", None, "not a regular file (a symlink is never followed)"))
            elif name != "records" and not stat.S_ISDIR(info.st_mode):
                skipped.append(Left(name, None, "not a regular file (a symlink is never followed)"))
        for relative, parent in candidates:
            leaf = relative.rsplit("/", 1)[-1]
            if _TEMPORARY.fullmatch(leaf):
                continue
            why = node_file_problem(relative, keep_pcaps)
            if why is not None:
                skipped.append(Left(relative, None, why))
                continue
            fd = parent.open_read(leaf)
            if fd is None:
                skipped.append(Left(relative, None, "not a regular file when opened (a symlink is never followed)"))
                continue
            offered.append(Outgoing(relative, os.fstat(fd).st_size, fd))
    except BaseException:
        _close_all(offered)
        raise
    finally:
        for handle in handles:
            handle.close()
    offered.sort(key=lambda f: (f.relative.endswith(".pcap"), f.relative))   # results before captures
    return offered, skipped


def send_node_files(world: World, files: list[Outgoing], skipped: list[Left], what: str) -> None:
    """The leader's side of one exchange with rank 0 (module docstring). Closes the files' descriptors."""
    import torch

    try:
        world.send({"files": [[f.relative, f.size] for f in files[:MAX_FILES_PER_NODE]],
                    "skipped": [[s.path, s.why] for s in skipped[:MAX_FILES_PER_NODE]]}, 0, what)
        answer = world.recv(0, what)
        take = answer.get("take") if isinstance(answer, dict) else None
        if not isinstance(take, list) or not all(isinstance(i, int) and 0 <= i < len(files) for i in take):
            raise DiagError(f"{what}: rank 0 answered the node's list of files with something diag cannot use")
        changed = []
        buffer = torch.zeros(CHUNK_BYTES, dtype=torch.uint8)
        view = memoryview(buffer.numpy())
        for index in take:
            f = files[index]
            os.lseek(f.fd, 0, os.SEEK_SET)
            left = f.size
            while left:
                n = min(left, CHUNK_BYTES)
                got = _read_into(f.fd, view[:n])
                if got < n:
                    view[got:n] = bytes(n - got)   # it shrank while it was sent: padded, named below
                    changed.append(index)
                world.send_chunk(buffer[:n], 0, what)
                left -= n
            if os.read(f.fd, 1):
                changed.append(index)             # it grew: what was sent is not the file
        world.send({"changed": sorted(set(changed))}, 0, what)
    finally:
        _close_all(files)


def _read_into(fd: int, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            break
        got += n
    return got


# --- rank 0's side --------------------------------------------------------------------------------------

def receive_node_files(world: World, src: int, node: str, directory: safefs.Dir, budget: Budget,
                       keep_pcaps: bool, what: str, node_path: str) -> NodeShipment:
    """Rank 0's side of one exchange with the leader ``src`` of ``node``: its files, checked, written below
    ``directory`` (rank 0's handle of nodes/<node>/); ``node_path``: where that folder is on the node."""
    import torch

    shipment = NodeShipment(node)
    try:
        files, skipped = _parse_manifest(world.recv(src, what), node, src)
    except DiagError as exc:   # MessageError too: nothing is taken, and the leader is told so before the job stops
        world.send({"take": []}, src, what)
        raise DiagError(f"{what}: {exc}") from None
    for path, why in skipped:
        shipment.left.append(Left(f"{node_path}/{path}", None, why))
    take: list[int] = []
    node_left = budget.per_node
    seen: set[str] = set()
    for index, (relative, size) in enumerate(files):
        why = node_file_problem(relative, keep_pcaps)
        if why is None and relative in seen:
            why = "offered twice"
        elif why is None and size > min(node_left, budget.total):
            why = (f"{human_bytes(size)} does not fit in what is left of the {human_bytes(budget.per_node)} a node "
                   f"may send rank 0 ({human_bytes(min(node_left, budget.total))})")
        if why is not None:
            shipment.left.append(Left(f"{node_path}/{relative}", size, why))
            continue
        seen.add(relative)
        take.append(index)
        node_left -= size
        budget.total -= size
    world.send({"take": take}, src, what)
    buffer = torch.zeros(CHUNK_BYTES, dtype=torch.uint8)
    view = memoryview(buffer.numpy())
    arrived: list[tuple[int, safefs.Dir, str, str]] = []   # written whole under a temporary name
    try:
        for index in take:
            relative, size = files[index]
            folder, _, name = relative.rpartition("/")
            target = directory.open_dir(folder, create=True) if folder else safefs.Dir(os.dup(directory.fd),
                                                                                    directory.path)
            scratch = f".{name}.{os.getpid()}.tmp"
            try:
                fd = target.create(scratch, replace=True)
                try:
                    left = size
                    while left:
                        n = min(left, CHUNK_BYTES)
                        world.recv_chunk(buffer[:n], src, what)
                        _write_all(fd, view[:n])
                        left -= n
                finally:
                    os.close(fd)
            except BaseException:
                target.remove(scratch)
                target.close()
                raise
            arrived.append((index, target, scratch, name))
        answer = world.recv(src, what)
        changed = answer.get("changed") if isinstance(answer, dict) else None
        if not isinstance(changed, list):
            changed = list(take)   # no word on which arrived whole: none is kept
        for index, target, scratch, name in arrived:
            relative, size = files[index]
            if index in changed:
                shipment.left.append(Left(f"{node_path}/{relative}", size, "changed on the node while it was sent"))
                continue
            target.rename(scratch, name)
            shipment.written.append(relative)
            shipment.bytes += size
    finally:
        for _, target, scratch, _ in arrived:
            target.remove(scratch)   # renamed ones are gone from there already
            target.close()
    return shipment


def _parse_manifest(manifest: Any, node: str, src: int) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
    def bad(why: str) -> DiagError:
        return DiagError(f"node {node} (rank {src}) sent a list of files diag cannot use ({why}); is every rank "
                         "running the same diag?")

    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list) \
            or not isinstance(manifest.get("skipped", []), list):
        raise bad("not a manifest")
    if len(manifest["files"]) > MAX_FILES_PER_NODE:
        raise bad(f"more than {MAX_FILES_PER_NODE} files")
    files = []
    for entry in manifest["files"]:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and not isinstance(entry[1], bool) and entry[1] >= 0):
            raise bad("an entry that is not [path, bytes]")
        files.append((entry[0][:MAX_NAME_CHARS + 16], entry[1]))
    skipped = [(str(e[0])[:MAX_NAME_CHARS + 16], str(e[1])[:200]) for e in manifest.get("skipped", [])[:100]
               if isinstance(e, list) and len(e) == 2]
    return files, skipped


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]


# --- the records, from rank 0 to every node -------------------------------------------------------------

def share_records(world: World, records: safefs.Dir | None, local: Callable[[], safefs.Dir] | None,
                  what: str = "sharing the records") -> tuple[list[str], str | None]:
    """Every rank calls it. Rank 0 passes its handle of records/ (``records``); a node's leader passes a
    function that opens its own nodes/<node>/records/ (``local``); the others pass None for both. Returns the
    names shared (on rank 0 and the leaders) and a note where they were too big to share (the nodes then
    analyse their captures without them)."""
    import torch

    note = None
    manifest: list[list[Any]] = []
    fds: list[int] = []
    if records is not None:
        for name, info in records.entries():
            if record_name_problem(name) is None and stat.S_ISREG(info.st_mode):
                fd = records.open_read(name)
                if fd is not None:
                    fds.append(fd)
                    manifest.append([name, os.fstat(fd).st_size])
        total = sum(size for _, size in manifest)
        if total > RECORDS_TOTAL_BYTES:
            note = (f"the run's records ({human_bytes(total)}) exceed the {human_bytes(RECORDS_TOTAL_BYTES)} diag "
                    "sends the nodes: the other nodes' captures were not analysed (run diag analyze there with "
                    "the records)")
            for fd in fds:
                os.close(fd)
            manifest, fds = [], []
    try:
        shared = world.broadcast({"records": manifest} if records is not None else None, what)
        entries = _parse_records(shared)
        out = None if local is None else local()
        buffer = torch.zeros(CHUNK_BYTES, dtype=torch.uint8)
        view = memoryview(buffer.numpy())
        try:
            for index, (name, size) in enumerate(entries):
                scratch = f".{name}.{os.getpid()}.tmp"
                fd = out.create(scratch, replace=True) if out is not None else -1
                try:
                    left = size
                    while left:
                        n = min(left, CHUNK_BYTES)
                        if fds:
                            got = _read_into(fds[index], view[:n])
                            view[got:n] = bytes(n - got)
                        world.broadcast_into(buffer[:n], what)
                        if fd >= 0:
                            _write_all(fd, view[:n])
                        left -= n
                finally:
                    if fd >= 0:
                        os.close(fd)
                if out is not None:
                    out.rename(scratch, name)
        finally:
            if out is not None:
                out.close()
    finally:
        for fd in fds:
            os.close(fd)
    return [name for name, _ in entries], note


def _parse_records(shared: Any) -> list[tuple[str, int]]:
    """Rank 0's list of records, checked on every rank before a byte of them moves."""
    def bad(why: str) -> DiagError:
        return DiagError(f"sharing the records: rank 0 sent a list of records diag refuses ({why})")

    if not isinstance(shared, dict) or not isinstance(shared.get("records"), list):
        raise bad("not a list")
    entries = []
    for entry in shared["records"]:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], int)
                and not isinstance(entry[1], bool) and entry[1] >= 0):
            raise bad("an entry that is not [name, bytes]")
        problem = record_name_problem(entry[0])
        if problem is not None:
            raise bad(f"{str(entry[0])[:80]!r}: {problem}")
        entries.append((entry[0], entry[1]))
    if len({name for name, _ in entries}) != len(entries):
        raise bad("a name twice")
    if sum(size for _, size in entries) > RECORDS_TOTAL_BYTES:
        raise bad(f"more than {human_bytes(RECORDS_TOTAL_BYTES)}")
    return entries


__all__ = ["CHUNK_BYTES", "MAX_FILES_PER_NODE", "NODE_FILE", "RECORDS_TOTAL_BYTES", "RECORD_NAME", "SHIP_NODE_BYTES",
           "SHIP_TOTAL_BYTES", "Budget", "Left", "NodeShipment", "Outgoing", "list_node_files", "node_file_problem",
           "receive_node_files", "record_name_problem", "send_node_files", "share_records"]
