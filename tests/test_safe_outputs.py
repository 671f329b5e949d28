"""diag (root) never writes through a planted symlink or into a directory someone else controls.

Each test plants what an unprivileged user could (a symlink at a name diag writes, a hard link, a
world-writable or foreign-owned output directory) and checks that the victim file is untouched, or that
the command refuses with one line before any work starts.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from report_helpers import make_record, write_records

from diag import safefs, validate
from diag.errors import DiagError
from diag.inplace.job import JobOptions
from diag.plan import sweep_plan
from diag.records import RecordWriter, export_csv
from diag.spec import SweepSpec
from diag.worker import StateFile
from tests.common import REPO, need_root, run_diag

NOBODY = 65534
VICTIM_TEXT = "precious\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir(exist_ok=True)
    path.write_text(VICTIM_TEXT)
    return path


def assert_untouched(path: Path) -> None:
    assert path.read_text() == VICTIM_TEXT


def assert_one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_a_planted_state_tmp_symlink_is_not_followed(tmp_path: Path) -> None:
    target = victim(tmp_path)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "rank0.tmp").symlink_to(target)
    StateFile(str(state_dir), 0).update(status="running")
    assert_untouched(target)
    assert '"status": "running"' in (state_dir / "rank0.json").read_text()
    assert not (state_dir / "rank0.tmp").exists()


def test_a_planted_job_file_symlink_is_replaced_and_the_job_file_is_0600(tmp_path: Path) -> None:
    target = victim(tmp_path)
    job_path = tmp_path / "job-n2.json"
    job_path.symlink_to(target)
    job = JobOptions(plan=sweep_plan(SweepSpec(backend="gloo"), (2,)).to_json(), command="sweep",
                     out=str(tmp_path / "r.d"), run_id="x")
    job.save(job_path)
    assert_untouched(target)
    info = os.lstat(job_path)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert JobOptions.load(job_path) == job


def test_a_job_file_others_can_write_or_read_is_refused(tmp_path: Path) -> None:
    job_path = tmp_path / "job-n2.json"
    JobOptions(out=str(tmp_path / "r.d"), run_id="x").save(job_path)
    for mode in (0o666, 0o644):
        os.chmod(job_path, mode)
        with pytest.raises(DiagError, match="mode 0600"):
            JobOptions.load(job_path)


def test_records_are_never_appended_through_a_symlink_or_hard_link(tmp_path: Path) -> None:
    target = victim(tmp_path)
    link = tmp_path / "sweep.jsonl"
    link.symlink_to(target)
    with pytest.raises(DiagError, match="symlink"):
        RecordWriter(link)
    hard = tmp_path / "hard.jsonl"
    os.link(target, hard)
    with pytest.raises(DiagError, match="hard links"):
        RecordWriter(hard)
    assert_untouched(target)


def test_csv_export_replaces_a_planted_symlink(tmp_path: Path) -> None:
    target = victim(tmp_path)
    records = write_records(tmp_path / "r.jsonl", [make_record("gloo", "all_gather", 2, 1024, [0.001] * 3)])
    csv_path = tmp_path / "rows.csv"
    csv_path.symlink_to(target)
    export_csv(records, csv_path)
    assert_untouched(target)
    assert not csv_path.is_symlink() and csv_path.read_text().startswith("series,backend,")


def test_a_tcp_info_file_symlink_is_refused(tmp_path: Path) -> None:
    from diag import safefs

    target = victim(tmp_path)
    (tmp_path / "tcpinfo-rank0.jsonl").symlink_to(target)
    with pytest.raises(DiagError, match="symlink"):
        safefs.open_append(tmp_path / "tcpinfo-rank0.jsonl")
    assert_untouched(target)


def test_directories_diag_creates_are_0700(tmp_path: Path) -> None:
    created = validate.output_dir(tmp_path / "a" / "b", "--run-dir")
    for directory in (created, created.parent):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "foreign-owned", "foreign-symlink"])
def test_an_unsafe_existing_output_dir_is_refused(tmp_path: Path, how: str) -> None:
    directory = tmp_path / "out"
    directory.mkdir(mode=0o700)
    if how == "world-writable":
        os.chmod(directory, 0o1777)
    elif how == "group-writable":
        os.chmod(directory, 0o770)
    elif how == "foreign-owned":
        os.chown(directory, NOBODY, NOBODY)
    else:
        link = tmp_path / "link"
        link.symlink_to(directory)
        os.lchown(link, NOBODY, NOBODY)
        directory = link
    if os.geteuid() != 0 and how.startswith("foreign"):
        pytest.skip("needs root to give a directory to another user")
    with pytest.raises(DiagError) as caught:
        validate.output_dir(directory, "--run-dir")
    assert len(str(caught.value).splitlines()) == 1
    assert "--run-dir" in str(caught.value)


def test_the_cli_refuses_an_unsafe_run_dir_before_any_rank(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--out", str(tmp_path / "r.jsonl"), "--run-dir",
                    str(shared))
    assert_one_line(proc, "--run-dir", "written by group or others")
    assert not (shared / "logs").exists()
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, NOBODY, NOBODY)
        assert_one_line(run_diag("reproduce", "--quick", "--out", str(foreign)), "--out", f"uid {NOBODY}")
        assert list(foreign.iterdir()) == []


def test_a_capture_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("tcpdump"):
        pytest.skip("needs root and tcpdump")
    from diag.capture import start_capture

    target = victim(tmp_path)
    pcap = tmp_path / "c.pcap"
    pcap.symlink_to(target)
    (tmp_path / "c.pcap.capture.json").symlink_to(target)
    info = start_capture(pcap, "lo", "tcp port 9", 64).stop()
    assert info.tool == "tcpdump"
    assert_untouched(target)
    assert not pcap.is_symlink() and pcap.read_bytes()[:4] in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4")


def test_a_sweep_run_dir_and_its_files_are_private(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "r.jsonl", tmp_path / "r.d"
    proc = subprocess.run([sys.executable, "-m", "diag", "sweep", "--nproc", "2", "--backend", "raw", "--sizes", "1K",
                           "--iters", "1", "--warmup", "0", "--quiet", "--out", str(out), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (node,) = (run_dir / "nodes").iterdir()
    assert list((node / "tcpinfo").glob("*.jsonl"))      # the raw transport's TCP_INFO, in its node's folder
    for directory in (run_dir, run_dir / "logs", run_dir / "logs" / "state-n2", run_dir / "records",
                      run_dir / "nodes", node, node / "tcpinfo"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert stat.S_IMODE(os.stat(run_dir / "logs" / "job-n2.json").st_mode) == 0o600


def test_the_cli_refuses_a_records_file_of_someone_else_before_any_rank(tmp_path: Path) -> None:
    target = victim(tmp_path)
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    proc = run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--out", str(link))
    assert_one_line(proc, "--out", "symlink")
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign.jsonl"
        foreign.write_text("")
        os.chown(foreign, NOBODY, NOBODY)
        assert_one_line(run_diag("sweep", "--nproc", "2", "--sizes", "1K", "--out", str(foreign)), "--out",
                        f"uid {NOBODY}")
    assert_untouched(target)
    assert not (tmp_path / "link.d").exists() and not (tmp_path / "foreign.d").exists()


# ---- the way to the output: no parent another user can swap (diag.safefs.open_dir) ----------------------

def as_user(uid: int, directory: Path, action: Callable[[int], None]) -> None:
    """Run ``action(fd)`` in a child process that has become ``uid`` (what that user could do, for real), with
    ``fd`` a handle of ``directory`` opened before (pytest's private temporary directory is closed to them)."""
    pid = os.fork()
    if pid == 0:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action(fd)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the other user's step failed"


def foreign_dir(tmp_path: Path, mode: int = 0o755) -> Path:
    """A directory another user made (in a shared temporary directory, say)."""
    need_root()
    directory = tmp_path / "theirs"
    directory.mkdir()
    os.chown(directory, NOBODY, NOBODY)
    os.chmod(directory, mode)
    return directory


def test_a_parent_another_user_owns_is_refused_so_a_swapped_run_dir_lands_nowhere(tmp_path: Path) -> None:
    """--out THEIRS/run, THEIRS owned by another user: the run directory itself was diag's (0700, root's), so
    it was accepted; that user then renamed it and put a symlink to a directory of their choice in its place,
    and root's next run.json and nodes/h1/ landed there. Now the output is refused in one line at the check,
    and every later write walks the path again and refuses too."""
    theirs = foreign_dir(tmp_path)
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    out = theirs / "run"
    with pytest.raises(DiagError) as caught:
        validate.output_dir(out, "--out")
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and "--out" in message and f"uid {NOBODY}" in message, message
    out.mkdir(mode=0o700, exist_ok=True)   # as the check made it before

    def swap(fd: int) -> None:
        os.rename("run", "moved", src_dir_fd=fd, dst_dir_fd=fd)
        os.symlink(chosen, "run", dir_fd=fd)

    as_user(NOBODY, theirs, swap)
    assert out.is_symlink()
    for write in (lambda: safefs.write_file(out / "run.json", "{}"), lambda: safefs.private_dir(out / "nodes" / "h1"),
                  lambda: os.close(safefs.open_append(out / "records.jsonl"))):
        with pytest.raises(DiagError):
            write()
    assert list(chosen.iterdir()) == []


def test_a_sticky_shared_directory_takes_a_run_dir_of_yours_but_not_anothers(tmp_path: Path) -> None:
    """/tmp-like (1777, root's): a child of the caller's is fine (nobody else can rename it, as the other user
    finds); a sticky directory of another user's is not (its owner can rename anything in it)."""
    need_root()
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    out = validate.output_dir(shared / "run", "--out")
    safefs.write_file(out / "run.json", "{}")

    def rename(fd: int) -> None:
        try:
            os.rename("run", "moved", src_dir_fd=fd, dst_dir_fd=fd)
        except PermissionError:
            return
        raise AssertionError("another user renamed root's run directory in a sticky directory")

    as_user(NOBODY, shared, rename)
    theirs = foreign_dir(tmp_path, 0o1777)
    with pytest.raises(DiagError, match=f"uid {NOBODY}"):
        validate.output_dir(theirs / "run", "--out")


def test_a_held_directory_is_written_where_it_was_opened(tmp_path: Path) -> None:
    """What diag holds open (a Dir) it writes into, whatever becomes of the path afterwards: a run directory
    renamed and replaced by a symlink receives the next file, never the symlink's target."""
    run, chosen = tmp_path / "run", tmp_path / "chosen"
    chosen.mkdir()
    with safefs.private_handle(run) as held:
        os.rename(run, tmp_path / "moved")
        os.symlink(chosen, run)
        held.write_file("run.json", "{}")
        with held.private_dir("nodes/h1") as node:
            node.write_file("fingerprint.json", "{}")
    assert (tmp_path / "moved" / "run.json").read_text() == "{}"
    assert (tmp_path / "moved" / "nodes" / "h1" / "fingerprint.json").exists()
    assert list(chosen.iterdir()) == []


def test_diag_report_refuses_to_write_below_another_users_directory(tmp_path: Path) -> None:
    """`diag report RUN` writes RUN/report/: with RUN inside a directory another user owns, one line (pass
    --out), and no report/ appears."""
    theirs = foreign_dir(tmp_path)
    staging, run = tmp_path / "staging", theirs / "run"
    write_records(staging / "records" / "sweep.jsonl", [make_record("gloo", "all_gather", 2, 1 << 20, [0.01] * 3)])
    shutil.move(staging, run)
    proc = run_diag("report", str(run))
    assert_one_line(proc, "--out", f"uid {NOBODY}")
    assert not (run / "report").exists()


def test_the_default_runs_directory_in_another_users_working_directory_is_refused(tmp_path: Path) -> None:
    theirs = foreign_dir(tmp_path)
    proc = subprocess.run([sys.executable, "-P", "-m", "diag", "sweep", "--nproc", "2", "--sizes", "1K", "--iters",
                           "1", "--warmup", "0", "--quiet"], cwd=theirs, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert_one_line(proc, f"uid {NOBODY}")
    assert list(theirs.iterdir()) == []
