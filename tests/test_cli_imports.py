"""Commands that need no torch never import it: they start fast and work where torch is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from report_helpers import anomaly_records, write_run_dir


def test_analyze_report_diagnose_and_lab_do_not_import_torch(tmp_path):
    from scapy.all import IP, TCP, Ether, wrpcap

    pcap = tmp_path / "one.pcap"
    wrpcap(str(pcap), [Ether() / IP(src="10.9.0.1", dst="10.9.0.2") / TCP(sport=1000, dport=2000, flags="S")])
    run_dir = write_run_dir(tmp_path / "run", anomaly_records())
    code = f"""
import sys
from diag.__main__ import main
codes = [main(['analyze', {str(pcap)!r}, '--json', '--out', {str(tmp_path / 'a.json')!r}]),
         main(['report', {str(run_dir)!r}]),
         main(['diagnose', {str(run_dir)!r}]),
         main(['compare', {str(run_dir / 'records' / 'sweep.jsonl')!r}, {str(run_dir / 'records' / 'sweep.jsonl')!r}]),
         main(['model', 'fit', {str(run_dir)!r}, '-o', {str(tmp_path / 'm.json')!r}]),
         main(['lab', 'status', '--name', 'absent1'])]
print(codes, 'torch' in sys.modules, file=sys.stderr)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith("False"), proc.stderr[-2000:]
    assert last.startswith("[0, 0, 0, 0, 0, "), last  # lab status of an absent lab is a one-line error
    assert (run_dir / "report" / "report.html").exists()


# A Python where torch is not installed, without uninstalling it: every `import torch` fails exactly as
# it does on a laptop without torch (ModuleNotFoundError, name "torch").
NO_TORCH = '''
import sys


class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
'''


def _without_torch(tmp_path, args: list[str]) -> subprocess.CompletedProcess[str]:
    site = tmp_path / "no_torch_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TORCH)
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), repo])}
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)


def test_file_commands_work_where_torch_is_not_installed_and_torch_commands_say_so(tmp_path):
    """pip install diag without the torch extra: analyze, report, diagnose, compare and model work; sweep,
    reproduce, advise and exec print one line naming the extra and exit 2."""
    from scapy.all import IP, TCP, Ether, wrpcap

    probe = _without_torch(tmp_path, ["--version"])
    assert probe.returncode == 0, probe.stderr
    check = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                           env={"PYTHONPATH": str(tmp_path / "no_torch_site")}, timeout=60)
    assert check.returncode != 0 and "No module named 'torch'" in check.stderr   # the blocker works

    pcap = tmp_path / "one.pcap"
    wrpcap(str(pcap), [Ether() / IP(src="10.9.0.1", dst="10.9.0.2") / TCP(sport=1000, dport=2000, flags="S")])
    run_dir = write_run_dir(tmp_path / "run", anomaly_records())
    records = str(run_dir / "records" / "sweep.jsonl")
    for args in (["analyze", str(pcap), "--json"], ["report", str(run_dir)], ["diagnose", str(run_dir)],
                 ["compare", records, records, "--html", str(tmp_path / "c.html")],
                 ["model", "fit", str(run_dir), "-o", str(tmp_path / "m.json")], ["sweep", "--help"]):
        done = _without_torch(tmp_path, args)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    assert (run_dir / "report" / "report.html").exists() and (tmp_path / "c.html").exists()

    for args in (["sweep", "--nproc", "2", "--sizes", "1K"], ["reproduce", "--quick"], ["advise"],
                 ["exec", "--", "x.py"]):
        done = _without_torch(tmp_path, args)
        assert done.returncode == 2, (args, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"diag {args[0]}: error: diag {args[0]} needs torch" in lines[0] and "pip install -e '.[torch]'" in lines[0]

    api = subprocess.run([sys.executable, "-c", "import diag\ntry:\n    diag.sweep(diag.SweepSpec(world_sizes=(2,)))\n"
                          "except ImportError as e:\n    print(e)"], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "no_torch_site"),
                                                             str(Path(__file__).resolve().parents[1])])})
    assert "diag.sweep() needs torch" in api.stdout, api.stderr
