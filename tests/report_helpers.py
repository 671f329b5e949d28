"""Builders for report/diagnose/compare/model tests: records and run directories made by code.

Records are written with diag.records.RecordWriter, so tests read them through the same loader as real
runs. Timing samples are drawn from a seeded generator so every test is deterministic.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from diag.records import Record, RecordWriter

MiB = 1 << 20
KiB = 1 << 10
TEST_ENV = {"host": "testhost", "kernel": "6.0-test", "cpu_count": 2, "torch": "2.13.0+cpu",
            "sysctl": {"net.ipv4.tcp_slow_start_after_idle": "1", "net.ipv4.tcp_rmem": "4096 131072 6291456"}}


def bus_factor(op: str, n: int) -> float:
    return (n - 1) / n if op == "all_gather" else 1.0


def total_bytes(op: str, n: int, size: int) -> int:
    return n * size if op == "all_gather" else size


def make_record(backend: str, op: str, n: int, size: int, times: Sequence[float], *, algo: str | None = None,
                knobs: dict[str, Any] | None = None, nwrong: int = 0, t_start_ns: int = 1_000_000_000) -> Record:
    times = [float(t) for t in times]
    med = statistics.median(times)
    total = total_bytes(op, n, size)
    algbw = total / med
    mean = statistics.fmean(times)
    return Record(
        backend=backend, algo=algo or ("ring" if backend == "raw" else "default"), op=op, world_size=n,
        size_bytes=size, total_bytes=total, volume_bytes=(n - 1) * size, dtype="uint8", count=size,
        iters=len(times), warmup=1, times_s=times, time_s=med, min_s=min(times), max_s=max(times), mean_s=mean,
        p95_s=sorted(times)[-1], stdev_s=statistics.stdev(times) if len(times) > 1 else 0.0,
        algbw_Bps=algbw, busbw_Bps=algbw * bus_factor(op, n), nwrong=nwrong,
        t_start_ns=t_start_ns, t_end_ns=t_start_ns + int(sum(times) * 1e9), knobs=dict(knobs or {}),
        hosts=[f"10.0.0.{i + 1}" for i in range(n)], run_id=f"test-{backend}-n{n}")


def timed(seconds: float, count: int = 8, spread: float = 0.02, seed: int = 0) -> list[float]:
    """`count` samples around `seconds` with a relative spread, deterministic."""
    rng = random.Random(seed)
    return [seconds * (1 + rng.gauss(0.0, spread)) for _ in range(count)]


def ideal_time(op: str, n: int, size: int, link_Bps: float, slowdown: float = 1.0, latency_s: float = 100e-6) -> float:
    """A link-bound time: each rank receives (N-1)*size at the link rate (exchange: size)."""
    volume = (n - 1) * size if op == "all_gather" else size
    return latency_s + slowdown * volume / link_Bps


def write_records(path: Path, records: Iterable[Record], env: dict[str, Any] | None = None) -> Path:
    records = list(records)
    with RecordWriter(path) as writer:
        for run_id in dict.fromkeys(r.run_id for r in records):
            writer.start(run_id, env=env if env is not None else TEST_ENV, spec={})
            for r in records:
                if r.run_id == run_id:
                    writer.record(r)
            writer.end(run_id, "ok")
    return path


def write_steps(path: Path, tags: Iterable[str]) -> None:
    """The start events that name each (step, N)'s files on the nodes, as the job writes them (meta ``tag``,
    ``world_size``, the transport in ``spec``): how the report learns a capture's N. The fixtures name their
    tags as the job does, ending in -n<N> (or _n<N>); a raw step's tag says raw."""
    import re

    with RecordWriter(path) as writer:
        for tag in sorted(set(tags)):
            found = re.search(r"[_-]n(\d+)$", tag)
            if found is None:
                continue
            run_id = f"step-{tag}"
            writer.start(run_id, world_size=int(found.group(1)), spec={"backend": "raw" if "raw" in tag else "gloo",
                                                                       "algo": "ring" if "raw" in tag else "default"},
                         meta={"tag": tag})
            writer.end(run_id, "ok", rows=0)


