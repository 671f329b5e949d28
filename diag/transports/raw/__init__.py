"""Raw-TCP reference collectives: the same bytes between the same hosts as fast as TCP allows, with
one knob per suspected mechanism (see docs/raw-tcp.md).

Public API::

    from diag.transports.raw import create_transport
    transport = create_transport(spec, rank, world_size, timeout_s)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diag.transports.raw.knobs import RawKnobs, resolve_knobs

if TYPE_CHECKING:
    from diag.spec import SweepSpec
    from diag.transports.raw.transport import RawTransport


def create_transport(spec: SweepSpec, rank: int, world_size: int, timeout_s: float,
                     store: Any | None = None, token: bytes | None = None) -> RawTransport:
    """Rendezvous (env:// or ``store``), build the connection mesh, return a ready transport. ``token``: the
    run token from a private channel (diag's 0600 job file); None: rank 0 publishes one in the store."""
    from diag.transports.raw.transport import RawTransport

    knobs = resolve_knobs(spec.algo, spec.order, spec.knobs)
    return RawTransport(knobs, rank, world_size, timeout_s, store=store, token=token)


__all__ = ["RawKnobs", "create_transport", "resolve_knobs"]
