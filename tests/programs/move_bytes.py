"""A stand-in for a benchmark program, for diag trial's tests: every rank but 0 sends BYTES to rank 0 over TCP,
ITERS times; rank 0 answers each transfer with one byte. Each sender prints one JSON line per iteration,
{"bytes": BYTES, "seconds": the time from its first byte sent to rank 0's answer}, so on a shaped link the
time is BYTES / rate (plus one round trip): an arm moving 1.5x the bytes is 1.5x slower, two arms moving the
same bytes are equal. Started by diag trial with placeholders: --rank {rank} --world {world} --master {master}
--port {port}."""

from __future__ import annotations

import argparse
import json
import socket
import time

CHUNK = 1 << 16


def serve(port: int, address: str, peers: int, size: int, iters: int) -> None:
    with socket.create_server((address, port), backlog=peers) as server:
        server.settimeout(60)
        conns = [server.accept()[0] for _ in range(peers)]
    buffer = bytearray(CHUNK)
    for _ in range(iters):
        for conn in conns:   # each sender's transfer, in turn; they overlap in the kernel's buffers
            left = size
            while left:
                got = conn.recv_into(buffer, min(CHUNK, left))
                if not got:
                    raise SystemExit("a sender closed early")
                left -= got
            conn.sendall(b"!")
    for conn in conns:
        conn.close()


def send(port: int, master: str, size: int, iters: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    payload = bytes(size)
    for _ in range(iters):
        start = time.perf_counter()
        conn.sendall(payload)
        if conn.recv(1) != b"!":
            raise SystemExit("no answer from rank 0")
        print(json.dumps({"bytes": size, "seconds": time.perf_counter() - start}), flush=True)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--rank", "--world", "--port", "--bytes", "--iters"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--master", required=True)
    args = parser.parse_args()
    if args.rank == 0:
        serve(args.port, args.master, args.world - 1, args.bytes, args.iters)
    else:
        send(args.port, args.master, args.bytes, args.iters)


if __name__ == "__main__":
    main()
