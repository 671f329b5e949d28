"""One rule for every paired experiment: the same rows run with one knob at two values, everything else
equal; does the knob change the metric?

An experiment is a row of data (``EXPERIMENTS``): the knob, its reference value ``a`` and its changed value
``b``, the metric compared (median time or busbw, as the ratio b / a), the effect threshold, whether a
change either way counts (two-sided) or only an improvement, which rows take part, and the sentences the
finding uses. A new knob of the raw transport's protocol model becomes one more row here; the mechanism
verdict reads ``reading`` and ``rules_out`` from the row, so it needs no change either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from diag.records import Record
from diag.report.compare import welch_test
from diag.report.diagnose.base import strength_of, undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.rundir import RunData
from diag.report.series import knob, series_label
from diag.report.thresholds import ALPHA, CONN_SPLIT_EFFECT, ORDER_EFFECT, Threshold, used
from diag.units import human_bytes, human_rate, human_time


@dataclass(frozen=True)
class PairedExperiment:
    id: str                          # the rule id of its findings
    knob: str                        # the knob toggled (a record knob, or extra, or a raw default)
    a: str                           # reference value
    b: str                           # changed value; the ratio is b / a
    metric: str                      # "time" (median time) or "busbw"
    effect: Threshold                # |ratio - 1| (two-sided) or ratio - 1 (one-sided) at least this is an effect
    two_sided: bool                  # a change either way counts; else only ratio >= 1 + effect
    ratio_key: str                   # name of the ratio in the evidence values
    compare: str                     # "{b} {b_time} vs {a} {a_time} (... {ratio:.2f}": what one pair shows
    headline: str                    # fired: "<headline>: <pairs with an effect>"
    clear: str                       # clear: "<clear>: <pairs without>"
    maybe: str                       # undecided, large but not significant: "<maybe>, but the samples ..."
    absent: str                      # undecided: no row has the knob at either value
    one_value: str                   # undecided: rows at one of the two values only
    reading: str                     # what a fired finding says about the mechanism behind an N=2 dip
    rules_out: bool = True           # a clear finding rules the suspected mechanism out
    backend: str | None = None       # only rows of this backend take part ("raw"); None: any
    hold: tuple[str, ...] = ()       # further knobs that may differ within a pair (left out of its label)

    # A rule's id is its __name__, for functions and experiments alike.
    @property
    def __name__(self) -> str:
        return self.id

    def value_of(self, record: Record) -> str | None:
        if self.backend is not None and record.backend != self.backend:
            return None
        value = knob(record, self.knob)
        return str(value) if value in (self.a, self.b) else None

    def ratio(self, a: Record, b: Record) -> float:
        if self.metric == "time":
            return b.time_s / a.time_s if a.time_s > 0 else math.inf
        return b.busbw_Bps / a.busbw_Bps if a.busbw_Bps > 0 else math.inf

    def is_large(self, ratio: float) -> bool:
        return abs(ratio - 1) >= self.effect.value if self.two_sided else ratio >= 1 + self.effect.value

    def __call__(self, run: RunData) -> list[Finding]:
        thresholds = used(self.effect, ALPHA)
        pairs: dict[tuple[str, str, int, int], dict[str, Record]] = defaultdict(dict)
        for r in run.records:
            value = self.value_of(r)
            if value is not None:
                label = series_label(r, without=(self.knob, *self.hold))
                pairs[(label, r.op, r.world_size, r.size_bytes)][value] = r
        both = {k: v for k, v in pairs.items() if len(v) == 2}
        if not both:
            return undecided(self.id, self.one_value if pairs else self.absent, self.effect, ALPHA)
        largest: dict[tuple[str, str, int], int] = {}
        for (label, op, n, size) in both:
            largest[(label, op, n)] = max(size, largest.get((label, op, n), 0))
        effects: list[Evidence] = []
        flat: list[str] = []
        unsure: list[str] = []
        for (label, op, n), size in sorted(largest.items()):
            a, b = both[(label, op, n, size)][self.a], both[(label, op, n, size)][self.b]
            ratio = self.ratio(a, b)
            test = welch_test(a.times_s, b.times_s)
            shown = self.compare.format(a=self.a, b=self.b, a_time=human_time(a.time_s), b_time=human_time(b.time_s),
                                        a_busbw=human_rate(a.busbw_Bps), b_busbw=human_rate(b.busbw_Bps), ratio=ratio)
            text = (f"{label} {op} N={n} {human_bytes(size)}: {shown}"
                    + (f", p={test.p_value:.2g})" if test.p_value is not None else f", {test.reason})"))
            if not self.is_large(ratio):
                flat.append(text)
            elif test.p_value is not None and test.p_value < ALPHA.value:
                effects.append(Evidence(text, {"world_size": n, "size_bytes": size, self.ratio_key: ratio,
                                               "p_value": test.p_value}, run.source_of(b), "busbw_vs_size.png"))
            else:
                unsure.append(text)  # a large difference the samples cannot confirm is not "no effect"
        if not effects and unsure:
            return undecided(self.id, f"{self.maybe}, but the samples cannot confirm it (more --iters would): "
                             + "; ".join(unsure), self.effect, ALPHA)
        if not effects:
            return [Finding(self.id, "clear", f"{self.clear}: " + "; ".join(flat), thresholds=thresholds)]
        largest_effect = max(math.exp(abs(math.log(e.values[self.ratio_key]))) for e in effects)
        statement = f"{self.headline}: " + "; ".join(e.text for e in effects)
        if flat:
            statement += "; no effect where: " + "; ".join(flat)
        return [Finding(self.id, "fired", statement,
                        strength_of(largest_effect - 1 - self.effect.value, 0.3, 0.1), tuple(effects), thresholds)]


EXCHANGE_ORDER = PairedExperiment(
    id="exchange_order", knob="order", a="recv-first", b="send-first", metric="time", effect=ORDER_EFFECT,
    two_sided=True, ratio_key="time_ratio_send_over_recv",
    compare="{b} {b_time} vs {a} {a_time} (send/recv time ratio {ratio:.2f}",
    headline="the order of send and receive changes throughput",
    clear="the exchange order does not change throughput",
    maybe="the order may change throughput",
    absent="no rows record an order (exchange --order): cannot tell whether the order matters",
    one_value="rows ran in one order only: run exchange with --order recv-first and send-first: cannot tell "
              "whether the order matters",
    reading="the order of send and receive on a pair changes throughput")

SHARED_CONNECTION = PairedExperiment(
    id="shared_connection", knob="conn", a="shared", b="split", metric="busbw", effect=CONN_SPLIT_EFFECT,
    two_sided=False, ratio_key="split_over_shared", backend="raw", hold=("emulate",),
    compare="{b} {b_busbw} vs {a} {a_busbw} busbw ({ratio:.2f}x",
    headline="both directions on one TCP connection are slower than one connection per direction",
    clear="sharing one connection for both directions costs nothing measurable",
    maybe="a shared connection may cost throughput",
    absent="no raw rows with both --conn shared and --conn split: cannot tell what sharing one connection for "
           "both directions costs",
    one_value="no raw rows with both --conn shared and --conn split: cannot tell what sharing one connection "
              "for both directions costs",
    reading="raw TCP reproduces the loss when both directions share one connection")

# Mechanism M1 of issue 10: gloo's ready-to-receive notice travels in-band on the pair's one byte stream, so a
# rank that is already writing data queues its notice behind that data and the peer's send waits. The raw
# transport's protocol model toggles exactly this piece (--notice in-band | own-conn, with --handshake notify
# or --emulate gloo): faster with the notice on its own connection is M1 shown; no change rules it out.
NOTICE_CHANNEL = PairedExperiment(
    id="notice_behind_data", knob="notice", a="in-band", b="own-conn", metric="busbw", effect=CONN_SPLIT_EFFECT,
    two_sided=False, ratio_key="own_conn_over_in_band", backend="raw",
    compare="notice {b} {b_busbw} vs {a} {a_busbw} busbw ({ratio:.2f}x",
    headline="M1 shown: the ready-to-receive notice queued behind the rank's own data on the shared pair costs "
             "throughput; on its own connection the same protocol runs faster",
    clear="M1 ruled out by experiment: moving the ready notice to its own connection does not change throughput",
    maybe="moving the ready notice to its own connection may change throughput",
    absent="M1 (ready notice queued behind own data on the shared pair) not isolated: no raw rows toggle --notice "
           "in-band / own-conn (e.g. --emulate gloo beside --emulate gloo --notice own-conn)",
    one_value="M1 (ready notice queued behind own data on the shared pair) not isolated: the raw rows ran with one "
              "--notice value only (add --emulate gloo --notice own-conn beside --emulate gloo)",
    reading="M1: the ready notice waits behind the rank's own data on the shared pair (the raw protocol model "
            "with the notice on its own connection is faster)")

# The paired experiments diagnose runs, in report order.
EXPERIMENTS: tuple[PairedExperiment, ...] = (SHARED_CONNECTION, EXCHANGE_ORDER, NOTICE_CHANNEL)
