"""torch.distributed as a transport: gloo on CPU tensors, NCCL on CUDA tensors.

The process group is created from the env:// variables (torchrun, Slurm via srun + env, the lab), so the
same code runs in place on a real cluster. Calls are the ones a user's script makes (dist.all_gather into a
list of tensors, isend/irecv), so what diag measures is what the user's loop measures, minus its mistakes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from diag.errors import EXIT_NO_DEVICE, DiagError
from diag.transports.base import UnsupportedOperation
from diag.transports.group import GroupContext

# Output buffers whose list of views is kept (the harness cycles through a ring of them), in bytes at most.
GATHER_VIEW_CACHE_BYTES = 8 << 20
MAX_HOST_CHARS = 300     # a rank's "hostname/address" as another rank reports it


def _check_interface(name: str | None) -> None:
    """gloo's own error for a bad interface name is a C++ exception deep in init; say it plainly."""
    if not name:
        return
    import psutil

    known = psutil.net_if_addrs()
    for item in name.split(","):
        if item and item not in known:
            raise DiagError(
                f"network interface {item!r} (GLOO_SOCKET_IFNAME) does not exist here; "
                f"choose one of: {', '.join(sorted(known))}"
            )


class TorchTransport:
    """``group``: run on a subgroup of the job (diag.transports.group.GroupContext) instead of the default
    group; ranks and peers are then the group's, and closing leaves the job's process groups alone."""

    def __init__(self, backend: str, timeout_s: float, device: str = "cpu", group: GroupContext | None = None) -> None:
        if backend == "nccl" and not torch.cuda.is_available():
            raise DiagError("backend nccl needs CUDA, and no CUDA device is visible; use --backend gloo",
                            exit_code=EXIT_NO_DEVICE)
        if backend == "gloo":
            _check_interface(os.environ.get("GLOO_SOCKET_IFNAME"))
        self.backend = backend
        self.algo = "default"
        self.timeout_s = timeout_s
        if backend == "nccl":
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local_rank)
            self.device = torch.device("cuda", local_rank)
        else:
            self.device = torch.device(device)
        self.context = group
        self.group = group.process_group if group is not None else None
        if group is None and not dist.is_initialized():
            try:
                kwargs: dict[str, Any] = {}
                if backend == "nccl":
                    kwargs["device_id"] = self.device
                dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **kwargs)
            except (RuntimeError, ValueError) as exc:
                raise DiagError(f"init_process_group({backend}) failed: {str(exc).splitlines()[0]}") from exc
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self._gather_views: dict[tuple[int, int, torch.dtype], list[torch.Tensor]] = {}
        self._gather_view_bytes = 0
        self._hosts = self._gather_hostnames()  # collective, so done here where every rank takes part

    # --- description -------------------------------------------------------------------------
    def knobs(self) -> dict[str, Any]:
        knobs: dict[str, Any] = {"timeout_s": self.timeout_s, "device": str(self.device)}
        for name, value in sorted(os.environ.items()):
            # DIAG_TCP_TOKEN is the raw transport's run token: a secret, never a recorded knob
            if name.startswith(("GLOO_", "NCCL_", "TORCH_GLOO", "TP_", "DIAG_TCP_")) and name != "DIAG_TCP_TOKEN":
                knobs[name] = value
        return knobs

    def _gather_hostnames(self) -> list[str]:
        """hostname, plus the interface address when GLOO_SOCKET_IFNAME names one (lab hosts share a name)."""
        import socket

        name = socket.gethostname()
        iface = (os.environ.get("GLOO_SOCKET_IFNAME") or "").split(",")[0]
        if iface:
            import psutil

            for addr in psutil.net_if_addrs().get(iface, []):
                if addr.family == socket.AF_INET:
                    name = f"{name}/{addr.address}"
                    break
        from diag.transports import messages

        # data, never a pickle (diag.transports.messages); a rank's name is cut where it would not fit a host name
        return [n[:MAX_HOST_CHARS] if isinstance(n, str) else "?" for n in messages.all_gather(name, group=self.group)]

    def hosts(self) -> list[str]:
        return list(self._hosts)

    # --- operations ----------------------------------------------------------------------------
    def _peer(self, group_rank: int) -> int:
        """torch's point-to-point calls take global ranks, also on a subgroup."""
        return self.context.global_rank(group_rank) if self.context is not None else group_rank

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            dist.barrier(group=self.group)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        # The list form is what users write (and gloo's allgather copies into the list), so we time it.
        # The list of views is made once per small buffer (the harness cycles through a few): building
        # it costs 5-10 us per call, which matters only where the op itself takes microseconds. Cached
        # views keep their buffer alive, hence the bound on what is cached.
        nbytes = output.numel() * output.element_size()
        if nbytes > GATHER_VIEW_CACHE_BYTES:
            dist.all_gather(list(output.chunk(self.world_size)), input, group=self.group)
            return
        key = (output.data_ptr(), output.numel(), output.dtype)
        views = self._gather_views.get(key)
        if views is None:
            if self._gather_view_bytes + nbytes > GATHER_VIEW_CACHE_BYTES:
                self._gather_views.clear()
                self._gather_view_bytes = 0
            views = self._gather_views[key] = list(output.chunk(self.world_size))
            self._gather_view_bytes += nbytes
        dist.all_gather(views, input, group=self.group)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        dist.send(tensor, self._peer(dst), group=self.group)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        dist.recv(tensor, self._peer(src), group=self.group)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int, order: str) -> None:
        other = self._peer(peer)
        if order == "send-first":
            works = [dist.isend(send, other, group=self.group), dist.irecv(recv, other, group=self.group)]
        else:
            works = [dist.irecv(recv, other, group=self.group), dist.isend(send, other, group=self.group)]
        for work in works:
            work.wait()

    def batch_p2p(self, recvs: list[tuple[torch.Tensor, int]], sends: list[tuple[torch.Tensor, int]],
                  order: str) -> None:
        receives = [dist.P2POp(dist.irecv, tensor, self._peer(peer), self.group) for tensor, peer in recvs]
        posts = [dist.P2POp(dist.isend, tensor, self._peer(peer), self.group) for tensor, peer in sends]
        for work in dist.batch_isend_irecv(receives + posts if order == "recv-first" else posts + receives):
            work.wait()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=self.group)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor) -> None:
        try:
            dist.reduce_scatter_tensor(output, input, group=self.group)
        except (RuntimeError, NotImplementedError) as exc:
            raise UnsupportedOperation(f"{self.backend} has no reduce_scatter here: {exc}") from exc

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        dist.broadcast(tensor, self._peer(root), group=self.group)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:
        dist.all_to_all_single(output, input, group=self.group)

    def on_iteration(self, phase: str, index: int) -> None:
        return None

    def row_extra(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        # A subgroup belongs to the job that made it (it runs several steps on it); only the transport that
        # initialized the default group tears it down.
        if self.context is None and dist.is_initialized():
            dist.destroy_process_group()
