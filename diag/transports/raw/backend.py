"""The torch.distributed backend ``diag_tcp``: a Python ProcessGroup over the raw transport.

``register()`` adds it with ``torch.distributed.Backend.register_backend``; afterwards an unchanged script
that calls ``init_process_group(backend="diag_tcp")`` moves its bytes over diag's sockets. Settings come
from the environment, so the script needs no change:

- ``DIAG_TCP_ALGO``  ring | pairwise | direct (default ring)
- ``DIAG_TCP_ORDER`` recv-first | send-first
- ``DIAG_TCP_KNOBS`` JSON object of raw transport knobs, e.g. ``{"conn": "shared", "chunks": 2}``
- ``DIAG_TCP_TOKEN`` the run token, 32 hex digits, the same on every rank; unset: rank 0 publishes one in
  the job's store (docs/raw-tcp.md, "Trust model"). diag's own launches set it from the 0600 job file.

Operations complete before they return (the returned Work is already finished); CPU tensors only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from diag.errors import DiagError

if TYPE_CHECKING:
    import torch

BACKEND_NAME = "diag_tcp"
ENV_ALGO = "DIAG_TCP_ALGO"
ENV_ORDER = "DIAG_TCP_ORDER"
ENV_KNOBS = "DIAG_TCP_KNOBS"
ENV_TOKEN = "DIAG_TCP_TOKEN"


def knobs_from_env() -> Any:
    from diag.transports.raw.knobs import resolve_knobs

    try:
        extra = json.loads(os.environ.get(ENV_KNOBS) or "{}")
    except json.JSONDecodeError as exc:
        raise DiagError(f"{ENV_KNOBS} is not valid JSON ({exc.msg}); e.g. '{{\"conn\": \"shared\"}}'") from None
    if not isinstance(extra, dict):
        raise DiagError(f"{ENV_KNOBS} must be a JSON object of knobs")
    return resolve_knobs(os.environ.get(ENV_ALGO, "ring"), os.environ.get(ENV_ORDER, "recv-first"), extra)


def token_from_env() -> bytes | None:
    text = os.environ.get(ENV_TOKEN)
    if not text:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise DiagError(f"${ENV_TOKEN} must be hex digits (32 of them), e.g. from secrets.token_hex(16)") from None


def register() -> None:
    """Idempotent: registering twice in one process is a no-op."""
    import torch.distributed as dist

    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu"])


def create_process_group(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    from diag.transports.raw.transport import RawTransport

    transport = RawTransport(knobs_from_env(), rank, world_size, timeout.total_seconds(), store=store,
                             token=token_from_env())
    return _process_group_class()(transport)


def _process_group_class() -> type:
    """The class is built on first use so importing this module never imports torch."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future
    from torch.futures import Future

    from diag.transports.raw.transport import RawTransport

    # opts.reduceOp is a ReduceOp object that compares equal to, but does not hash like, the enum values.
    reduce_names = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.MIN, "min"),
                    (dist.ReduceOp.PRODUCT, "product")]

    def done(result: Any) -> Any:
        future: Future = Future()
        future.set_result(result)
        return _create_work_from_future(future)

    def reduce_name(opts: Any) -> str:
        name = next((name for op, name in reduce_names if opts.reduceOp == op), None)
        if name is None:
            raise ValueError(f"{BACKEND_NAME} supports SUM, MAX, MIN and PRODUCT reductions, not {opts.reduceOp}")
        return name

    def staged(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_contiguous() else tensor.contiguous()

    def write_into(tensor: torch.Tensor, write: Callable[[torch.Tensor], None]) -> None:
        """Let ``write`` fill a contiguous stand-in for tensor, then copy it back if it was a copy."""
        target = staged(tensor)
        write(target)
        if target is not tensor:
            tensor.copy_(target)

    class DiagTcpProcessGroup(dist.ProcessGroup):
        def __init__(self, transport: RawTransport) -> None:
            super().__init__(transport.rank, transport.world_size)
            self.transport = transport

        def getBackendName(self) -> str:
            return BACKEND_NAME

        def size(self) -> int:
            return self.transport.world_size

        def rank(self) -> int:
            return self.transport.rank

        def barrier(self, opts: Any = None) -> Any:
            self.transport.barrier()
            return done(None)

        def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                      opts: Any = None) -> Any:
            for outputs, inp in zip(output_tensors, input_tensors, strict=True):
                gathered = torch.empty((self.transport.world_size, *inp.shape), dtype=inp.dtype)
                self.transport.all_gather(gathered, staged(inp))
                for index, out in enumerate(outputs):
                    out.copy_(gathered[index])
            return done(output_tensors)

        def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
            write_into(output, lambda target: self.transport.all_gather(target, staged(input)))
            return done(output)

        def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
            return self._allgather_base(output, input, opts)

        def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                            opts: Any = None) -> Any:
            for output, inp in zip(outputs, inputs, strict=True):
                self._allgather_base(output, inp)
            return done(outputs)

        def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
            name = reduce_name(opts) if opts is not None else "sum"
            for tensor in tensors:
                write_into(tensor, lambda target: self.transport.all_reduce(target, name))
            return done(tensors)

        def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
            root = opts.rootRank if opts is not None else 0
            for tensor in tensors:
                write_into(tensor, lambda target: self.transport.broadcast(target, root))
            return done(tensors)

        def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                           opts: Any = None) -> Any:
            name = reduce_name(opts) if opts is not None else "sum"
            for output, inputs in zip(outputs, input_lists, strict=True):
                stacked = torch.stack([staged(t) for t in inputs])
                write_into(output, lambda target, stacked=stacked: self.transport.reduce_scatter(target, stacked, name))
            return done(outputs)

        def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
            name = reduce_name(opts) if opts else "sum"
            write_into(output, lambda target: self.transport.reduce_scatter(target, staged(input), name))
            return done(output)

        def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
            return self._reduce_scatter_base(output, input, opts)

        def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                              input_split_sizes: list[int], opts: Any = None) -> Any:
            return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

        def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> Any:
            if output_split_sizes or input_split_sizes:
                raise ValueError(f"{BACKEND_NAME} all_to_all_single supports equal splits only")
            write_into(output, lambda target: self.transport.all_to_all(target, staged(input)))
            return done(output)

        def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
            for tensor in tensors:
                self.transport.send(staged(tensor), dst)
            return done(tensors)

        def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
            for tensor in tensors:
                write_into(tensor, lambda target: self.transport.recv(target, src))
            return done(tensors)

        def shutdown(self) -> None:
            self.transport.close()

        def abort(self) -> None:
            self.transport.close()

        def __repr__(self) -> str:
            return f"DiagTcpProcessGroup(rank={self.transport.rank}, size={self.transport.world_size})"

    return DiagTcpProcessGroup
