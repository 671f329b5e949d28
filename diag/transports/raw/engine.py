"""The data path: moves a schedule of sends and receives over nonblocking sockets, one event loop.

A schedule is a list of stages; a stage is a list of ``Op`` (send or receive of one contiguous byte
range to/from one peer on one stream). Stages run one after the other. Ops on one socket go in schedule
order, so both ends agree on sequence numbers without negotiating.

Two protocols. ``--handshake none``: inside a stage every op runs as soon as it may (a send once the ops
it depends on, ``after``, completed: ring forwarding); data is sent without asking.

``--handshake notify`` is a model of gloo's pair protocol (gloo/transport/tcp/pair.cc, unbound buffers):
the stage is a *program* posted in schedule order, as gloo's all_gather posts send, recv, send, recv; an
op is posted once the ops in its ``after`` completed (gloo's waitSend/waitRecv), and posting never waits
for the network. Posting a receive queues RECV_READY; posting a send queues SEND_READY and, if the peer's
RECV_READY for it already arrived, the data right behind it, else the data waits and is queued when that
RECV_READY arrives. Everything a rank writes to a socket goes through one FIFO per socket (gloo's ``tx_``),
so a RECV_READY posted while the rank's own data is queued on the same socket waits behind that data:
that is the mechanism the model exists to show. Where notices travel is a knob: on the data socket
(``--notice in-band``, as gloo), on the reverse direction of the receive socket (``--conn split``), or on a
socket of their own (``--notice own-conn``). Notices that arrived between operations are read at the
start of the next one before anything is posted, as gloo's device thread reads them the moment they
arrive. A send completes when its last byte is handed to the kernel, as in gloo.

A RECV_READY that finds no send waiting is kept as a credit for a later send, but never more credits than
the peer can have posted receives for: this operation's sends on that (peer, stream) not yet posted, plus
one operation's worth (``early_credits``: a peer is at most one operation ahead, since its next one needs
this one's data from us). A peer that sends more is refused with a protocol error, so notices cannot grow
a rank's memory.

Zero copy: payload bytes go from the caller's buffer to ``send``/``sendmsg`` (memoryview slices, header
and payload in one call so Nagle never splits them) and from ``recv_into`` straight into the caller's
output buffer. Python touches each chunk a handful of times, never each byte.

``--io duplex`` (default) services both directions of every socket from one loop: the kernel keeps both
directions of the wire busy while Python is elsewhere. ``--io alternate`` moves one piece in one
direction at a time and never has a send and a receive in progress together: half duplex, the
hypothesis "the two directions take turns" made deliberate.
"""

from __future__ import annotations

import collections
import errno
import select
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diag.errors import DiagError
from diag.transports.raw import wire

if TYPE_CHECKING:
    from diag.transports.raw.mesh import Conn

SEND = 0
RECV = 1

ALTERNATE_PIECE_BYTES = 64 * 1024   # one turn of --io alternate; small enough to fit socket buffers
ALTERNATE_READ_WAIT_S = 0.005       # how long a receive turn waits before giving the turn back
_POLL_IN = select.POLLIN | select.POLLPRI
_POLL_OUT = select.POLLOUT
_EMPTY = memoryview(b"")
# Receives one operation posts per (peer, stream) at most, for two ranks without --chunks: a block in up to
# MAX_CHUNKS pieces per stream, world_size - 1 blocks per ring step sequence (the transport passes its own).
DEFAULT_EARLY_CREDITS = 2 * 1024
ABORT_FLUSH_S = 1.0    # how long a failing rank tries to finish a half-written message so its ABORT can follow


class Mismatch(DiagError):
    """The peers' messages do not fit this rank's operation: the ranks called different operations or sizes."""


class PeerAborted(DiagError):
    """A peer stopped the operation (its own error says why) and told this rank so."""

    def __init__(self, peer: int, reason: int) -> None:
        why = ("found that the ranks called different operations or sizes" if reason == wire.ABORT_MISMATCH
               else "failed in it (a timeout or a lost rank)")
        super().__init__(f"rank {peer} stopped this operation: it {why}; its own error names the cause")
        self.peer = peer