def write_run_dir(root: Path, records: Iterable[Record], *, meta: dict[str, Any] | None = None,
                  analyses: dict[str, dict[str, Any]] | None = None,
                  captures: dict[str, dict[str, Any]] | None = None,
                  observe: dict[str, list[dict[str, Any]]] | None = None,
                  tcpinfo: list[dict[str, Any]] | None = None, env: dict[str, Any] | None = None,
                  advise: dict[str, Any] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if advise is not None:
        (root / "advise").mkdir(exist_ok=True)
        (root / "advise" / "advise.json").write_text(json.dumps(advise))
    write_records(root / "records" / "sweep.jsonl", records, env)
    tags = [*(analyses or {}), *(captures or {}), *(observe or {})]
    if tags:
        write_steps(root / "records" / "steps.jsonl", tags)
    if meta is not None:
        (root / "run.json").write_text(json.dumps(meta))
    for folder, items, suffix in (("analysis", analyses, ".json"), ("captures", captures, ".capture.json")):
        for tag, value in (items or {}).items():
            (root / folder).mkdir(exist_ok=True)
            (root / folder / f"{tag}{suffix}").write_text(json.dumps(value))
    for tag, samples in (observe or {}).items():
        (root / "observe").mkdir(exist_ok=True)
        (root / "observe" / f"{tag}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if tcpinfo:
        (root / "tcpinfo").mkdir(exist_ok=True)
        (root / "tcpinfo" / "rank0.jsonl").write_text("".join(json.dumps(s) + "\n" for s in tcpinfo))
    return root


LINK_BPS = 12.5e6  # 100 Mbit/s lab link in bytes/s
SIZES = (64 * KiB, 256 * KiB, MiB, 4 * MiB)


def anomaly_records(n2_slowdown: float = 1.9, raw_dip: bool = False, seed: int = 0) -> list[Record]:
    """gloo all_gather with an N=2 dip from 256 KiB up, raw ring at link speed, raw shared-connection rows
    slower at N=2, and exchange rows where send-first is slower: the shape of the reported anomaly."""
    out: list[Record] = []
    k = seed
    for n in (2, 3, 4):
        for size in SIZES:
            k += 1
            dip = n2_slowdown if n == 2 and size >= 256 * KiB else 1.0
            out.append(make_record("gloo", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, 1.1 * dip), seed=k)))
            out.append(make_record("raw", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, dip if raw_dip else 1.0),
                                         seed=k + 1000), knobs={"conn": "split", "order": "recv-first"}))
            shared = n2_slowdown if n == 2 else 1.0
            out.append(make_record("raw", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, shared), seed=k + 2000),
                                   knobs={"conn": "shared", "order": "recv-first"}))
    for size in SIZES:
        k += 1
        for order, slow in (("recv-first", 1.0), ("send-first", 1.6)):
            out.append(make_record("gloo", "exchange", 2, size, timed(ideal_time("exchange", 2, size, LINK_BPS, slow),
                                                                       seed=k + (7 if slow > 1 else 0)),
                                   knobs={"order": order}))
    return out


def flat_records(seed: int = 0) -> list[Record]:
    """Same sweep with no anomaly anywhere: every rule on records should stay silent."""
    out: list[Record] = []
    k = seed
    for n in (2, 3, 4):
        for size in SIZES:
            k += 1
            out.append(make_record("gloo", "all_gather", n, size,
                                   timed(ideal_time("all_gather", n, size, LINK_BPS, 1.05), seed=k)))
            for conn in ("split", "shared"):
                out.append(make_record("raw", "all_gather", n, size,
                                       timed(ideal_time("all_gather", n, size, LINK_BPS), seed=k + 1000 + len(conn)),
                                       knobs={"conn": conn, "order": "recv-first"}))
    for size in SIZES:
        k += 1
        for order in ("recv-first", "send-first"):
            out.append(make_record("gloo", "exchange", 2, size,
                                   timed(ideal_time("exchange", 2, size, LINK_BPS), seed=k + len(order)),
                                   knobs={"order": order}))
    return out


def direction(payload: int, *, packets: int = 1000, retrans: int = 0, zero_windows: int = 0, window_full: int = 0,
              idle_count: int = 0, idle_total_s: float = 0.0, idle_max_s: float = 0.0, first_ts: float = 100.0,
              last_ts: float = 102.0, throughput: list[float] | None = None) -> dict[str, Any]:
    span = last_ts - first_ts
    return {"packets": packets, "payload_bytes": payload, "unique_payload_bytes": payload - retrans * 1448,
            "retransmissions": retrans, "fast_retransmissions": 0, "dup_acks": 0, "zero_windows": zero_windows,
            "window_full": window_full, "first_ts": first_ts, "last_ts": last_ts,
            "goodput_Bps": payload / span if span else 0.0, "active_goodput_Bps": payload / span if span else 0.0,
            "rtt_ms": {"median": 0.5, "p95": 1.0, "n": 100},
            "bytes_in_flight": {"median": 32 * KiB, "p95": 64 * KiB, "max": 128 * KiB},
            "idle_gaps": {"count": idle_count, "total_s": idle_total_s, "max_s": idle_max_s},
            "throughput": {"bin_s": 0.1, "t0": first_ts, "Bps": throughput or [payload / span] * int(span / 0.1)}}


