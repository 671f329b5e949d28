"""The adapters of diag trial (diag.external.adapters) on real and documented program output, the command
placeholders, and which printed row a block takes. Pure functions: no torch, no ranks (~0.1 s).

gloo's benchmark: the files under tests/data/gloo-benchmark/ are its real output (rank 0's stdout; the
other ranks print nothing), made by the binaries docs/upstream/build-gloo-benchmark.sh builds (see that folder's
README.md). nccl-tests: no CUDA here, so its output is written by the test from nccl-tests' own print
formats (src/util.cu at NCCL_TESTS_VERSION 2.19.6: writeResultHeader, writeBenchmarkLinePreamble,
writeBenchmarkLineBody with getFloatStr, writePerIterReport, writeResultFooter; the JSON file of -J from the
same file's json* writers, JSON_FILE_VERSION 3), field for field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.errors import DiagError
from diag.external.adapters import adapter, parse_gloo_benchmark
from diag.external.arm import expand, pick_row

DATA = Path(__file__).parent / "data" / "gloo-benchmark"


# --- gloo's benchmark, real output ---------------------------------------------------------------------------

def test_gloo_benchmark_table_of_a_real_run() -> None:
    rows = parse_gloo_benchmark((DATA / "allgather-n2-4MiB-rank0.txt").read_text())
    assert len(rows) == 1
    (row,) = rows
    assert row.size_bytes == 4194304 and row.fields["elements"] == 1048576
    assert row.statistic == "p50" and row.fields["iterations"] == 3
    assert row.times_s == (row.fields["p50_s"],)
    assert row.fields["min_s"] <= row.fields["p50_s"] <= row.fields["p99_s"] <= row.fields["max_s"]
    assert row.nwrong == 0               # verify=true and no "Mismatch" line: checked, nothing wrong
    unchecked = (DATA / "allgather-n2-4MiB-rank0.txt").read_text().replace("verify=true", "verify=false")
    assert parse_gloo_benchmark(unchecked)[0].nwrong is None


def test_gloo_benchmark_sweep_in_nanoseconds() -> None:
    text = (DATA / "allgather-n2-sweep-nanos-rank0.txt").read_text()
    rows = parse_gloo_benchmark(text)
    # its own element sweep (100, 200, 500, 1000, ... as runner.cc's run()) in ns (--nanos)
    assert [r.fields["elements"] for r in rows][:4] == [100, 200, 500, 1000]
    assert all(r.size_bytes == 4 * r.fields["elements"] for r in rows)
    line = next(line for line in text.splitlines() if line.split()[:2] == ["4000", "1000"])
    assert rows[3].fields["p50_s"] == pytest.approx(int(line.split()[3]) * 1e-9)


def test_gloo_benchmark_counts_verify_errors() -> None:
    text = (DATA / "allgather-n2-4MiB-rank0.txt").read_text()
    # the VERIFY ERRORS section as runner.cc's checkErrors prints it (rank 0, after the table)
    text += "\n" + "=" * 100 + "\n" + " " * 45 + "VERIFY ERRORS\n\n" + "".join(
        f"[rank 1] Mismatch at index: [1, 0, {i}] {i} vs {i + 1}\n" for i in range(3))
    (row,) = parse_gloo_benchmark(text)
    assert row.nwrong == 3


# --- nccl-tests, from its own print formats -----------------------------------------------------------------

def _float_str(value: float, width: int) -> str:
    """util.cu getFloatStr: the first of %.2f, %.1f, %.0f that fits the width, else an exponent."""
    for precision in (2, 1, 0):
        text = f"{value:{width}.{precision}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def printf(fmt: str, *args: object) -> str:
    """C's printf, for the formats copied from util.cu as they are (%li as %d: Python has no length modifier;
    %*s with a zero pad as %0s)."""
    return fmt % args


def _nccl_text(rows: list[tuple[int, int, float, float, float, int | None, float, float, float, int | None]],
               per_iter: bool = False) -> str:
    """all_gather_perf's stdout: header lines, one line per size (out-of-place then in-place), footer."""
    out = ["# nccl-tests version 2.19.6 nccl-headers=22703 nccl-library=22703\n",
           "# Collective test starting: all_gather_perf\n",
           "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 67108864 step: 4(factor) warmup iters: 1 iters: 20 "
           "agg iters: 1 validation: 1 graph: 0 unalign: 0\n", "#\n", "# Using devices\n",
           "#  Rank  0 Group  0 Pid   4242 on      node0 device  0 [0000:17:00] NVIDIA H100 80GB HBM3\n",
           "#  Rank  1 Group  0 Pid   4243 on      node1 device  0 [0000:17:00] NVIDIA H100 80GB HBM3\n", "#\n"]
    if per_iter:
        names = ("time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
        out.append(printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  "
                          "%7s  %7s  %7s  %7s %0s\n", "size", "count", "type", "redop", "root", *names, *names, ""))
    else:
        out.append(printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
                          "          \n", "", "", "", "", ""))
        out.append(printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %0s\n", "size",
                          "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                          "busbw", "#wrong", ""))
        out.append(printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %0s\n", "(B)",
                          "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ""))
    for size, count, *bodies in rows:
        line = printf("%12d  %12d  %8s  %6s  %6s", size, count, "float", "none", printf("%6i", -1))
        for time_us, algbw, busbw, wrong in (bodies[:4], bodies[4:]):
            times = (_float_str(time_us, 7), _float_str(algbw, 6), _float_str(busbw, 6))
            # writeBenchmarkLineBody: with reportErrors "  %7s  %6s  %6s  %6g", else "  %7s  %6s  %6s    N/A"
            line += (printf("  %7s  %6s  %6s  %6g", *times, wrong) if wrong is not None
                     else printf("  %7s  %6s  %6s    N/A", *times))
            if per_iter:   # writePerIterReport: i_min, i_max, i_p99, i_cv%
                line += printf("  %7s  %7s  %7s  %7s", _float_str(time_us * 0.9, 7), _float_str(time_us * 1.2, 7),
                               _float_str(time_us * 1.1, 7), _float_str(3.5, 7))
        out.append(line + "\n")
    out += [printf("# %-20s : %d %s\n", "Out of bounds values", 0, "OK"),
            printf("# %-20s : %g %s\n", "Avg bus bandwidth", 11.2, ""), "#\n",
            printf("# Collective test concluded: %s\n", "all_gather_perf"), "#\n"]
    return "".join(out)


NCCL_ROWS = [  # size (total), count (per rank), out-of-place time/algbw/busbw/#wrong, in-place the same
    (2097152, 262144, 1234.56, 1.70, 0.85, 0, 1200.0, 1.75, 0.87, 0),
    (8388608, 1048576, 4321.0, 1.94, 0.97, 0, 4100.5, 2.05, 1.02, 0),
    (33554432, 4194304, 16384.2, 2.05, 1.02, 2, 16000.0, 2.10, 1.05, 0),
]


def test_nccl_tests_table_out_of_place_and_in_place() -> None:
    text = _nccl_text(NCCL_ROWS)
    rows = adapter("nccl-tests").parse(text)
    assert [r.total_bytes for r in rows] == [2097152, 8388608, 33554432]
    assert [r.times_s[0] for r in rows] == pytest.approx([1234.56e-6, 4321.0e-6, 16384.2e-6], rel=1e-3)
    assert [r.nwrong for r in rows] == [0, 0, 2] and {r.statistic for r in rows} == {"mean"}
    in_place = adapter("nccl-tests:in-place").parse(text)
    assert [r.times_s[0] for r in in_place] == pytest.approx([1200.0e-6, 4100.5e-6, 16000.0e-6], rel=1e-3)
    assert [r.fields["busbw_GBps"] for r in in_place] == [0.87, 1.02, 1.05]


def test_nccl_tests_table_unchecked_and_per_iteration_columns() -> None:
    unchecked = [(s, c, t, a, b, None, t2, a2, b2, None) for s, c, t, a, b, _, t2, a2, b2, _ in NCCL_ROWS]
    rows = adapter("nccl-tests").parse(_nccl_text(unchecked))
    assert [r.nwrong for r in rows] == [None, None, None]   # "N/A": no data check (-c 0)
    per_iter = adapter("nccl-tests:in-place").parse(_nccl_text(NCCL_ROWS, per_iter=True))
    assert [r.times_s[0] for r in per_iter] == pytest.approx([1200.0e-6, 4100.5e-6, 16000.0e-6], rel=1e-3)


def _nccl_json(per_iter: bool) -> str:
    """The -J file, in the order util.cu writes it (jsonOutputInit, writeDeviceReport, writeResultHeader, one
    result per size, writeResultFooter, writeErrors, jsonOutputFinalize)."""
    results = []
    for size, count, t, a, b, wrong, t2, a2, b2, wrong2 in NCCL_ROWS:
        result = {"size": size, "count": count, "type": "float", "redop": "none", "root": "    -1",
                  "out_of_place": {"time": t, "alg_bw": a, "bus_bw": b, "nwrong": float(wrong)}}
        if per_iter:
            result["out_of_place_per_iter"] = {
                "skipped_iterations": 0, "min_us": t * 0.9, "max_us": t * 1.1, "avg_us": t, "p50_us": t,
                "p95_us": t * 1.05, "p99_us": t * 1.1, "stdev_us": t * 0.05, "cv_pct": 5.0,
                "times_us": [t * 0.9, t, t * 1.1]}
        result["in_place"] = {"time": t2, "alg_bw": a2, "bus_bw": b2, "nwrong": float(wrong2)}
        result.update({"actual_iterations": 20, "experiment_name": ""})
        results.append(result)
    return json.dumps({
        "version": 3, "start_time": "2026-07-09 16:03:21", "args": ["all_gather_perf", "-b", "1M", "-J", "out.json"],
        "env": ["NCCL_DEBUG=WARN"], "nccl_version": 22703,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": 1048576, "maximum_bytes": 67108864,
                   "step_factor": 4, "warmup_iters": 1, "iterations": 20, "aggregated_iterations": 1,
                   "validation": 1, "graph": 0, "blocking_collectives": False, "per_iter_timing": per_iter,
                   "per_iter_skip": 0, "parallel_init": False,
                   "devices": [{"rank": 0, "group": 0, "pid": 4242, "hostname": "node0", "device": 0,
                                "device_hex": "0000:17:00", "device_info": "NVIDIA H100 80GB HBM3"}]},
        "results": results, "out_of_bounds": {"count": 2, "okay": False},
        "average_bus_bandwidth": {"bandwidth": 0.95, "okay": "unchecked"}, "errors": [],
        "end_time": "2026-07-09 16:04:02"}, indent=1)


def test_nccl_tests_json_mean_and_per_iteration_samples() -> None:
    rows = adapter("nccl-tests-json").parse(_nccl_json(per_iter=False))
    assert adapter("nccl-tests-json").reads == "output"
    assert [r.total_bytes for r in rows] == [2097152, 8388608, 33554432]
    assert [r.times_s for r in rows] == [(1234.56e-6,), (4321.0e-6,), (16384.2e-6,)]
    assert [r.nwrong for r in rows] == [0, 0, 2]
    sampled = adapter("nccl-tests-json").parse(_nccl_json(per_iter=True))
    assert sampled[0].statistic == "samples"
    assert sampled[0].times_s == pytest.approx((1234.56e-6 * 0.9, 1234.56e-6, 1234.56e-6 * 1.1))
    assert adapter("nccl-tests-json:in-place").parse(_nccl_json(per_iter=True))[1].times_s == (4100.5e-6,)
    assert adapter("nccl-tests-json").parse("not json") == []


# --- regex and JSON paths -----------------------------------------------------------------------------------

def test_regex_adapter_samples_and_sizes() -> None:
    parse = adapter(r"regex:(?P<bytes>\d+) B took (?P<time_ms>[0-9.]+) ms").parse
    rows = parse("1024 B took 1.5 ms\n1024 B took 2.5 ms\n2048 B took 4 ms\nwarm-up done\n")
    by_size = {r.size_bytes: r.times_s for r in rows}
    assert by_size == {1024: pytest.approx((1.5e-3, 2.5e-3)), 2048: pytest.approx((4e-3,))}
    (plain,) = adapter(r"regex:took (?P<time_us>\d+)us").parse("took 10us\ntook 30us")
    assert plain.size_bytes is None and plain.times_s == pytest.approx((10e-6, 30e-6))


def test_json_adapter_paths_units_and_lines() -> None:
    lines = "\n".join(json.dumps({"bytes": 10, "seconds": s}) for s in (0.5, 0.25)) + "\nnot json\n"
    assert adapter("json:seconds").parse(lines)[0].times_s == (0.5, 0.25)
    document = json.dumps({"results": [{"time_us": 5}, {"time_us": 7}], "n": 2})
    assert adapter("json:results[*].time_us").parse(document)[0].times_s == pytest.approx((5e-6, 7e-6))
    assert adapter("json:results[*].time_us@ms").parse(document)[0].times_s == pytest.approx((5e-3, 7e-3))
    assert adapter("json:missing@s").parse(document) == []


@pytest.mark.parametrize("spec", ["gloo", "regex:(no group", "regex:(?P<time>1)", "json:a..b", "json:elapsed",
                                  "json:x@parsecs"])
def test_bad_adapters_are_one_line(spec: str) -> None:
    with pytest.raises(DiagError) as info:
        adapter(spec)
    assert "\n" not in str(info.value) and "--adapter" in str(info.value)


# --- placeholders and rows ----------------------------------------------------------------------------------

def test_placeholders_fill_known_names_only() -> None:
    values = {"rank": 1, "world": 4, "bytes": 1024, "elements": 256, "port": 5000, "prefix": "p"}
    command = "prog --rank {rank}/{world} -n {elements} --port {port} | awk '{print $1}' {unknown}"
    assert expand(command, {**dict.fromkeys(("address", "master", "addresses", "iface", "shared", "output",
                                             "total_bytes", "volume", "iters", "warmup", "arm", "round"), ""),
                            **values}) == "prog --rank 1/4 -n 256 --port 5000 | awk '{print $1}' {unknown}"


def test_pick_row_by_size() -> None:
    rows = adapter("nccl-tests").parse(_nccl_text(NCCL_ROWS))
    # a 2-rank all_gather of 4 MiB per rank: nccl-tests' size is the total, 8 MiB
    assert pick_row(rows, 4194304, 8388608) is rows[1]
    assert pick_row(rows, 123, 246) is None                       # only other sizes: the block fails
    (unsized,) = adapter("json:seconds").parse('{"seconds": 1}\n{"seconds": 2}')
    assert pick_row([unsized], 123, 246).times_s == (1, 2)


def test_the_trial_is_one_step_at_every_n_of_one_plan(tmp_path: Path) -> None:
    """diag trial --nproc 2,3,4 --volumes: one plan, one trial step at every N (one launch of 4 ranks), each N's
    per-rank sizes D/(N-1) for all_gather; the program arms need no process group; --seed is kept over the job's
    seed (0: the job's); the plan survives its JSON round trip (the job file, run.json)."""
    from diag.external.run import ProgramTrial
    from diag.plan import Plan, step_spec, step_trial

    trial = ProgramTrial(arms=(("a", "true"), ("b", "true")), adapter="json:seconds", world_sizes=(2, 3, 4),
                         volumes=(12 << 20,), link=True, capture="", seed=7)
    plan = Plan.from_json(trial.plan((2, 3, 4), tmp_path, str(tmp_path / "shared")).to_json())
    (step,) = plan.steps
    assert plan.world_sizes_of(step) == (2, 3, 4) and step.captured and plan.capture and not plan.probe
    assert {n: step_trial(plan, step, seed=99, world_size=n).sizes for n in (2, 3, 4)} == {
        2: (12 << 20,), 3: (6 << 20,), 4: (4 << 20,)}
    assert step_trial(plan, step, seed=99, world_size=3).seed == 7
    assert plan.groups_at(2) == () and step.trial is not None and step.trial.torch_backends == ()
    assert step_spec(plan, step, 4).backend == "gloo" and step_spec(plan, step, 4).sizes == (4 << 20,)
    fixed = ProgramTrial(arms=(("a", "true"), ("b", "true")), adapter="json:seconds", sizes=(1 << 20,))
    (given,) = fixed.plan((2, 3), tmp_path, "/tmp").steps
    assert given.volumes == "given" and step_trial(fixed.plan((2, 3), tmp_path, "/tmp"), given, seed=5).seed == 5


def test_what_other_ranks_say_of_a_block_is_checked() -> None:
    """Rank 0's port and prefix go into every rank's shell command: only a port and a plain name pass; a rank's
    result reaches rank 0 as known fields of known types, named by the rank it came from."""
    from diag.external.arm import _address, _block, _result

    assert _block({"port": 29500, "prefix": "diag-ab-a-s0-r1-0f0f0f"}) == {"port": 29500, "prefix": "diag-ab-a-s0-r1-0f0f0f"}
    for said in ({"port": 0, "prefix": "x"}, {"port": True, "prefix": "x"}, {"port": 1, "prefix": "x; rm -rf /"},
                 {"port": 1, "prefix": "$(id)"}, ["port"], None):
        with pytest.raises(DiagError, match="not a port and a name"):
            _block(said)
    assert _address("10.77.0.2", 1) == "10.77.0.2"
    with pytest.raises(DiagError, match="rank 1 sent"):
        _address("10.0.0.1;reboot", 1)
    good = _result({"rank": 5, "host": "10.77.0.2", "status": "ok", "rc": 0, "stdout": "a\n", "stderr": "",
                    "output": None, "t_start_ns": 1, "t_end_ns": 2, "wall_s": 0.5, "busiest_thread": 0.25}, 1)
    assert good["rank"] == 1 and good["status"] == "ok" and good["stdout"] == "a\n" and good["busiest_thread"] == 0.25
    bad = _result({"status": "pwned", "rc": "0", "stdout": 3, "wall_s": "x"}, 2)
    assert bad["status"] == "exit" and bad["rc"] is None and bad["stdout"] == "" and bad["wall_s"] == 0.0
    assert bad["stderr"] == "sent a result that is not diag's" and _result("nonsense", 3)["status"] == "exit"
