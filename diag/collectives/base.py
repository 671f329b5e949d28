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


class Pattern:
    """Caches ``i % 101`` per (count, dtype, device) so filling and checking cost one pass each."""

    def __init__(self) -> None:
        self._base: dict[tuple[int, str, str], torch.Tensor] = {}

    def base(self, count: int, like: torch.Tensor) -> torch.Tensor:
        import torch

        key = (count, str(like.dtype), str(like.device))
        if key not in self._base:
            self._base.clear()  # one size at a time: do not hoard memory across a sweep
            self._base[key] = (torch.arange(count, device=like.device) % PATTERN_MODULUS).to(like.dtype)
        return self._base[key]

    def fill(self, target: torch.Tensor, rank: int, iteration: int, seed: int) -> None:
        base = self.base(target.numel(), target)
        target.copy_(base)
        target.add_(pattern_offset(rank, iteration, seed))

    def count_wrong(self, actual: torch.Tensor, rank: int, iteration: int, seed: int) -> int:
        base = self.base(actual.numel(), actual)
        return int(actual.ne(base + pattern_offset(rank, iteration, seed)).sum().item())


class Collective(ABC):
    """One collective operation. Sizes are per-rank input bytes (``size_bytes``)."""

    name: str = ""
    min_world_size: int = 1
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
