"""The main job: reproduce (or rule out) the WORLD_SIZE=2 all_gather anomaly on one machine, with evidence.

Composes the other parts and adds no measurement logic of its own:
  lab (shaped full-duplex hosts) -> link measurement -> gloo and raw-TCP all_gather sweeps at equal
  per-device volume D for every N, captured and observed -> exchange in both orders -> raw knob experiments
  at N=2 -> analysis of every capture against its records -> report + findings. The lab is always torn down.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.spec import SweepSpec
from diag.units import human_bits, human_bytes, parse_rate_bps, parse_size

# A single TCP stream below this fraction of the shaped goodput means the CPU, not the link, limits the lab.
CPU_BOUND_LINK_FRACTION = 0.85
EXCHANGE_MIN_ITERS = 8
# Each N's iperf3 ring pattern runs this long (0.5 s of it warm-up): 7 N add ~20 s to a default run.
RING_PATTERN_SECONDS = 2.0


@dataclass(frozen=True)
class Plan:
    """What a reproduce run does; --quick and the default differ only in these numbers."""

    world_sizes: tuple[int, ...]
    volumes: tuple[int, ...]            # per-device volume D = (N-1) x per-rank bytes, the same for every N
    exchange_sizes: tuple[int, ...]
    knob_volume: int                    # D of the N=2 raw knob experiments
    rate: str
    warmup: int
    iters: int
    knob_sets: tuple[tuple[str, dict[str, Any]], ...] = ()
    # transports of the exchange in both orders; raw TCP beside gloo shows whether the order effect is gloo's
    exchange_transports: tuple[str, ...] = ("gloo", "raw-split")


# N=2 raw experiments, one suspected mechanism each (docs/raw-tcp.md): one shared connection, and a
# half-duplex schedule (directions in turns). --emulate gloo (shared + notify + 2 chunks) runs at every N.
KNOBS_QUICK: tuple[tuple[str, dict[str, Any]], ...] = (
    ("shared-conn", {"conn": "shared"}),
    ("alternate-io", {"io": "alternate"}),
)
KNOBS_FULL = (
    *KNOBS_QUICK,
    ("notify", {"conn": "split", "handshake": "notify", "chunks": 2}),
    ("shared-alternate", {"conn": "shared", "io": "alternate"}),
)

QUICK = Plan(world_sizes=(2, 3, 4), volumes=tuple(parse_size(s) for s in ("1M", "4M", "16M")),
             exchange_sizes=(parse_size("16M"),), knob_volume=parse_size("16M"), rate="200mbit",
             warmup=1, iters=5, knob_sets=KNOBS_QUICK)
# D=32M is left out of the default: on a 2-core machine N=2..8 with it measured ~21 min (half the steps in
# 10.7 min), over the 20 minutes the default may take; pass --volumes 1M,4M,16M,32M to include it.
FULL = Plan(world_sizes=(2, 3, 4, 5, 6, 7, 8), volumes=tuple(parse_size(s) for s in ("1M", "4M", "16M")),
            exchange_sizes=(parse_size("4M"), parse_size("16M")), knob_volume=parse_size("16M"), rate="200mbit",
            warmup=1, iters=6, knob_sets=KNOBS_FULL)


def per_rank_size(volume: int, world_size: int, element: int = 4) -> int:
    """S = D / (N-1), rounded down to whole elements."""
    return max(element, volume // (world_size - 1) // element * element)


def make_say(started: float) -> Callable[[str], None]:
    """Progress lines on stderr, each with the time since the start (the tables go to stdout)."""

    def say(text: str) -> None:
        elapsed = int(time.monotonic() - started)
        print(f"{elapsed // 60:2d}:{elapsed % 60:02d} {text}", file=sys.stderr, flush=True)

    return say


def run_reproduce(quick: bool, out: Path | None, rate: str | None, max_n: int | None, keep_going: bool,
                  volumes: list[int] | None = None) -> int:
    plan = QUICK if quick else FULL
    if volumes:
        plan = Plan(**{**plan.__dict__, "volumes": tuple(volumes), "exchange_sizes": (max(volumes),),
                       "knob_volume": max(volumes)})
    if max_n is not None:
        if max_n < 2:
            raise DiagError("--max-n must be at least 2")
        plan = Plan(**{**plan.__dict__, "world_sizes": tuple(n for n in range(2, max_n + 1))})
    rate = rate or plan.rate
    parse_rate_bps(rate)
    run_dir = out or Path("runs") / f"reproduce-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / "records").exists() and any((run_dir / "records").iterdir()):
        raise DiagError(f"{run_dir} already holds records: choose a new --out directory")
    for sub in ("records", "captures", "analysis", "observe", "tcpinfo"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)

    use_lab = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
    started = time.monotonic()
    say = make_say(started)
    say(f"diag reproduce: {'quick' if quick else 'full'} run into {run_dir}; N = "
        f"{', '.join(map(str, plan.world_sizes))}; D = {', '.join(human_bytes(v) for v in plan.volumes)}")
    if not use_lab:
        say("diag reproduce: no root (CAP_NET_ADMIN) or no iproute2: falling back to unshaped loopback. There the "
            "CPU, not a NIC, is the bottleneck and the N=2 anomaly may not show; run as root for the lab.")
    capture = "" if use_lab and shutil.which("tcpdump") else None
    if use_lab and capture is None:
        say("diag reproduce: tcpdump is missing: no captures (install it: apt-get install tcpdump)")

    meta: dict[str, Any] = {"created_ns": time.time_ns(), "cpu_count": os.cpu_count(), "quick": quick,
                            "plan": {k: v for k, v in plan.__dict__.items() if k != "knob_sets"},
                            "knob_sets": [name for name, _ in plan.knob_sets], "lab": None, "link": None,
                            "notes": [], "failures": []}

    def write_meta() -> None:
        (run_dir / "run.json").write_text(json.dumps(meta, indent=1, default=str))

    write_meta()
    if use_lab:
        from diag.lab import LabConfig, lab_session, measure_link
        from diag.lab.measure import iperf3_available

        config = LabConfig(name=f"repro{os.getpid() % 100000}", hosts=max(plan.world_sizes), rate=rate)
        with lab_session(config) as lab:
            meta["lab"] = {"name": lab.name, "rate_bps": lab.rate_bps, "hosts": len(lab.hosts),
                           "addresses": [h.address for h in lab.hosts]}
            say(f"[lab] {len(lab.hosts)} hosts, {human_bits(lab.rate_bps)} full duplex each; measuring the link")
            # iperf3 (C) when present: diag's own socket probe runs both directions in one Python process,
            # which a 2-core machine can make CPU-bound.
            link = measure_link(lab, 0, 1, seconds=2.0, tool="iperf3" if iperf3_available() else "socket")
            meta["link"] = {"single_stream_Bps": link.single_stream_Bps, "bidir_Bps": list(link.bidir_Bps),
                            "tool": link.tool}
            expected = lab.rate_bps / 8 * 0.94
            if link.single_stream_Bps < CPU_BOUND_LINK_FRACTION * expected:
                note = (f"one TCP stream reached {link.single_stream_Bps / 1e6:.1f} MB/s, below "
                        f"{CPU_BOUND_LINK_FRACTION:.0%} of the {expected / 1e6:.1f} MB/s the link allows: the CPU "
                        "(or other load) limits this machine; lower --rate")
                meta["notes"].append(note)
                say(f"[lab] warning: {note}")
            say(f"[lab] single stream {link.single_stream_Bps / 1e6:.1f} MB/s, both directions "
                f"{link.bidir_Bps[0] / 1e6:.1f} + {link.bidir_Bps[1] / 1e6:.1f} MB/s")
            _measure_ring_pattern(lab, plan.world_sizes, meta, say)
            write_meta()
            _run_sweeps(plan, run_dir, lab, capture, meta, write_meta, say, keep_going)
        say("[lab] torn down")
    else:
        _run_sweeps(plan, run_dir, None, None, meta, write_meta, say, keep_going)

    _analyze(run_dir, say)
    say("[report] rendering")
    from diag.report import load_run, write_report

    result = write_report(load_run([str(run_dir)]), run_dir / "report")
    elapsed = time.monotonic() - started
    print(f"\ndiag reproduce: done in {elapsed / 60:.1f} min; report: {run_dir / 'report' / 'report.html'}")
    fired = [f for f in result.findings if f.status == "fired"]
    undecided = [f for f in result.findings if f.status != "fired" and f.status != "clear"]
    print(f"findings ({len(fired)}):")
    for finding in fired:
        print(f"  [{finding.strength}] {finding.statement}")
    if not fired:
        print("  none fired; see report.md for the rules that could not decide")
    if undecided:
        print(f"  ({len(undecided)} rules could not decide: see {run_dir / 'report' / 'findings.json'})")
    if meta["failures"]:
        print(f"{len(meta['failures'])} step(s) failed: see {run_dir / 'run.json'}")
        return 1
    return 0


def _measure_ring_pattern(lab: Any, world_sizes: tuple[int, ...], meta: dict[str, Any],
                          say: Callable[[str], None]) -> None:
    """The machine's own limit per N: iperf3 in the ring's flow pattern (h(i) -> h((i+1) % N), every edge at
    once) -> run.json link.ring_pattern. Where it stays below the single stream the CPU, not the link, sets
    the pace, and the report's link-reference table and the cpu_bound rule hold raw TCP against it there."""
    from diag.lab import measure_ring_pattern
    from diag.lab.measure import iperf3_available
    from diag.report.rundir import RING_PATTERN_CPU_LIMIT

    if not iperf3_available():
        note = "iperf3 is not installed: no ring-pattern reference, every N is held against the single stream"
        meta["notes"].append(note)
        say(f"[lab] {note}")
        return
    patterns: dict[str, Any] = {}
    for n in world_sizes:
        try:
            pattern = measure_ring_pattern(lab, n, seconds=RING_PATTERN_SECONDS)
        except DiagError as exc:
            meta["notes"].append(f"ring pattern N={n} not measured: {exc}")
            say(f"[lab] ring pattern N={n} not measured: {exc}")
            continue
        patterns[str(n)] = pattern.to_json()
    meta["link"]["ring_pattern"] = patterns
    if patterns:
        say("[lab] iperf3 ring pattern, mean MB/s per edge: " + ", ".join(
            f"N={n} {p['mean_edge_Bps'] / 1e6:.1f}" for n, p in patterns.items()))
    single = meta["link"]["single_stream_Bps"]
    cpu_limited = [n for n, p in patterns.items() if p["mean_edge_Bps"] < RING_PATTERN_CPU_LIMIT * single]
    if cpu_limited:
        note = (f"at N={','.join(cpu_limited)} iperf3's ring pattern stayed below {RING_PATTERN_CPU_LIMIT:.0%} of "
                "the single stream: the CPU, not the link, is the limit there, and the report holds raw TCP "
                "against the pattern at those N")
        meta["notes"].append(note)
        say(f"[lab] {note}")


