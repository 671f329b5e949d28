"""Models a simulator can use: one per series and op across N and size (per-step latency, per-byte cost,
TCP's ramp, gloo's N=2 turn-taking), tested on data each fit did not see; predictions with an interval
from the samples; exports for Vidur and ASTRA-sim (docs/model.md).

examples:
  diag model fit RUN_DIR|RECORDS... -o model.json [--world-sizes 2,3,4]
  diag model predict --model model.json --op all_gather --world-size 8 --size 16M [--series torch:gloo]
  diag model check --model model.json RUN_DIR|RECORDS...      # predict measured rows it was not fitted on
  diag model export --model model.json --vidur DIR --series torch:gloo
  diag model export --model model.json --astra-sim network.yml [--npus 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from diag import safefs

# An N=2 turn-taking share this large is named where the model is printed (below it: the ring's own N=2).
NAMED_SHARE = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    fit = sub.add_parser("fit", help="fit one model per series and op, print held-out errors, write JSON")
    fit.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS")
    fit.add_argument("-o", "--output", type=Path, default=None, help="write model.json here")
    fit.add_argument("--world-sizes", default=None, metavar="N,N,...",
                     help="fit on these N only (e.g. 2,3,4, to predict the others with `diag model check`)")
    fit.add_argument("--json", action="store_true", help="print model.json instead of the summary (also with -o)")
    predict = sub.add_parser("predict", help="how long will OP of SIZE per rank take on N ranks")
    predict.add_argument("--model", type=Path, required=True, help="model JSON from `diag model fit`")
    predict.add_argument("--op", default="all_gather", help="all_gather (default), all_reduce or send_recv: an op the "
                                                             "model file has")
    predict.add_argument("--world-size", type=int, required=True, metavar="N",
                         help="ranks taking part (2 or more); an N the fit did not see is predicted and said to "
                              "extrapolate")
    predict.add_argument("--size", required=True, help="per-rank input size, e.g. 16M, 12589824 (1 byte or more)")
    predict.add_argument("--series", "--backend", dest="series", default=None,
                         help="a series label as the model file names it (e.g. \"raw:ring [emulate=gloo]\"), or a "
                              "transport: gloo, torch:gloo, raw, raw:ring (its reference series; default: every series)")
    predict.add_argument("--algo", default=None, help="raw algorithm (ring, pairwise): with --series raw or none, "
                                                      "the series raw:ALGO")
    predict.add_argument("--json", action="store_true", help="print the predictions as JSON (time_s, median_s, "
                                                             "low_s, high_s, modes, extrapolated, where)")
    check = sub.add_parser("check", help="predict every row of measured records and print the errors")
    check.add_argument("paths", nargs="+", metavar="RUN_DIR|RECORDS")
    check.add_argument("--model", type=Path, required=True, help="model JSON from `diag model fit`")
    check.add_argument("--large", default="1M", help="the summary's 'large' rows: at least this many bytes "
                                                     "through each link (D for all_gather; default 1M)")
    check.add_argument("--json", action="store_true", help="print the rows, summaries and N=2 losses as JSON")
    export = sub.add_parser("export", help="write Vidur's collective profiles or an ASTRA-sim network config")
    export.add_argument("--model", type=Path, required=True, help="model JSON from `diag model fit`")
    export.add_argument("--vidur", type=Path, default=None, metavar="DIR",
                        help="write all_reduce.csv, send_recv.csv, all_gather.csv (Vidur's profiling layout) here")
    export.add_argument("--astra-sim", type=Path, default=None, metavar="FILE",
                        help="write an ASTRA-sim analytical network config (YAML) here")
    export.add_argument("--series", default=None,
                        help="the series to export (Vidur: needed when several are modelled; ASTRA-sim: default "
                             "raw:ring, the raw-TCP reference)")
    export.add_argument("--world-sizes", default=None, metavar="N,N,...",
                        help="Vidur: the num_workers to write (default: the fitted N; others are extrapolated)")
    export.add_argument("--max-size", default="64M", help="Vidur: the largest size on its grid (default 64M)")
    export.add_argument("--npus", type=int, default=None, help="ASTRA-sim: npus_count (default: the largest fitted N)")
    export.add_argument("--topology", default="Switch", choices=("Switch", "Ring", "FullyConnected"),
                        help="ASTRA-sim: how the hosts connect (default Switch: a NIC each, one switch)")


def run(args: argparse.Namespace) -> int:
    actions = {"fit": _fit, "predict": _predict, "check": _check, "export": _export}
    return actions[args.model_command](args)


def _world_sizes(text: str | None) -> list[int] | None:
    from diag.errors import DiagError

    if text is None:
        return None
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise DiagError(f"--world-sizes {text!r}: give world sizes like 2,3,4") from None
    if not values or values[0] < 2:
        raise DiagError(f"--world-sizes {text!r}: give world sizes of at least 2, like 2,3,4")
    return values


def _fit(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.model.fitting import fit
    from diag.report.rundir import load_run

    data = load_run(args.paths)
    model = fit(data.model_records, _world_sizes(args.world_sizes), [str(f.path) for f in data.record_files])
    if not model.series_models:
        why = "; ".join(f"{s['series']} {s['op']}: {s['why']}" for s in model.skipped) or "no rows"
        raise DiagError(f"nothing to model ({why}): sweep two or more sizes of all_gather, all_reduce or send_recv")
    text = json.dumps(model.to_json(), indent=1, allow_nan=False) + "\n"
    if args.output is not None:
        safefs.write_file(safefs.make_parent(args.output), text, flag="--output")
    if args.json:
        print(text, end="")
        return 0
    for line in fit_lines(model):
        print(line)
    print(f"wrote {len(model.series_models)} models to {args.output}" if args.output is not None
          else "(not saved: give -o model.json, or --json to print it)")
    return 0


def fit_lines(model: Any) -> list[str]:
    """What `diag model fit` prints: per series and op, the terms, the errors, where it extrapolates."""
    from diag.units import human_bytes, human_rate, human_time

    lines = []
    for m in model.series_models:
        t, iv, st = m.terms, m.intervals, m.structure
        lines.append(f"{m.series} {m.op} ({st.algorithm}: L={st.text[0]} steps, m={st.text[1]}, V={st.text[2]} "
                     f"bytes per link), fitted on N={','.join(map(str, m.world_sizes))}, "
                     f"{human_bytes(m.sizes_bytes[0])}..{human_bytes(m.sizes_bytes[-1])} per rank, "
                     f"{len(m.cells)} cells, {sum(c.samples for c in m.cells)} samples")
        terms = [f"alpha {human_time(t.alpha_s)} per step [{_span(iv.get('alpha_s'), human_time)}]",
                 f"1/beta {human_rate(t.bandwidth_Bps) if t.beta_s_per_byte > 0 else 'n/a'} "
                 f"[{_span(iv.get('beta_s_per_byte'), lambda b: human_rate(1 / b) if b > 0 else 'n/a', reverse=True)}]"]
        if m.ramp:
            sign = "slower" if t.ramp_s > 0 else "faster"
            terms.append(f"ramp {'+' if t.ramp_s >= 0 else '-'}{human_time(abs(t.ramp_s))} per step, half at "
                         f"{human_bytes(t.ramp_half_bytes)} (small messages {sign} per byte)")
        if m.n2_penalty:
            share = iv.get("n2_turn_share")
            terms.append(f"N=2 turn-taking share {t.n2_turn_share:.1%}"
                         + (f" [{share[0]:.1%}, {share[1]:.1%}]" if share else "")
                         + (f", half of it at {human_bytes(t.n2_half_bytes)} per step" if t.n2_half_bytes else ""))
        lines.append("  " + "; ".join(terms) + " (95% bootstrap intervals)")
        lines.append(f"  fit error {m.fit_error:.1%} (median over cells), stated error {m.stated_error:.1%} "
                     f"(90% of cells within it)")
        by_n = [h for h in m.heldout if h.kind == "world_size"]
        by_size = [h for h in m.heldout if h.kind != "world_size"]
        if by_n:
            lines.append("  leave-one-N-out: " + ", ".join(
                f"N={h.value} {h.median_error:.1%}{' (extrapolated)' if h.extrapolated else ''}" for h in by_n))
            if m.n2_penalty and t.n2_turn_share >= NAMED_SHARE:
                lines += [f"    {h.note}" for h in by_n if h.note]
        if by_size:
            axis = "D" if by_size[0].kind == "volume" else "per-rank size"
            errors = sorted(h.median_error for h in by_size)
            worst = max(by_size, key=lambda h: h.median_error)
            lines.append(f"  leave-one-size-out ({axis}, {len(by_size)} sizes): median {errors[len(errors) // 2]:.1%}, "
                         f"worst {worst.median_error:.1%} at {human_bytes(worst.value)}; edges "
                         + ", ".join(f"{human_bytes(h.value)} {h.median_error:.1%}" for h in by_size if h.extrapolated))
        lines.append("  " + m.heldout_statement())
        lines.append("  " + m.extrapolation_statement())
        lines += [f"  note: {n}" for n in m.notes]
    for s in model.skipped:
        lines.append(f"{s['series']} {s['op']}: {s['why']}")
    return lines


def _span(interval: tuple[float, float] | None, fmt: Any, reverse: bool = False) -> str:
    if not interval:
        return "-"
    low, high = (interval[1], interval[0]) if reverse else interval
    return f"{fmt(low)}, {fmt(high)}"


def _predict(args: argparse.Namespace) -> int:
    from diag.model.core import load
    from diag.units import human_bytes, human_time, parse_size

    model = load(args.model)
    size = parse_size(args.size)
    answers = []
    series = f"raw:{args.algo}" if args.algo and args.series in (None, "raw") else args.series
    for m in model.select(args.op, series):
        p = m.predict(args.world_size, size)
        answers.append(p.to_json())
        if not args.json:
            modes = (f"; two modes: fast {human_time(p.modes['fast_s'])}, slow {human_time(p.modes['slow_s'])} in "
                     f"{p.modes['slow_fraction']:.0%} of operations" if p.modes else "")
            print(f"{p.op} of {human_bytes(size)} per rank on {p.world_size} ranks with {p.series}: "
                  f"{human_time(p.time_s)} mean; {p.confidence:.0%} of operations {human_time(p.low_s)}.."
                  f"{human_time(p.high_s)} (median {human_time(p.median_s)}){modes}"
                  f"{'; ' + p.where if p.where else ''}")
    if args.json:
        print(json.dumps(answers, indent=1))
    return 0


def check_rows(model: Any, records: Any, large_bytes: int) -> dict[str, Any]:
    """Every measured row the model has a series for: measured mean, predicted mean, error; per series and op
    the median |error| (all rows, and rows with at least ``large_bytes`` through each link); and for models with
    the N=2 term, the N=2 loss diag's dip measures (1 - N=2 busbw / median N>=3 busbw at equal D) beside the
    same ratio of the model's predictions."""
    import numpy as np

    from diag.model.fitting import SAME_VOLUME
    from diag.records import series_label
    from diag.report.diagnose.dip import dip_ratio
    from diag.report.series import by_series

    by_key = {(m.series, m.op): m for m in model.series_models}
    large_bytes = large_bytes / SAME_VOLUME       # D = 1 MiB at N=4 is 1048572 bytes (whole float32 elements)
    rows = []
    for r in records:
        m = by_key.get((series_label(r), r.op))
        if m is None or r.nwrong > 0 or not r.times_s:
            continue
        p = m.predict(r.world_size, r.size_bytes)
        mean = float(np.mean(r.times_s))
        link = float(m.structure.counts(np.array(r.world_size), np.array(r.size_bytes))[2])
        rows.append({"series": m.series, "op": m.op, "world_size": r.world_size, "size_bytes": r.size_bytes,
                     "link_bytes": link, "measured_mean_s": mean, "predicted_s": p.time_s, "error": p.time_s / mean - 1,
                     "low_s": p.low_s, "high_s": p.high_s, "inside": p.low_s <= mean <= p.high_s,
                     "extrapolated": p.extrapolated, "fitted_on": r.world_size in m.world_sizes})
    summary = []
    for series, op in by_key:
        mine = [row for row in rows if row["series"] == series and row["op"] == op]
        if not mine:
            continue
        large = [abs(row["error"]) for row in mine if row["link_bytes"] >= large_bytes]
        unseen = [abs(row["error"]) for row in mine if not row["fitted_on"]]
        summary.append({"series": series, "op": op, "rows": len(mine),
                        "median_error": float(np.median([abs(row["error"]) for row in mine])),
                        "median_error_large": float(np.median(large)) if large else None, "rows_large": len(large),
                        "median_error_unseen_n": float(np.median(unseen)) if unseen else None,
                        "rows_unseen_n": len(unseen),
                        "unseen_n_large": float(np.median([abs(row["error"]) for row in mine if not row["fitted_on"]
                                                           and row["link_bytes"] >= large_bytes]))
                        if any(not row["fitted_on"] and row["link_bytes"] >= large_bytes for row in mine) else None,
                        "inside_interval": sum(row["inside"] for row in mine) / len(mine)})
    penalty = []
    for (label, op), per_n in sorted(by_series(records).items()):
        m = by_key.get((label, op))
        if m is None or not m.n2_penalty or 2 not in per_n:
            continue
        for size2, row2 in sorted(per_n[2].items()):
            volume = row2.volume_bytes
            others = [row for n, rows_n in per_n.items() if n >= 3 for row in rows_n.values()
                      if abs(row.volume_bytes - volume) <= (SAME_VOLUME - 1) * volume and row.times_s]
            if not others or not row2.times_s:
                continue
            measured = dip_ratio(row2, others)
            link2 = float(m.structure.counts(np.array(2), np.array(size2))[2])
            predicted_busbw = [float(m.structure.counts(np.array(o.world_size), np.array(o.size_bytes))[2])
                               / float(m.mean_s(o.world_size, o.size_bytes)) for o in others]
            ratio = (link2 / float(m.mean_s(2, size2))) / float(np.median(predicted_busbw))
            penalty.append({"series": label, "op": op, "volume_bytes": volume,
                            "reference_world_sizes": sorted({o.world_size for o in others}),
                            "measured_loss": 1 - measured.ratio.point,
                            "measured_low": 1 - measured.ratio.high, "measured_high": 1 - measured.ratio.low,
                            "predicted_loss": 1 - ratio, "turn_share": m.terms.n2_turn_share})
    n2_summary = []
    for label in dict.fromkeys(p["series"] for p in penalty):
        large = [p for p in penalty if p["series"] == label and p["volume_bytes"] >= large_bytes]
        if large:
            measured = float(np.median([p["measured_loss"] for p in large]))
            predicted = float(np.median([p["predicted_loss"] for p in large]))
            n2_summary.append({"series": label, "op": large[0]["op"], "volumes": len(large),
                               "measured_loss": measured, "predicted_loss": predicted,
                               "relative_difference": predicted / measured - 1 if measured > 0 else None})
    return {"rows": rows, "summary": summary, "n2_loss": penalty, "n2_loss_summary": n2_summary,
            "large_bytes": round(large_bytes * SAME_VOLUME)}


