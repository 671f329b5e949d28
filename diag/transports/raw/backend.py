"""The torch.distributed backend ``diag_tcp``: diag's raw transport behind torch's ProcessGroup API.

``register()`` adds it with ``torch.distributed.Backend.register_backend(..., extended_api=True,
devices=["cpu"])``; afterwards an unchanged script that calls ``init_process_group(backend="diag_tcp")``
moves its bytes over diag's sockets. Settings come from the environment, so the script needs no change:

- ``DIAG_TCP_ALGO``  ring | pairwise | direct (default ring)
- ``DIAG_TCP_ORDER`` recv-first | send-first
- ``DIAG_TCP_KNOBS`` JSON object of raw transport knobs, e.g. ``{"conn": "shared", "chunks": 2}``
- ``DIAG_TCP_TOKEN`` the run token, 32 hex digits, the same on every rank; unset: rank 0 publishes one in
  the job's store (docs/raw-tcp.md, "Trust model"). diag's own launches set it from the 0600 job file.

What torch needs of a backend, and how it gets it here (torch 2.13; docs/raw-tcp.md, "The torch.distributed
backend"): torch's C++ ``Backend`` class cannot be subclassed from Python, so the group is a Python
``ProcessGroup`` subclass (as torch's own Python backends are). It keeps its group name and description
itself (``pg.group_name``, which DeviceMesh, DTensor and the functional collectives resolve groups by) and
registers the cpu device type, so ``pg._device_types`` is ``[cpu]``. Collectives run when called, one at
a time, on one mesh of sockets, and return a finished Work; point-to-point runs on a second mesh, driven by
a background thread (p2p.py), and returns at once with a Work that completes when the bytes moved.
Every op gloo offers on CPU is here, with gloo's results bit for bit (reductions.py); what is not (AVG,
PREMUL_SUM, sparse tensors, non-CPU tensors) is a one-line error naming the op and the backend.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
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
# gloo's reduce functions (ProcessGroupGloo.cpp toFunction, and torch 2.13's AVG); PREMUL_SUM is refused as gloo does
# Building the two meshes waits at least this long for every rank (ranks of a loaded machine reach
# init_process_group seconds apart); operations keep the group's own timeout.
SETUP_FLOOR_S = 60.0
REDUCE_NAMES = {"SUM": "sum", "PRODUCT": "product", "MIN": "min", "MAX": "max", "BAND": "band", "BOR": "bor",
                "BXOR": "bxor", "AVG": "avg"}


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
    dist.Backend.register_backend(BACKEND_NAME, _create_extended, extended_api=True, devices=["cpu"])


def _create_extended(options: Any, backend_options: Any = None) -> Any:
    """The creator torch calls with ``extended_api=True``: it names the group and its global ranks."""
    return create_process_group(options.store, options.group_rank, options.group_size, options.timeout,
                                group_name=getattr(options, "group_id", "") or "",
                                global_ranks=list(getattr(options, "global_ranks_in_group", []) or []))


def create_process_group(store: Any, rank: int, world_size: int, timeout: timedelta, group_name: str = "",
                         global_ranks: Sequence[int] = ()) -> Any:
    """Two meshes on ``store``: one for collectives, one for point-to-point (its own thread)."""
    from diag.transports.raw.transport import RawTransport

    knobs = knobs_from_env()
    token = token_from_env()
    seconds = timeout.total_seconds()
    setup = max(seconds, SETUP_FLOOR_S)
    collectives = RawTransport(knobs, rank, world_size, seconds, store=store, token=token, setup_timeout_s=setup)
    try:
        p2p_mesh = RawTransport(knobs, rank, world_size, seconds, store=store, token=token, setup_timeout_s=setup)
    except BaseException:
        collectives.close()
        raise
    return _process_group_class()(collectives, p2p_mesh, group_name, list(global_ranks), seconds)


_CLASS: type | None = None


def _process_group_class() -> type:
    """The class is built on first use so importing this module never imports torch."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _build_class()
    return _CLASS


