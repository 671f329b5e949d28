#!/usr/bin/env bash
# Verdicts under load, live (docs/benchmarks.md): 10 `diag reproduce --quick` runs, the conditions alternating
# (odd runs: no added load; even runs: beside two busy processes, `python3 -c 'while True: pass'`), then the
# table of what each run said and the resampling check over all of them.
#   bash docs/verdicts-live.sh OUT_DIR [RUNS]
set -u
out=${1:?usage: bash docs/verdicts-live.sh OUT_DIR [RUNS]}
runs=${2:-10}
mkdir -p "$out"
busy=()
stop_busy() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null; done; busy=(); }
trap stop_busy EXIT INT TERM
for i in $(seq 1 "$runs"); do
  condition=quiet
  if (( i % 2 == 0 )); then
    condition=busy2
    python3 -c 'while True: pass' & busy+=($!)
    python3 -c 'while True: pass' & busy+=($!)
  fi
  load=$(cut -d' ' -f1 /proc/loadavg)
  diag reproduce --quick --out "$out/run$i" >"$out/run$i.out" 2>"$out/run$i.err"
  echo "run$i $condition exit=$? load_before=$load" | tee -a "$out/conditions.txt"
  stop_busy
done
python3 -m bench.verdicts --table "$out"/run*/
python3 -m bench.verdicts "$out"/run*/ --resamples 1000
