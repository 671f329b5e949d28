"""A short run of the analyzer fuzzer (the 100,000-case run is a command: docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fuzz_analyze import analyze_once, mutate, run_cases, seed_corpus

# computes in this process: may run beside an `alone` test (tests/conftest.py)
pytestmark = pytest.mark.in_process


def test_every_seed_is_a_valid_capture(tmp_path: Path) -> None:
    """The corpus must be analyzable as built, or the mutations would only ever test the first check."""
    from diag.capture import analyze_files

    for seed in seed_corpus():
        path = tmp_path / seed.name
        path.write_bytes(seed.data)
        result = analyze_files([path])
        assert result["capture"]["packets"] >= 20, seed.name
        assert not result["files"][0]["skipped"], (seed.name, result["files"][0]["skipped"])
        analyze_once(path)


def test_mutations_are_reproducible() -> None:
    import random

    seeds = seed_corpus()
    first = [mutate(random.Random(f"3:{i}"), seeds) for i in range(50)]
    again = [mutate(random.Random(f"3:{i}"), seeds) for i in range(50)]
    assert first == again
    assert len({data for data, _ in first}) == 50


def test_a_few_hundred_mutations_never_traceback(tmp_path: Path) -> None:
    report = run_cases(seed=11, start=0, count=400, out_dir=tmp_path / "failures", case_timeout_s=30)
    assert report.failures == [], report.failures[:3]
    # both outcomes occur: the mutations neither always break the file nor never do
    assert report.outcomes["ok"] > 40 and report.outcomes["clean"] > 40, report.outcomes
    assert report.peak_rss_mb < 1024