def _check(args: argparse.Namespace) -> int:
    from diag.model.core import load
    from diag.report.rundir import load_run
    from diag.units import human_bytes, human_time, parse_size

    model = load(args.model)
    data = load_run(args.paths)
    result = check_rows(model, data.model_records, parse_size(args.large))
    if args.json:
        print(json.dumps(result, indent=1, allow_nan=False))
        return 0
    print(f"{'series':<24} {'op':<11} {'N':>2} {'size':>10} {'D/link':>10} {'measured':>9} {'predicted':>9} "
          f"{'error':>7}  {'95% interval':<19}")
    for row in result["rows"]:
        tag = " extrapolated" if row["extrapolated"] else ("" if row["fitted_on"] else " unseen N")
        print(f"{row['series'][:24]:<24} {row['op']:<11} {row['world_size']:>2} {human_bytes(row['size_bytes']):>10} "
              f"{human_bytes(row['link_bytes']):>10} {human_time(row['measured_mean_s']):>9} "
              f"{human_time(row['predicted_s']):>9} {row['error']:>+7.1%}  "
              f"{human_time(row['low_s'])}..{human_time(row['high_s'])}{'' if row['inside'] else ' (outside)'}{tag}")
    large = human_bytes(result["large_bytes"])
    for s in result["summary"]:
        unseen = (f"; at N it was not fitted on: {s['median_error_unseen_n']:.1%} ({s['rows_unseen_n']} rows)"
                  + (f", {s['unseen_n_large']:.1%} at >= {large}" if s["unseen_n_large"] is not None else "")
                  if s["median_error_unseen_n"] is not None else "")
        print(f"{s['series']} {s['op']}: median |error| of the mean {s['median_error']:.1%} over {s['rows']} rows"
              + (f", {s['median_error_large']:.1%} at >= {large} per link ({s['rows_large']} rows)"
                 if s["median_error_large"] is not None else "")
              + f"{unseen}; {s['inside_interval']:.0%} of measured means inside the 95% interval")
    for p in result["n2_loss"]:
        print(f"{p['series']} {p['op']} N=2 loss at D={human_bytes(p['volume_bytes'])} against "
              f"N={','.join(map(str, p['reference_world_sizes']))}: measured {p['measured_loss']:.1%} "
              f"[{p['measured_low']:.1%}, {p['measured_high']:.1%}], model {p['predicted_loss']:.1%} "
              f"(turn-taking share {p['turn_share']:.1%})")
    for s in result["n2_loss_summary"]:
        differs = (f" ({s['relative_difference']:+.0%} of the measured)" if s["relative_difference"] is not None
                   else "")
        print(f"{s['series']} {s['op']} N=2 loss, median over the {s['volumes']} D >= {large}: measured "
              f"{s['measured_loss']:.1%}, model {s['predicted_loss']:.1%}{differs}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from diag.errors import DiagError
    from diag.model.core import load
    from diag.model.export import astra_network, write_vidur
    from diag.units import parse_size

    if args.vidur is None and args.astra_sim is None:
        raise DiagError("nothing to export: give --vidur DIR and/or --astra-sim FILE")
    model = load(args.model)
    if args.vidur is not None:
        files, notes = write_vidur(model, args.vidur, args.series, _world_sizes(args.world_sizes),
                                   parse_size(args.max_size))
        if not files:
            raise DiagError("no all_reduce, send_recv or all_gather model to export for Vidur")
        safefs.make_dirs(args.vidur, flag="--vidur")
        for path, text in files:
            safefs.write_file(path, text)
            print(f"wrote {path} ({text.count(chr(10)) - 1} rows)")
        for note in notes:
            print(note)
    if args.astra_sim is not None:
        text, m = astra_network(model, args.series, args.npus, args.topology)
        safefs.write_file(safefs.make_parent(args.astra_sim), text, flag="--astra-sim")
        print(f"wrote {args.astra_sim} (ASTRA-sim analytical network from {m.series} all_gather)")
    return 0
