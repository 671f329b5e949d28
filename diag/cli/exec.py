"""Run an unchanged torch.distributed script with the diag_tcp backend registered (`diag exec -- SCRIPT ARGS`).

The script selects the backend itself (e.g. ``DIST_BACKEND=diag_tcp`` with
``init_process_group(backend=os.getenv("DIST_BACKEND", "gloo"))``). The options below set the raw
transport knobs through DIAG_TCP_* environment variables, so ranks started by torchrun inherit them.
As `python SCRIPT` does, the script's directory goes first on sys.path (its own modules import), except
under a safe path (python -P, PYTHONSAFEPATH=1, as diag's own children run): then nothing is added. Run as
root, a script in a directory others can write imports what they plant there: use -P, or a private directory.

examples:
  DIST_BACKEND=diag_tcp torchrun --nproc-per-node 2 --no-python diag exec --conn shared -- train.py
"""

from __future__ import annotations

import argparse
import json
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algo", choices=("ring", "pairwise", "direct"), help="all_gather algorithm (ring)")
    parser.add_argument("--order", choices=("recv-first", "send-first"), help="post receive or send first")
    parser.add_argument("--conn", choices=("shared", "split"), help="one socket per pair, or one per direction")
    parser.add_argument("--handshake", choices=("none", "notify"), help="gloo's ready-to-receive protocol")
    parser.add_argument("--notice", choices=("in-band", "own-conn"), help="notify: where ready notices travel")
    parser.add_argument("--skew-us", type=int, help="every rank but 0 starts each operation this much later")
    parser.add_argument("--io", choices=("duplex", "alternate"), help="concurrent or alternating directions")
    parser.add_argument("--chunks", type=int, help="messages per block")
    parser.add_argument("--streams", type=int, help="sockets per peer (and direction), striped")
    parser.add_argument("--sockbuf", help="SO_SNDBUF/SO_RCVBUF bytes (default: kernel autotuning)")
    parser.add_argument("--nodelay", choices=("on", "off"), help="TCP_NODELAY (default on)")
    parser.add_argument("--emulate", choices=("gloo",), help="preset that mirrors gloo's pattern")
    parser.add_argument("--iface", help="interface to listen on (default GLOO_SOCKET_IFNAME / route to master)")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...] or -- -m MODULE [ARGS...]")


def run(args: argparse.Namespace) -> int:
    from diag.errors import require_torch

    require_torch("diag exec")
    from diag.exec import run_script
    from diag.transports.raw.knobs import knobs_from_args

    knobs = {**json.loads(os.environ.get("DIAG_TCP_KNOBS") or "{}"), **knobs_from_args(args)}
    os.environ["DIAG_TCP_KNOBS"] = json.dumps(knobs)
    if args.algo:
        os.environ["DIAG_TCP_ALGO"] = args.algo
    if args.order:
        os.environ["DIAG_TCP_ORDER"] = args.order
    from diag.transports.raw.backend import knobs_from_env

    knobs_from_env()  # validate before the script starts, as one line
    run_script(args.script)
    return 0
