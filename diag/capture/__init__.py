"""Capture TCP traffic and analyze it: tcpdump/scapy capture, pcap reader -> numpy columns, flows, metrics.

Public API (used by ``diag sweep --capture`` and ``diag reproduce``)::

    handle = start_capture(path, iface, bpf_filter="tcp", snaplen=128, netns=None)
    info: CaptureInfo = handle.stop()          # also writes <path>.capture.json
    result: dict = analyze_files([pcaps], records=[records.jsonl] or None, bin_s=0.01)

Imports are lazy so ``import diag.capture`` stays cheap (numpy loads on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diag.capture.live import CaptureInfo

__all__ = ["CaptureInfo", "analyze_files", "start_capture"]


def start_capture(*args: Any, **kwargs: Any) -> Any:
    from diag.capture.live import start_capture as _start

    return _start(*args, **kwargs)


def analyze_files(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from diag.capture.analysis import analyze_files as _analyze

    return _analyze(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name == "CaptureInfo":
        from diag.capture.live import CaptureInfo as _info

        return _info
    raise AttributeError(name)
