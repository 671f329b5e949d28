"""Shared test plumbing: privilege and tool checks whose skips say why."""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from typing import Any

import pytest

from tests import common


@pytest.fixture
def need_root() -> None:
    """The fixture form of common.need_root."""
    common.need_root()


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"'{name}' is not installed (.ci/run installs it with apt)")
    return path


@pytest.fixture(autouse=True)
def _twins_under_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """DIAG_NATIVE=check, set by a test (the tshark agreement tests): every capture read as one chunk in this
    process is also decoded by the reader's numpy twin, and its TCP state computed by the TCP state's twin;
    both must equal the kernels' (native_helpers.comparable; every PacketState field)."""
    if not request.node.path.name.startswith("test_analyze"):
        return
    import dataclasses

    import numpy as np

    from diag.capture import reader, source
    from tests import decode_twin, native_helpers, tcpstate_twin

    read, state = reader.read_capture, source.analyze_packets

    def checked_read(path: Any, first_frame: int = 1, decoder: Any = None) -> Any:
        result = read(path, first_frame, decoder=decoder)
        if decoder is None and os.environ.get("DIAG_NATIVE") == "check" and os.path.isfile(path):
            twin = decode_twin.read_capture(path, first_frame)
            assert native_helpers.comparable(result) == native_helpers.comparable(twin), f"twins differ on {path}"
        return result

    def checked_state(cols: Any, conn: Any, direction: Any, wscale: Any, first_rtt: Any, **kwargs: Any) -> Any:
        out = state(cols, conn, direction, wscale, first_rtt, **kwargs)
        if os.environ.get("DIAG_NATIVE") == "check":
            twin = tcpstate_twin.analyze_packets_numpy(cols, conn, direction, wscale, first_rtt)
            differ = [f.name for f in dataclasses.fields(out) if getattr(out, f.name) is not None
                      and not np.array_equal(getattr(out, f.name), getattr(twin, f.name))]
            assert not differ, f"_ctcp and its numpy twin differ in {', '.join(differ)}"
        return out

    monkeypatch.setattr(reader, "read_capture", checked_read)  # read_files' look-up
    monkeypatch.setattr(source, "analyze_packets", checked_state)


# The suite runs on pytest-xdist workers (pyproject's addopts: `-n auto --dist loadgroup --no-loadscope-reorder`);
# with `-n 0`, in one process, in its files' order, where none of this applies. On a 2-core machine: ~9 minutes
# instead of ~18 in one process. How the tests share the machine:
# - `-n auto` starts as many workers as the machine has cores, plus two (pytest_xdist_auto_num_workers below):
#   the live tests spend much of their time waiting on their shaped links or a timeout, and a worker waiting so
#   holds no core;
# - a module's tests run on one worker, in order, so its module fixtures (often a lab or a real sweep) are
#   built once; a module that sets SPREAD = True lets each of its tests go to whichever worker is free (its
#   tests share no fixture: each brings up its own lab);
# - CPU slots, one more than the cores: at most that many tests that compute run at once, so a live verdict
#   shares the machine with at most `cores` other tests, on two cores the two busy loops every verdict is
#   tested beside (measured: 1.9 of 2 cores busy through the run, against 1.65 with a slot per core, where a
#   slot held by a test waiting on its wire left a core idle); a test marked `waits` takes no slot: most of its
#   time is a timeout running out or a host held to a tenth of a core (under 0.4 s of CPU per second);
# - a test marked `alone` runs with no other live test beside it: its bound was measured on a quiet machine and
#   beside two busy loops, never beside a second lab (a shallow switch port only drops where its incast senders
#   burst at the link's rate, a ratio of wire timings). It holds every CPU slot but one, which the tests marked
#   `in_process` (they compute in their own process) take one at a time: at most one busy core beside it, as
#   the busy loops were, where a whole core sat idle for the ~55 s of the `alone` tests before. The `alone`
#   tests go first, then the `in_process` modules, then the modules with slow tests, so the short ones fill
#   the gaps at the end.


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: the machine's cores plus two (see above)."""
    return (os.cpu_count() or 1) + 2