@dataclass(eq=False, slots=True)
class Op:
    kind: int
    peer: int
    view: memoryview            # contiguous bytes (format "B")
    stream: int = 0
    after: tuple[Op, ...] = ()  # this op may start only once these completed (ring forwarding, gloo's waits)
    done: bool = False
    link: Link | None = None
    total: int = 0              # bytes of the whole block or message this piece belongs to (checked on arrival)
    request: Any = None         # point-to-point: the message (p2p.Request) this piece belongs to

    def ready(self) -> bool:
        return all(dependency.done for dependency in self.after)


@dataclass(eq=False, slots=True)
class OutMessage:
    header: bytearray
    payload: memoryview
    op: Op | None               # None for a notice
    header_sent: int = 0
    payload_sent: int = 0

    def remaining(self) -> int:
        return len(self.header) - self.header_sent + len(self.payload) - self.payload_sent


@dataclass(eq=False)
class Link:
    """Per-socket protocol state; it outlives single operations so sequence numbers keep counting."""

    conn: Conn
    send_seq: int = 0            # next DATA sequence number we send
    recv_seq: int = 0            # next DATA sequence number we expect
    out: collections.deque[OutMessage] = field(default_factory=collections.deque)
    to_send: collections.deque[Op] = field(default_factory=collections.deque)
    to_post: collections.deque[Op] = field(default_factory=collections.deque)
    posted: collections.deque[Op] = field(default_factory=collections.deque)
    header: bytearray = field(default_factory=lambda: bytearray(wire.HEADER_BYTES))
    header_filled: int = 0
    receiving: Op | None = None
    received: int = 0
    eof: bool = False            # the peer closed its side while nothing was owed on this socket
    bytes_out: int = 0
    bytes_in: int = 0

    def __post_init__(self) -> None:
        self.header_view = memoryview(self.header)



@dataclass(eq=False)
class Channel:
    """Notify protocol state of one (peer, stream): gloo's per-pair tallies of remote pending receives.

    ``data_out``/``data_in`` carry our data to the peer and the peer's data to us; ``send_notices`` and
    ``recv_notices`` are where our SEND_READY and RECV_READY go (the data socket, the receive socket's
    reverse direction, or the notice socket)."""

    peer: int
    stream: int
    data_out: Link | None
    data_in: Link | None
    send_notices: Link | None
    recv_notices: Link | None
    credits: collections.deque[int] = field(default_factory=collections.deque)  # peer's receives not yet used
    waiting: collections.deque[Op] = field(default_factory=collections.deque)   # our sends without a credit
    recv_ready_out: int = 0      # sequence numbers of the notices we sent and expect
    recv_ready_in: int = 0
    send_ready_out: int = 0
    send_ready_in: int = 0


