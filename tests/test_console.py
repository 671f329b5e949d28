"""The progress component: ETA weighted by bytes x iterations, a live bar only on a terminal, the sweep's bar,
the read progress of diag analyze, and the plan-level weights of diag reproduce."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from report_helpers import make_record

from diag.console import Progress, ReadProgress, SweepConsole, format_duration, row_weight


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_eta_is_weighted_by_bytes_not_rows() -> None:
    """Sizes double: after the 1, 2 and 4 MiB rows of 1..8 MiB, 3 of 4 rows are done but under half the work."""
    sizes = [1 << 20, 2 << 20, 4 << 20, 8 << 20]
    weights = [row_weight(s, 10) for s in sizes]
    clock = Clock()
    bar = Progress("sweep", sum(weights), live=False, clock=clock)
    assert bar.eta_s() is None and "eta ?" in bar.status()
    for w in weights[:3]:
        clock.now += 10 * w / weights[0]      # time proportional to the bytes, as on a link
        bar.advance(w)
    elapsed = clock.now - 100.0
    assert bar.fraction == pytest.approx(sum(weights[:3]) / sum(weights))
    assert bar.fraction < 0.5
    assert bar.eta_s() == pytest.approx(elapsed * weights[3] / sum(weights[:3]))
    row_count_eta = elapsed / 3                               # what counting rows would have said
    assert bar.eta_s() > 2 * row_count_eta
    filled = round(bar.fraction * 20)
    assert bar.status() == (f"[{'#' * filled}{'-' * (20 - filled)}] {bar.fraction:4.0%} "
                            f"{format_duration(elapsed)} elapsed, eta {format_duration(bar.eta_s())}")


def test_work_done_before_counts_on_the_bar_not_in_the_rate() -> None:
    clock = Clock()
    bar = Progress("sweep", 100, done=50, live=False, clock=clock)
    clock.now += 10
    bar.advance(25)
    assert bar.fraction == 0.75 and bar.eta_s() == pytest.approx(10.0)


def test_format_duration() -> None:
    assert format_duration(59.6) == "1:00" and format_duration(3725) == "1:02:05" and format_duration(-3) == "0:00"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_sweep_console_draws_a_weighted_bar_with_eta_on_a_terminal_only() -> None:
    records = [make_record("gloo", "all_gather", 2, s, [0.01, 0.011]) for s in (1 << 10, 1 << 20)]
    total = sum(row_weight(r.volume_bytes, r.iters + r.warmup) for r in records)
    screen = Terminal()
    console = SweepConsole(2, stream=screen, weight_total=total)
    console.header("torch:gloo N=2")
    console.row(records[0])
    assert console._progress is not None
    assert console._progress.done == pytest.approx(row_weight(records[0].volume_bytes, records[0].iters + records[0].warmup))
    console.row(records[1])
    console.close()
    assert "eta" in screen.getvalue() and " all_gather " in screen.getvalue()
    plain = io.StringIO()
    console = SweepConsole(2, stream=plain, weight_total=total)
    console.row(records[0])
    console.close()
    assert "eta" not in plain.getvalue() and plain.getvalue().count("\n") == 1


def test_read_progress_follows_the_readers_file_position_and_passes(tmp_path: Path) -> None:
    capture = tmp_path / "big.pcap"
    capture.write_bytes(b"x" * 100_000)
    progress = ReadProgress([capture], passes=2, live=False)
    assert progress.total == 200_000
    with capture.open("rb", buffering=0) as reader:
        reader.read(50_000)
        assert progress.sample() == 50_000                      # first pass, half way
        reader.seek(0)
        reader.read(10_000)
        assert progress.sample() == 110_000                     # started over: the second pass
    assert progress.sample() == 200_000                         # closed: that pass is done
    assert ReadProgress(["-"], live=False).total == 0            # a pipe has no size: no bar


def test_plan_weights_follow_the_plan() -> None:
    pytest.importorskip("torch")
    from diag.plan import QUICK, step_spec

    weights = __import__("diag.console", fromlist=["plan_weights"]).plan_weights(QUICK, step_spec)
    steps = [(step, n) for step in QUICK.steps for n in QUICK.world_sizes_of(step)]
    assert len(weights) == len(steps) and all(w > 0 for w in weights)
    # equal per-device volume D at every N: on a link the N=2, 3 and 4 sweeps take about as long, and so weigh
    gloo = [w for (step, n), w in zip(steps, weights, strict=False) if step.name == "gloo-all_gather"]
    assert len(gloo) == 3 and max(gloo) / min(gloo) < 1.01
    # the N=2 knob rows run at the experiment volumes only: lighter than a whole sweep; the interleaved trial
    # runs every arm for at least min_rounds rounds: heavier than one sweep
    knob = next(w for (step, n), w in zip(steps, weights, strict=False)
                if step.at == "n2" and step.op == "all_gather" and step.trial is None)
    trial = next(w for (step, n), w in zip(steps, weights, strict=False) if step.name == "n2-trial")
    assert knob < gloo[0] < trial
