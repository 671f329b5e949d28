"""What other ranks send the in-place job is data (docs/inplace.md, "Trust model"): never unpickled, named by
the rank that sent it, checked by shape and size, moved in bounded chunks. Real gloo groups on loopback; the
hostile rank speaks the wire itself (tests/control_plane_ranks.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from diag.lifeline import CHILD_CWD, child_env, python_command
from tests.common import free_port, need_root

RANKS = Path(__file__).resolve().parent / "control_plane_ranks.py"


def run_ranks(scenarios: str, base: Path, world_size: int, timeout_s: float = 300,
              wrap: dict[int, list[str]] | None = None) -> list[dict[str, Any]]:
    """Every rank's report; ``wrap``: a command that starts the rank of that index (a private mount)."""
    port = str(free_port())
    procs = [subprocess.Popen([*(wrap or {}).get(rank, []), *python_command(str(RANKS), scenarios, str(base))],
                              cwd=CHILD_CWD, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=child_env({**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size),
                                             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}))
             for rank in range(world_size)]
    deadline = time.monotonic() + timeout_s
    outputs = []
    try:
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs.append(proc.communicate())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    reports = []
    for rank, (out, err) in enumerate(outputs):
        report: dict[str, Any] = {}
        for line in out.splitlines():
            if line.startswith("{"):
                report.update(json.loads(line))
        assert report, f"rank {rank} printed no report: {err[-2000:]}"
        reports.append(report)
    return reports


