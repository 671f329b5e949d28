"""Non-blocking point-to-point with tags: gloo's pair protocol on a mesh of its own, run by one thread.

``isend``/``irecv`` post a message and return at once; a background thread (one per process group) moves
it and completes its ``Request``. Matching follows torch's semantics on gloo: a receive from rank P with
tag T takes the sends of P with tag T in the order P posted them. The protocol is gloo's
(gloo/transport/tcp/pair.cc with unbound buffers, gloo/context.cc for receive-from-any):

- posting a receive from P sends RECV_READY(tag, size) to P; posting a send sends SEND_READY(tag, size);
- a send writes its data only once P's RECV_READY for it arrived, so data only ever lands in a posted
  buffer: tags match in any order, a receive posted before its send never waits for a buffer, and a peer
  cannot grow this rank's memory with data nobody asked for (a RECV_READY with no send yet is kept as a
  credit, at most MAX_CREDITS per peer);
- a receive from any source waits for the first SEND_READY with its tag that no receive from that rank
  claims (gloo's recvFromAny), then sends RECV_READY to that rank;
- a RECV_READY whose size differs from the send is answered with REFUSE: both the send and the receive
  fail with both sizes, no byte moves, and the pair stays usable.

Data goes in pieces of ``chunk_bytes`` (``--chunks``) striped over ``--streams``, on the sockets
``--conn`` makes; notices travel as ``--conn``/``--notice`` say (in-band on a shared socket, as gloo; on
the reverse direction of the receive socket with ``split``; on a socket of their own with ``own-conn``).
``--handshake`` does not apply: tags and receive-from-any need the notices. ``--io``, ``--order``,
``--algo`` and ``--skew-us`` are about collectives.

The thread owns all protocol state; user threads only append posts (under a lock) and wake it through a
pipe. It sleeps in poll() when there is nothing to do. A wait that runs out of time cancels its request
with a message that says what this rank knows about the peer: no matching receive (and which tags the peer
does wait for), no matching send, or data that stopped after N bytes. A cancelled receive whose RECV_READY
already went out still takes its data when it comes, into a scratch buffer that is dropped.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diag.errors import DiagError
from diag.transports.raw import wire
from diag.transports.raw.engine import RECV, SEND, Engine, Link, Op, OutMessage, PeerAborted
from diag.transports.raw.schedules import transfer_ops

if TYPE_CHECKING:
    from diag.transports.raw.knobs import RawKnobs

log = logging.getLogger("diag.raw")

MAX_CREDITS = 1 << 16          # RECV_READYs (or SEND_READYs) one peer may have outstanding here
CANCEL_WAIT_S = 5.0            # how long a timed-out wait waits for the thread to settle its request
_EMPTY = memoryview(b"")


@dataclass(eq=False)
class Request:
    """One isend or irecv. ``peer`` None: a receive from any source (``source`` says who, once known)."""

    kind: int
    peer: int | None
    tag: int
    view: memoryview
    source: int | None = None
    state: str = "posted"        # posted, announced (the peer's matching notice is here), moving, done, failed
    error: str | None = None
    parts_left: int = 0
    bytes_done: int = 0
    parts: list[Op] = field(default_factory=list)
    event: threading.Event = field(default_factory=threading.Event)
    callbacks: list[Callable[[Request], None]] = field(default_factory=list)
    ready_seq: int = -1          # receive: the number of the RECV_READY that announced it

    @property
    def nbytes(self) -> int:
        return len(self.view)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


@dataclass(eq=False)
class _Peer:
    """gloo's per-pair bookkeeping, per tag."""

    rank: int
    data_out: list[Link]
    data_in: list[Link]
    send_notices: Link
    recv_notices: Link
    waiting_sends: dict[int, collections.deque[Request]] = field(default_factory=dict)   # no RECV_READY yet
    credits: dict[int, collections.deque[tuple[int, int]]] = field(default_factory=dict)  # (size, seq)
    unannounced: dict[int, collections.deque[Request]] = field(default_factory=dict)     # receives, no SEND_READY
    unclaimed: dict[int, int] = field(default_factory=dict)   # SEND_READYs no receive has claimed
    receiving: dict[int, collections.deque[Request]] = field(default_factory=dict)       # RECV_READY sent
    sending: set[Request] = field(default_factory=set)
    recv_ready_out: int = 0
    recv_ready_in: int = 0
    send_ready_out: int = 0
    send_ready_in: int = 0
    outstanding: int = 0          # credits + unclaimed: bounded by MAX_CREDITS
    failed: str | None = None


