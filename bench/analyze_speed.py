"""Benchmark: `diag analyze` vs `tshark -T fields` on a real loopback capture of >= 2M TCP packets.

    python -m bench.analyze_speed [--packets 2000000] [--dir /tmp/diag-bench] [--keep] [--pcap FILE]
                                 [--repeat 5] [--baseline TREE] [--no-tshark]

Generates the capture with tcpdump (snaplen 128) from a loopback transfer whose MSS is clamped small so
there are many packets, then times, in the same run, `diag analyze --json` end to end (a fresh process,
so imports and JSON output count; --repeat runs, median and best) and tshark extracting the columns diag
reads (once: it takes minutes). --baseline TREE interleaves the main runs with `diag analyze` from another
source tree (repeat it for more trees), so that machine noise hits all alike
(PYTHONPATH=TREE: e.g. `git archive` of the commit before a change, its kernels built in place): an A/B of
several versions in one run, and whether they print the same JSON.
Peak memory is each child's max RSS, CPU its user + system time. Needs root, tcpdump and tshark.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from diag.lifeline import CHILD_CWD, python_command

TSHARK_FIELDS = ["frame.time_epoch", "ip.src", "tcp.srcport", "ip.dst", "tcp.dstport", "tcp.seq_raw", "tcp.ack_raw",
                 "tcp.len", "tcp.window_size_value", "tcp.flags", "tcp.options.timestamp.tsval",
                 "tcp.options.timestamp.tsecr"]
SMALL_MSS = 200
GENERATE_TIMEOUT_S = 300
# Send as many MSS-sized data segments as packets wanted: with the ACKs (about one per eight data
# segments on this loopback) the capture then holds ~1.1x the target, never fewer.
DATA_MARGIN = 1.0
# The sender is paced (SO_MAX_PACING_RATE: the kernel's internal TCP pacing, no fq qdisc needed) so that
# tcpdump, sharing two busy cores with everything else, keeps up: an unpaced loopback transfer outruns it
# and the kernel drops packets. The large -B buffer absorbs the scheduling hiccups that remain.
DEFAULT_RATE_BPS = 16_000_000
TCPDUMP_BUFFER_KIB = 256 * 1024
# Without --immediate-mode libpcap hands over packets in blocks retired after at most ~1 s: wait that out.
BLOCK_FLUSH_S = 1.5


TRANSFER = """
import socket, sys, threading
target = int(sys.argv[1]); mss = int(sys.argv[2]); rate = int(sys.argv[3])
server = socket.create_server(("127.0.0.1", 5201))
def sink():
    conn, _ = server.accept()
    while conn.recv(1 << 16):
        pass
thread = threading.Thread(target=sink); thread.start()
client = socket.socket()
client.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
client.setsockopt(socket.SOL_SOCKET, 47, rate)  # SO_MAX_PACING_RATE, bytes/s
client.connect(("127.0.0.1", 5201))
chunk = b"x" * (1 << 16); sent = 0
while sent < target:
    client.sendall(chunk); sent += len(chunk)
client.close(); thread.join()
"""


@dataclass(frozen=True)
class Generated:
    packets: int
    kernel_dropped: int | None
    seconds: float


def generate(path: Path, packets: int, rate_Bps: int = DEFAULT_RATE_BPS) -> Generated:
    """A paced transfer inside a private namespace whose loopback has segmentation offloads off (so the
    capture sees every MSS-sized segment; the machine's own loopback is left alone)."""
    from diag.capture.live import start_capture

    netns = f"diagbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    start = time.monotonic()
    try:
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", netns, "ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off"],
                       check=False, capture_output=True)
        handle = start_capture(path, "lo", "tcp port 5201", 128, netns=netns, buffer_kib=TCPDUMP_BUFFER_KIB,
                               immediate=False)
        target_bytes = int(packets * DATA_MARGIN * SMALL_MSS)
        try:
            subprocess.run(["ip", "netns", "exec", netns, *python_command("-c", TRANSFER, str(target_bytes),
                            str(SMALL_MSS), str(rate_Bps))], check=True, timeout=GENERATE_TIMEOUT_S, cwd=CHILD_CWD)
        finally:
            time.sleep(BLOCK_FLUSH_S)
            info = handle.stop()
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
    return Generated(int(info.packets or 0), info.kernel_dropped, time.monotonic() - start)


@dataclass(frozen=True)
class Timed:
    wall_s: float
    cpu_s: float  # user + system
    peak_rss_kib: int


def timed(command: list[str], stdout_path: Path, env: dict[str, str] | None = None) -> Timed:
    """Wall and CPU seconds and peak RSS of one child; os.wait4 gives that child's own rusage."""
    start = time.perf_counter()
    with stdout_path.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{command[0]} failed with exit code {proc.returncode}")
    return Timed(elapsed, usage.ru_utime + usage.ru_stime, int(usage.ru_maxrss))


