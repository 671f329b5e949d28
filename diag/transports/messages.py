"""The job's control messages as data: JSON in uint8 tensors over a gloo group, never pickled.

Everything the ranks of a job tell each other beside the measurement (where they run, what failed, the
probe's ports and results, the records the nodes analyse against, the nodes' files for rank 0) travels
here. torch's object collectives (``all_gather_object``, ``broadcast_object_list``, ``gather_object``)
unpickle what arrives, so anyone who can reach the job's store and group (or one compromised node) would
run code as root on every rank; these functions move bytes and parse them as JSON instead, with limits:

- every message is length-prefixed: the lengths travel first (an int64 per rank) and a rank checks each
  against the limit before it allocates anything, so no rank can make another allocate more than
  ``limit`` per sender (an all_gather: at most ``GATHER_TOTAL_BYTES`` over all senders);
- the payload is UTF-8 JSON, parsed by ``json.loads`` (no objects are built but dicts, lists, strings,
  numbers, booleans and null); a message that is not (bad UTF-8, bad JSON, nesting too deep, an integer
  too long) is one :class:`MessageError` naming the rank that sent it, raised alike on every rank that
  received it;
- a message from rank r is the one in r's slot of the collective (or the one received from r): the
  sender is named by the group, never by what it says.

The wire sequence of :func:`all_gather` and :func:`broadcast` is the one torch's object collectives use
(the sizes, then one padded uint8 tensor per rank), so a peer that still pickles is read as a message that
is not JSON and refused, never unpickled.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from diag.errors import DiagError

if TYPE_CHECKING:
    import torch

MAX_MESSAGE_BYTES = 1 << 20        # one rank's message: identities, notes, errors, probe ports and results
GATHER_TOTAL_BYTES = 64 << 20      # an all_gather's buffer over all ranks (each slot padded to the longest)
MIN_GATHER_SLOT_BYTES = 16 << 10   # what every rank may always send, however many ranks the job has


class MessageError(DiagError):
    """A rank sent something that is not a control message of this job (too long, or not JSON)."""


def encode(value: Any, limit: int = MAX_MESSAGE_BYTES) -> bytes:
    """``value`` as compact UTF-8 JSON; DiagError if it exceeds ``limit`` (diag's own message: a bug)."""
    try:
        data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise DiagError(f"a control message is not plain JSON ({exc}); this is a bug in diag") from None
    if len(data) > limit:
        raise DiagError(f"a control message of {len(data)} bytes exceeds its limit of {limit}; this is a bug in diag")
    return data


def decode(data: bytes | bytearray | memoryview, sender: int, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """The JSON value of one message from rank ``sender``; MessageError naming it for anything else."""
    if len(data) > limit:
        raise MessageError(f"rank {sender} sent a control message of {len(data)} bytes (limit {limit}): "
                           "is every rank running the same diag?")
    try:
        return json.loads(bytes(data).decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = type(exc).__name__ if isinstance(exc, RecursionError) else str(exc).split(":")[0]
        raise MessageError(f"rank {sender} sent a control message that is not diag's JSON ({reason}); refused "
                           "unread: is every rank running the same diag version, and is the job's network "
                           "trusted?") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def gather_slot_limit(world_size: int, limit: int = MAX_MESSAGE_BYTES) -> int:
    """What one rank may send in an all_gather of ``world_size`` ranks (the buffer holds world_size slots)."""
    return min(limit, max(MIN_GATHER_SLOT_BYTES, GATHER_TOTAL_BYTES // max(1, world_size)))


def _check_length(length: int, sender: int, limit: int) -> int:
    if not 0 <= length <= limit:
        raise MessageError(f"rank {sender} announced a control message of {length} bytes (limit {limit}); refused "
                           "before reading it: is every rank running the same diag version?")
    return length


def _u8(data: bytes) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def _device(group: Any) -> Any:
    """Where a collective's tensors live: the GPU for NCCL (which moves nothing else), else the CPU."""
    import torch
    import torch.distributed as dist

    if str(dist.get_backend(group)).lower() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _global(group: Any, group_rank: int) -> int:
    import torch.distributed as dist

    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def all_gather(value: Any, group: Any = None, limit: int = MAX_MESSAGE_BYTES) -> list[Any]:
    """Every rank's ``value``, indexed by group rank. Every rank of ``group`` calls it."""
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    slot = gather_slot_limit(size, limit)
    data = encode(value, slot)
    device = _device(group)
    lengths = torch.zeros(size, dtype=torch.long, device=device)
    dist.all_gather(list(lengths.view(size, 1).unbind(0)),
                    torch.tensor([len(data)], dtype=torch.long, device=device), group=group)
    checked = [_check_length(int(n), r, slot) for r, n in enumerate(lengths.tolist())]
    longest = max(checked)
    out = torch.zeros(longest * size, dtype=torch.uint8, device=device)
    if longest:   # every rank saw the same lengths: all skip it alike
        mine = torch.zeros(longest, dtype=torch.uint8, device=device)
        mine[:len(data)] = _u8(data).to(device)
        dist.all_gather(list(out.view(size, longest).unbind(0)), mine, group=group)
    raw = out.cpu().numpy().tobytes()
    return [decode(raw[r * longest:r * longest + n], r, slot) for r, n in enumerate(checked)]


def broadcast(value: Any, src: int = 0, group: Any = None, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """Rank ``src``'s ``value`` (``src`` is a rank of ``group``) on every rank; others pass anything."""
    import torch
    import torch.distributed as dist

    me = dist.get_rank(group)
    data = encode(value, limit) if me == src else b""
    device = _device(group)
    length = torch.tensor([len(data)], dtype=torch.long, device=device)
    dist.broadcast(length, src=_global(group, src), group=group)
    n = _check_length(int(length[0]), src, limit)
    payload = _u8(data).to(device) if me == src else torch.zeros(n, dtype=torch.uint8, device=device)
    if n:
        dist.broadcast(payload, src=_global(group, src), group=group)
    return decode(payload.cpu().numpy().tobytes(), src, limit)


def broadcast_bytes_into(buffer: torch.Tensor, src: int = 0, group: Any = None) -> None:
    """Rank ``src``'s ``buffer`` (uint8, a length every rank agreed on beforehand) into every rank's."""
    import torch.distributed as dist

    if buffer.numel():
        dist.broadcast(buffer, src=_global(group, src), group=group)


def send(value: Any, dst: int, tag: int, group: Any = None, limit: int = MAX_MESSAGE_BYTES) -> None:
    """One message to rank ``dst`` (a rank of ``group``), which calls :func:`recv` with the same tag."""
    import torch
    import torch.distributed as dist

    data = encode(value, limit)
    dist.send(torch.tensor([len(data)], dtype=torch.long), dst=_global(group, dst), group=group, tag=tag)
    if data:
        dist.send(_u8(data), dst=_global(group, dst), group=group, tag=tag)


def recv(src: int, tag: int, group: Any = None, limit: int = MAX_MESSAGE_BYTES) -> Any:
    """The message rank ``src`` sent with :func:`send` (its length checked before anything is allocated)."""
    import torch
    import torch.distributed as dist

    length = torch.zeros(1, dtype=torch.long)
    dist.recv(length, src=_global(group, src), group=group, tag=tag)
    n = _check_length(int(length[0]), src, limit)
    payload = torch.zeros(n, dtype=torch.uint8)
    if n:
        dist.recv(payload, src=_global(group, src), group=group, tag=tag)
    return decode(payload.numpy().tobytes(), src, limit)


def send_bytes(buffer: torch.Tensor, dst: int, tag: int, group: Any = None) -> None:
    """A uint8 buffer whose length rank ``dst`` already knows (a chunk of a file both sides agreed on)."""
    import torch.distributed as dist

    if buffer.numel():
        dist.send(buffer, dst=_global(group, dst), group=group, tag=tag)


def recv_bytes_into(buffer: torch.Tensor, src: int, tag: int, group: Any = None) -> None:
    import torch.distributed as dist

    if buffer.numel():
        dist.recv(buffer, src=_global(group, src), group=group, tag=tag)


__all__ = ["GATHER_TOTAL_BYTES", "MAX_MESSAGE_BYTES", "MessageError", "all_gather", "broadcast",
           "broadcast_bytes_into", "decode", "encode", "gather_slot_limit", "recv", "recv_bytes_into", "send",
           "send_bytes"]
