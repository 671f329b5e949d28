"""Shared fixtures for the lab tests: root checks, unique lab names, guaranteed teardown."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_counter = itertools.count()


def is_root_with_netns() -> bool:
    from diag.lab.netns import CAP_NET_ADMIN, CAP_SYS_ADMIN, has_capability

    return (has_capability(CAP_NET_ADMIN) and has_capability(CAP_SYS_ADMIN)
            and all(shutil.which(tool) for tool in ("ip", "tc", "ethtool")))


requires_root = pytest.mark.skipif(
    not is_root_with_netns(),
    reason="needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and ip/tc/ethtool: network namespaces and tc qdiscs",
)


def unique_lab_name(tag: str = "") -> str:
    """Lab names must not clash with other engineers' concurrent test runs: pid + counter (<= 12 chars)."""
    name = f"t{os.getpid() % 10_000_000}{next(_counter)}{tag}"
    return name[:12]


def lab_netns(name: str) -> list[str]:
    """This lab's namespaces that exist now."""
    from diag.lab.config import owns_netns
    from diag.lab.netns import list_netns

    return [ns for ns in list_netns() if owns_netns(name, ns)]


def root_links() -> set[str]:
    """Interface names in the test's own namespace (the lab must never add any)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


@pytest.fixture
def lab_names() -> Iterator[list[str]]:
    """Append every lab name a test uses; each is torn down afterwards, whatever happened."""
    names: list[str] = []
    yield names
    from diag.lab import tear_down

    for name in names:
        tear_down(name)
        assert not lab_netns(name), f"namespaces of lab {name} survived teardown"
