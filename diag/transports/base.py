"""How bytes move. A Transport runs one blocking operation at a time and never times itself.

Implementations: ``torch_dist.TorchTransport`` (torch.distributed gloo / nccl) and the raw-TCP transport in
``diag/transports/raw/``. The harness drives either through this interface alone, so their rows compare
one to one. Tensors are contiguous; ``output`` of all_gather holds world_size blocks in rank order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Transport(Protocol):
    backend: str          # "gloo", "nccl", "raw" (records' ``backend``)
    algo: str             # "default" for torch backends; "ring", "pairwise", "direct" for raw
    rank: int
    world_size: int

    def knobs(self) -> dict[str, Any]:
        """Settings in force (socket options, interface, algorithm knobs): recorded in every row."""
        ...

    def hosts(self) -> list[str]:
        """rank -> address or host name, as seen by this transport."""
        ...

    def barrier(self) -> None: ...

    def synchronize(self) -> None:
        """Wait until the last operation really finished (CUDA streams); a no-op on CPU."""
        ...

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None: ...

    def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    def recv(self, tensor: torch.Tensor, src: int) -> None: ...

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, order: str) -> None:
        """Send ``send`` to and receive ``recv`` from ``peer`` at the same time (isend + irecv).
        ``order`` is "recv-first" or "send-first": which of the two calls this rank posts first."""
        ...

    def batch_p2p(self, recvs: list[tuple[torch.Tensor, int]], sends: list[tuple[torch.Tensor, int]],
                  order: str) -> None:
        """Post every receive (tensor, src) and send (tensor, dst) at once and wait for all of them, as
        ``torch.distributed.batch_isend_irecv`` does; ``order`` says which kind is posted first."""
        ...

    def all_reduce(self, tensor: torch.Tensor) -> None: ...

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> None: ...

    def broadcast(self, tensor: torch.Tensor, root: int) -> None: ...

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None: ...

    def on_iteration(self, phase: str, index: int) -> None:
        """Called with phase "begin"/"end" around each timed iteration, outside the timed region:
        a place to sample TCP_INFO. Torch transports do nothing."""
        ...

    def row_extra(self) -> dict[str, Any]:
        """Extra per-row facts (TCP_INFO summaries, ...), collected on every rank after a row."""
        ...

    def close(self) -> None: ...


class UnsupportedOperation(NotImplementedError):
    """The transport does not implement this collective; the harness reports it as one line."""