def _run_sweeps(plan: Plan, run_dir: Path, lab: Any, capture: str | None, meta: dict[str, Any],
                write_meta: Callable[[], None], say: Callable[[str], None], keep_going: bool) -> None:
    from diag.runner import make_job, run_worlds

    base = SweepSpec(backend="gloo", ops=("all_gather",), sizes=(1,), warmup=plan.warmup, iters=plan.iters,
                     timeout_s=120.0)
    transports: list[tuple[str, SweepSpec]] = [
        ("gloo", base),
        ("raw-ring", base.replace(backend="raw", algo="ring")),
        ("raw-ring-emulate-gloo", base.replace(backend="raw", algo="ring", knobs={"emulate": "gloo"})),
    ]
    steps: list[tuple[str, Callable[[], None]]] = []
    for name, spec in transports:
        for n in plan.world_sizes:
            sized = spec.replace(sizes=tuple(sorted({per_rank_size(v, n) for v in plan.volumes})))
            steps.append((f"{name} all_gather N={n}", _sweep_step(sized, n, run_dir, f"{name}-all_gather",
                                                               lab, capture, make_job, run_worlds)))
    exchange_specs = {"gloo": base, "raw-split": base.replace(backend="raw", algo="ring")}
    exchange_transports = [(name, exchange_specs[name]) for name in plan.exchange_transports]
    for order in ("recv-first", "send-first"):
        for name, spec in exchange_transports:
            # more samples here: the order effect is judged by a two-sample test on these rows alone
            exchange = spec.replace(ops=("exchange",), sizes=plan.exchange_sizes, order=order,
                                    iters=max(plan.iters, EXCHANGE_MIN_ITERS))
            steps.append((f"{name} exchange {order} N=2",
                          _sweep_step(exchange, 2, run_dir, f"{name}-exchange-{order}", lab, capture, make_job,
                                      run_worlds)))
    for knob_name, knobs in plan.knob_sets:
        spec = base.replace(backend="raw", algo="ring", knobs=knobs, sizes=(per_rank_size(plan.knob_volume, 2),))
        steps.append((f"raw-ring {knob_name} N=2",
                      _sweep_step(spec, 2, run_dir, f"raw-ring-{knob_name}-all_gather", lab, capture, make_job,
                                  run_worlds)))
    steps.append(("advise: workarounds for gloo all_gather N=2",
                  _advise_step(run_dir, lab, per_rank_size(plan.knob_volume, 2), plan, say)))
    for index, (title, action) in enumerate(steps, 1):
        say(f"[{index}/{len(steps)}] {title}")
        step_started = time.monotonic()
        try:
            action()
            meta.setdefault("step_seconds", {})[title] = round(time.monotonic() - step_started, 2)
            write_meta()
        except DiagError as exc:
            meta["failures"].append({"step": title, "error": str(exc)})
            write_meta()
            say(f"[{index}/{len(steps)}] failed: {exc}")
            if not keep_going:
                raise


