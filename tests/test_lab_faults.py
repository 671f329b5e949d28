"""Per-host faults without root: the --fault syntax, scenario files, the rules that need the lab, the
per-host link numbers, the JSON round trip and the command line a faulty host's commands start with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.errors import DiagError
from diag.lab import HostFault, LabConfig, builtin_scenarios, load_scenario, parse_fault
from diag.lab.cgroups import (
    JOIN_SCRIPT,
    CpuController,
    join_prefix,
    parse_mountinfo,
    quota_files,
    quota_for,
    read_cpus,
    view_prefix,
)
from diag.lab.config import QUEUE_MIN_BYTES
from diag.lab.faults import merge_faults
from diag.lab.shaping import parse_qdiscs
from diag.lab.topology import Lab, plan_lab
from diag.launch import HostLaunch
from tests.common import run_diag

REPO = Path(__file__).resolve().parents[1]


def test_the_examples_of_the_syntax_parse() -> None:
    assert parse_fault("h2:rate=100mbit") == HostFault("h2", rate="100mbit")
    assert parse_fault("h1:rx-queue=16K,tx-queue=16K") == HostFault("h1", rx_queue_bytes=16384, tx_queue_bytes=16384)
    assert parse_fault("h3:mtu=9000") == HostFault("h3", mtu=9000)
    assert parse_fault("h2:tcp_rmem=4096 16384 65536").tcp_rmem == (4096, 16384, 65536)
    assert parse_fault("h2:tcp_wmem=4K/16K/64K").tcp_wmem == (4096, 16384, 65536)
    assert parse_fault("h1:cc=reno").congestion_control == "reno"
    assert parse_fault("h1:cpu=0.3").cpu == pytest.approx(0.3)
    assert parse_fault("1:cpu=30%") == HostFault("h1", cpu=0.3)
    # spellings: hyphen or underscore, the sysctl's own name, upper case keys
    assert parse_fault("h0:RX_QUEUE=2K,tcp_congestion_control=bbr,tcp-slow-start-after-idle=off") == HostFault(
        "h0", rx_queue_bytes=2048, congestion_control="bbr", slow_start_after_idle=False)
    assert parse_fault("h4:rate=25%").rate == "25%"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("h1", "use HOST:KEY=VALUE"),
        ("h1:", "use HOST:KEY=VALUE"),
        ("x1:rate=1gbit", "bad host 'x1'"),
        ("h1:colour=red", "unknown key 'colour'; use one of rate, rx-queue"),
        ("h1:rate=fast", "bad rate 'fast'"),
        ("h1:rate=0%", "share of the lab's rate"),
        ("h1:rx-queue=-5", "bad size"),
        ("h1:mtu=9k", "whole number"),
        ("h1:tcp_rmem=4096 16384", "give three sizes"),
        ("h1:tcp_rmem=65536 16384 4096", "min <= default <= max"),
        ("h1:tcp_rmem=4096,16384,65536", "not commas"),
        ("h1:cc=Reno!", "name a congestion control"),
        ("h1:slow_start_after_idle=maybe", "use 1 or 0"),
        ("h1:cpu=0", "CPUs of time must lie in"),
        ("h1:cpu=lots", "CPUs of time"),
        ("h1:rate=1gbit,rate=2gbit", "rate is given twice"),
        ("h1:rate", "is not KEY=VALUE"),
        ("h1:mtu=", "mtu has no value"),
    ],
)
def test_bad_fault_is_one_line_naming_the_flag(text: str, needle: str) -> None:
    with pytest.raises(DiagError) as caught:
        parse_fault(text, flag="--lab-fault")
    message = str(caught.value)
    assert needle in message and "\n" not in message
    assert message.startswith(f"--lab-fault {text!r}")


def test_repeated_flags_merge_per_host_and_refuse_a_key_twice() -> None:
    merged = merge_faults([parse_fault("h2:rate=100mbit"), parse_fault("h0:mtu=9000"), parse_fault("h2:cc=reno")])
    assert merged == (HostFault("h0", mtu=9000), HostFault("h2", rate="100mbit", congestion_control="reno"))
    with pytest.raises(DiagError, match="h2's rate is given twice"):
        merge_faults([parse_fault("h2:rate=100mbit"), parse_fault("h2:rate=50mbit")])


@pytest.mark.parametrize(
    ("faults", "needle"),
    [
        (["h3:mtu=9000"], "the lab has hosts h0..h2 (--hosts 3)"),
        (["h1:mtu=100"], "mtu must be between 576 and 9000"),
        (["h1:rate=10kbit"], "outside 100kbit..100gbit"),
        (["h1:rate=0.001%"], "outside 100kbit..100gbit"),
        (["h1:rx-queue=1000"], "rx-queue 1000 is below two of its frames"),
        (["h1:mtu=9000,tx-queue=10K"], "tx-queue 10240 is below two of its frames (18076 bytes)"),
    ],
)
def test_fault_rules_that_need_the_lab(faults: list[str], needle: str) -> None:
    with pytest.raises(DiagError) as caught:
        LabConfig(hosts=3, rate="200mbit").with_faults(faults)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_an_explicit_burst_must_hold_a_jumbo_frame() -> None:
    with pytest.raises(DiagError, match="below one of its frames"):
        LabConfig(burst_bytes=4000).with_faults(["h1:mtu=9000"])


def test_host_shape_is_the_labs_unless_the_fault_says_otherwise() -> None:
    config = LabConfig(hosts=3, rate="200mbit").with_faults(["h1:rate=50mbit,rx-queue=16K", "h2:mtu=9000,rate=25%"])
    plain, slow, jumbo = (config.host_shape(i) for i in range(3))
    assert plain.rate_bps == 200e6 and plain.mtu == 1500 and plain.rx_queue_bytes == 125_000
    assert plain.expected_goodput_Bps == pytest.approx(config.expected_goodput_Bps)
    assert slow.rate_bps == 50e6 and slow.rx_queue_bytes == 16384
    assert slow.tx_queue_bytes == 1000 * 1538     # a shallow switch port leaves the NIC's own queue alone
    assert slow.expected_goodput_Bps == pytest.approx(50e6 / 8 * 1448 / 1538)
    assert jumbo.rate_bps == 50e6 and jumbo.mtu == 9000 and jumbo.frame_bytes == 9038
    assert jumbo.burst_bytes == 8 * 9038          # eight of its own frames
    assert jumbo.rx_queue_bytes == QUEUE_MIN_BYTES


def test_scenario_and_flags_combine_flags_win() -> None:
    config = LabConfig(hosts=3).with_faults(["h1:rate=50mbit", "h2:cc=reno"], scenario="slow-nic")
    assert config.scenario is not None and config.scenario.name == "slow-nic"
    assert config.scenario.source == "builtin:slow-nic" and "autonegotiation" in config.scenario.imitates
    assert config.faults == (HostFault("h1", rate="50mbit"), HostFault("h2", congestion_control="reno"))


def test_every_builtin_scenario_loads_and_the_help_names_them_all() -> None:
    names = builtin_scenarios()
    assert names == sorted(["jumbo-host", "shallow-buffer", "slow-cpu", "slow-nic", "small-windows"])
    for name in names:
        scenario = load_scenario(name)
        assert scenario.label.name == name and scenario.faults
        LabConfig(hosts=2).with_faults(scenario=name)      # every one fits the smallest lab
        # what diag should call it lives with it: rules that must name each faulty host, all on a host it faults
        assert scenario.expected_rules() and set().union(*scenario.expected_rules().values()) <= {
            fault.host for fault in scenario.faults}
    help_text = "".join(run_diag("lab", "up", "--help").stdout.split())   # argparse wraps at hyphens
    assert all(name in help_text for name in names)


TOML = """
name = "two-odd-hosts"
imitates = "a node with another sysctl profile beside a jumbo-frame node"

