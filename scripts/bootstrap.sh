# Sourced by scripts/run and scripts/test: a virtual environment in .venv with the project installed, its
# runtime dependencies from the hashed lock in requirements/ (scripts/lock writes it); the OS packages it needs.
# Usage: bootstrap_venv EXTRA [REQUIREMENT...]   (EXTRA is a pip extra such as "test", "cuda,plot", or empty;
# the requirements are installed in the same pip call as the extras the lock does not cover)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  as_root apt-get update -qq
  # env, not a prefix assignment: sudo would drop the variable
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# The lock of the runtime dependencies for EXTRA on Python VERSION (major.minor): the cuda set where EXTRA names
# cuda, else the plain one. Prints its path; fails, naming the locks there are, where VERSION has none.
# Usage: lock_file EXTRA VERSION
lock_file() {
  local extra="$1" version="$2" set=runtime
  if [[ ",$extra," == *,cuda,* ]]; then set=cuda; fi
  local lock="requirements/$set-py$version.txt"
  if [ ! -e "$lock" ]; then
    echo "no lock of the runtime dependencies for Python $version ($lock); there are: $(cd requirements && echo *.txt)." \
      "Set PYTHON to a Python they cover (e.g. PYTHON=python3.11), or add $version to scripts/lock and run it" >&2
    return 1
  fi
  echo "$lock"
}

# The extras of the comma-separated EXTRA that no lock covers (all but cuda), comma-separated.
# Usage: unlocked_extras EXTRA
unlocked_extras() {
  local name rest=()
  IFS=, read -ra names <<<"$1"
  for name in "${names[@]}"; do
    if [ -n "$name" ] && [ "$name" != cuda ]; then rest+=("$name"); fi
  done
  (IFS=,; echo "${rest[*]}")
}

# The unit files systemd has enabled, one per line, sorted (none where systemctl is missing).
enabled_units() {
  if command -v systemctl >/dev/null; then
    systemctl list-unit-files --state=enabled --no-legend --no-pager | awk '{print $1}' | sort
  fi
}

# Debian enables, and where systemd runs starts, the services its packages ship: prometheus installs a system
# Prometheus on :9090, prometheus-alertmanager one on :9093, podman its API socket. Stops and disables each unit
# enabled now that BEFORE (enabled_units' output before the install) did not list, and names them on stderr.
# WHO says whose install it was. ROOT (default: the real one) is there for the tests.
# Usage: disable_units_enabled_since BEFORE WHO [ROOT]
disable_units_enabled_since() {
  local before="$1" who="$2" root="${3:-}" unit new
  new=$(comm -13 <(echo "$before") <(enabled_units))
  if [ -z "$new" ]; then return 0; fi
  for unit in $new; do
    as_root systemctl disable --quiet "$unit"
    # Only a running systemd can stop a unit (in a container or chroot, the install could not start it).
    if [ -d "$root/run/systemd/system" ]; then as_root systemctl stop "$unit"; fi
  done
  echo "$who: stopped and disabled what installing its packages enabled, which the tests do not use:" \
    "${new//$'\n'/ } (systemctl enable --now UNIT brings one back)" >&2
}