def cpu_slots() -> int:
    """How many tests that compute may run at once: the machine's cores plus one (see above)."""
    return (os.cpu_count() or 1) + 1


def _module(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return module.__name__ if module is not None else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):     # one process: the suite in its files' order
        return
    slow_modules = {_module(item) for item in items if item.get_closest_marker("slow")}
    for item in items:
        if not item.get_closest_marker("xdist_group"):
            if item.get_closest_marker("alone"):     # every `alone` test in one group, run one after another
                group = "alone"
            elif getattr(getattr(item, "module", None), "SPREAD", False):
                group = item.nodeid
            else:
                group = _module(item)
            item.add_marker(pytest.mark.xdist_group(group))
    # `alone` tests first (at the start every worker is at a test's start: the others wait for it, or run an
    # `in_process` test beside it), then the `in_process` modules, then the modules with slow tests; a stable
    # sort keeps every module's own order
    in_process = {_module(item) for item in items if item.get_closest_marker("in_process")}
    items.sort(key=lambda item: (item.get_closest_marker("alone") is None, _module(item) not in in_process,
                                 _module(item) not in slow_modules))


class _MachineLock:
    """A readers-writer lock between the suite's workers, writer first: every test holds the machine shared, an
    `alone` test holds it exclusively. A turnstile taken on the way in keeps a waiting `alone` test from being
    overtaken by the shared holders of the next tests. Besides, a test that is not `waits` holds CPU slots (a
    lock file each, cpu_slots() of them), taken in turn: a worker looks for free slots only while it holds the
    slot queue, so one that just gave its slot up queues behind whoever waits. A test holds one slot; an
    `alone` test all but one. An `in_process` test takes a slot and not the machine, so it may run beside an
    `alone` test, one at a time."""

    def __init__(self, folder: str) -> None:
        self.turnstile = os.open(os.path.join(folder, "machine.turnstile"), os.O_CREAT | os.O_RDWR, 0o600)
        self.machine = os.open(os.path.join(folder, "machine.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        self.slots = [os.open(os.path.join(folder, f"cpu-slot-{n}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
                      for n in range(cpu_slots())]
        self.slot_queue = os.open(os.path.join(folder, "cpu-slot.queue"), os.O_CREAT | os.O_RDWR, 0o600)
        self.machine_held = False
        self.taken: list[int] = []

    def acquire(self, alone: bool, slots: int, machine: bool = True) -> None:
        if machine:
            fcntl.flock(self.turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            if not alone:
                fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            self.machine_held = True
        if not slots:
            return
        fcntl.flock(self.slot_queue, fcntl.LOCK_EX)
        try:
            while len(self.taken) < slots:
                for fd in self.slots:
                    if fd in self.taken:
                        continue
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    self.taken.append(fd)
                    if len(self.taken) == slots:
                        break
                else:
                    time.sleep(0.02)
        finally:
            fcntl.flock(self.slot_queue, fcntl.LOCK_UN)

    def release(self) -> None:
        for fd in self.taken:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self.taken = []
        if self.machine_held:
            fcntl.flock(self.machine, fcntl.LOCK_UN)
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            self.machine_held = False


_machine_lock: _MachineLock | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Under xdist, every test (its fixtures' set-up and teardown too) runs inside the machine lock."""
    global _machine_lock
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    if _machine_lock is None:
        # the workers' base temp dirs share one parent: the run's own folder
        _machine_lock = _MachineLock(str(item.config._tmp_path_factory.getbasetemp().parent))  # type: ignore[attr-defined]
    alone = item.get_closest_marker("alone") is not None
    if not (alone and _machine_lock.machine_held):
        if alone:
            _machine_lock.acquire(True, slots=cpu_slots() - 1)
        elif item.get_closest_marker("in_process"):
            _machine_lock.acquire(False, slots=1, machine=False)
        else:
            _machine_lock.acquire(False, slots=0 if item.get_closest_marker("waits") else 1)
    try:
        yield
    finally:
        # consecutive `alone` tests keep the machine between them
        if not (alone and nextitem is not None and nextitem.get_closest_marker("alone")):
            _machine_lock.release()
