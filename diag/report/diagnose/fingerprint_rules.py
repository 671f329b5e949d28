"""Node fingerprints that differ: a node whose TCP sysctls, MTU, offloads, NIC, congestion control, kernel or
software versions are not the others' is named with the key and both values, as an observation (a host rule says
where a difference costs time). Keys that differ by nature (names, addresses, namespace and boot ids, the job's
own variables) and identifiers the kernel hands out (a qdisc's handle) never count (diag.report.nodes)."""

from __future__ import annotations

from diag.report.diagnose.base import undecided
from diag.report.diagnose.findings import Evidence, Finding
from diag.report.nodes import fingerprint_differences
from diag.report.rundir import RunData

# What a key is about, most telling first: TCP and the NIC set the pace of the wire; a software version may;
# anything else (CPU model, platform string) is worth knowing, no more.
KIND_ORDER = ("network", "software", "other")
SHOWN_IN_STATEMENT = 3


def node_fingerprints(run: RunData) -> list[Finding]:
    name = "node_fingerprints"
    fingerprints = run.fingerprints()
    if len(fingerprints) < 2:
        return undecided(name, f"{len(fingerprints)} node fingerprint(s) (nodes/<node>/fingerprint.json): nothing "
                         "to compare")
    differences = fingerprint_differences(run)
    nodes = ", ".join(fingerprints)
    if not differences:
        return [Finding(name, "clear", f"the fingerprints of {nodes} agree on every key that is not a name, "
                        "an address or an id")]
    evidence = tuple(Evidence(d.text, {"key": d.key, "kind": d.kind, "nodes": list(d.odd),
                                       "values": {n: v for v, ns in d.groups for n in ns}},
                              ", ".join(f"nodes/{n}/fingerprint.json" for n in d.odd)) for d in differences)
    shown = "; ".join(d.text for d in differences[:SHOWN_IN_STATEMENT])
    more = f"; {len(differences) - SHOWN_IN_STATEMENT} more key(s) in the evidence" if len(differences) > SHOWN_IN_STATEMENT else ""
    odd = sorted({n for d in differences for n in d.odd})
    who = f"{odd[0]} differs" if len(odd) == 1 else f"{', '.join(odd)} differ"
    # How the nodes differ is objective information: an observation. Where a difference costs time, the host
    # rules say so (window_at_host ties a limited window to its host's tcp_rmem), with the difference as evidence.
    kinds = sorted({d.kind for d in differences}, key=KIND_ORDER.index)
    return [Finding(name, "observed", f"the nodes are not configured alike ({who}): {shown}{more} ({', '.join(kinds)} "
                    "keys)", evidence=evidence, explains="none: how the nodes differ; a host rule says where a "
                    "difference costs time")]
