"""Per-host faults: the syntax of ``--fault HOST:KEY=VALUE[,KEY=VALUE]`` and of scenario files.

One host of a real cluster is often the odd one out: its NIC negotiated 100 Mbit/s, its switch port has a
shallow buffer, it carries another sysctl profile or MTU, or its CPU is slow or busy. A ``HostFault`` says
what one lab host does differently; ``LabConfig`` (diag/lab/config.py) holds them and owns the rules that
need the lab (which hosts exist, MTU and rate bounds); ``diag/lab/topology.py`` builds them.

Pure code: no root, no subprocesses. Values arrive as text (the command line) or typed (a scenario file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.units import parse_rate_bps, parse_size

# Accepted key spellings (lowercase, "-" read as "_") -> HostFault field. The first spelling of each field
# is the one the docs, errors and `lab status` use.
KEY_ALIASES: dict[str, str] = {
    "rate": "rate",
    "rx_queue": "rx_queue_bytes",
    "tx_queue": "tx_queue_bytes",
    "mtu": "mtu",
    "tcp_rmem": "tcp_rmem",
    "tcp_wmem": "tcp_wmem",
    "cc": "congestion_control",
    "congestion_control": "congestion_control",
    "tcp_congestion_control": "congestion_control",
    "slow_start_after_idle": "slow_start_after_idle",
    "tcp_slow_start_after_idle": "slow_start_after_idle",
    "cpu": "cpu",
}
# Field -> the key as written in docs, errors and status (hyphens where the brief's examples have them).
KEY_NAMES: dict[str, str] = {
    "rate": "rate", "rx_queue_bytes": "rx-queue", "tx_queue_bytes": "tx-queue", "mtu": "mtu",
    "tcp_rmem": "tcp_rmem", "tcp_wmem": "tcp_wmem", "congestion_control": "cc",
    "slow_start_after_idle": "slow_start_after_idle", "cpu": "cpu",
}
# Field -> the per-namespace sysctl it sets (each of these is per network namespace since Linux 4.15).
SYSCTLS: dict[str, str] = {
    "tcp_rmem": "net.ipv4.tcp_rmem",
    "tcp_wmem": "net.ipv4.tcp_wmem",
    "congestion_control": "net.ipv4.tcp_congestion_control",
    "slow_start_after_idle": "net.ipv4.tcp_slow_start_after_idle",
}
# cpu=X is X CPUs' worth of time (0.3: 30% of one core). The CFS quota must be at least 1 ms per period;
# MAX_CPU only catches typos (a host with 1000 CPUs is no fault).
MIN_CPU, MAX_CPU = 0.01, 1024.0
MAX_RATE_PERCENT = 1000.0       # rate=X% of the lab's rate; above 100% is a host faster than the rest
_HOST_RE = re.compile(r"h?(\d{1,3})")
_CC_RE = re.compile(r"[a-z][a-z0-9_]{0,15}")   # TCP_CA_NAME_MAX is 16
_TRUE, _FALSE = {"1", "on", "true", "yes"}, {"0", "off", "false", "no"}
SCENARIO_SUFFIXES = (".json", ".toml")
BUILTIN_SCENARIOS = "scenarios"   # diag/lab/scenarios/NAME.json


@dataclass(frozen=True)
class HostFault:
    """What one lab host does differently from the rest. None: as the lab."""

    host: str                                   # "h2"
    rate: str | float | None = None             # tc rate ("100mbit"), bits/s, or "25%" of the lab's rate
    rx_queue_bytes: int | None = None           # its switch port's queue (what it receives), tail drop
    tx_queue_bytes: int | None = None           # its own NIC's transmit queue
    mtu: int | None = None
    tcp_rmem: tuple[int, int, int] | None = None
    tcp_wmem: tuple[int, int, int] | None = None
    congestion_control: str | None = None
    slow_start_after_idle: bool | None = None
    cpu: float | None = None                    # CPUs of time for everything started on the host

    @property
    def index(self) -> int:
        """The host's number; -1 for the ``all`` fault (it sorts first, and expand_all replaces it)."""
        return -1 if self.host == ALL_HOSTS else int(self.host[1:])

    def asked(self) -> dict[str, Any]:
        """The fields this fault sets (field name -> value), in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "host" and getattr(self, f.name) is not None}

    def sysctls(self) -> dict[str, str]:
        """sysctl name -> the value to write, for the TCP settings this fault changes."""
        values = {}
        for name, sysctl in SYSCTLS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, tuple):
                values[sysctl] = " ".join(str(part) for part in value)
            elif isinstance(value, bool):
                values[sysctl] = str(int(value))
            else:
                values[sysctl] = str(value)
        return values

    def overridden_by(self, other: HostFault) -> HostFault:
        """This fault with every field other sets replaced by other's."""
        return replace(self, **other.asked())

    def shape_key(self) -> tuple[Any, ...]:
        """What the built lab depends on ("100mbit" and 1e8 are the same fault)."""
        rate = self.rate
        if isinstance(rate, str) and not rate.strip().endswith("%"):
            rate = parse_rate_bps(rate)
        return (self.host, *(rate if name == "rate" else getattr(self, name)
                             for name in (f.name for f in fields(self)) if name != "host"))

    def describe(self) -> str:
        """'rate=100mbit,cc=reno': the fault in the --fault syntax (the host before it)."""
        return ",".join(f"{KEY_NAMES[name]}={format_value(name, value)}" for name, value in self.asked().items())

    def to_json(self) -> dict[str, Any]:
        """{"host": "h2", KEY: value, ...} with only the keys this fault sets (tuples as lists)."""
        return {"host": self.host, **{name: list(value) if isinstance(value, tuple) else value
                                      for name, value in self.asked().items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostFault:
        """The inverse of to_json (what a state file or run.json holds); values are checked again."""
        host = parse_host(str(data.get("host", "")), "fault")
        values = {name: value for name, value in data.items() if name != "host"}
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise DiagError(f"fault of {host} has unknown fields {', '.join(unknown)}")
        return cls(host=host, **{name: parse_value(name, value, f"fault {host}") for name, value in values.items()})


@dataclass(frozen=True)
class ScenarioLabel:
    """Which scenario a lab's faults came from, and the real-cluster situation it imitates."""

    name: str
    imitates: str
    source: str                 # the file, or "builtin:NAME"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "imitates": self.imitates, "source": self.source}


@dataclass(frozen=True)
class Scenario:
    """A named fault set: `{"name": ..., "imitates": ..., "faults": {"h1": {"rate": "100mbit"}}}`, and, where
    the file says so, what diag should call it: ``expect`` maps a host to the diagnose rules whose findings
    must name it (`"expect": {"h1": ["slow_host_link"]}`; what the fault bench and the live fault tests hold
    a run against)."""

    label: ScenarioLabel
    faults: tuple[HostFault, ...]
    expect: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def expected_rules(self) -> dict[str, set[str]]:
        """rule -> the hosts its findings must name."""
        out: dict[str, set[str]] = {}
        for host, rules in self.expect:
            for rule in rules:
                out.setdefault(rule, set()).add(host)
        return out


def format_value(name: str, value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(part) for part in value)
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def canonical_key(key: str, where: str) -> str:
    """The HostFault field a user's key names; DiagError listing the keys otherwise."""
    field_name = KEY_ALIASES.get(key.strip().lower().replace("-", "_"))
    if field_name is None:
        known = ", ".join(dict.fromkeys(KEY_NAMES.values()))
        raise DiagError(f"{where}: unknown key {key.strip()!r}; use one of {known}")
    return field_name


ALL_HOSTS = "all"   # a fault for every host of the lab (a lab-wide setting, e.g. all:cc=reno)


def parse_host(text: str, where: str) -> str:
    """'h2' or '2' -> 'h2'; 'all' stays 'all' (every host: see expand_all)."""
    if text.strip().lower() == ALL_HOSTS:
        return ALL_HOSTS
    match = _HOST_RE.fullmatch(text.strip())
    if not match:
        raise DiagError(f"{where}: bad host {text.strip()!r}: name it h0, h1, ... (or 0, 1, ..., or all)")
    return f"h{int(match.group(1))}"


def expand_all(faults: Sequence[HostFault], hosts: int) -> tuple[HostFault, ...]:
    """The ``all`` fault given to each of ``hosts`` hosts, under each host's own (which wins key by key)."""
    common = next((fault for fault in faults if fault.host == ALL_HOSTS), None)
    if common is None:
        return tuple(faults)
    own = {fault.host: fault for fault in faults if fault.host != ALL_HOSTS}
    merged = [replace(common, host=f"h{i}").overridden_by(own[f"h{i}"]) if f"h{i}" in own
              else replace(common, host=f"h{i}") for i in range(hosts)]
    return tuple(merged) + tuple(fault for host, fault in own.items() if int(host[1:]) >= hosts)


def parse_value(name: str, value: Any, where: str) -> Any:
    """One key's value, from text or from a scenario file's typed value, in its field's type."""
    key = KEY_NAMES[name]
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise DiagError(f"{where}: {key} has no value")
    try:
        return _PARSERS[name](value)
    except DiagError as exc:
        raise DiagError(f"{where}: {key}={format_value(name, value)}: {exc}") from None
    except (TypeError, ValueError):
        raise DiagError(f"{where}: {key}={value!r}: {_HINTS[name]}") from None


def _parse_rate(value: Any) -> str | float:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, (int, float)):
        if not value > 0:
            raise DiagError("a rate must be positive")
        return float(value)
    if value.endswith("%"):
        share = float(value[:-1])
        if not 0 < share <= MAX_RATE_PERCENT:
            raise DiagError(f"a share of the lab's rate must lie in (0, {MAX_RATE_PERCENT:g}]%")
        return value
    parse_rate_bps(value)       # checked now, kept as written (status shows "100mbit", not 1e8)
    return value


def _parse_bytes(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    count = value if isinstance(value, int) else parse_size(str(value))
    if count <= 0:
        raise DiagError("must be a positive number of bytes")
    return count


def _parse_mtu(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise TypeError
    return int(value)


def _parse_buffer_triple(value: Any) -> tuple[int, int, int]:
    parts = re.split(r"[\s/]+", value) if isinstance(value, str) else list(value)
    if len(parts) != 3:
        raise DiagError("give three sizes, min default max, separated by spaces or /, e.g. 4096/16384/65536")
    triple = tuple(_parse_bytes(part) for part in parts)
    if not triple[0] <= triple[1] <= triple[2]:
        raise DiagError("the three sizes must be min <= default <= max")
    if triple[2] > (1 << 31) - 1:
        raise DiagError("the kernel takes at most 2147483647 bytes")
    return triple  # type: ignore[return-value]   # three parts, checked above


def _parse_cc(value: Any) -> str:
    if not isinstance(value, str) or not _CC_RE.fullmatch(value):
        raise DiagError("name a congestion control algorithm, e.g. reno, cubic, bbr")
    return value


def _parse_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise DiagError("use 1 or 0 (on/off)")


def _parse_cpu(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError
    cpus = float(value[:-1]) / 100 if isinstance(value, str) and value.endswith("%") else float(value)
    if not MIN_CPU <= cpus <= MAX_CPU:
        raise DiagError(f"CPUs of time must lie in {MIN_CPU:g}..{MAX_CPU:g} (0.3 or 30%: a third of one core)")
    return cpus


_PARSERS: dict[str, Any] = {
    "rate": _parse_rate, "rx_queue_bytes": _parse_bytes, "tx_queue_bytes": _parse_bytes, "mtu": _parse_mtu,
    "tcp_rmem": _parse_buffer_triple, "tcp_wmem": _parse_buffer_triple, "congestion_control": _parse_cc,
    "slow_start_after_idle": _parse_flag, "cpu": _parse_cpu,
}
_HINTS: dict[str, str] = {
    "rate": "use a tc rate (100mbit, 1gbit) or a share of the lab's rate (25%)",
    "rx_queue_bytes": "use bytes or a size, e.g. 16K", "tx_queue_bytes": "use bytes or a size, e.g. 16K",
    "mtu": "use a whole number of bytes, e.g. 9000", "tcp_rmem": "use three sizes, e.g. 4096/16384/65536",
    "tcp_wmem": "use three sizes, e.g. 4096/16384/65536", "congestion_control": "name an algorithm, e.g. reno",
    "slow_start_after_idle": "use 1 or 0", "cpu": "use CPUs of time, e.g. 0.3 or 30%",
}


def parse_fault(text: str, flag: str = "--fault") -> HostFault:
    """'h2:rate=100mbit,cc=reno' -> HostFault; DiagError (one line, naming flag) on anything else."""
    where = f"{flag} {text!r}"
    host_text, colon, rest = str(text).partition(":")
    if not colon or not rest.strip():
        raise DiagError(f"{where}: use HOST:KEY=VALUE[,KEY=VALUE], e.g. {flag} h1:rate=100mbit")
    host = parse_host(host_text, where)
    parts = rest.split(",")
    for previous, part in zip(["", *parts[:-1]], parts, strict=True):
        if "=" not in part:
            hint = (" (separate the three sizes of tcp_rmem/tcp_wmem with spaces or /, not commas)"
                    if re.match(r"\s*tcp[_-][rw]mem\s*=", previous, re.IGNORECASE) else "")
            raise DiagError(f"{where}: {part.strip()!r} is not KEY=VALUE{hint}")
    values: dict[str, Any] = {}
    for part in parts:
        key, _, value = part.partition("=")
        name = canonical_key(key, where)
        if name in values:
            raise DiagError(f"{where}: {KEY_NAMES[name]} is given twice")
        values[name] = parse_value(name, value, where)
    return HostFault(host=host, **values)


def merge_faults(faults: Iterable[HostFault], flag: str = "--fault") -> tuple[HostFault, ...]:
    """One fault per host, in host order; a key given twice for one host is an error."""
    merged: dict[str, HostFault] = {}
    for fault in faults:
        before = merged.get(fault.host)
        if before is not None:
            twice = sorted(set(before.asked()) & set(fault.asked()))
            if twice:
                raise DiagError(f"{flag}: {fault.host}'s {KEY_NAMES[twice[0]]} is given twice")
            fault = before.overridden_by(fault)
        merged[fault.host] = fault
    return tuple(sorted(merged.values(), key=lambda fault: fault.index))


def override_faults(base: Sequence[HostFault], overrides: Sequence[HostFault]) -> tuple[HostFault, ...]:
    """base (a scenario's faults) with every key that overrides (the command line's) sets replaced."""
    merged = {fault.host: fault for fault in base}
    for fault in overrides:
        merged[fault.host] = merged[fault.host].overridden_by(fault) if fault.host in merged else fault
    return tuple(sorted(merged.values(), key=lambda fault: fault.index))


# --- scenario files -----------------------------------------------------------------------------------------

def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped in diag/lab/scenarios/."""
    folder = resources.files("diag.lab").joinpath(BUILTIN_SCENARIOS)
    return sorted(entry.name[:-5] for entry in folder.iterdir() if entry.name.endswith(".json"))


def load_scenario(source: str, flag: str = "--scenario") -> Scenario:
    """A scenario from a .json/.toml file, or a built-in one by name (e.g. slow-nic)."""
    path = Path(source)
    if path.suffix in SCENARIO_SUFFIXES or "/" in source or path.exists():
        return _scenario_from_file(path, flag)
    if source in builtin_scenarios():
        text = resources.files("diag.lab").joinpath(BUILTIN_SCENARIOS, f"{source}.json").read_text("utf-8")
        return scenario_from_mapping(_json_object(text, f"built-in scenario {source}"), f"builtin:{source}", flag)
    raise DiagError(f"{flag} {source!r}: no such file; give a .json or .toml file, or a built-in scenario: "
                    f"{', '.join(builtin_scenarios())}")


def _scenario_from_file(path: Path, flag: str) -> Scenario:
    if path.suffix not in SCENARIO_SUFFIXES:
        raise DiagError(f"{flag} {path}: a scenario file ends in .json or .toml")
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise DiagError(f"{flag} {path}: no such file") from None
    except OSError as exc:
        raise DiagError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise DiagError(f"{flag} {path}: not UTF-8 text") from None
    if path.suffix == ".json":
        return scenario_from_mapping(_json_object(text, f"{flag} {path}"), str(path), flag)
    try:
        import tomllib
    except ModuleNotFoundError:    # Python 3.10
        raise DiagError(f"{flag} {path}: TOML needs Python 3.11+ (tomllib); write the scenario as JSON") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DiagError(f"{flag} {path}: not TOML ({exc})") from None
    return scenario_from_mapping(data, str(path), flag)


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise DiagError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DiagError(f"{where}: a scenario is a JSON object with name, imitates and faults")
    return data


def scenario_from_mapping(data: Mapping[str, Any], source: str, flag: str = "--scenario") -> Scenario:
    """{"name", "imitates", "faults": {HOST: {KEY: VALUE}}} -> Scenario; one-line errors name the file."""
    where = f"{flag} {source}"
    unknown = sorted(set(data) - {"name", "imitates", "faults", "expect"})
    if unknown:
        raise DiagError(f"{where}: unknown key {unknown[0]!r}; a scenario has name, imitates, faults and "
                        "(optionally) expect")
    name, imitates, faults = data.get("name"), data.get("imitates"), data.get("faults")
    if not isinstance(name, str) or not name.strip():
        raise DiagError(f"{where}: give the scenario a name (name = \"slow-nic\")")
    if not isinstance(imitates, str) or not imitates.strip():
        raise DiagError(f"{where}: say what the scenario imitates (imitates = \"a host stuck at 100 Mbit/s\")")
    if not isinstance(faults, Mapping) or not faults:
        raise DiagError(f"{where}: faults must map hosts to their settings, e.g. faults.h1 = {{rate = \"100mbit\"}}")
    parsed = []
    for host_text, settings in faults.items():
        host = parse_host(str(host_text), where)
        if not isinstance(settings, Mapping) or not settings:
            raise DiagError(f"{where}: the faults of {host} must be a table of KEY = VALUE")
        values: dict[str, Any] = {}
        for key, value in settings.items():
            field_name = canonical_key(str(key), f"{where} ({host})")
            if field_name in values:
                raise DiagError(f"{where}: {host}'s {KEY_NAMES[field_name]} is given twice")
            values[field_name] = parse_value(field_name, value, f"{where} ({host})")
        parsed.append(HostFault(host=host, **values))
    return Scenario(label=ScenarioLabel(name=name.strip(), imitates=imitates.strip(), source=source),
                    faults=merge_faults(parsed, where), expect=_expectations(data.get("expect"), where))


def _expectations(expect: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``expect``: {HOST: [RULE, ...]}, the diagnose rules whose findings must name each host."""
    if expect is None:
        return ()
    if not isinstance(expect, Mapping) or not all(
            isinstance(rules, list) and rules and all(isinstance(r, str) and r for r in rules)
            for rules in expect.values()):
        raise DiagError(f"{where}: expect must map hosts to the rules that name them, e.g. "
                        "expect.h1 = [\"slow_host_link\"]")
    return tuple((parse_host(str(host), where), tuple(rules)) for host, rules in expect.items())