class Engine:
    """Runs schedules on the links of one transport. Not thread safe: one operation at a time."""

    def __init__(self, links: dict[tuple[int, int, bool], Link], *, notify: bool, send_first: bool,
                 alternate: bool, sockbuf: int | None, notice_links: dict[int, Link] | None = None,
                 early_credits: int = DEFAULT_EARLY_CREDITS) -> None:
        # key: (peer, stream, sends?) -> the link that carries that direction
        self.routes = links
        self.early_credits = early_credits
        # notify: this operation's sends not yet posted, per (peer, stream): what the credits are capped at
        self.unposted: collections.Counter[tuple[int, int]] = collections.Counter()
        self.notice_links = notice_links or {}   # peer -> its notice socket (--notice own-conn)
        self.channels: dict[tuple[int, int], Channel] = {}
        self.program: collections.deque[Op] = collections.deque()
        self.notify = notify
        self.send_first = send_first
        self.alternate = alternate
        self.piece = ALTERNATE_PIECE_BYTES if sockbuf is None else max(1024, min(ALTERNATE_PIECE_BYTES,
                                                                                 sockbuf // 2))
        self.broken: str | None = None
        self.timeout_s = 0.0

    # ----------------------------------------------------------------------------------- public
    def run(self, stages: list[list[Op]], what: str, timeout_s: float) -> None:
        if self.broken:
            raise DiagError(f"the raw transport is unusable after an earlier failure ({self.broken}); "
                            "restart all ranks")
        deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        if self.notify:
            self.unposted = collections.Counter((op.peer, op.stream) for stage in stages for op in stage
                                                if op.kind == SEND)
        try:
            for stage in stages:
                if stage:
                    self._run_stage(stage, what, deadline, timeout_s)
        except DiagError as exc:
            self.broken = str(exc)
            self._abort_peers(wire.ABORT_MISMATCH if isinstance(exc, Mismatch) else wire.ABORT_FAILED,
                              exc)
            exc.detail = str(exc)   # type: ignore[attr-defined]  # without the operation's name
            exc.args = (f"{what}: {exc}",)
            raise

    # ----------------------------------------------------------------------------------- stage
    def _run_stage(self, stage: list[Op], what: str, deadline: float, timeout_s: float) -> None:
        links: list[Link] = []
        seen: set[int] = set()

        def use(link: Link | None) -> None:
            if link is not None and id(link) not in seen:
                seen.add(id(link))
                links.append(link)

        for op in stage:
            link = self.routes.get((op.peer, op.stream, op.kind == SEND))
            if link is None:
                raise DiagError(f"no connection to rank {op.peer} (stream {op.stream}); internal routing error")
            op.link = link
            op.done = False
            use(link)
            if self.notify:
                channel = self._channel(op.peer, op.stream)
                use(channel.send_notices if op.kind == SEND else channel.recv_notices)
            else:
                (link.to_send if op.kind == SEND else link.to_post).append(op)
        self.remaining = len(stage)
        self.stage_links = links
        if self.notify:
            self.program = collections.deque(stage)
            for link in links:
                self._read(link, None)     # notices that arrived since the last operation (gloo's device thread)
            self._post_program()
        else:
            for link in links:
                self._advance(link)
        if self.alternate:
            self._loop_alternate(links, what, deadline, timeout_s)
        else:
            self._loop_duplex(links, what, deadline, timeout_s)

    def _loop_duplex(self, links: list[Link], what: str, deadline: float, timeout_s: float) -> None:
        poller = select.poll()
        masks: dict[int, int] = {}
        while self.remaining:
            # One pass drains every socket (write until full, read until empty)...
            for link in links:
                if link.out:
                    self._write(link, None)
                if self._wants_read(link):
                    self._read(link, None)
            if not self.remaining:
                break
            # ...then always sleep in poll until a socket is ready. Going round again at once because a
            # few bytes moved made a busy rank spin through passes that mostly hit EAGAIN, burning the CPU
            # the kernel needs for packet processing when N ranks share 2 cores. (SO_RCVLOWAT, to wake
            # only per 32 KiB, was tried and measured 12% slower at N=3 on the lab, cause not pinned
            # down; see docs/raw-tcp.md.)
            for link in links:
                mask = (_POLL_OUT if link.out else 0) | (_POLL_IN if self._wants_read(link) else 0)
                fd = link.conn.fd
                if masks.get(fd) != mask:
                    if mask:
                        poller.register(fd, mask)   # register() on a known fd modifies it
                    elif fd in masks:
                        poller.unregister(fd)
                    if mask:
                        masks[fd] = mask
                    else:
                        masks.pop(fd, None)
            left = deadline - time.monotonic()
            if left <= 0:
                self._timeout(links, timeout_s)
            if not masks:
                raise DiagError(f"{what}: schedule stalled with nothing to send or receive (internal error)")
            for _fd, event in poller.poll(max(1, int(min(left, 1.0) * 1000))):
                if event & (select.POLLERR | select.POLLNVAL):
                    pass  # the next send/recv raises the real error with the peer's rank

    def _loop_alternate(self, links: list[Link], what: str, deadline: float, timeout_s: float) -> None:
        sending_turn = self.send_first
        while self.remaining:
            if time.monotonic() > deadline:
                self._timeout(links, timeout_s)
            if sending_turn:
                link = next((candidate for candidate in links if candidate.out), None)
                if link is not None:
                    self._write(link, deadline, budget=self.piece)
            else:
                readers = [candidate for candidate in links if self._wants_read(candidate)]
                ready = self._wait_readable(readers, ALTERNATE_READ_WAIT_S if any(x.out for x in links)
                                            else min(1.0, max(0.0, deadline - time.monotonic())))
                if ready is not None:
                    self._read(ready, deadline, budget=self.piece)
            sending_turn = not sending_turn

    # ----------------------------------------------------------------------------------- protocol
    def _advance(self, link: Link) -> None:
        """--handshake none: queue what may go now; ``send_first`` decides which kind goes first."""
        if self.send_first:
            self._queue_sends(link)
            self._post_receives(link)
        else:
            self._post_receives(link)
            self._queue_sends(link)

    def _post_receives(self, link: Link) -> None:
        while link.to_post:
            link.posted.append(link.to_post.popleft())

    def _queue_sends(self, link: Link) -> None:
        while link.to_send and link.to_send[0].ready():
            self._queue_data(link, link.to_send.popleft())

    def _queue_data(self, link: Link, op: Op) -> None:
        header = bytearray(wire.HEADER_BYTES)
        wire.pack_header(header, wire.MSG_DATA, link.send_seq, len(op.view), op.stream, total=op.total)
        link.send_seq += 1
        link.out.append(OutMessage(header, op.view, op))

    # --- the notify protocol (gloo's pair)
    def _channel(self, peer: int, stream: int) -> Channel:
        channel = self.channels.get((peer, stream))
        if channel is None:
            data_out = self.routes.get((peer, stream, True))
            data_in = self.routes.get((peer, stream, False))
            own = self.notice_links.get(peer)
            channel = Channel(peer, stream, data_out, data_in, send_notices=own or data_out,
                              recv_notices=own or data_in)
            self.channels[(peer, stream)] = channel
        return channel

    def _notice(self, link: Link | None, kind: int, seq: int, length: int, stream: int) -> None:
        if link is None:
            raise DiagError("no connection for a ready notice; internal routing error")
        header = bytearray(wire.HEADER_BYTES)
        wire.pack_header(header, kind, seq, length, stream)
        link.out.append(OutMessage(header, _EMPTY, None))

    def _post_program(self) -> None:
        """Post the stage's ops in program order until one must wait for earlier ops (gloo's user thread)."""
        while self.program and self.program[0].ready():
            op = self.program.popleft()
            channel = self._channel(op.peer, op.stream)
            if op.kind == SEND:
                self._notice(channel.send_notices, wire.MSG_SEND_READY, channel.send_ready_out, len(op.view),
                             op.stream)
                channel.send_ready_out += 1
                self.unposted[(op.peer, op.stream)] -= 1
                if channel.credits:
                    self._start_send(channel, op, channel.credits.popleft())
                else:
                    channel.waiting.append(op)
            else:
                assert op.link is not None
                op.link.posted.append(op)
                self._notice(channel.recv_notices, wire.MSG_RECV_READY, channel.recv_ready_out, len(op.view),
                             op.stream)
                channel.recv_ready_out += 1

    def _start_send(self, channel: Channel, op: Op, posted: int) -> None:
        if posted != len(op.view):
            raise Mismatch(f"rank {op.peer} posted a receive of {posted} bytes for a send of "
                           f"{len(op.view)} bytes: the ranks called different operations or sizes")
        assert op.link is not None
        self._queue_data(op.link, op)

    def _on_notice(self, kind: int, stream: int, seq: int, length: int, peer: int) -> None:
        if not self.notify:
            raise DiagError(f"rank {peer} sent a ready notice but this rank runs --handshake none; "
                            "are all ranks using the same --handshake?")
        channel = self._channel(peer, stream)
        if kind == wire.MSG_SEND_READY:
            if seq != channel.send_ready_in & 0xFFFFFFFF:
                raise DiagError(f"rank {peer} sent SEND_READY {seq}, expected {channel.send_ready_in & 0xFFFFFFFF}")
            channel.send_ready_in += 1
            return
        if seq != channel.recv_ready_in & 0xFFFFFFFF:
            raise DiagError(f"rank {peer} sent RECV_READY {seq}, expected {channel.recv_ready_in & 0xFFFFFFFF}")
        channel.recv_ready_in += 1
        if channel.waiting:
            self._start_send(channel, channel.waiting.popleft(), length)
            return
        limit = max(0, self.unposted[(peer, stream)]) + self.early_credits
        if len(channel.credits) >= limit:
            raise DiagError(f"rank {peer} sent more RECV_READY notices (stream {stream}) than it can have posted "
                            f"receives for ({limit}); are all ranks running the same diag and operations?")
        channel.credits.append(length)

    def _complete(self, op: Op) -> None:
        op.done = True
        self.remaining -= 1
        if self.notify:
            self._post_program()
            return
        for link in self.stage_links:
            if link.to_send or link.to_post:
                self._advance(link)

    def _wants_read(self, link: Link) -> bool:
        # Notify: like gloo's device thread, always read what arrives (notices may come at any time).
        if self.notify:
            return not link.eof or self._expects(link)
        return bool(link.receiving is not None or link.header_filled or link.posted)

    def _expects(self, link: Link) -> bool:
        """Whether this rank still waits for bytes on ``link`` (data, or RECV_READY for a waiting send)."""
        return bool(link.posted or link.receiving is not None or link.header_filled
                    or any(channel.waiting and channel.send_notices is link for channel in self.channels.values()))

    # ----------------------------------------------------------------------------------- I/O
    def _write(self, link: Link, deadline: float | None, budget: int | None = None) -> bool:
        """Write queued messages until the socket is full (deadline None) or ``budget`` bytes went out
        (blocking on this socket alone, --io alternate). Returns whether any byte moved."""
        sock = link.conn.sock
        moved = 0
        while link.out and (budget is None or moved < budget):
            message = link.out[0]
            limit = None if budget is None else budget - moved
            try:
                if message.header_sent < len(message.header):
                    parts = [memoryview(message.header)[message.header_sent:]]
                    if len(message.payload):
                        parts.append(self._cap(message.payload[message.payload_sent:],
                                               None if limit is None else max(0, limit - len(parts[0]))))
                    sent = sock.sendmsg(parts)
                    header_part = min(sent, len(message.header) - message.header_sent)
                    message.header_sent += header_part
                    message.payload_sent += sent - header_part
                else:
                    sent = sock.send(self._cap(message.payload[message.payload_sent:], limit))
                    message.payload_sent += sent
            except BlockingIOError:
                if deadline is None:
                    break
                self._wait(link, _POLL_OUT, deadline)
                continue
            except OSError as exc:
                self._peer_failed(link, exc)
            moved += sent
            link.bytes_out += sent
            if not message.remaining():
                link.out.popleft()
                if message.op is not None:
                    self._complete(message.op)
        return moved > 0

    @staticmethod
    def _cap(view: memoryview, limit: int | None) -> memoryview:
        return view if limit is None or len(view) <= limit else view[:limit]

    def _read(self, link: Link, deadline: float | None, budget: int | None = None) -> bool:
        sock = link.conn.sock
        peer = link.conn.peer
        moved = 0
        while self._wants_read(link) and (budget is None or moved < budget):
            op = link.receiving
            try:
                if op is None:
                    got = sock.recv_into(link.header_view[link.header_filled:])
                else:
                    target = op.view[link.received:]
                    got = sock.recv_into(self._cap(target, None if budget is None else budget - moved))
            except BlockingIOError:
                if deadline is None or (budget is not None and op is None and not link.header_filled):
                    break
                self._wait(link, _POLL_IN, deadline)
                continue
            except OSError as exc:
                self._peer_failed(link, exc)
            if got == 0:
                if self.notify and not self._expects(link):
                    # The peer finished and closed while this rank still reads greedily: not a failure
                    # unless a later operation needs this socket (then _expects turns true and it raises).
                    link.eof = True
                    break
                self._peer_failed(link, None)
            moved += got
            link.bytes_in += got
            if op is not None:
                link.received += got
                if link.received == len(op.view):
                    link.receiving = None
                    self._complete(op)
                    if budget is not None:
                        break
                continue
            link.header_filled += got
            if link.header_filled < wire.HEADER_BYTES:
                continue
            link.header_filled = 0
            self._on_header(link, peer)
            if budget is not None and link.receiving is None:
                break
        return moved > 0

    def _on_header(self, link: Link, peer: int) -> None:
        kind, stream, seq, length = wire.parse_header(link.header, peer)
        if kind == wire.MSG_ABORT:
            raise PeerAborted(peer, length)
        if kind != wire.MSG_DATA:
            self._on_notice(kind, stream, seq, length, peer)
            return
        if not link.posted:
            raise Mismatch(f"rank {peer} sent {length} data bytes nobody asked for; "
                           "are all ranks running the same operations and knobs?")
        op = link.posted[0]
        _tag, total = wire.header_tag_total(link.header)
        if total != op.total:
            raise Mismatch(f"rank {peer} moves {total} bytes per rank in this operation where this rank moves "
                           f"{op.total}: the ranks called it with different sizes")
        if seq != link.recv_seq & 0xFFFFFFFF or length != len(op.view):
            raise Mismatch(f"rank {peer} sent message {seq} of {length} bytes where message "
                           f"{link.recv_seq & 0xFFFFFFFF} of {len(op.view)} bytes was expected: "
                           "the ranks called different operations or sizes")
        link.posted.popleft()
        link.recv_seq += 1
        if length == 0:
            self._complete(op)
        else:
            link.receiving = op
            link.received = 0

    # ----------------------------------------------------------------------------------- waiting
    def _wait(self, link: Link, mask: int, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            self._timeout([link], self.timeout_s)
        poller = select.poll()
        poller.register(link.conn.fd, mask)
        poller.poll(max(1, int(min(left, 1.0) * 1000)))

    @staticmethod
    def _wait_readable(links: list[Link], wait_s: float) -> Link | None:
        if not links:
            return None
        poller = select.poll()
        by_fd = {link.conn.fd: link for link in links}
        for fd in by_fd:
            poller.register(fd, _POLL_IN)
        events = poller.poll(max(0, int(wait_s * 1000)))
        return by_fd[events[0][0]] if events else None

    # ----------------------------------------------------------------------------------- failures
    def _abort_peers(self, reason: int, exc: DiagError) -> None:
        """Best effort: one ABORT on every connection this rank writes on, so that peers waiting for this
        rank fail at once with the cause instead of timing out (or, once this process exits, reporting it
        dead). A half-written message is finished first (a header must start at a message boundary); a
        peer that does not read within ABORT_FLUSH_S, or whose connection failed, is skipped."""
        failed_peer = exc.peer if isinstance(exc, PeerAborted) else None
        deadline = time.monotonic() + ABORT_FLUSH_S
        links = {id(link): link for link in self.routes.values()}
        links.update({id(link): link for link in self.notice_links.values()})
        for link in links.values():
            if link.conn.peer == failed_peer or not (link.conn.sends or link in self.notice_links.values()):
                continue
            head = link.out[0] if link.out and (link.out[0].header_sent or link.out[0].payload_sent) else None
            link.out.clear()
            if head is not None:
                head.op = None       # finishing it completes nothing: the operation is over
                link.out.append(head)
            header = bytearray(wire.HEADER_BYTES)
            wire.pack_header(header, wire.MSG_ABORT, 0, reason)
            link.out.append(OutMessage(header, _EMPTY, None))
            try:
                while link.out and time.monotonic() < deadline:
                    if not self._write(link, None):
                        self._wait_quietly(link, _POLL_OUT, deadline)
            except DiagError:
                pass
            link.out.clear()

    @staticmethod
    def _wait_quietly(link: Link, mask: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(link.conn.fd, mask)
        poller.poll(max(1, int(min(max(0.0, deadline - time.monotonic()), 0.1) * 1000)))

    def _timeout(self, links: list[Link], timeout_s: float) -> None:
        starved = sorted({link.conn.peer for link in links
                          if link.posted or link.receiving is not None or link.header_filled}
                         | {channel.peer for channel in self.channels.values() if channel.waiting})
        blocked = sorted({link.conn.peer for link in links if link.out})
        parts = []
        if starved:
            parts.append(f"no data from rank(s) {', '.join(map(str, starved))}")
        if blocked:
            parts.append(f"rank(s) {', '.join(map(str, blocked))} not reading")
        raise DiagError(f"timed out after {timeout_s:g}s: {'; '.join(parts) or 'no progress'}; that rank is "
                        "stuck, dead or in another operation (check its log), or raise the timeout")

    @staticmethod
    def _peer_failed(link: Link, exc: OSError | None) -> None:
        peer = link.conn.peer
        if exc is None or exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
            raise DiagError(f"rank {peer} closed its connection ({link.conn.label}) in the middle of an "
                            "operation: that rank died or exited early; see its log")
        raise DiagError(f"socket error talking to rank {peer} ({link.conn.label}): {exc.strerror}")
