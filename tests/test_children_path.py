"""Children diag starts (launchers, ranks, tcpdump's lifeline) never import code from the working directory.

diag runs as root, often in a directory others can write. ``python -m X`` puts the working directory first on
sys.path, so a ``diag/`` (or ``torch/``) planted there would run as root in every child. The plant here
writes a marker file when imported; the control shows it is imported by a child started the old way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from diag.lifeline import CHILD_CWD, child_env, python_command
from diag.records import load_records
from tests.common import REPO

PLANTED = ("diag", "torch", "numpy")


def plant(directory: Path, markers: Path) -> None:
    """``diag/``, ``torch/`` and ``numpy/`` packages in ``directory`` that leave a marker when imported."""
    for name in PLANTED:
        package = directory / name
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(
            "import os\n"
            f"open(os.path.join({str(markers)!r}, '{name}-' + str(os.getpid())), 'w').close()\n")


def test_the_plant_is_imported_by_a_child_started_the_old_way(tmp_path: Path) -> None:
    shared, markers = tmp_path / "shared", tmp_path / "markers"
    markers.mkdir()
    plant(shared, markers)
    # What launch.py and capture/live.py ran before: python -m diag.lifeline, in the caller's directory.
    subprocess.run([sys.executable, "-m", "diag.lifeline", str(os.getpid()), "--", "true"], cwd=shared,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=60)
    assert any(p.name.startswith("diag-") for p in markers.iterdir())


def test_a_child_started_as_diag_does_ignores_the_plant(tmp_path: Path) -> None:
    shared, markers = tmp_path / "shared", tmp_path / "markers"
    markers.mkdir()
    plant(shared, markers)
    # A PYTHONPATH with an empty entry (an unset variable expanded as "$PYTHONPATH:...") names the working
    # directory too: child_env drops it.
    env = child_env({**os.environ, "PYTHONPATH": os.pathsep + str(REPO)})
    proc = subprocess.run([*python_command("-m", "diag.lifeline", str(os.getpid()), "--", "true")], cwd=CHILD_CWD,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    # and its own children (torch's launcher starts workers as python -u -m ...) inherit PYTHONSAFEPATH
    proc = subprocess.run([sys.executable, "-c", "import sys; print(sys.flags.safe_path)"], cwd=shared, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == ("True" if sys.version_info >= (3, 11) else ""), proc.stderr
    assert list(markers.iterdir()) == []


def test_a_sweep_started_in_a_planted_directory_imports_none_of_it(tmp_path: Path) -> None:
    """The real thing: diag sweep --nproc 2 (torchrun launcher, two gloo ranks) and, as root with tcpdump, a
    capture, all started from a directory holding a planted diag/, torch/ and numpy/."""
    shared, markers = tmp_path / "shared", tmp_path / "markers"
    markers.mkdir()
    plant(shared, markers)
    capture = ["--capture", "lo"] if os.geteuid() == 0 and shutil.which("tcpdump") else []
    out = tmp_path / "runs" / "sweep.jsonl"
    # The user's own command must not import the plant either (the installed `diag` script does not put the
    # working directory on sys.path; python -c does, so the test puts the repository there instead).
    parent = [sys.executable, "-c", f"import sys; sys.path[0] = {str(REPO)!r}; from diag.__main__ import main; "
                                    "sys.exit(main())"]
    proc = subprocess.run([*parent, "sweep", "--nproc", "2", "--backend", "gloo", "--sizes", "1K", "--iters", "1",
                           "--warmup", "0", "--quiet", "--out", str(out), *capture], cwd=shared,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in markers.iterdir()) == []
    assert len(load_records(out).records) == 1
    if capture:
        assert list((tmp_path / "runs" / "sweep.d" / "nodes").glob("*/analysis/*.json"))


def test_diag_exec_adds_the_scripts_directory_only_where_python_would(tmp_path: Path) -> None:
    """``python -P -m diag.exec SCRIPT`` (a safe path, as every Python child of diag's runs) puts nothing on
    sys.path, as ``python -P SCRIPT`` would not; without -P the script's directory comes first, as with
    ``python SCRIPT`` (documented in diag exec's help)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    script = shared / "train.py"
    script.write_text("import json, sys\nprint(json.dumps(sys.path))\n")
    env = child_env()
    for flags, expected in ((("-P",), False), ((), True)):
        if flags and sys.version_info < (3, 11):
            continue
        env_here = env if flags else {k: v for k, v in env.items() if k != "PYTHONSAFEPATH"}
        proc = subprocess.run([sys.executable, *flags, "-m", "diag.exec", str(script)], cwd=CHILD_CWD, env=env_here,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        paths = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (str(shared) in paths) is expected, (flags, paths)