def connection(a: str, b: str, ab: dict[str, Any], ba: dict[str, Any], overlap: float) -> dict[str, Any]:
    return {"a": a, "b": b, "directions": {"a->b": ab, "b->a": ba}, "duplex_overlap": overlap, "active_s": 2.0,
            "overlap_Bps": {"a->b": 0.0, "b->a": 0.0}, "alone_Bps": {"a->b": 0.0, "b->a": 0.0}}


def analysis(world_size: int, connections: list[dict[str, Any]], hosts: list[dict[str, Any]] | None = None,
             backend: str = "gloo", kernel_dropped: int = 0, op: str = "all_gather") -> dict[str, Any]:
    phase = {"backend": backend, "algo": "default", "op": op, "world_size": world_size,
             "size_bytes": 4 * MiB, "iteration": 0, "t_start_ns": 0, "t_end_ns": 1}
    return {"schema": 1, "files": ["x.pcap"], "capture": {"kernel_dropped": kernel_dropped,
                                                          "flagged": kernel_dropped > 0},
            "connections": connections, "hosts": hosts or [],
            "phases": [{"phase": phase, "connections": connections, "hosts": hosts or []}], "warnings": []}


def host(address: str, tx: int, rx: int, overlap: float) -> dict[str, Any]:
    return {"address": address, "tx_bytes": tx, "rx_bytes": rx, "duplex_overlap": overlap,
            "tx_Bps_overlap": 0.0, "rx_Bps_overlap": 0.0, "active_s": 2.0}


def turn_taking_analyses() -> dict[str, dict[str, Any]]:
    """N=2: one connection carries both directions and they take turns; N=4: one-way ring connections."""
    half = [LINK_BPS, 0.0] * 10
    other = [0.0, LINK_BPS] * 10
    n2 = analysis(2, [connection("10.0.0.1:5000", "10.0.0.2:40000",
                                 direction(8 * MiB, throughput=half), direction(8 * MiB, throughput=other), 0.1)],
                  [host("10.0.0.1", 8 * MiB, 8 * MiB, 0.1)])
    ring = [connection(f"10.0.0.{i + 1}:5000", f"10.0.0.{(i + 1) % 4 + 1}:4000{i}",
                       direction(12 * MiB), direction(0, packets=500), 0.0) for i in range(4)]
    n4 = analysis(4, ring, [host("10.0.0.1", 12 * MiB, 12 * MiB, 0.95)])
    return {"gloo_n2": n2, "gloo_n4": n4}


def cpu_samples(name: str, pct: float, count: int = 6, tid: int = 11) -> list[dict[str, Any]]:
    return [{"kind": "cpu_thread", "t_ns": 1_000_000_000 + i * 100_000_000, "pid": 10, "tid": tid, "name": name,
             "cpu_pct": pct} for i in range(count)]


def host_cpu_samples(busy_pct: float, cpus: int = 2, count: int = 6) -> list[dict[str, Any]]:
    return [{"kind": "cpu_host", "t_ns": 1_000_000_000 + i * 100_000_000, "cpus": cpus, "busy_pct": busy_pct,
             "per_cpu_pct": [busy_pct] * cpus} for i in range(count)]


def tcp_info_samples(rwnd_limited_s: float, busy_s: float = 1.0, count: int = 5) -> list[dict[str, Any]]:
    return [{"kind": "tcp_info", "t_ns": 1_000_000_000 + i * 100_000_000, "pid": 10, "local": "10.0.0.1:5000",
             "remote": "10.0.0.2:40000", "cwnd": 10 + 5 * i, "rtt_us": 500, "send_q": 1000 * i, "recv_q": 0,
             "delivery_rate_Bps": LINK_BPS, "busy_s": busy_s * i / (count - 1),
             "rwnd_limited_s": rwnd_limited_s * i / (count - 1), "sndbuf_limited_s": 0.0, "retrans": 0}
            for i in range(count)]