def _sweep_step(spec: SweepSpec, world_size: int, run_dir: Path, name: str, lab: Any, capture: str | None,
                make_job: Callable[..., Any], run_worlds: Callable[..., Any]) -> Callable[[], None]:
    def action() -> None:
        out = run_dir / "records" / f"{name}.jsonl"
        job = make_job(spec, out, argv=["reproduce"], quiet=False)
        run_worlds(spec, job, out, run_dir, world_sizes=[world_size], lab=lab, capture=capture,
                   observe=lab is not None, tag_prefix=f"{name}--")
    return action


def _advise_step(run_dir: Path, lab: Any, size: int, plan: Plan, say: Callable[[str], None]) -> Callable[[], None]:
    """diag advise on the same lab: RUN_DIR/advise/{records.jsonl,advise.json} (docs/raw-tcp.md)."""
    def action() -> None:
        from diag.advise import run_advise

        result = run_advise(run_dir / "advise", lab=lab, world_size=2, sizes=(size,), warmup=plan.warmup,
                            iters=max(plan.iters, 3), say=say)
        if result["failures"]:
            raise DiagError("; ".join(f"{f['workaround']}: {f['error']}" for f in result["failures"]))
    return action


def _analyze(run_dir: Path, say: Callable[[str], None]) -> None:
    pcaps = sorted((run_dir / "captures").glob("*.pcap"))
    if not pcaps:
        return
    from diag.capture import analyze_files

    records = [str(p) for p in sorted((run_dir / "records").glob("*.jsonl"))]
    started = time.monotonic()
    for index, pcap in enumerate(pcaps, 1):
        say(f"[analyze {index}/{len(pcaps)}] {pcap.name}")
        try:
            result = analyze_files([str(pcap)], records=records)
        except DiagError as exc:
            say(f"[analyze] {pcap.name}: {exc}")
            continue
        (run_dir / "analysis" / f"{pcap.stem}.json").write_text(json.dumps(result, default=str))
    say(f"[analyze] {len(pcaps)} captures in {time.monotonic() - started:.0f} s")
