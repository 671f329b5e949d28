"""The ``diag`` command line: subparsers plus an explicit dispatch table.

Each subcommand lives in ``diag/cli/<name>.py`` with ``add_arguments(parser)`` and ``run(args) -> int``.
Those modules import only the standard library at module level, so ``diag --help`` and the commands that
need no torch (``analyze``, ``lab``, ``report``, ...) start fast and work where torch is absent.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from diag.errors import DiagError

# name -> (module, one-line help). Order is the order shown by --help.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "reproduce": ("diag.cli.reproduce", "the main job: lab + gloo and raw-TCP sweeps + captures + report"),
    "sweep": ("diag.cli.sweep", "time collectives over a size sweep (torch gloo/nccl or raw TCP)"),
    "lab": ("diag.cli.lab", "cluster in a box: network namespaces with shaped full-duplex links"),
    "capture": ("diag.cli.capture", "capture TCP traffic with tcpdump (scapy fallback)"),
    "analyze": ("diag.cli.analyze", "per-connection, per-direction TCP analysis of pcap files"),
    "report": ("diag.cli.report", "render report.html/report.md and plots from a run directory"),
    "diagnose": ("diag.cli.diagnose", "findings with evidence from a run directory"),
    "compare": ("diag.cli.compare", "row-by-row ratios of two record files, with significance"),
    "trial": ("diag.cli.trial", "A/B-test programs (a patched build, a setting) as arms of an interleaved trial"),
    "advise": ("diag.cli.advise", "measure workarounds for gloo's N=2 all_gather and print the code to use"),
    "model": ("diag.cli.model", "fit, test, query and export models of collectives for simulators"),
    "exec": ("diag.cli.exec", "run an unchanged torch.distributed script with the diag_tcp backend"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with ``only`` the one subcommand the command line names: then the other
    subcommands' modules are not imported (``diag lab``'s options alone import the lab package, ~35 ms, a
    twentieth of a two-million-packet ``diag analyze``)."""
    parser = argparse.ArgumentParser(
        prog="diag",
        description="Root-cause bandwidth anomalies of collective communication over TCP.",
    )
    parser.add_argument("--version", action="version", version="diag 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # a subcommand not built into this installation
        sub_parser = sub.add_parser(
            name,
            help=help_text,
            # The whole docstring: what the command does and its examples (argparse keeps its line breaks).
            description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # A command line that starts with a subcommand gets only that one's parser; anything else (no
    # command, --help, a typo) gets the whole parser and its usual messages.
    parser = build_parser(words[0] if words and words[0] in SUBCOMMANDS else None)
    args = parser.parse_args(words)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    from diag.lifeline import Terminated, restore_handlers, terminate_as_exception

    # SIGTERM/SIGHUP unwind like Ctrl-C, so launchers, ranks, captures and labs are stopped on the way out.
    previous_handlers = terminate_as_exception()
    try:
        return int(args._module.run(args) or 0)
    except DiagError as exc:
        from diag.textsafe import visible

        print(f"diag {args.command}: error: {visible(str(exc))}", file=sys.stderr)   # it may quote what a node said
        return exc.exit_code
    except ModuleNotFoundError as exc:
        if exc.name != "torch" and not str(exc.name).startswith("torch."):
            raise
        from diag.errors import EXIT_USAGE, torch_missing

        # a path that reached torch without require_torch: the same one line, not a traceback
        print(f"diag {args.command}: error: {torch_missing(f'diag {args.command}')}", file=sys.stderr)
        return EXIT_USAGE
    except Terminated as exc:
        print(f"diag {args.command}: {exc}; finished results were kept", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"diag {args.command}: interrupted; finished results were kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    finally:
        restore_handlers(previous_handlers)


if __name__ == "__main__":
    sys.exit(main())