def trial_records(spec: Any, times: Any, world_size: int = 2, rounds: int = 6, run_id: str = "trial-1",
                  cpu: Any = None) -> list[Record]:
    """The block records an interleaved trial (diag/trial.py) writes: every arm once per round, in the
    trial's own seeded order. ``times(arm, size, round) -> per-iteration seconds``; ``cpu(arm, round) ->
    {"machine_busy": [...], "busiest_thread": [...]}`` or None."""
    from diag.trialspec import round_order

    out: list[Record] = []
    t = 1_000_000_000
    for size_index, size in enumerate(spec.sizes):
        for r in range(rounds):
            order = round_order(spec, size_index, r)
            for position, name in enumerate(order):
                arm = spec.arm(name)
                samples = times(name, size, r)
                record = make_record(arm.backend, arm.op, world_size, size, samples,
                                     knobs={**arm.knobs, "order": arm.order} if arm.backend == "raw" else
                                     {"order": arm.order} if arm.op == "exchange" else {}, t_start_ns=t)
                t = record.t_end_ns + 1_000_000
                block = {"trial": spec.name, "arm": name, "round": r, "position": position, "order": order,
                         "size_index": size_index, "cpu": cpu(name, r) if cpu else {}}
                out.append(Record(**{**record.__dict__, "run_id": run_id, "block": block}))
    return out


def write_trial(path: Path, spec: Any, records: Sequence[Record], run_id: str = "trial-1",
                env: dict[str, Any] | None = None) -> Path:
    """A trial launch's records file: start (meta.trial), the blocks, end."""
    with RecordWriter(path) as writer:
        writer.start(run_id, env=env if env is not None else TEST_ENV, spec={}, meta={"trial": spec.to_json()})
        for r in records:
            writer.record(r)
        writer.end(run_id, "ok", trial={"name": spec.name, "sizes": {}})
    return path


# The N=2 trial of diag reproduce, and arm shapes (fast s, slow s, slow share) of the reported anomaly: gloo and
# its protocol model mostly in the slow mode, the model with its notice on its own connection at the link.
ANOMALY_SHAPES = {"gloo": (0.73, 1.12, 0.7), "raw": (0.72, 0.72, 0.0), "model": (0.73, 1.10, 0.8),
                  "model-own-conn": (0.75, 1.1, 0.03), "shared-conn": (0.72, 0.72, 0.0)}


def n2_trial(sizes: tuple[int, ...] = (16 * MiB,), seed: int = 7) -> Any:
    from diag.plan import N2_ARMS, N2_COMPARISONS
    from diag.trialspec import TrialSpec

    return TrialSpec("n2-trial", N2_ARMS, N2_COMPARISONS, sizes=sizes, seed=seed)


def shaped_times(shapes: dict[str, tuple[float, float, float]], per_block: int = 2) -> Any:
    """times(arm, size, round) for trial_records: each iteration in the arm's fast or slow mode, 2% jitter."""
    def times(arm: str, size: int, r: int) -> list[float]:
        fast, slow, share = shapes[arm]
        rng = random.Random(f"{arm}/{size}/{r}")
        return [(slow if rng.random() < share else fast) * (1 + rng.gauss(0, 0.02)) for _ in range(per_block)]
    return times
def advise_row(size: int, speedup: float, verdict: str, nwrong: int = 0, spread: float = 0.05,
               rounds: int = 8) -> dict[str, Any]:
    """One row of advise.json (schema 2) as diag.advise writes it: the speed-up of the mean times with its
    interval, and the trial's verdict on it."""
    return {"size_bytes": size, "busbw_Bps": 6e6 * speedup, "baseline_busbw_Bps": 6e6, "time_s": 1 / speedup,
            "baseline_time_s": 1.0, "speedup": speedup, "speedup_low": speedup * (1 - spread),
            "speedup_high": speedup * (1 + spread), "verdict": verdict, "reason": f"{verdict} (test)",
            "rounds": rounds, "nwrong": nwrong, "baseline_nwrong": 0,
            "decision": {"design": "difference", "p_value": 1e-3, "rounds": rounds}}


def advise_doc(speedup: float = 1.62, verdict: str = "faster", second: float = 1.04) -> dict[str, Any]:
    """advise.json as diag.advise writes it: the recv-first workaround with ``speedup`` at two sizes and the
    trial's ``verdict`` on it, diag_tcp with ``second`` (within the effect threshold: the same)."""
    from diag.advise import WORKAROUNDS

    def rows(factor: float, verdict: str) -> list[dict[str, Any]]:
        return [advise_row(size, factor, verdict) for size in (16 * MiB, 32 * MiB)]

    return {"schema": 2, "anomaly": "gloo all_gather at N=2", "world_size": 2, "sizes": [16 * MiB, 32 * MiB],
            "lab": "t", "records": "records/advise.jsonl", "trial": "advise", "design": "difference", "effect": 0.1,
            "baseline": {}, "failures": [], "complete": True, "stopped": {},
            "workarounds": [{"name": w.name, "title": w.title, "backend": w.backend, "op": w.op, "code": w.code,
                             "rows": rows(speedup if i == 0 else second, verdict if i == 0 else "same")}
                            for i, w in enumerate(WORKAROUNDS)]}