class P2PEngine(Engine):
    """Point-to-point over one mesh's links, driven by its own thread (see the module docstring)."""

    def __init__(self, routes: dict[tuple[int, int, bool], Link], notice_links: dict[int, Link],
                 links: list[Link], knobs: RawKnobs, rank: int, names: Callable[[int], str]) -> None:
        super().__init__(routes, notify=True, send_first=False, alternate=False, sockbuf=knobs.sockbuf,
                         notice_links=notice_links)
        self.knobs = knobs
        self.rank = rank
        self.name = names
        self.all_links = links
        self.peers: dict[int, _Peer] = {}
        for peer in sorted({link.conn.peer for link in links}):
            data_out = [routes[(peer, s, True)] for s in range(knobs.streams)]
            data_in = [routes[(peer, s, False)] for s in range(knobs.streams)]
            own = notice_links.get(peer)
            self.peers[peer] = _Peer(peer, data_out, data_in, send_notices=own or data_out[0],
                                     recv_notices=own or data_in[0])
        self.expect: dict[tuple[int, int], collections.deque[Op]] = {}   # (id(link), tag) -> pieces, in order
        self.any_recvs: dict[int, collections.deque[Request]] = {}
        self.unclaimed_order: dict[int, collections.deque[int]] = {}    # tag -> peers, in arrival order
        self._lock = threading.Lock()
        self._posts: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closing = False
        self._thread = threading.Thread(target=self._main, name="diag-tcp-p2p", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------------- user threads
    def post(self, requests: list[Request]) -> None:
        """Post requests in list order, in one pass of the thread (a coalesced batch stays together)."""
        self._submit(lambda: [self._post(request) for request in requests])

    def cancel(self, request: Request, waited_s: float) -> None:
        """Fail ``request`` (unless it finished meanwhile) with what this rank knows about its peer."""
        settled = threading.Event()

        def expire() -> None:
            if not request.finished:
                self._fail(request, f"timed out after {waited_s:g}s: {self._diagnose(request)}")
                self._forget(request)
            settled.set()

        self._submit(expire)
        settled.wait(CANCEL_WAIT_S)

    def close(self) -> None:
        with self._lock:
            self._closing = True
        self._wake()
        self._thread.join(timeout=5)
        for request in self._open_requests():
            self._fail(request, "the process group was destroyed before it completed")
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    def _submit(self, action: Callable[[], None]) -> None:
        with self._lock:
            if self._closing:
                raise DiagError("the process group is destroyed")
            self._posts.append(action)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):   # a full pipe holds wake-ups already
            os.write(self._wake_w, b"x")

    # ----------------------------------------------------------------------------------- the thread
    def _main(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        masks: dict[int, int] = {}
        try:
            while True:
                with self._lock:
                    posts, self._posts = self._posts, collections.deque()
                    closing = self._closing
                for action in posts:
                    action()
                if closing:
                    return
                for link in self.all_links:
                    self._service(link)
                for link in self.all_links:
                    mask = 0 if self._dead(link) else (select.POLLIN | (select.POLLOUT if link.out else 0))
                    if masks.get(link.conn.fd) != mask:
                        if mask:
                            poller.register(link.conn.fd, mask)
                        elif link.conn.fd in masks:
                            poller.unregister(link.conn.fd)
                        masks[link.conn.fd] = mask
                for fd, _event in poller.poll(1000):
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(self._wake_r, 4096):
                                pass
        except BaseException as exc:   # a bug here must not leave waiters hanging: fail everything
            log.exception("diag_tcp point-to-point thread failed")
            for request in self._open_requests():
                self._fail(request, f"the point-to-point thread failed ({type(exc).__name__}: {exc})")

    def _service(self, link: Link) -> None:
        peer = self.peers[link.conn.peer]
        if peer.failed or link.eof:
            return
        try:
            if link.out:
                self._write(link, None)
            self._read(link, None)
        except DiagError as exc:
            self._fail_peer(peer, str(exc))

    def _dead(self, link: Link) -> bool:
        return bool(self.peers[link.conn.peer].failed or link.eof)

    # ----------------------------------------------------------------------------------- posting
    def _post(self, request: Request) -> None:
        if request.peer is None:
            self._post_any(request)
            return
        peer = self.peers[request.peer]
        if peer.failed:
            self._fail(request, peer.failed)
            return
        request.source = peer.rank if request.kind == SEND else None
        if request.kind == SEND:
            self._p2p_notice(peer.send_notices, wire.MSG_SEND_READY, peer.send_ready_out, request.nbytes,
                         request.tag)
            peer.send_ready_out += 1
            credits = peer.credits.get(request.tag)
            if credits:
                size, seq = credits.popleft()
                peer.outstanding -= 1
                self._start_send(peer, request, size, seq)
            else:
                peer.waiting_sends.setdefault(request.tag, collections.deque()).append(request)
            return
        if peer.unclaimed.get(request.tag):
            self._claim(peer, request.tag)
            request.state = "announced"
        else:
            peer.unannounced.setdefault(request.tag, collections.deque()).append(request)
        self._open_receive(peer, request)

    def _post_any(self, request: Request) -> None:
        order = self.unclaimed_order.get(request.tag)
        while order:
            peer = self.peers[order[0]]
            if peer.failed or not peer.unclaimed.get(request.tag):
                order.popleft()
                continue
            self._claim(peer, request.tag)
            request.state = "announced"
            self._open_receive(peer, request)
            return
        if all(peer.failed for peer in self.peers.values()):
            self._fail(request, "every other rank's connection failed")
            return
        self.any_recvs.setdefault(request.tag, collections.deque()).append(request)

    def _claim(self, peer: _Peer, tag: int) -> None:
        """Take one unclaimed SEND_READY of ``peer`` with ``tag``."""
        peer.unclaimed[tag] -= 1
        peer.outstanding -= 1
        order = self.unclaimed_order.get(tag)
        if order and peer.rank in order:
            order.remove(peer.rank)

    def _open_receive(self, peer: _Peer, request: Request) -> None:
        """Expect the receive's pieces on their sockets and tell the peer: RECV_READY (gloo's recv)."""
        request.source = peer.rank
        request.ready_seq = peer.recv_ready_out
        request.parts = self._pieces(RECV, peer.rank, request)
        for part in request.parts:
            link = peer.data_in[part.stream]
            self.expect.setdefault((id(link), request.tag), collections.deque()).append(part)
        peer.receiving.setdefault(request.tag, collections.deque()).append(request)
        self._p2p_notice(peer.recv_notices, wire.MSG_RECV_READY, peer.recv_ready_out, request.nbytes, request.tag)
        peer.recv_ready_out += 1

    def _pieces(self, kind: int, peer: int, request: Request) -> list[Op]:
        parts = transfer_ops(kind, peer, request.view, self.knobs.chunks_for(request.nbytes), self.knobs.streams)
        for part in parts:
            part.request = request
        request.parts_left = len(parts)
        return parts

    def _start_send(self, peer: _Peer, request: Request, size: int, seq: int) -> None:
        if size != request.nbytes:
            # No byte moves; the peer's receive fails too (REFUSE names this send's size), the pair goes on.
            self._p2p_notice(peer.send_notices, wire.MSG_REFUSE, seq, request.nbytes, request.tag)
            self._fail(request, f"{self.name(peer.rank)} posted a receive of {size} bytes for this send of "
                                f"{request.nbytes} bytes: the ranks called it with different sizes")
            return
        request.state = "moving"
        peer.sending.add(request)
        for part in self._pieces(SEND, peer.rank, request):
            link = peer.data_out[part.stream]
            header = bytearray(wire.HEADER_BYTES)
            wire.pack_header(header, wire.MSG_DATA, link.send_seq, len(part.view), part.stream, request.tag,
                             request.nbytes)
            link.send_seq += 1
            link.out.append(OutMessage(header, part.view, part))

    @staticmethod
    def _p2p_notice(link: Link, kind: int, seq: int, length: int, tag: int) -> None:
        header = bytearray(wire.HEADER_BYTES)
        wire.pack_header(header, kind, seq, length, 0, tag)
        link.out.append(OutMessage(header, _EMPTY, None))

    # ----------------------------------------------------------------------------------- arrivals
    def _wants_read(self, link: Link) -> bool:
        return not link.eof and not self.peers[link.conn.peer].failed

    def _expects(self, link: Link) -> bool:
        peer = self.peers[link.conn.peer]
        return bool(link.receiving is not None or link.header_filled
                    or any(deque for deque in peer.waiting_sends.values())
                    or any(deque for deque in peer.receiving.values()) or peer.sending)

    def _on_header(self, link: Link, peer_rank: int) -> None:
        kind, stream, seq, length = wire.parse_header(link.header, peer_rank)
        tag, total = wire.header_tag_total(link.header)
        peer = self.peers[peer_rank]
        if kind == wire.MSG_DATA:
            self._on_data(link, peer, stream, seq, length, tag, total)
        elif kind == wire.MSG_RECV_READY:
            self._count(peer, "recv_ready_in", seq, "RECV_READY")
            waiting = peer.waiting_sends.get(tag)
            if waiting:
                self._start_send(peer, waiting.popleft(), length, seq)
            else:
                self._bound(peer)
                peer.credits.setdefault(tag, collections.deque()).append((length, seq))
        elif kind == wire.MSG_SEND_READY:
            self._count(peer, "send_ready_in", seq, "SEND_READY")
            self._on_send_ready(peer, tag)
        elif kind == wire.MSG_REFUSE:
            self._on_refuse(peer, tag, seq, length)
        else:
            raise PeerAborted(peer_rank, length)

    def _count(self, peer: _Peer, counter: str, seq: int, what: str) -> None:
        expected = getattr(peer, counter)
        if seq != expected & 0xFFFFFFFF:
            raise DiagError(f"{self.name(peer.rank)} sent {what} {seq}, expected {expected & 0xFFFFFFFF}")
        setattr(peer, counter, expected + 1)

    def _bound(self, peer: _Peer) -> None:
        peer.outstanding += 1
        if peer.outstanding > MAX_CREDITS:
            raise DiagError(f"{self.name(peer.rank)} announced more than {MAX_CREDITS} point-to-point messages "
                            "nobody here has posted; is it running the same program?")

    def _on_send_ready(self, peer: _Peer, tag: int) -> None:
        unannounced = peer.unannounced.get(tag)
        if unannounced:
            request = unannounced.popleft()     # a receive from this rank already asked for it (gloo's order)
            if request.state == "posted":
                request.state = "announced"
            return
        waiting_any = self.any_recvs.get(tag)
        if waiting_any:
            request = waiting_any.popleft()
            request.state = "announced"
            self._open_receive(peer, request)
            return
        self._bound(peer)
        peer.unclaimed[tag] = peer.unclaimed.get(tag, 0) + 1
        self.unclaimed_order.setdefault(tag, collections.deque()).append(peer.rank)

    def _on_refuse(self, peer: _Peer, tag: int, seq: int, size: int) -> None:
        receiving = peer.receiving.get(tag) or collections.deque()
        request = next((r for r in receiving if r.ready_seq == seq), None)
        if request is None:
            raise DiagError(f"{self.name(peer.rank)} refused a receive this rank never announced; "
                            "is it running the same program?")
        self._drop_pieces(request)
        self._fail(request, f"{self.name(peer.rank)}'s matching send has {size} bytes, this receive "
                            f"{request.nbytes}: the ranks called it with different sizes")
        self._forget(request)

    def _on_data(self, link: Link, peer: _Peer, stream: int, seq: int, length: int, tag: int, total: int) -> None:
        pieces = self.expect.get((id(link), tag))
        if not pieces:
            raise DiagError(f"{self.name(peer.rank)} sent {length} bytes with tag {tag} that no receive here "
                            "asked for; is it running the same program?")
        part = pieces[0]
        request = part.request
        if seq != link.recv_seq & 0xFFFFFFFF or length != len(part.view) or total != request.nbytes:
            raise DiagError(f"{self.name(peer.rank)} sent a piece of {length} bytes of a {total}-byte message "
                            f"(tag {tag}) where a piece of {len(part.view)} bytes of {request.nbytes} was "
                            "expected; is it running the same diag and knobs?")
        pieces.popleft()
        link.recv_seq += 1
        if request.state != "failed":
            request.state = "moving"
        if length == 0:
            self._complete(part)
        else:
            link.receiving = part
            link.received = 0

    def _complete(self, op: Op) -> None:
        request: Request = op.request
        request.bytes_done += len(op.view)
        request.parts_left -= 1
        if request.parts_left:
            return
        if request.source is not None:
            peer = self.peers[request.source]
            if request.kind == SEND:
                peer.sending.discard(request)
            else:
                receiving = peer.receiving.get(request.tag)
                if receiving and request in receiving:
                    receiving.remove(request)
        if request.state != "failed":
            request.state = "done"
            self._finish(request)

    # ----------------------------------------------------------------------------------- failures
    def _fail_peer(self, peer: _Peer, reason: str) -> None:
        """A broken connection or a protocol error: every message with that peer fails, others go on."""
        if peer.failed:
            return
        peer.failed = reason
        affected = [r for r in self._open_requests() if r.source == peer.rank or r.peer == peer.rank]
        for request in affected:
            self._fail(request, reason)
            self._forget(request)
        for link in self.all_links:
            if link.conn.peer == peer.rank:
                link.out.clear()
                link.receiving = None

    def _fail(self, request: Request, reason: str) -> None:
        if request.finished:
            return
        request.state = "failed"
        request.error = reason
        self._finish(request)

    def _finish(self, request: Request) -> None:
        request.event.set()
        for callback in list(request.callbacks):
            try:
                callback(request)
            except Exception:   # a user's future callback: its error is the user's, never the thread's
                log.exception("diag_tcp: a point-to-point completion callback failed")

    def _forget(self, request: Request) -> None:
        """Remove a finished or failed request from the queues that could still hand it work."""
        for deques in (self.any_recvs,):
            deque = deques.get(request.tag)
            if deque and request in deque:
                deque.remove(request)
        for peer in self.peers.values():
            # not ``unannounced``: the peer's SEND_READY for a receive it was asked for may still come, and
            # must be taken by that receive, not by a later one
            for table in (peer.waiting_sends, peer.receiving):
                deque = table.get(request.tag)
                if deque and request in deque:
                    deque.remove(request)
            peer.sending.discard(request)
        if request.kind == RECV and request.parts_left and request.source is not None:
            self._drain_into_scratch(request)

    def _drain_into_scratch(self, request: Request) -> None:
        """A failed receive whose RECV_READY went out: its data may still come; it goes to scratch memory."""
        for part in request.parts:
            if len(part.view):
                part.view = memoryview(bytearray(len(part.view)))

    def _drop_pieces(self, request: Request) -> None:
        peer = self.peers[request.source] if request.source is not None else None
        if peer is None:
            return
        for part in request.parts:
            deque = self.expect.get((id(peer.data_in[part.stream]), request.tag))
            if deque and part in deque:
                deque.remove(part)
        request.parts_left = 0

    def _open_requests(self) -> list[Request]:
        seen: dict[int, Request] = {}
        for table in [self.any_recvs] + [t for peer in self.peers.values()
                                         for t in (peer.waiting_sends, peer.unannounced, peer.receiving)]:
            for deque in table.values():
                for request in deque:
                    seen[id(request)] = request
        for peer in self.peers.values():
            for request in peer.sending:
                seen[id(request)] = request
        return [request for request in seen.values() if not request.finished]

    def _diagnose(self, request: Request) -> str:
        """What this rank knows about why ``request`` has not completed (for the timeout message)."""
        if request.peer is None and request.source is None:
            waiting = sorted((peer.rank, tag) for peer in self.peers.values()
                             for tag, count in peer.unclaimed.items() if count)
            also = (f"; sends announced here that no receive claimed: "
                    f"{', '.join(f'{self.name(r)} tag {t}' for r, t in waiting)}" if waiting else "")
            return f"no rank has posted a send with tag {request.tag}{also}"
        peer = self.peers[request.source if request.source is not None else request.peer]  # type: ignore[index]
        name = self.name(peer.rank)
        if request.state == "moving":
            what = "sending" if request.kind == RECV else "reading"
            return (f"{name} stopped {what} after {request.bytes_done} of {request.nbytes} bytes: it is stuck, "
                    "dead or busy without reading its connections (check its log)")
        if request.kind == SEND:
            other = sorted(tag for tag, credits in peer.credits.items() if credits and tag != request.tag)
            hint = (f"; it does wait for this rank's sends with tag(s) {', '.join(map(str, other))}"
                    if other else "")
            return f"{name} has posted no receive for this rank's sends with tag {request.tag}{hint}"
        if request.state == "announced":
            return f"{name} announced its send but has sent none of its {request.nbytes} bytes"
        other = sorted(tag for tag, count in peer.unclaimed.items() if count and tag != request.tag)
        hint = (f"; it did announce sends with tag(s) {', '.join(map(str, other))} that no receive here claimed"
                if other else "")
        return f"{name} has posted no send with tag {request.tag}{hint}"


__all__ = ["MAX_CREDITS", "P2PEngine", "Request"]