def one_line(text: str | None) -> str:
    assert text is not None and "\n" not in text and "Traceback" not in text, text
    return text


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One pair of ranks plays every two-rank scenario in turn (a rank's start is mostly importing torch)."""
    base = tmp_path_factory.mktemp("two-ranks")
    os.chmod(base, 0o700)
    return base, run_ranks("pickles,big,records", base, 2)


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    base = tmp_path_factory.mktemp("three-ranks")
    os.chmod(base, 0o700)
    (base / "secret").write_text("root's secret\n")
    return base, run_ranks("ship", base, 3)


def test_a_pickle_from_another_rank_is_refused_unread(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    """Rank 1 sends a pickle that would create a file when unpickled, through torch's all_gather_object and
    broadcast_object_list (the same collectives, the same sizes on the wire); rank 0's World refuses both in
    one line naming rank 1 and never unpickles them."""
    tmp_path, reports = two_ranks
    for what in ("all_gather", "broadcast"):
        error = one_line(reports[0]["pickles"].get(f"{what}_error"))
        assert "rank 1 sent a control message that is not diag's JSON" in error, error
    assert not list(tmp_path.glob("unpickled-*")), "a pickle from rank 1 ran on rank 0"


def test_a_node_ships_only_its_own_results_below_its_own_folder(
        three_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    """h1 offers a path with '..', an absolute path, a path into h2's folder, a records file, a name twice and
    a file over what a node may send (1 MiB here); h2 is honest, but its folder holds a planted symlink to a
    secret, a FIFO and a capture (kept on its node without --keep-pcaps). Rank 0 takes h1's one good result
    and h2's real files (one of five 64 kB chunks), nothing lands outside nodes/<node>/, and run.json's
    left_on_nodes says what stayed where and why."""
    tmp_path, reports = three_ranks
    assert all("error" not in r["ship"] for r in reports), reports
    run = tmp_path / "run-0"
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
    assert not (tmp_path / "absolute-escape").exists()
    shipped = {str(p.relative_to(run / "nodes")) for p in (run / "nodes").rglob("*") if p.is_file()}
    assert shipped == {"h1/analysis/ok.json", "h2/fingerprint.json", "h2/analysis/steps.json"}, shipped
    assert (run / "nodes" / "h2" / "fingerprint.json").read_text() == '{"node": "h2"}'
    assert (run / "nodes" / "h2" / "analysis" / "steps.json").read_bytes() == bytes(range(256)) * 1200
    assert not any(p.is_symlink() for p in (run / "nodes").rglob("*"))
    left = reports[0]["ship"]["left_on_nodes"]
    h1 = {Path(f["path"]).name if "escape" in f["path"] else f["path"].split("/nodes/h1/")[-1]: f["why"]
          for f in left["h1"]["files"]}
    assert left["h1"]["directory"].endswith("/nodes/h1")
    for refused in ("authorized_keys", "absolute-escape", "../h2/fingerprint.json", "records/run.jsonl",
                    "analysis/.."):
        assert "not a path of a node's results" in h1[refused], (refused, h1)
    assert h1["analysis/ok.json"] == "offered twice"
    assert "does not fit" in h1["analysis/big.json"]
    h2 = {f["path"].split("/nodes/h2/")[-1]: f["why"] for f in left["h2"]["files"]}
    assert "symlink is never followed" in h2["analysis/leak.json"]
    assert "symlink is never followed" in h2["observe/planted.jsonl"]
    assert "--keep-pcaps" in h2["captures/steps.pcap"]


def test_rank_0_holds_one_chunk_of_a_node_file_at_a_time(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    """A node's 96 MiB result reaches rank 0 whole, and rank 0's peak memory grows by far less than the file
    (a gather of the whole file would hold it at least twice)."""
    tmp_path, reports = two_ranks
    assert all("error" not in r["big"] for r in reports), reports
    received = tmp_path / "run-0" / "nodes" / "h1" / "analysis" / "big.json"
    sent = tmp_path / "run-1" / "nodes" / "h1" / "analysis" / "big.json"
    assert received.stat().st_size == sent.stat().st_size == 96 << 20
    assert received.read_bytes() == sent.read_bytes()
    assert reports[0]["big"]["grown_kib"] < 32 << 10, reports[0]


def test_record_names_from_rank_0_are_checked_on_every_node(two_ranks: tuple[Path, list[dict[str, Any]]]) -> None:
    """Rank 0 names a records file '../../escape/evil.jsonl', in a shared run directory and in a copy for the
    nodes: the node's leader refuses both in one line, and writes nothing."""
    tmp_path, reports = two_ranks
    for shared in (True, False):
        error = one_line(reports[1]["records"].get(f"shared={shared}_error"))
        assert "records" in error and "refuses" in error, error
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
    assert not list((tmp_path / "run-1").rglob("*.jsonl"))


@pytest.mark.parametrize("path", ["../x.json", "/etc/passwd", "analysis/../../x.json", "analysis/a/b.json",
                                  "analysis/.hidden.json", "nodes/h2/fingerprint.json", "records/a.jsonl",
                                  "analysis/a.json\n", "captures/a.pcap"])
def test_node_file_shapes_refuse_everything_else(path: str) -> None:
    from diag.inplace.transfer import node_file_problem

    assert node_file_problem(path, keep_pcaps=False) is not None


@pytest.mark.parametrize("path", ["fingerprint.json", "analysis/sweep--raw-ring-all_gather-n2.json",
                                  "observe/x.jsonl", "tcpinfo/tcpinfo-rank1.jsonl", "captures/a.pcap.capture.json"])
def test_node_file_shapes_take_what_a_node_writes(path: str) -> None:
    from diag.inplace.transfer import node_file_problem

    assert node_file_problem(path, keep_pcaps=False) is None
    assert node_file_problem("captures/a.pcap", keep_pcaps=True) is None


def test_record_names_are_plain() -> None:
    from diag.inplace.transfer import record_name_problem

    assert record_name_problem("sweep.jsonl") is None
    for bad in ("../sweep.jsonl", "a/b.jsonl", ".hidden.jsonl", "sweep.json", 3):
        assert record_name_problem(bad) is not None


def test_a_fifo_planted_at_the_shared_marker_is_never_waited_on(tmp_path: Path) -> None:
    """The run directory is not shared with rank 1, which sees its own empty tmpfs there (a machine of its
    own), with a FIFO at the marker rank 0 writes. Reading the marker followed it and blocked until a writer
    came (never): the whole job hung. Now the node reads it without blocking, finds no marker, and the job
    goes on, the directory taken as not shared."""
    need_root()
    unshare, sh, mount, mkfifo = (shutil.which(tool) for tool in ("unshare", "sh", "mount", "mkfifo"))
    if not all((unshare, sh, mount, mkfifo)):
        pytest.skip("needs unshare, sh, mount and mkfifo for a private mount")
    os.chmod(tmp_path, 0o700)
    (tmp_path / "run").mkdir(mode=0o700)
    private_fifo = [unshare, "--mount", "--propagation", "private", "--", sh, "-c",
                    f'{mount} -t tmpfs tmpfs "$0" && {mkfifo} "$0/.diag-shared" && exec "$@"', str(tmp_path / "run")]
    reports = run_ranks("marker", tmp_path, 2, timeout_s=240, wrap={1: private_fifo})
    assert [r["marker"] for r in reports] == [{"shared": False}] * 2, reports


def test_no_module_calls_torchs_pickling_collectives() -> None:
    """torch's object collectives unpickle what arrives; diag's control plane moves data (messages.py)."""
    import re

    pickling = re.compile(r"\b_?dist\.(all_gather_object|broadcast_object_list|gather_object|scatter_object_list|"
                          r"send_object_list|recv_object_list)\(")
    package = Path(__file__).resolve().parent.parent / "diag"
    calls = [f"{path.relative_to(package)}: {match.group(0)}" for path in sorted(package.rglob("*.py"))
             for match in pickling.finditer(path.read_text())]
    assert calls == []