bootstrap_venv() {
  local extra="$1" python="${PYTHON:-python3}" version lock rest
  shift
  # One stamp per extra: a venv first made without the cuda extra gets it once a GPU appears.
  local stamp=".venv/.installed${extra:+-$extra}"
  if [ ! -x .venv/bin/python ]; then
    # Debian and Ubuntu ship venv's pip bootstrap separately.
    "$python" -m venv .venv 2>/dev/null || { rm -rf .venv; apt_install python3-venv && "$python" -m venv .venv; }
  fi
  version=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  lock=$(lock_file "$extra" "$version")
  # Install the first time and again only when pyproject.toml or the lock changes: a restart needs no package index.
  if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    # The runtime dependencies exactly as locked; pip refuses a file whose hash the lock lacks, and a
    # dependency the lock misses.
    .venv/bin/python -m pip install -q --require-hashes -r "$lock"
    rest=$(unlocked_extras "$extra")
    if [ -z "$rest" ] && [ $# -eq 0 ]; then
      .venv/bin/python -m pip install -q --no-deps -e .
    else
      # Extras the lock does not cover (test, plot, ...) are resolved, held to the locked versions: a conflict
      # fails here instead of moving a locked package. pip takes no hashes in a constraints file.
      sed -e '/^ *--hash=/d' -e 's/ *\\$//' "$lock" >.venv/lock-constraints.txt
      .venv/bin/python -m pip install -q -e ".${rest:+[$rest]}" "$@" -c .venv/lock-constraints.txt
    fi
    touch "$stamp"
  fi
}

# Where an NVIDIA GPU shows, without CUDA: the driver's list of GPUs, a GPU device node, `nvidia-smi -L`, or an
# NVIDIA display controller on the PCI bus (a GPU whose driver is not loaded yet). Prints the first it finds and
# succeeds; fails, printing nothing, where none shows. ROOT (default: the real one) and NVIDIA_SMI (default:
# nvidia-smi) are there for the tests, which point it at a fake tree.
# Usage: nvidia_gpu_seen [ROOT [NVIDIA_SMI]]
nvidia_gpu_seen() {
  local root="${1:-}" smi="${2:-nvidia-smi}" found listed
  for found in "$root"/proc/driver/nvidia/gpus/*; do
    if [ -e "$found" ]; then echo "$found"; return 0; fi
  done
  if [ -e "$root/dev/nvidia0" ]; then echo "$root/dev/nvidia0"; return 0; fi
  # A bounded wait: nvidia-smi can hang for minutes on a driver in a bad state.
  if listed=$(timeout 10 "$smi" -L 2>/dev/null) && [ -n "$listed" ]; then
    echo "nvidia-smi -L: ${listed%%$'\n'*}"
    return 0
  fi
  for found in "$root"/sys/bus/pci/devices/*; do
    # Vendor 0x10de is NVIDIA; class 0x03xxxx a display or 3D controller (not a GPU's audio function).
    if [ "$(cat "$found/vendor" 2>/dev/null)" = 0x10de ] && [[ "$(cat "$found/class" 2>/dev/null)" == 0x03* ]]; then
      echo "an NVIDIA display controller at PCI ${found##*/}, its driver not loaded"
      return 0
    fi
  done
  return 1
}

# The extra scripts/run installs: CROSSOVER_MONITOR_EXTRA where it is set (empty for none), else "cuda" where an
# NVIDIA GPU shows, so that TensorFlow has its CUDA libraries (tensorflow[and-cuda]), else none. Prints the extra
# on stdout and, in one line on stderr, what it found and what it chose.
# Usage: run_extra [ROOT [NVIDIA_SMI]]   (as nvidia_gpu_seen)
run_extra() {
  local seen chosen="without extras"
  if [ -n "${CROSSOVER_MONITOR_EXTRA+set}" ]; then
    if [ -n "$CROSSOVER_MONITOR_EXTRA" ]; then chosen="with [$CROSSOVER_MONITOR_EXTRA]"; fi
    echo "scripts/run: CROSSOVER_MONITOR_EXTRA='$CROSSOVER_MONITOR_EXTRA' chosen, no GPU detection: the package $chosen" >&2
    echo "$CROSSOVER_MONITOR_EXTRA"
  elif seen=$(nvidia_gpu_seen "$@"); then
    echo "scripts/run: NVIDIA GPU found ($seen): the package with the cuda extra, TensorFlow's CUDA" \
      "libraries (several GB the first time; CROSSOVER_MONITOR_EXTRA= to go without)" >&2
    echo cuda
  else
    echo "scripts/run: no NVIDIA GPU found (no /proc/driver/nvidia/gpus/*, /dev/nvidia0, nvidia-smi -L or NVIDIA" \
      "display controller): the package without the cuda extra; the CPU is timed alone" >&2
    echo ""
  fi
}
