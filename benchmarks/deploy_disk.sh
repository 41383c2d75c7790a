#!/usr/bin/env bash
# Peak disk of one real-deploy image build (tests/realdeploy.py), with given podman build flags.
# Needs the suite's store and wheelhouse in .cache/deploy (run the real-deploy tests once first), root.
# Usage: benchmarks/deploy_disk.sh LABEL Dockerfile|Dockerfile.gpu WHEELHOUSE [podman build flags...]
# (WHEELHOUSE: the folder in .cache/deploy/wheels named after the lock the Dockerfile installs: runtime-py3.11)
# Appends one line to benchmarks/results/deploy-disk-$(date +%F).txt: the peak and what stays, in MB
# above the filesystem's use before the build, sampled every second with df.
set -euo pipefail
cd "$(dirname "$0")/.."
label=$1 dockerfile=$2 wheels=$3
shift 3
cache="$PWD/.cache/deploy"
runroot="/run/crossover-monitor-tests/$(python3 -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:12])" "$cache")"
podman=(env "TMPDIR=$cache/tmp" podman --runtime=runc --storage-driver=overlay "--root=$cache/podman"
  "--runroot=$runroot" --cgroup-manager=cgroupfs --events-backend=file)
base=$("${podman[@]}" images --format '{{.Repository}}:{{.Tag}}' | grep -m1 crossover-monitor-test-base)
used() { df -B1M --output=used "$cache" | tail -1; }
"${podman[@]}" rmi -f localhost/crossover-monitor:disk >/dev/null 2>&1 || true
"${podman[@]}" image prune -f >/dev/null
before=$(used)
samples=$(mktemp)
(while true; do used >>"$samples"; sleep 1; done) &
sampler=$!
start=$(date +%s)
"${podman[@]}" build --format=docker --network=none "--volume=$cache/wheels/$wheels:/wheels:ro" \
  "--volume=$cache/pip.conf:/etc/pip.conf:ro" "--build-arg=BASE=$base" "$@" \
  --file "deploy/container/$dockerfile" --tag localhost/crossover-monitor:disk . >/dev/null
seconds=$(($(date +%s) - start))
kill "$sampler"
after=$(used)
"${podman[@]}" image prune -f >/dev/null
pruned=$(used)
peak=$(sort -n "$samples" | tail -1)
rm -f "$samples"
line="$label $dockerfile flags=[$*] seconds=$seconds peak_mb=$((peak - before)) after_mb=$((after - before)) after_prune_mb=$((pruned - before))"
echo "$line" | tee -a "benchmarks/results/deploy-disk-$(date +%F).txt"
"${podman[@]}" rmi -f localhost/crossover-monitor:disk >/dev/null
"${podman[@]}" image prune -f >/dev/null
