"""Reductions in gloo's exact order, so that diag's results equal gloo's bit for bit.

The transport gathers every rank's values and reduces locally; the order matters for floating point
(rounding, -0.0, NaN). gloo reduces with its ring (gloo/allreduce.cc, ``ring``): the input is cut into
``world_size`` chunks (segments of at most 1 MiB, at least 2 per rank, rounded to whole elements); chunk c
travels the ring downwards, starting with rank c-1's values, and every rank j it passes computes
``fn(own_j, received)``, the last one being rank c:

    fn(x[c], fn(x[c+1], ... fn(x[c-2], x[c-1])))          (ranks mod world_size)

in the tensor's own dtype, one operation at a time (float16/bfloat16 are rounded after every step, as
gloo's ``float16`` and c10's ``BFloat16`` operators do). gloo's reduce, reduce_scatter (the tensor form:
the whole input reduced, each rank keeping its slice; the list form: each output reduced as a tensor of its
own) and allreduce_coalesced (the tensors flattened into one) follow the same ring; tests/test_raw_backend.py
compares them with gloo bit for bit on 2 and 3 ranks.

``fn`` is gloo's: ``a + b``, ``a * b``, ``std::max(a, b)`` (``b`` if ``a < b``, else ``a``: the order decides
-0.0 against 0.0 and whether a NaN wins), ``std::min``, and for integers ``&``, ``|``, ``^``; bools as the
bytes they are (gloo adds them as uint8: a SUM of two True is the byte 2); a bfloat16 NaN from a sum or product is c10's 0x7FC0; AVG (floating point only) is
the SUM divided by the group size in the dtype, as torch 2.13's gloo does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diag.errors import DiagError

if TYPE_CHECKING:
    import torch

REDUCE_OPS = ("sum", "product", "max", "min", "band", "bor", "bxor", "avg")
BITWISE_OPS = ("band", "bor", "bxor")
MAX_SEGMENT_BYTES = 1 << 20      # gloo's AllreduceOptionsImpl::kMaxSegmentSize


def check_reduction(op: str, dtype: torch.dtype) -> None:
    """gloo's refusals, before anything moves (so that a refused call leaves the group usable)."""
    if op not in REDUCE_OPS:
        raise DiagError(f"reduce op {op!r} is not supported (choose {', '.join(REDUCE_OPS)})")
    if op in BITWISE_OPS and (dtype.is_floating_point or dtype.is_complex):
        raise DiagError(f"Cannot use ReduceOp.{op.upper()} with non-integral dtype {dtype}")
    if op == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise DiagError(f"ReduceOp.AVG of {dtype} tensors: the average is not a {dtype} (gloo fails the same way)")


def ring_chunks(numel: int, element_size: int, world_size: int) -> list[tuple[int, int]]:
    """Element ranges [lo, hi) of gloo's ring chunks 0..world_size-1 for a tensor of ``numel`` elements."""
    total = numel * element_size
    max_segment = element_size * max(1, MAX_SEGMENT_BYTES // element_size)
    segments = _round_up(max(_ceil_div(total, max_segment), 2 * world_size), world_size)
    per_rank = segments // world_size
    segment_bytes = _round_up(_ceil_div(total, segments), element_size)
    chunk_elements = per_rank * segment_bytes // element_size
    return [(min(numel, c * chunk_elements), min(numel, (c + 1) * chunk_elements)) for c in range(world_size)]


def copy_result(target: torch.Tensor, result: torch.Tensor) -> None:
    """``target.copy_(result)``, bools byte for byte (a copy as bool would turn gloo's byte 2 into 1)."""
    import torch

    if target.dtype == torch.bool:
        target.view(torch.uint8).copy_(result.reshape(target.shape).view(torch.uint8))
    else:
        target.copy_(result.reshape(target.shape))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, multiple: int) -> int:
    return _ceil_div(a, multiple) * multiple


def _fn(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    import torch

    if op == "sum":
        return a + b
    if op == "product":
        return a * b
    if op == "max":
        return torch.where(a < b, b, a)
    if op == "min":
        return torch.where(b < a, b, a)
    if op == "band":
        return a & b
    if op == "bor":
        return a | b
    return a ^ b


def reduce_like_gloo(values: list[torch.Tensor], op: str, start: int = 0, numel: int | None = None) -> torch.Tensor:
    """Reduce ``values`` (rank r's values of one region, flat, in rank order) as gloo's ring would.

    The region is elements [start, start + len) of a tensor of ``numel`` elements (default: the region is
    the whole tensor), whose ring chunks decide each element's order."""
    import torch

    if op == "avg":   # gloo (torch 2.13): the SUM, then divided by the group size in the dtype
        return reduce_like_gloo(values, "sum", start, numel).div_(len(values))
    world_size = len(values)
    flat = [value.reshape(-1) for value in values]
    if flat[0].dtype == torch.bool:
        flat = [value.view(torch.uint8) for value in flat]
    length = flat[0].numel()
    numel = length if numel is None else numel
    out = torch.empty_like(flat[0])
    try:
        for chunk, (lo, hi) in enumerate(ring_chunks(numel, flat[0].element_size(), world_size)):
            lo, hi = max(lo, start) - start, min(hi, start + length) - start
            if hi <= lo:
                continue
            acc = flat[(chunk - 1) % world_size][lo:hi]
            for step in range(2, world_size + 1):
                acc = _fn(op, flat[(chunk - step) % world_size][lo:hi], acc)
            out[lo:hi] = acc
    except (RuntimeError, TypeError) as exc:
        raise DiagError(f"reduce op {op.upper()} on {flat[0].dtype} tensors: {str(exc).splitlines()[0]}") from None
    if values[0].dtype == torch.bool:
        out = out.view(torch.bool)   # the bytes gloo leaves (true + true is the byte 2): copy them as bytes
    elif values[0].dtype == torch.bfloat16 and op in ("sum", "product"):
        # c10::BFloat16 rounds every NaN to 0x7FC0; torch's vectorized bf16 arithmetic keeps other NaN bits
        nan = out.isnan()
        if bool(nan.any()):
            out[nan] = torch.tensor(0x7FC0, dtype=torch.int16).view(torch.bfloat16)
    return out.view(values[0].shape) if values[0].numel() == out.numel() else out


__all__ = ["REDUCE_OPS", "check_reduction", "copy_result", "reduce_like_gloo", "ring_chunks"]
