"""What a collective means: byte counts, the nccl-tests bus factor, seeded data and its check.

A collective never times itself and never knows which transport moves its bytes; the harness times it,
the transport (torch.distributed or raw TCP) moves the bytes. A new collective is a small module that
subclasses Collective and registers itself in diag/collectives/__init__.py.

Seeded data: element i of rank r's input in timed iteration k is ``i % 101 + (13 r + 7 k + seed) % 101``,
a pattern that is exact in every supported dtype (bfloat16 included), differs per rank and per iteration
(a stale buffer is caught) and per position (a misplaced block is caught).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from diag.transports.base import Transport

PATTERN_MODULUS = 101


@dataclass
class Buffers:
    input: torch.Tensor
    output: torch.Tensor | None = None
    scratch: dict[str, Any] = field(default_factory=dict)


def pattern_offset(rank: int, iteration: int, seed: int) -> int:
    return (13 * rank + 7 * iteration + seed) % PATTERN_MODULUS


def _numpy_view(tensor: torch.Tensor) -> np.ndarray | None:
    """The tensor's memory as a numpy array (no copy) where numpy has the dtype and the tensor is on CPU.

    Fill and check run between timed iterations, and any work there slows the next timed op (see
    harness.RING_DEPTH); on small sizes torch's per-call dispatch (~5 us an op) made the check alone cost
    ~60 us at N=2 (1 KiB). numpy does the same arithmetic in ~1 us an op. bfloat16 and device tensors stay
    on torch.
    """
    import torch

    if tensor.device.type != "cpu" or tensor.dtype == torch.bfloat16 or tensor.requires_grad:
        return None
    return tensor.numpy()


def clear(tensor: torch.Tensor) -> None:
    """Zero a buffer (numpy where it can, for the reason above): a block nobody wrote shows as wrong."""
    array = _numpy_view(tensor)
    if array is not None:
        array.fill(0)
    else:
        tensor.zero_()


class Pattern:
    """Caches ``i % 101`` per (count, dtype, device) so filling and checking cost one pass each."""

    def __init__(self) -> None:
        self._key: tuple[int, Any, Any] | None = None
        self._base: torch.Tensor | None = None
        self._base_array: np.ndarray | None = None

    def base(self, count: int, like: torch.Tensor) -> torch.Tensor:
        return self._cached(count, like)[0]

    def _cached(self, count: int, like: torch.Tensor) -> tuple[torch.Tensor, np.ndarray | None]:
        """(base tensor, its numpy view or None); one size at a time: no hoarding memory across a sweep."""
        import torch

        key = (count, like.dtype, like.device)
        if self._base is None or key != self._key:
            self._base = (torch.arange(count, device=like.device) % PATTERN_MODULUS).to(like.dtype)
            self._base_array = _numpy_view(self._base)
            self._key = key
        return self._base, self._base_array

    def fill(self, target: torch.Tensor, rank: int, iteration: int, seed: int) -> None:
        base, base_array = self._cached(target.numel(), target)
        offset = pattern_offset(rank, iteration, seed)
        if base_array is not None and (array := _numpy_view(target)) is not None:
            np.add(base_array, offset, out=array)
        else:
            target.copy_(base)
            target.add_(offset)

    def count_wrong(self, actual: torch.Tensor, rank: int, iteration: int, seed: int) -> int:
        return self.count_wrong_blocks(actual, [rank], iteration, seed)

    def count_wrong_blocks(self, actual: torch.Tensor, sources: list[int], iteration: int, seed: int,
                           base: torch.Tensor | None = None) -> int:
        """Elements of ``actual`` (len(sources) equal contiguous blocks) that differ from block j =
        ``base + offset(sources[j])``; ``base`` defaults to the pattern's ``i % 101`` over one block."""
        import torch

        rows = len(sources)
        width = actual.numel() // rows
        if base is None:
            base, base_array = self._cached(width, actual)
        else:
            base_array = _numpy_view(base)
        offsets = [pattern_offset(source, iteration, seed) for source in sources]  # < 101: fits every dtype
        if base_array is not None and (array := _numpy_view(actual)) is not None:
            expected = base_array + np.array(offsets, dtype=base_array.dtype)[:, None]
            return int(np.count_nonzero(array.reshape(rows, width) != expected))
        column = torch.tensor(offsets, dtype=base.dtype, device=base.device).view(rows, 1)
        return int(torch.count_nonzero(actual.view(rows, width).ne(base + column)))


class Collective(ABC):
    """One collective operation. Sizes are per-rank input bytes (``size_bytes``)."""

    name: str = ""
    min_world_size: int = 1
    # Every rank talks to one peer only, so the world size does not change the traffic pattern.
    pairwise: bool = False
    # The op's input bytes must split into world_size equal chunks (reduce_scatter, all_to_all).
    divisible_by_world: bool = False

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.pattern = Pattern()

    @abstractmethod
    def total_bytes(self, size_bytes: int, world_size: int) -> int:
        """nccl-tests' ``size`` for this op: the bytes algbw divides by time."""

    @abstractmethod
    def bus_factor(self, world_size: int) -> float:
        """busbw = algbw x this factor (nccl-tests doc/PERFORMANCE.md)."""

    def volume_bytes(self, size_bytes: int, world_size: int) -> int:
        """Per-device volume D: bytes that cross each rank's link in the bus model = size x bus factor.

        For all_gather this is (N-1) x per-rank bytes, the D users plot; for all_reduce 2(N-1)/N x size.
        """
        return round(self.total_bytes(size_bytes, world_size) * self.bus_factor(world_size))

    @abstractmethod
    def allocate(self, count: int, dtype: torch.dtype, device: torch.device, rank: int, world_size: int) -> Buffers:
        ...

    @abstractmethod
    def fill(self, buffers: Buffers, rank: int, world_size: int, iteration: int) -> None:
        ...

    @abstractmethod
    def run(self, transport: Transport, buffers: Buffers) -> None:
        ...

    @abstractmethod
    def count_wrong(self, buffers: Buffers, rank: int, world_size: int, iteration: int) -> int:
        ...


def pair_peer(rank: int, world_size: int) -> int | None:
    """Point-to-point ops pair ranks (0,1), (2,3), ...; with an odd world size the last rank idles."""
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    return peer if peer < world_size else None
