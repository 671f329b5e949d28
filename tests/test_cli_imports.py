"""Commands that need no torch never import it: they start fast and work where torch is absent."""

from __future__ import annotations

import subprocess
import sys

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