[faults.h1]
tcp_rmem = [4096, 16384, 65536]
cc = "reno"
slow_start_after_idle = false

[faults.h2]
mtu = 9000
cpu = "50%"
"""


def test_scenario_files_in_toml_and_json(tmp_path: Path) -> None:
    toml_file = tmp_path / "odd.toml"
    toml_file.write_text(TOML)
    scenario = load_scenario(str(toml_file))
    assert scenario.label.name == "two-odd-hosts" and scenario.label.source == str(toml_file)
    assert scenario.faults == (HostFault("h1", tcp_rmem=(4096, 16384, 65536), congestion_control="reno",
                                         slow_start_after_idle=False), HostFault("h2", mtu=9000, cpu=0.5))
    assert scenario.expect == ()
    json_file = tmp_path / "odd.json"
    json_file.write_text(json.dumps({"name": "n", "imitates": "i", "faults": {"3": {"rate": 1e8}},
                                     "expect": {"3": ["slow_host_link", "node_fingerprints"]}}))
    loaded = load_scenario(str(json_file))
    assert loaded.faults == (HostFault("h3", rate=1e8),)
    assert loaded.expected_rules() == {"slow_host_link": {"h3"}, "node_fingerprints": {"h3"}}


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"name": "n", "imitates": "i"}', "faults must map hosts"),
        ('{"imitates": "i", "faults": {"h1": {"mtu": 9000}}}', "give the scenario a name"),
        ('{"name": "n", "faults": {"h1": {"mtu": 9000}}}', "say what the scenario imitates"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": {"mtu": 9000}}, "hosts": 3}', "unknown key 'hosts'"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": {"colour": 1}}}', "unknown key 'colour'"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": {"mtu": true}}}', "mtu=True: use a whole number"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": {"cc": "reno", "congestion_control": "bbr"}}}',
         "cc is given twice"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": 5}}', "must be a table of KEY = VALUE"),
        ('{"name": "n", "imitates": "i", "faults": {"h1": {"mtu": 9000}}, "expect": {"h1": "x"}}',
         "expect must map hosts to the rules"),
        ("[1, 2]", "a scenario is a JSON object"),
        ("{not json", "not JSON"),
    ],
)
def test_bad_scenario_file_is_one_line_naming_it(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DiagError) as caught:
        load_scenario(str(path))
    assert needle in str(caught.value) and str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_missing_scenario_lists_the_builtin_ones(tmp_path: Path) -> None:
    with pytest.raises(DiagError, match="built-in scenario: jumbo-host, shallow-buffer"):
        load_scenario("no-such-scenario", "--lab-scenario")
    with pytest.raises(DiagError, match="no such file"):
        load_scenario(str(tmp_path / "absent.toml"))
    with pytest.raises(DiagError, match=r"ends in \.json or \.toml"):
        load_scenario(str(tmp_path))


def test_faults_round_trip_through_the_labs_json() -> None:
    config = LabConfig(name="x", hosts=3, rate="200mbit").with_faults(
        ["h1:rate=25%,rx-queue=16K,tcp_rmem=4K/16K/64K,cc=reno,slow_start_after_idle=0,cpu=0.3",
         "h2:mtu=9000,tcp_wmem=4096 8192 16384"], scenario="shallow-buffer")
    lab = plan_lab(config, CpuController(version=1, root="/sys/fs/cgroup/cpu"))
    document = json.loads(json.dumps(lab.to_json()))
    again = Lab.from_json(document)
    assert again == lab and again.config.shape_key() == config.shape_key()
    h0, h1, h2 = document["hosts"]
    # the scenario's all:cc=reno reaches every host; each host's own keys win over it
    assert h0["fault"] == {"cc": "reno"} and h0["cpu_cgroup"] is None
    assert h1["fault"] == {"rate": "25%", "rx-queue": 16384, "tcp_rmem": [4096, 16384, 65536], "cc": "reno",
                           "slow_start_after_idle": False, "cpu": 0.3}
    assert h1["link"]["rate_bps"] == 50e6 and h1["link"]["rx_queue_bytes"] == 16384
    assert h1["cpu_cgroup"] == "/sys/fs/cgroup/cpu/diag-x-h1"
    assert h2["fault"] == {"mtu": 9000, "tcp_wmem": [4096, 8192, 16384], "cc": "reno"} and h2["link"]["mtu"] == 9000
    assert document["faulty_hosts"] == ["h0", "h1", "h2"]
    assert document["scenario"]["name"] == "shallow-buffer"
    # the command line flag's spelling and the file's agree: the same fault from either
    assert config.fault_for(1).sysctls() == {"net.ipv4.tcp_rmem": "4096 16384 65536",
                                          "net.ipv4.tcp_congestion_control": "reno",
                                          "net.ipv4.tcp_slow_start_after_idle": "0"}


def test_a_lab_state_without_faults_still_loads() -> None:
    lab = plan_lab(LabConfig(name="old", hosts=2))
    document = lab.to_json()
    for host in document["hosts"]:
        del host["cpu_cgroup"], host["fault"], host["link"]
    del document["config"]["faults"], document["config"]["scenario"]
    assert Lab.from_json(document) == lab


def test_faults_change_the_labs_identity() -> None:
    base = LabConfig(hosts=3)
    assert base.with_faults(["h1:rate=100mbit"]).shape_key() == base.with_faults(["h1:rate=0.1gbit"]).shape_key()
    assert base.with_faults(["h1:rate=100mbit"]).shape_key() != base.shape_key()
    assert base.with_faults(["h1:cc=reno"]).shape_key() != base.with_faults(["h2:cc=reno"]).shape_key()


def test_only_a_cpu_starved_host_joins_a_cgroup_before_its_namespace() -> None:
    config = LabConfig(name="x", hosts=3).with_faults(["h1:cpu=0.3", "h2:mtu=9000"])
    lab = plan_lab(config, CpuController(version=2, root="/sys/fs/cgroup"))
    assert lab.exec_prefix("h0") == ["ip", "netns", "exec", "diag-x-h0"]
    assert lab.exec_prefix("h2") == ["ip", "netns", "exec", "diag-x-h2"]
    starved = lab.exec_prefix("h1")
    # join the cgroup, enter the namespace, then show the cgroup hierarchy inside it (the quota observer reads it)
    assert starved == [*join_prefix("/sys/fs/cgroup/diag-x-h1"), "ip", "netns", "exec", "diag-x-h1",
                       *view_prefix("/sys/fs/cgroup/diag-x-h1")]
    assert starved[:3] == ["/bin/sh", "-c", JOIN_SCRIPT] and starved[4] == "/sys/fs/cgroup/diag-x-h1/cgroup.procs"
    assert starved[9:11] == ["/bin/sh", "-c"] and "mount -t cgroup" in starved[11]
    # the launchers of diag sweep --lab start with the lab's prefix
    launch = HostLaunch("h1", 1, netns="diag-x-h1", exec_prefix=tuple(starved))
    assert launch.prefix == tuple(starved)
    assert HostLaunch("h0", 1, netns="diag-x-h0").prefix == ("ip", "netns", "exec", "diag-x-h0")
    with pytest.raises(DiagError, match="cpu= needs a cgroup cpu controller"):
        plan_lab(config, None)


def test_cfs_quota_per_share() -> None:
    assert quota_for(0.3) == (3000, 10_000)
    assert quota_for(1.5) == (15_000, 10_000)
    assert quota_for(0.05) == (1000, 20_000)          # the kernel's 1 ms minimum quota: a longer period
    assert quota_for(0.01) == (1000, 100_000)
    assert quota_files(0.3, 1) == {"cpu.cfs_period_us": "10000", "cpu.cfs_quota_us": "3000"}
    assert quota_files(0.3, 2) == {"cpu.max": "3000 10000"}


def test_read_cpus_of_both_cgroup_versions(tmp_path: Path) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    for name, value in quota_files(0.3, 1).items():
        (v1 / name).write_text(value + "\n")
    (v2 / "cpu.max").write_text(quota_files(0.25, 2)["cpu.max"] + "\n")
    assert read_cpus(str(v1)) == pytest.approx(0.3) and read_cpus(str(v2)) == pytest.approx(0.25)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert read_cpus(str(v2)) is None


MOUNTINFO_V1 = """\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
38 33 0:33 / /sys/fs/cgroup/cpuset rw,nosuid shared:15 - cgroup cgroup rw,cpuset
39 33 0:34 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:16 - cgroup cgroup rw,cpu,cpuacct
40 33 0:35 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
"""
MOUNTINFO_V2 = """\
25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
34 25 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
"""


def test_the_cpu_controller_is_found_in_mountinfo() -> None:
    # cpuset and cpuacct are not cpu; a combined cpu,cpuacct hierarchy is
    assert parse_mountinfo(MOUNTINFO_V1, {}) == CpuController(1, "/sys/fs/cgroup/cpu,cpuacct")
    assert parse_mountinfo(MOUNTINFO_V2, {"/sys/fs/cgroup": "cpuset cpu io memory pids"}) == CpuController(
        2, "/sys/fs/cgroup")
    assert parse_mountinfo(MOUNTINFO_V2, {"/sys/fs/cgroup": "memory pids"}) is None
    spaced = MOUNTINFO_V1.replace("/sys/fs/cgroup/cpu,cpuacct", "/mnt/my\\040cgroups")
    assert parse_mountinfo(spaced, {}) == CpuController(1, "/mnt/my cgroups")


def test_tbf_limit_read_back_from_tc_json() -> None:
    # tc prints a tbf's limit as the latency of a full queue ("lat", us), or as "limit" when that is negative
    sample = json.dumps([
        {"kind": "tbf", "handle": "1:", "root": True, "options": {"rate": 12500000, "burst": 12325, "lat": 4256,
                                                                  "overhead": 24}},
        {"kind": "tbf", "handle": "1:", "root": True, "options": {"rate": 12500000, "burst": 12325, "limit": 4096}},
    ])
    by_latency, by_limit = parse_qdiscs("ns", "eth0", sample)
    assert by_latency.limit_bytes == pytest.approx(65536, abs=20)    # the 64 KiB default queue at 100mbit
    assert by_limit.limit_bytes == 4096
    assert by_latency.to_json()["limit_bytes"] == by_latency.limit_bytes


def test_a_pairs_goodput_bound_is_its_slower_link_at_the_smaller_mtu() -> None:
    lab = plan_lab(LabConfig(hosts=3, rate="100mbit").with_faults(["h2:rate=40mbit,mtu=9000", "h1:mtu=9000"]))
    assert lab.expected_goodput_between("h0", "h1") == pytest.approx(lab.expected_goodput_Bps)   # MSS of 1500
    assert lab.expected_goodput_between("h0", "h2") == pytest.approx(40e6 / 8 * 1448 / 1538)
    assert lab.expected_goodput_between("h2", "h1") == pytest.approx(40e6 / 8 * 8948 / 9038)    # both jumbo


def test_a_fault_for_all_hosts_reaches_each_under_its_own() -> None:
    config = LabConfig(name="x", hosts=3, rate="200mbit").with_faults(["all:cc=reno,mtu=9000", "h2:cc=bbr"])
    assert [(f.host, f.congestion_control, f.mtu) for f in config.faults] == [
        ("h0", "reno", 9000), ("h1", "reno", 9000), ("h2", "bbr", 9000)]
    with pytest.raises(DiagError, match="bad host 'every'"):
        LabConfig(name="x", hosts=3).with_faults(["every:cc=reno"])
