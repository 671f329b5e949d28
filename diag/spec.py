"""A sweep is data: a frozen SweepSpec that says what to run, read by every launcher and runner."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from diag import validate
from diag.errors import DiagError

# diag_tcp: diag's raw transport as a torch.distributed backend, driven through torch's API as a
# user's script drives it (ranks start through diag.exec, the way `diag exec` runs a script).
BACKENDS = ("gloo", "nccl", "raw", "diag_tcp")
DTYPES = ("uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
ORDERS = ("recv-first", "send-first")


@dataclass(frozen=True)
class SweepSpec:
    backend: str = "gloo"
    ops: tuple[str, ...] = ("all_gather",)
    sizes: tuple[int, ...] = (1024,)          # per-rank input bytes
    world_sizes: tuple[int, ...] = ()         # () = run in place under an env:// launcher
    algo: str = "default"                     # raw transport: ring | pairwise | direct
    warmup: int = 5
    iters: int = 20
    gap_s: float = 0.0                        # idle time before each timed iteration
    timeout_s: float = 60.0                   # per collective; a dead or hung peer fails within it
    dtype: str = "float32"
    device: str = "cpu"                       # "cpu" or "cuda" (nccl)
    order: str = "recv-first"                 # exchange: which call each rank posts first
    check: bool = True                        # verify every timed iteration
    seed: int = 0
    knobs: dict[str, Any] = field(default_factory=dict)   # transport options (raw: conn, handshake, ...)
    # Adaptive rows: past `iters`, keep sampling (one batch at a time) until the standard error of the mean
    # time is at most target_sem of it, or max_iters were run. 0: exactly `iters`.
    max_iters: int = 0
    target_sem: float = 0.03
    # ... and stop extending a row once its timed iterations took this many seconds (0: no limit): small sizes
    # get many iterations, large ones `iters` (a profile under a time budget).
    row_budget_s: float = 0.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise DiagError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.dtype not in DTYPES:
            raise DiagError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.order not in ORDERS:
            raise DiagError(f"unknown order {self.order!r}: choose recv-first or send-first")
        if self.iters < 1 or self.warmup < 0:
            raise DiagError("--iters must be >= 1 and --warmup >= 0")
        if self.max_iters and self.max_iters < self.iters:
            raise DiagError("max_iters must be at least iters (0: exactly iters)")
        if not 0 < self.target_sem < 1:
            raise DiagError("target_sem must be between 0 and 1 (a fraction of the mean)")
        if not self.sizes:
            raise DiagError("no sizes to run")
        if any(n < 1 for n in self.world_sizes):
            raise DiagError("world sizes must be >= 1")
        validate.seconds(self.timeout_s, "timeout_s (--timeout)")
        validate.seconds(self.gap_s, "gap_s (--gap-ms / 1000)", allow_zero=True)
        validate.seconds(self.row_budget_s, "row_budget_s", allow_zero=True)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSpec:
        data = dict(data)
        for name in ("ops", "sizes", "world_sizes"):
            if name in data:
                data[name] = tuple(data[name])
        return cls(**data)

    def replace(self, **changes: Any) -> SweepSpec:
        return dataclasses.replace(self, **changes)
