#!/bin/bash
# The node's usual load against the real service (issue 32): one core kept busy throughout by a pinned spinner,
# TensorFlow sweeps every 2 s (1 thread, n = 64 and 256, compute), /metrics scraped every 3 s until 12 sweeps;
# then the service restarted on the same history and scraped before its first sweep ends (the state is kept).
# Usage: benchmarks/usual_load_gauge.sh > benchmarks/results/usual-load-gauge-MACHINE-DATE.log
set -u
cd "$(dirname "$0")/.."
work=$(mktemp -d)
cat > "$work/config.yaml" <<YAML
schedule: {interval: 2s}
benchmark: {backend: tensorflow, sizes: [64, 256], modes: [compute], cpu_threads: 1, timeout: 2m}
guard: {require_nvml: false}
server: {listen: "127.0.0.1:9437"}
history: {directory: $work/state}
YAML
python3 -c "import os; os.sched_setaffinity(0, {0})
while True: pass" &
spinner=$!
scrape() {
  curl -s 127.0.0.1:9437/metrics |
    grep -E '^matmul_sweeps_total\{result="(success|partial)"\}|^matmul_host_usual_other_load_cores|^matmul_cpu_other_load_cores' |
    tr '\n' ' '
  echo
}
swept() {  # success + partial sweeps in a scrape
  echo "$1" | grep -oE 'result="(success|partial)"\} [0-9.]+' | awk '{s += $2} END {print int(s)}'
}
.venv/bin/crossover-monitor run --config "$work/config.yaml" > "$work/run1.log" 2>&1 &
service=$!
for _ in $(seq 1 120); do
  sleep 3
  line=$(scrape)
  echo "$(date -u +%H:%M:%S) $line"
  [ "$(swept "$line")" -ge 12 ] && break
done
kill -INT $service; wait $service
echo "restarted $(date -u +%H:%M:%S)"
.venv/bin/crossover-monitor run --config "$work/config.yaml" > "$work/run2.log" 2>&1 &
service=$!
sleep 4
echo "after the restart, before its first sweep ends: $(scrape)"
kill -INT $service; wait $service
kill $spinner
rm -rf "$work"