def _build_class() -> type:
    import torch
    import torch.distributed as dist
    from torch.futures import Future

    from diag.transports.raw.engine import RECV, SEND
    from diag.transports.raw.p2p import Request
    from diag.transports.raw.transport import RawTransport, tensor_bytes

    reduce_types = {member: name for name, member in dist.ReduceOp.RedOpType.__members__.items()}

    def failure(op: str, exc: BaseException) -> RuntimeError:
        """One line naming the backend and the op; communication failures as torch's DistBackendError."""
        text = getattr(exc, "detail", None) or str(exc)
        text = text.splitlines()[0] if text else type(exc).__name__
        kind = dist.DistBackendError if isinstance(exc, DiagError) else RuntimeError
        return kind(f"{BACKEND_NAME} {op}: {text}")

    def refuse(op: str, text: str) -> RuntimeError:
        return RuntimeError(f"{BACKEND_NAME} {op}: {text}")

    def reduce_name(op: str, opts: Any) -> str:
        if opts is None:
            return "sum"
        red = opts.reduceOp
        kind = getattr(red, "op", red)
        name = reduce_types.get(kind, str(kind))
        if name in REDUCE_NAMES:
            return REDUCE_NAMES[name]
        if name == "PREMUL_SUM":
            raise refuse(op, f"Cannot use ReduceOp.{name} with {BACKEND_NAME} (as with gloo); multiply, then "
                             "reduce with SUM")
        raise refuse(op, f"unknown reduce op {name}")

    def check_tensors(op: str, tensors: Sequence[torch.Tensor]) -> None:
        for tensor in tensors:
            if tensor.device.type != "cpu":
                raise refuse(op, f"{BACKEND_NAME} moves CPU tensors only, not {tensor.device.type} tensors")
            if tensor.layout != torch.strided:
                raise refuse(op, f"{tensor.layout} tensors are not supported; use dense tensors")

    def staged(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.is_contiguous() else tensor.contiguous()

    def write_into(tensor: torch.Tensor, write: Callable[[torch.Tensor], None]) -> None:
        """Let ``write`` fill a contiguous stand-in for tensor, then copy it back if it was a copy."""
        target = staged(tensor)
        write(target)
        if target is not tensor:
            tensor.copy_(target)

    def flat_bytes(tensor: torch.Tensor) -> memoryview:
        return tensor_bytes(tensor)

    def same_shapes(op: str, what: str, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> None:
        for index, tensor in enumerate(tensors):
            if tensor.dtype != like.dtype or tensor.shape != like.shape:
                raise refuse(op, f"invalid {what} at index {index}: expected {like.dtype} {tuple(like.shape)}, "
                                 f"got {tensor.dtype} {tuple(tensor.shape)}")

    class DiagTcpWork(dist.Work):
        """A finished collective, or point-to-point requests that complete in the background."""

        def __init__(self, op: str, outputs: list[Any], requests: Sequence[Request] = (),
                     p2p: Any = None, timeout_s: float = 0.0) -> None:
            super().__init__()
            self._op = op
            self._outputs = outputs
            self._requests = list(requests)
            self._p2p = p2p
            self._timeout_s = timeout_s
            self._future: Future = Future()
            self._lock = threading.Lock()
            self._left = len(self._requests)
            if not self._requests:
                self._future.set_result(outputs)
            for request in self._requests:
                request.callbacks.append(self._one_done)
                if request.finished:
                    self._one_done(request)

        def _one_done(self, request: Request) -> None:
            with self._lock:
                if request.callbacks and self._one_done in request.callbacks:
                    request.callbacks.remove(self._one_done)
                else:
                    return   # counted already (finished before the callback was added)
                self._left -= 1
                last = self._left == 0
            if last:
                error = self._error()
                if error is None:
                    self._future.set_result(self._outputs)
                else:
                    self._future.set_exception(error)

        def _error(self) -> RuntimeError | None:
            failed = next((r for r in self._requests if r.state == "failed"), None)
            if failed is None:
                return None
            return dist.DistBackendError(f"{BACKEND_NAME} {self._label(failed)}: {failed.error}")

        def _label(self, request: Request) -> str:
            return self._op if len(self._requests) == 1 else f"{self._op} ({_describe(request, self._p2p)})"

        def wait(self, timeout: Any = None) -> bool:
            limit = self._timeout_s
            if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
                limit = timeout.total_seconds()
            elif isinstance(timeout, (int, float)) and timeout > 0:
                limit = float(timeout)
            started = time.monotonic()
            for request in self._requests:
                left = max(0.0, started + limit - time.monotonic())
                if not request.event.wait(left):
                    self._p2p.cancel(request, limit)
            error = self._error()
            if error is not None:
                raise error
            return True

        def is_completed(self) -> bool:
            return all(request.finished for request in self._requests)

        def is_success(self) -> bool:
            return self.is_completed() and self._error() is None

        def exception(self) -> Any:
            return self._error() if self.is_completed() else None

        def source_rank(self) -> int:
            sources = [request.source for request in self._requests if request.kind == RECV]
            if len(sources) != 1 or sources[0] is None:
                raise RuntimeError("sourceRank() may only be called on a completed receive's work")
            return int(sources[0])

        def _source_rank(self) -> int:
            return self.source_rank()

        def result(self) -> list[Any]:
            if not self.is_completed():
                raise RuntimeError("Work needs to be completed before calling result(); call wait() first")
            return self._outputs

        def get_future(self) -> Future:
            return self._future

        def synchronize(self) -> None:
            """CPU tensors: nothing to synchronize with."""

    def done(op: str, outputs: list[Any]) -> DiagTcpWork:
        return DiagTcpWork(op, outputs)

    class DiagTcpProcessGroup(dist.ProcessGroup):
        def __init__(self, transport: RawTransport, p2p_mesh: RawTransport, group_name: str,
                     global_ranks: list[int], timeout_s: float) -> None:
            super().__init__(transport.rank, transport.world_size)
            self.transport = transport
            self._p2p_mesh = p2p_mesh
            self._global = global_ranks if len(global_ranks) == transport.world_size else []
            self._p2p = p2p_mesh.point_to_point(self.rank_name)
            self._timeout_s = timeout_s
            self._name = group_name
            self._desc = ""
            self._lock = threading.RLock()     # collectives: one at a time, in call order
            self._coalescing: list[Request] | None = None
            self._closed = False
            # the device type torch looks up (pg._device_types, object collectives), with no C++ backend
            # behind it; an older torch that insists on one leaves _device_types empty
            with contextlib.suppress(TypeError, RuntimeError, AttributeError):
                self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, None)

        # --- identity
        def getBackendName(self) -> str:
            return BACKEND_NAME

        def getGroupName(self) -> str:
            return self._name

        def setGroupName(self, name: str) -> None:
            self._name = name

        def getGroupDesc(self) -> str:
            return self._desc

        def setGroupDesc(self, desc: str) -> None:
            self._desc = desc

        def size(self) -> int:
            return self.transport.world_size

        def rank(self) -> int:
            return self.transport.rank

        def rank_name(self, group_rank: int) -> str:
            """How errors name a rank: its global rank (what isend/irecv take), and its rank in a subgroup."""
            if self._global and self._global[group_rank] != group_rank:
                return f"rank {self._global[group_rank]} (rank {group_rank} of this group)"
            return f"rank {group_rank}"

        def __repr__(self) -> str:
            return (f"DiagTcpProcessGroup(rank={self.transport.rank}, size={self.transport.world_size}, "
                    f"name={self._name!r})")

        # --- running a collective
        def _collective(self, op: str, body: Callable[[], Any], outputs: list[Any]) -> DiagTcpWork:
            if self._closed:
                raise refuse(op, "the process group is destroyed")
            with self._lock:
                try:
                    body()
                except RuntimeError:
                    raise
                except (DiagError, ValueError) as exc:
                    raise failure(op, exc) from None
            return done(op, outputs)

        # --- collectives
        def barrier(self, opts: Any = None) -> DiagTcpWork:
            return self._collective("barrier", self.transport.barrier, [])

        def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DiagTcpWork:
            op = "all_reduce"
            name = reduce_name(op, opts)
            check_tensors(op, tensors)
            if len(tensors) != 1:
                raise refuse(op, "takes one tensor per call (use all_reduce_coalesced for several)")
            tensor = tensors[0]
            self._check_reduction(op, name, tensor.dtype)
            return self._collective(op, lambda: write_into(tensor, lambda t: self.transport.all_reduce(t, name)),
                                    tensors)

        def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> DiagTcpWork:
            op = "all_reduce_coalesced"
            name = reduce_name(op, opts)
            check_tensors(op, tensors)
            if tensors:
                same_dtype = all(t.dtype == tensors[0].dtype for t in tensors)
                if not same_dtype:
                    raise refuse(op, "tensors must all have the same type")
                self._check_reduction(op, name, tensors[0].dtype)

            def body() -> None:
                if not tensors:
                    return
                flat = torch.cat([t.reshape(-1) for t in tensors])   # gloo flattens them into one
                self.transport.all_reduce(flat, name)
                offset = 0
                for tensor in tensors:
                    tensor.copy_(flat[offset:offset + tensor.numel()].view(tensor.shape))
                    offset += tensor.numel()

            return self._collective(op, body, tensors)

        def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DiagTcpWork:
            op = "reduce"
            name = reduce_name(op, opts)
            check_tensors(op, tensors)
            if len(tensors) != 1:
                raise refuse(op, "takes one tensor per call")
            root = opts.rootRank if opts is not None else 0
            self._check_root(op, root)
            tensor = tensors[0]
            self._check_reduction(op, name, tensor.dtype)
            return self._collective(op, lambda: write_into(tensor, lambda t: self.transport.reduce(t, root, name)),
                                    tensors)

        def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> DiagTcpWork:
            op = "broadcast"
            root = opts.rootRank if opts is not None else 0
            check_tensors(op, tensors)
            self._check_root(op, root)

            def body() -> None:
                for tensor in tensors:
                    write_into(tensor, lambda target: self.transport.broadcast(target, root))

            return self._collective(op, body, tensors)

        def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                      opts: Any = None) -> DiagTcpWork:
            op = "all_gather"
            check_tensors(op, input_tensors)
            if len(output_tensors) != len(input_tensors):
                raise refuse(op, "needs one output list per input tensor")
            for outputs, inp in zip(output_tensors, input_tensors, strict=True):
                if len(outputs) != self.transport.world_size:
                    raise refuse(op, f"needs {self.transport.world_size} output tensors, got {len(outputs)}")
                check_tensors(op, outputs)
                same_shapes(op, "output tensor", outputs, inp)

            def body() -> None:
                for outputs, inp in zip(output_tensors, input_tensors, strict=True):
                    gathered = torch.empty((self.transport.world_size, *inp.shape), dtype=inp.dtype)
                    self.transport.all_gather(gathered, staged(inp))
                    for index, out in enumerate(outputs):
                        out.copy_(gathered[index])

            return self._collective(op, body, output_tensors)

        def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> DiagTcpWork:
            op = "all_gather_into_tensor"
            check_tensors(op, [output, input])
            if output.dtype != input.dtype or output.numel() != input.numel() * self.transport.world_size:
                raise refuse(op, f"output must hold world_size x input elements of {input.dtype} "
                                 f"({self.transport.world_size} x {input.numel()}), got {output.numel()} of "
                                 f"{output.dtype}")
            return self._collective(op, lambda: write_into(output, lambda t: self.transport.all_gather(
                t, staged(input))), [output])

        _allgather_base = all_gather_single

        def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                                opts: Any = None) -> DiagTcpWork:
            op = "all_gather_coalesced"
            check_tensors(op, inputs)
            for outputs in output_lists:
                if len(outputs) != len(inputs):
                    raise refuse(op, "every output list needs one tensor per input tensor")
                for out, inp in zip(outputs, inputs, strict=True):
                    same_shapes(op, "output tensor", [out], inp)
            if len(output_lists) != self.transport.world_size:
                raise refuse(op, f"needs {self.transport.world_size} output lists, got {len(output_lists)}")
            if len({t.dtype for t in inputs}) > 1:
                raise refuse(op, "input tensors must all have the same type")

            def body() -> None:
                if not inputs:
                    return
                flat = torch.cat([t.reshape(-1) for t in inputs])
                gathered = torch.empty((self.transport.world_size, flat.numel()), dtype=flat.dtype)
                self.transport.all_gather(gathered, flat)
                for rank, outputs in enumerate(output_lists):
                    offset = 0
                    for out in outputs:
                        out.copy_(gathered[rank, offset:offset + out.numel()].view(out.shape))
                        offset += out.numel()

            return self._collective(op, body, output_lists)

        def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> DiagTcpWork:
            op = "all_gather_into_tensor_coalesced"
            for output, inp in zip(outputs, inputs, strict=True):
                self.all_gather_single(output, inp)
            return done(op, outputs)

        allgather_into_tensor_coalesced = all_gather_single_coalesced

        def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                   opts: Any = None) -> DiagTcpWork:
            op = "gather"
            root = opts.rootRank if opts is not None else 0
            self._check_root(op, root)
            check_tensors(op, input_tensors)
            if len(input_tensors) != 1:
                raise refuse(op, "requires a single-element input tensor list")
            inp = input_tensors[0]
            mine = self.transport.rank == root
            if mine:
                if len(output_tensors) != 1 or len(output_tensors[0]) != self.transport.world_size:
                    raise refuse(op, f"requires a single-element output list containing a list with "
                                     f"{self.transport.world_size} tensors")
                check_tensors(op, output_tensors[0])
                same_shapes(op, "output tensor", output_tensors[0], inp)
            elif output_tensors and any(output_tensors):
                raise refuse(op, "requires empty output on non-root")

            def body() -> None:
                if not mine:
                    self.transport.gather(None, flat_bytes(staged(inp)), root)
                    return
                targets = [staged(t) for t in output_tensors[0]]
                self.transport.gather([flat_bytes(t) for t in targets], flat_bytes(staged(inp)), root)
                for target, out in zip(targets, output_tensors[0], strict=True):
                    if target is not out:
                        out.copy_(target)

            return self._collective(op, body, output_tensors)

        def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                    opts: Any = None) -> DiagTcpWork:
            op = "scatter"
            root = opts.rootRank if opts is not None else 0
            self._check_root(op, root)
            check_tensors(op, output_tensors)
            if len(output_tensors) != 1:
                raise refuse(op, "requires a single-element output tensor list")
            out = output_tensors[0]
            mine = self.transport.rank == root
            if mine:
                if len(input_tensors) != 1 or len(input_tensors[0]) != self.transport.world_size:
                    raise refuse(op, f"requires a single-element input list containing a list with "
                                     f"{self.transport.world_size} tensors")
                check_tensors(op, input_tensors[0])
                same_shapes(op, "input tensor", input_tensors[0], out)
            elif input_tensors and any(input_tensors):
                raise refuse(op, "requires empty input on non-root")

            def body() -> None:
                sources = [flat_bytes(staged(t)) for t in input_tensors[0]] if mine else None
                write_into(out, lambda target: self.transport.scatter(flat_bytes(target), sources, root))

            return self._collective(op, body, output_tensors)

        def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                           opts: Any = None) -> DiagTcpWork:
            op = "reduce_scatter"
            name = reduce_name(op, opts)
            check_tensors(op, outputs)
            if len(outputs) != 1 or len(input_lists) != 1:
                raise refuse(op, "requires a single-element output and input list")
            output, inputs = outputs[0], input_lists[0]
            if len(inputs) != self.transport.world_size:
                raise refuse(op, f"needs {self.transport.world_size} input tensors, got {len(inputs)}")
            check_tensors(op, inputs)
            same_shapes(op, "input tensor", inputs, output)
            self._check_reduction(op, name, output.dtype)
            stacked = torch.stack([staged(t) for t in inputs]) if inputs else None

            def body() -> None:
                write_into(output, lambda target: self.transport.reduce_scatter(target, stacked, name,
                                                                                whole=False))

            return self._collective(op, body, outputs)

        def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> DiagTcpWork:
            op = "reduce_scatter_tensor"
            name = reduce_name(op, opts)
            check_tensors(op, [output, input])
            if output.dtype != input.dtype or input.numel() != output.numel() * self.transport.world_size:
                raise refuse(op, f"input must hold world_size x output elements of {output.dtype} "
                                 f"({self.transport.world_size} x {output.numel()}), got {input.numel()} of "
                                 f"{input.dtype}")
            self._check_reduction(op, name, output.dtype)
            return self._collective(op, lambda: write_into(output, lambda t: self.transport.reduce_scatter(
                t, staged(input), name)), [output])

        _reduce_scatter_base = reduce_scatter_single

        def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                            opts: Any = None) -> DiagTcpWork:
            for output, inp in zip(outputs, inputs, strict=True):
                self.reduce_scatter_single(output, inp, opts)
            return done("reduce_scatter_tensor_coalesced", outputs)

        reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

        def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                              input_split_sizes: list[int], opts: Any = None) -> DiagTcpWork:
            op = "all_to_all_single"
            check_tensors(op, [output, input])
            world = self.transport.world_size
            if output.dtype != input.dtype:
                raise refuse(op, f"input is {input.dtype}, output {output.dtype}")
            sends = self._splits(op, "input", input, list(input_split_sizes), world)
            recvs = self._splits(op, "output", output, list(output_split_sizes), world)

            def body() -> None:
                source = staged(input)
                target = staged(output)
                self.transport.all_to_all_v([flat_bytes(target)[lo:hi] for lo, hi in recvs],
                                            [flat_bytes(source)[lo:hi] for lo, hi in sends], op)
                if target is not output:
                    output.copy_(target)

            return self._collective(op, body, [output])

        alltoall_base = all_to_all_single

        def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                     opts: Any = None) -> DiagTcpWork:
            op = "all_to_all"
            world = self.transport.world_size
            check_tensors(op, [*output_tensors, *input_tensors])
            if len(output_tensors) != world or len(input_tensors) != world:
                raise refuse(op, f"needs {world} input and {world} output tensors")
            dtypes = {t.dtype for t in [*output_tensors, *input_tensors]}
            if len(dtypes) > 1:
                raise refuse(op, "tensors must all have the same type")

            def body() -> None:
                sources = [staged(t) for t in input_tensors]
                targets = [staged(t) for t in output_tensors]
                self.transport.all_to_all_v([flat_bytes(t) for t in targets], [flat_bytes(t) for t in sources], op)
                for target, out in zip(targets, output_tensors, strict=True):
                    if target is not out:
                        out.copy_(target)

            return self._collective(op, body, output_tensors)

        # --- point-to-point
        def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> DiagTcpWork:
            return self._p2p_post("isend", SEND, tensors, dst, tag)

        def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> DiagTcpWork:
            return self._p2p_post("irecv", RECV, tensors, src, tag)

        def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> DiagTcpWork:
            return self._p2p_post("irecv", RECV, tensors, None, tag)

        def _p2p_post(self, op: str, kind: int, tensors: list[torch.Tensor], peer: int | None,
                      tag: int) -> DiagTcpWork:
            check_tensors(op, tensors)
            if len(tensors) != 1:
                raise refuse(op, "takes one tensor per call")
            tensor = tensors[0]
            if not tensor.is_contiguous():
                raise refuse(op, "needs a contiguous tensor (call .contiguous() first)")
            if peer is not None and (not 0 <= peer < self.transport.world_size or peer == self.transport.rank):
                raise refuse(op, f"invalid peer rank {peer} of a group of {self.transport.world_size} "
                                 f"(this rank is {self.transport.rank})")
            if self._closed:
                raise refuse(op, "the process group is destroyed")
            request = Request(kind, peer, int(tag), tensor_bytes(tensor))
            if self._coalescing is not None:
                self._coalescing.append(request)
            else:
                self._p2p.post([request])
            return DiagTcpWork(_describe(request, self._p2p), [tensor], [request], self._p2p, self._timeout_s)

        # --- coalescing (torch's _coalescing_manager): point-to-point ops posted together in one pass
        def _start_coalescing(self, device: Any = None) -> None:
            if self._coalescing is not None:
                raise refuse("_start_coalescing", "coalescing already started")
            self._coalescing = []

        def _end_coalescing(self, device: Any = None) -> DiagTcpWork:
            requests, self._coalescing = self._coalescing or [], None
            if requests:
                self._p2p.post(requests)
            return DiagTcpWork("coalesced point-to-point", [], requests, self._p2p, self._timeout_s)

        # --- lifetime
        def shutdown(self) -> None:
            if self._closed:
                return
            self._closed = True
            self._p2p_mesh.close()
            self.transport.close()

        def abort(self) -> None:
            self.shutdown()

        # --- helpers
        def _check_root(self, op: str, root: int) -> None:
            if not 0 <= root < self.transport.world_size:
                raise refuse(op, f"invalid root rank {root} of a group of {self.transport.world_size}")

        @staticmethod
        def _check_reduction(op: str, name: str, dtype: torch.dtype) -> None:
            from diag.transports.raw.reductions import check_reduction

            try:
                check_reduction(name, dtype)
            except DiagError as exc:
                raise refuse(op, str(exc)) from None

        @staticmethod
        def _splits(op: str, what: str, tensor: torch.Tensor, splits: list[int],
                    world: int) -> list[tuple[int, int]]:
            """Byte ranges of the blocks along dim 0 (equal blocks when ``splits`` is empty)."""
            rows = tensor.shape[0] if tensor.dim() else 1
            if not splits:
                if rows % world:
                    raise refuse(op, f"{what} dim 0 ({rows}) is not divisible by the group size {world}")
                splits = [rows // world] * world
            if len(splits) != world or any(s < 0 for s in splits) or sum(splits) != rows:
                raise refuse(op, f"{what} split sizes {splits} do not match the group size {world} and dim 0 "
                                 f"size {rows}")
            row_bytes = (tensor.numel() // rows if rows else 0) * tensor.element_size()
            edges = [0]
            for size in splits:
                edges.append(edges[-1] + size * row_bytes)
            return list(itertools.pairwise(edges))

    return DiagTcpProcessGroup


def _describe(request: Any, p2p: Any) -> str:
    """'isend to rank 1 (tag 3, 4096 bytes)', with the rank as the group's errors name it."""
    from diag.transports.raw.engine import SEND

    if request.peer is None:
        where = "irecv from any rank"
    else:
        where = f"{'isend to' if request.kind == SEND else 'irecv from'} {p2p.name(request.peer)}"
    return f"{where} (tag {request.tag}, {request.nbytes} bytes)"
