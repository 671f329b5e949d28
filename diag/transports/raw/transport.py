"""RawTransport: diag's raw-TCP reference collectives behind diag.transports.base.Transport."""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

from diag import safefs
from diag.errors import DiagError
from diag.transports.raw import mesh, schedules, tcpinfo, wire
from diag.transports.raw.engine import RECV, SEND, Engine, Link
from diag.transports.raw.knobs import MAX_CHUNKS, RawKnobs
from diag.transports.raw.reductions import REDUCE_OPS, check_reduction, copy_result, reduce_like_gloo

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from diag.transports.raw.p2p import P2PEngine

STORE_PREFIX = "diag_raw"


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's own memory as a flat byte memoryview (no copy)."""
    import torch

    if tensor.device.type != "cpu":
        raise DiagError("the raw transport moves CPU tensors only; use --device cpu")
    if not tensor.is_contiguous():
        raise DiagError("the raw transport needs contiguous tensors (call .contiguous())")
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


def rendezvous_store(rank: int, world_size: int, timeout_s: float) -> Any:
    """The store of an initialized default group, else env:// (torchrun's agent store or MASTER_ADDR)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise DiagError(f"{name} is not set: run under torchrun/Slurm or `diag sweep`, or export "
                            "MASTER_ADDR and MASTER_PORT")
    try:
        store, _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size,
                                           timeout=timedelta(seconds=timeout_s)))
    except (RuntimeError, ValueError) as exc:
        raise DiagError(f"rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} failed: "
                        f"{str(exc).splitlines()[0]}") from None
    return store


class RawTransport:
    backend = "raw"

    def __init__(self, knobs: RawKnobs, rank: int, world_size: int, timeout_s: float,
                 store: Any | None = None, token: bytes | None = None, setup_timeout_s: float | None = None) -> None:
        """``token``: the run token, given to every rank over a private channel (diag's 0600 job file, or
        $DIAG_TCP_TOKEN); None: rank 0 makes one and publishes it in the store (the in-place trust model,
        docs/raw-tcp.md)."""
        import torch.distributed as dist

        if token is not None and len(token) != wire.TOKEN_BYTES:
            raise DiagError(f"the raw transport's run token must be {wire.TOKEN_BYTES} bytes, got {len(token)}")
        self._token = token

        self.settings = knobs
        self.algo = knobs.algo
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._closed = False
        self._conns: list[mesh.Conn] = []
        self._last_size_bytes = 0
        self._sample_file: TextIO | None = None
        self._sample_lock = threading.Lock()
        self._row_begin: dict[str, dict[str, Any]] = {}
        self._row_last: dict[str, dict[str, Any]] = {}
        self._row_samples: dict[str, list[dict[str, Any]]] = {}
        self._stop_sampler = threading.Event()
        self._sampler: threading.Thread | None = None
        self._p2p: P2PEngine | None = None

        setup_s = timeout_s if setup_timeout_s is None else setup_timeout_s   # rendezvous and connecting
        self._setup_timeout_s = setup_s
        base = store if store is not None else rendezvous_store(rank, world_size, setup_s)
        # Every rank creates transports in the same sequence, so its own counter names the same
        # generation everywhere: two transports in one process never read each other's keys.
        generation = base.add(f"{STORE_PREFIX}/generation/{rank}", 1)
        self._store = dist.PrefixStore(f"{STORE_PREFIX}/{generation}", base)   # keys: diag_raw/<gen>/<key>
        self._store.set_timeout(timedelta(seconds=setup_s))
        deadline = time.monotonic() + setup_s
        self._address = mesh.choose_address(knobs.iface)
        listener = mesh.listen(self._address, knobs)
        try:
            self._connect(listener, deadline)
        except BaseException:
            mesh.close_all(self._conns, linger_s=0.0)  # the mesh never formed: nothing owed to anyone
            raise
        finally:
            listener.close()
        links: dict[tuple[int, int, bool], Link] = {}
        notice_links: dict[int, Link] = {}
        self._links: list[Link] = []
        for conn in self._conns:
            link = Link(conn)
            self._links.append(link)
            if conn.role == wire.ROLE_NOTICE:
                notice_links[conn.peer] = link
            if conn.sends:
                links[(conn.peer, conn.stream, True)] = link
            if conn.receives:
                links[(conn.peer, conn.stream, False)] = link
        self._engine = Engine(links, notify=knobs.handshake == "notify", send_first=knobs.order == "send-first",
                              alternate=knobs.io == "alternate", sockbuf=knobs.sockbuf,
                              notice_links=notice_links,
                              early_credits=world_size * (knobs.chunks or MAX_CHUNKS))
        # --skew-us: every rank but 0 starts each operation (not the barrier) this much later.
        self._skew_s = knobs.skew_us / 1e6 if rank != 0 else 0.0
        self._barrier_out = bytearray(world_size)
        if knobs.tcpinfo_dir:
            directory = safefs.private_dir(knobs.tcpinfo_dir)
            self._sample_file = os.fdopen(safefs.open_append(directory / f"tcpinfo-rank{rank}.jsonl"), "a",
                                          encoding="utf-8")
        if knobs.tcpinfo_interval_s:
            self._sampler = threading.Thread(target=self._sample_periodically, name="diag-raw-tcpinfo",
                                             daemon=True)
            self._sampler.start()

    # ----------------------------------------------------------------------------------- setup
    def _connect(self, listener: socket.socket, deadline: float) -> None:
        store = self._store
        if self._token is None and self.rank == 0:
            store.set("token", secrets.token_bytes(wire.TOKEN_BYTES))
        port = listener.getsockname()[1]
        store.set(f"addr/{self.rank}", f"{self._address}:{port}")
        fingerprint = json.dumps({k: v for k, v in self.settings.as_record().items()
                                  if k in ("algo", "order", "conn", "handshake", "chunks", "chunk_bytes", "streams", "io",
                                           "notice")},
                                 sort_keys=True)
        store.set(f"knobs/{self.rank}", fingerprint)
        try:
            token = self._token if self._token is not None else bytes(store.get("token"))
            fingerprints = [bytes(store.get(f"knobs/{peer}")).decode() for peer in range(self.world_size)]
            self._addresses = [bytes(store.get(f"addr/{peer}")).decode() for peer in range(self.world_size)]
        except RuntimeError as exc:
            raise DiagError(f"rank {self.rank}: not all ranks published their address within "
                            f"{self._setup_timeout_s:g}s ({str(exc).splitlines()[0]})") from None
        mismatched = [(peer, theirs) for peer, theirs in enumerate(fingerprints) if theirs != fingerprint]
        if mismatched:
            # Every rank read every rank's knobs, so all of them see the mismatch and refuse; but the
            # store may live in one of them (rank 0 under env://), so nobody leaves before all have read.
            self._leave_together(store, deadline)
            peer, theirs = mismatched[0]
            raise DiagError(f"rank {self.rank} runs with knobs {fingerprint} but rank {peer} with {theirs}: "
                            "give every rank the same raw transport settings")
        for peer in range(self.rank):
            host, peer_port = self._addresses[peer].rsplit(":", 1)
            for role, stream in mesh.conn_plan(self.rank, peer, self.settings):
                self._conns.append(mesh.connect_to(self.rank, peer, (host, int(peer_port)), token, role, stream,
                                                   self.settings, deadline))
        self._conns.extend(mesh.accept_all(listener, self.rank, self.world_size, token, self.settings,
                                           deadline))

    def _leave_together(self, store: Any, deadline: float) -> None:
        """Wait (bounded) until every rank has read the knobs before this rank may exit. Each rank counts
        itself in after its reads; rank 0, which may host the store, also waits for the others' count so
        a rank still reading never finds the store gone. Store errors here only shorten the wait."""
        try:
            store.add("refused", 1)
            if self.rank != 0:
                return
            while store.add("refused", 0) < self.world_size and time.monotonic() < deadline:
                time.sleep(0.02)
        except RuntimeError:
            pass

    # ----------------------------------------------------------------------------------- Transport
    def knobs(self) -> dict[str, Any]:
        resolved = self.settings.as_record()
        resolved["address"] = self._address
        if self._conns:
            sock = self._conns[0].sock
            resolved["so_sndbuf"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            resolved["so_rcvbuf"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        resolved["connections_per_peer"] = len(mesh.conn_plan(0, 1, self.settings))
        return resolved

    def hosts(self) -> list[str]:
        return [address.rsplit(":", 1)[0] for address in self._addresses]

    def barrier(self) -> None:
        self._barrier_out[:] = bytes(self.world_size)
        view = memoryview(self._barrier_out)
        stages = schedules.all_gather("direct", view, self.rank, self.world_size, 1, 1,
                                      self.settings.order == "send-first")
        self._run(stages, "barrier")

    def synchronize(self) -> None:
        """CPU sockets: an operation is complete when it returns."""

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        out = tensor_bytes(output)
        inp = tensor_bytes(input)
        if len(out) != len(inp) * self.world_size:
            raise DiagError(f"all_gather output has {len(out)} bytes, expected world_size x {len(inp)}")
        self._last_size_bytes = len(inp)
        block = len(inp)
        if len(inp) and output.data_ptr() + self.rank * block != input.data_ptr():
            out[self.rank * block:(self.rank + 1) * block] = inp
        knobs = self.settings
        stages = schedules.all_gather(knobs.algo, out, self.rank, self.world_size, knobs.chunks_for(block),
                                      knobs.streams, knobs.order == "send-first",
                                      gloo_waits=knobs.handshake == "notify")
        self._run(stages, "all_gather")

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._check_peer(dst)
        view = tensor_bytes(tensor)
        self._last_size_bytes = len(view)
        self._run([schedules.transfer_ops(SEND, dst, view, self.settings.chunks_for(len(view)),
                                          self.settings.streams)],
                  f"send to rank {dst}")

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._check_peer(src)
        view = tensor_bytes(tensor)
        self._last_size_bytes = len(view)
        self._run([schedules.transfer_ops(RECV, src, view, self.settings.chunks_for(len(view)),
                                          self.settings.streams)],
                  f"receive from rank {src}")

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, order: str) -> None:
        self._check_peer(peer)
        out_view = tensor_bytes(send)
        in_view = tensor_bytes(recv)
        self._last_size_bytes = len(out_view)
        sends = schedules.transfer_ops(SEND, peer, out_view, self.settings.chunks_for(len(out_view)),
                                       self.settings.streams)
        recvs = schedules.transfer_ops(RECV, peer, in_view, self.settings.chunks_for(len(in_view)),
                                       self.settings.streams)
        self._run([sends + recvs if order == "send-first" else recvs + sends], f"exchange with rank {peer}")

    def batch_p2p(self, recvs: list[tuple[torch.Tensor, int]], sends: list[tuple[torch.Tensor, int]],
                  order: str) -> None:
        ops: dict[str, list[Any]] = {"recv": [], "send": []}
        for kind, name, pairs in ((RECV, "recv", recvs), (SEND, "send", sends)):
            for tensor, peer in pairs:
                self._check_peer(peer)
                view = tensor_bytes(tensor)
                self._last_size_bytes = len(view)
                ops[name] += schedules.transfer_ops(kind, peer, view, self.settings.chunks_for(len(view)),
                                                    self.settings.streams)
        stage = ops["recv"] + ops["send"] if order == "recv-first" else ops["send"] + ops["recv"]
        self._run([stage], "batch_isend_irecv")

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        self._check_peer(root, allow_self=True)
        view = tensor_bytes(tensor)
        self._last_size_bytes = len(view)
        self._run(schedules.broadcast(view, self.rank, root, self.world_size,
                                      self.settings.chunks_for(len(view)), self.settings.streams), "broadcast")

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:
        out = tensor_bytes(output)
        inp = tensor_bytes(input)
        if len(out) != len(inp) or len(inp) % self.world_size:
            raise DiagError("all_to_all needs input and output of equal size, divisible by world_size")
        self._last_size_bytes = len(inp)
        block = len(inp) // self.world_size
        out[self.rank * block:(self.rank + 1) * block] = inp[self.rank * block:(self.rank + 1) * block]
        self._run(schedules.all_to_all(out, inp, self.rank, self.world_size, self.settings.chunks_for(block),
                                       self.settings.streams, self.settings.order == "send-first"), "all_to_all")

    def all_to_all_v(self, outputs: list[memoryview], inputs: list[memoryview], what: str = "all_to_all") -> None:
        """inputs[j] goes to rank j, outputs[j] comes from rank j (any sizes; each must equal what the other
        side sends or expects, else both fail naming the sizes). Own block copied locally."""
        if len(outputs) != self.world_size or len(inputs) != self.world_size:
            raise DiagError(f"{what} needs one block per rank ({self.world_size})")
        if len(outputs[self.rank]) != len(inputs[self.rank]):
            raise DiagError(f"{what}: this rank's own block is {len(inputs[self.rank])} bytes in the input and "
                            f"{len(outputs[self.rank])} in the output")
        outputs[self.rank][:] = inputs[self.rank]
        self._last_size_bytes = sum(len(view) for view in inputs)
        self._swap([(peer, inputs[peer]) for peer in range(self.world_size) if peer != self.rank],
                   [(peer, outputs[peer]) for peer in range(self.world_size) if peer != self.rank], what)

    def gather(self, outputs: list[memoryview] | None, input: memoryview, root: int, what: str = "gather") -> None:
        """Every rank's ``input`` into ``outputs[rank]`` on ``root`` (outputs None elsewhere)."""
        self._check_peer(root, allow_self=True)
        self._last_size_bytes = len(input)
        if self.rank != root:
            self._swap([(root, input)], [], what)
            return
        assert outputs is not None and len(outputs) == self.world_size
        outputs[root][:] = input
        self._swap([], [(peer, outputs[peer]) for peer in range(self.world_size) if peer != root], what)

    def scatter(self, output: memoryview, inputs: list[memoryview] | None, root: int, what: str = "scatter") -> None:
        """``inputs[rank]`` of ``root`` into every rank's ``output`` (inputs None except on root)."""
        self._check_peer(root, allow_self=True)
        self._last_size_bytes = len(output)
        if self.rank != root:
            self._swap([], [(root, output)], what)
            return
        assert inputs is not None and len(inputs) == self.world_size
        output[:] = inputs[root]
        self._swap([(peer, inputs[peer]) for peer in range(self.world_size) if peer != root], [], what)

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
        """Gather every rank's tensor, then reduce locally in gloo's order (reductions.py): exact, gloo's
        result bit for bit and identical on every rank; it moves (N-1) x size per rank (a reference for
        correctness, not a fast all_reduce)."""
        import torch

        check_reduction(op, tensor.dtype)
        gathered = torch.empty((self.world_size, *tensor.shape), dtype=tensor.dtype)
        self.all_gather(gathered, tensor.contiguous())
        copy_result(tensor, reduce_like_gloo(list(gathered.unbind(0)), op))

    def reduce(self, tensor: torch.Tensor, root: int, op: str = "sum") -> None:
        """``root`` receives every rank's tensor and reduces in gloo's order; the others' tensors are left as
        they are (torch leaves them unspecified; gloo uses them as scratch space)."""
        import torch

        check_reduction(op, tensor.dtype)
        staged = tensor.contiguous()
        if self.rank != root:
            self.gather(None, tensor_bytes(staged), root, "reduce")
            return
        gathered = torch.empty((self.world_size, *tensor.shape), dtype=tensor.dtype)
        self.gather([tensor_bytes(block) for block in gathered.unbind(0)], tensor_bytes(staged), root, "reduce")
        copy_result(tensor, reduce_like_gloo(list(gathered.unbind(0)), op))

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                       whole: bool = True) -> None:
        """Block r of every rank's ``input`` reduced into rank r's ``output``. ``whole``: in gloo's order for
        the input as one tensor (reduce_scatter_tensor); else for each block as a tensor of its own (the
        list form)."""
        import torch

        check_reduction(op, input.dtype)
        if input.numel() != output.numel() * self.world_size:
            raise DiagError("reduce_scatter input must hold world_size x output elements")
        received = torch.empty(input.numel(), dtype=input.dtype)
        self.all_to_all(received, input.contiguous().reshape(-1))
        blocks = list(received.view(self.world_size, -1).unbind(0))
        start = self.rank * output.numel() if whole else 0
        copy_result(output, reduce_like_gloo(blocks, op, start, input.numel() if whole else None))

    def point_to_point(self, names: Callable[[int], str]) -> P2PEngine:
        """Hand this transport's mesh to a non-blocking point-to-point engine (p2p.py) with its own thread;
        the transport then carries nothing else (its close() stops the engine)."""
        from diag.transports.raw.p2p import P2PEngine

        self._p2p = P2PEngine(self._engine.routes, self._engine.notice_links, self._links, self.settings,
                              self.rank, names)
        return self._p2p

    def on_iteration(self, phase: str, index: int) -> None:
        for conn in self._conns:
            info = tcpinfo.read_tcp_info(conn.sock)
            if info is None:
                continue
            self._row_samples.setdefault(conn.label, []).append(info)
            self._row_begin.setdefault(conn.label, info)
            self._row_last[conn.label] = info
            self._write_sample(conn, info, phase, index)

    def row_extra(self) -> dict[str, Any]:
        summary = {label: tcpinfo.summarize(self._row_begin[label], self._row_last[label], samples)
                   for label, samples in self._row_samples.items()}
        self._row_begin.clear()
        self._row_last.clear()
        self._row_samples.clear()
        return {"tcp_info": summary} if summary else {}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._p2p is not None:
            self._p2p.close()
        self._stop_sampler.set()
        if self._sampler is not None:
            self._sampler.join(timeout=5)
        mesh.close_all(self._conns)
        with self._sample_lock:
            if self._sample_file is not None:
                self._sample_file.close()
                self._sample_file = None

    def __enter__(self) -> RawTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- helpers
    def _run(self, stages: list[list[Any]], what: str) -> None:
        if self._closed:
            raise DiagError("the raw transport is closed")
        if self._skew_s and what != "barrier":
            _wait_precisely(self._skew_s)
        self._engine.run(stages, what, self.timeout_s)

    def _swap(self, sends: list[tuple[int, memoryview]], recvs: list[tuple[int, memoryview]], what: str) -> None:
        """One stage: every send and receive at once (posted in --order), each cut into pieces as usual."""
        knobs = self.settings
        ops: dict[int, list[Any]] = {SEND: [], RECV: []}
        for kind, pairs in ((SEND, sends), (RECV, recvs)):
            for peer, view in pairs:
                self._check_peer(peer)
                ops[kind] += schedules.transfer_ops(kind, peer, view, knobs.chunks_for(len(view)), knobs.streams)
        stage = ops[SEND] + ops[RECV] if knobs.order == "send-first" else ops[RECV] + ops[SEND]
        self._run([stage], what)

    def _check_peer(self, peer: int, allow_self: bool = False) -> None:
        if not 0 <= peer < self.world_size or (peer == self.rank and not allow_self):
            raise DiagError(f"rank {self.rank}: invalid peer rank {peer} (world size {self.world_size})")

    def _write_sample(self, conn: mesh.Conn, info: dict[str, Any], phase: str, index: int) -> None:
        if self._sample_file is None:
            return
        direction = "both" if conn.sends and conn.receives else ("send" if conn.sends else "recv")
        line = {"kind": "tcp_info", "t_ns": time.time_ns(), "rank": self.rank, "world_size": self.world_size,
                "peer": conn.peer,
                "conn": conn.label, "direction": direction, "phase": phase,
                "size_bytes": self._last_size_bytes, "iteration": index, **info}
        with self._sample_lock:
            if self._sample_file is not None:
                self._sample_file.write(json.dumps(line) + "\n")
                if phase != "interval":
                    self._sample_file.flush()

    def _sample_periodically(self) -> None:
        interval = self.settings.tcpinfo_interval_s or 1.0
        index = 0
        while not self._stop_sampler.wait(interval):
            for conn in self._conns:
                info = tcpinfo.read_tcp_info(conn.sock)
                if info is not None:
                    self._write_sample(conn, info, "interval", index)
            index += 1


SPIN_BELOW_S = 0.0005   # time.sleep overshoots by ~0.1 ms; the last half millisecond is spun


def _wait_precisely(seconds: float) -> None:
    end = time.perf_counter() + seconds
    if seconds > SPIN_BELOW_S:
        time.sleep(seconds - SPIN_BELOW_S)
    while time.perf_counter() < end:
        pass


__all__ = ["REDUCE_OPS", "RawTransport", "rendezvous_store", "tensor_bytes"]