def summary(runs: list[Timed], packets: int) -> dict[str, float]:
    walls = sorted(r.wall_s for r in runs)
    cpus = sorted(r.cpu_s for r in runs)
    median_wall = statistics.median(walls)
    return {
        "runs": len(runs),
        "wall_median_s": round(median_wall, 3), "wall_best_s": round(walls[0], 3),
        "cpu_median_s": round(statistics.median(cpus), 3), "cpu_best_s": round(cpus[0], 3),
        "packets_per_s_median": round(packets / median_wall), "packets_per_s_best": round(packets / walls[0]),
        "peak_rss_max_MB": round(max(r.peak_rss_kib for r in runs) / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.analyze_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=2_000_000)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--pcap", type=Path, help="reuse this capture instead of generating one")
    parser.add_argument("--keep", action="store_true", help="keep the capture")
    parser.add_argument("--repeat", type=int, default=5, help="diag runs (median and best; default %(default)s)")
    parser.add_argument("--baseline", type=Path, metavar="TREE", action="append", default=[],
                        help="also time `diag analyze` of this source tree (PYTHONPATH=TREE), interleaved with the "
                             "main runs (give it again for more trees: e.g. the tree before a change and an older "
                             "release, all in one run)")
    parser.add_argument("--no-tshark", action="store_true", help="skip tshark (it takes minutes)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE_BPS / 1e6, metavar="MB/s",
                        help="pace the generating transfer at this payload rate (default %(default)s MB/s)")
    args = parser.parse_args(argv)
    for tool in ("tcpdump", "tshark"):
        if not shutil.which(tool):
            print(f"needs {tool}", file=sys.stderr)
            return 3
    work = args.dir or Path(tempfile.mkdtemp(prefix="diag-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pcap = args.pcap or work / "bench.pcap"
    try:
        generated = None
        if not args.pcap:
            generated = generate(pcap, args.packets, int(args.rate * 1e6))
            print(f"captured {generated.packets} packets into {pcap} ({pcap.stat().st_size / 1e6:.0f} MB) in "
                  f"{generated.seconds:.1f} s, kernel dropped {generated.kernel_dropped}", file=sys.stderr)
            if generated.packets < args.packets or generated.kernel_dropped:
                print("warning: the capture is short of the target or dropped packets; lower --rate",
                      file=sys.stderr)
        from diag.capture.native import available

        command = python_command("-m", "diag", "analyze", str(pcap), "--json")
        # As an installed package runs: with its bytecode cached (an environment with PYTHONDONTWRITEBYTECODE
        # would compile every module from source on every run, ~50 ms here). One untimed run writes the
        # bytecode and brings the capture into the page cache.
        native_env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
        engines = [("native", native_env)]
        engines += [(f"baseline{'' if k == 0 else k + 1}", {**native_env, "PYTHONPATH": str(tree)})
                    for k, tree in enumerate(args.baseline)]
        for _name, env in engines:
            timed(command, work / "diag-warmup.json", env)
        load_before_diag = os.getloadavg()[0]
        runs: dict[str, list[Timed]] = {name: [] for name, _env in engines}
        outputs: dict[str, set[bytes]] = {name: set() for name, _env in engines}
        for turn in range(args.repeat):
            # Alternate the engines' order (ABC, CBA, ...), so a drift of the machine's load hits them alike.
            for name, env in engines if turn % 2 == 0 else engines[::-1]:
                out_path = work / f"diag-{name}.json"
                runs[name].append(timed(command, out_path, env))
                outputs[name].add(out_path.read_bytes())
        native_runs = runs["native"]
        result = json.loads((work / "diag-native.json").read_text())
        n = result["capture"]["packets"]
        report: dict[str, object] = {
            "packets": n, "file_bytes": pcap.stat().st_size,
            "kernel_dropped": generated.kernel_dropped if generated else result["capture"]["kernel_dropped"],
            "kernels": available(),
            # Other work on the machine slows both tools; the ratio is fair only if these are alike.
            "load_1m_before_diag": round(load_before_diag, 2),
            "diag": summary(native_runs, n),
            "json_identical_across_runs": len(outputs["native"]) == 1,
        }
        for (name, _env), tree in zip(engines[1:], args.baseline, strict=True):
            report[f"diag_{name}"] = {"tree": str(tree), **summary(runs[name], n),
                                      # an older tree may write fewer keys: a difference is not an error
                                      "json_identical_to_main": outputs[name] == outputs["native"]}
            report[f"{name}_vs_main_wall"] = round(statistics.median(r.wall_s for r in runs[name])
                                                   / statistics.median(r.wall_s for r in native_runs), 2)
            report[f"{name}_vs_main_cpu"] = round(statistics.median(r.cpu_s for r in runs[name])
                                                  / statistics.median(r.cpu_s for r in native_runs), 2)
            report[f"{name}_vs_main_peak_rss"] = round(
                max(r.peak_rss_kib for r in runs[name]) / max(r.peak_rss_kib for r in native_runs), 2)
        if not args.no_tshark:
            fields = [x for f in TSHARK_FIELDS for x in ("-e", f)]
            report["load_1m_before_tshark"] = round(os.getloadavg()[0], 2)
            tshark = timed(["tshark", "-n", "-r", str(pcap), "-T", "fields", *fields], work / "tshark.txt")
            report["tshark_s"] = round(tshark.wall_s, 3)
            report["tshark_cpu_s"] = round(tshark.cpu_s, 3)
            report["tshark_peak_rss_MB"] = round(tshark.peak_rss_kib / 1024, 1)
            report["speedup_vs_tshark_median"] = round(tshark.wall_s / statistics.median(r.wall_s for r in native_runs), 1)
            report["speedup_vs_tshark_cpu"] = round(tshark.cpu_s / statistics.median(r.cpu_s for r in native_runs), 1)
        report["load_1m_after"] = round(os.getloadavg()[0], 2)
        print(json.dumps(report, indent=1))
    finally:
        if not args.keep and not args.pcap:
            for name in ("bench.pcap", "bench.pcap.capture.json", "diag-native.json",
                         *(f"diag-baseline{'' if k == 0 else k + 1}.json" for k in range(len(args.baseline))),
                         "diag-warmup.json", "tshark.txt"):
                with_path = work / name
                if with_path.exists():
                    os.unlink(with_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
