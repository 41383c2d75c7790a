# Sourced by scripts/run and scripts/test: a virtual environment in .venv with the project installed.
# Usage: bootstrap_venv EXTRA [REQUIREMENT...]   (EXTRA is a pip extra such as "test", or empty;
# the requirements are installed in the same pip call)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  as_root apt-get update -qq
  # env, not a prefix assignment: sudo would drop the variable
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

bootstrap_venv() {
  local extra="$1" python="${PYTHON:-python3}"
  shift
  local stamp=".venv/.installed${extra:+-$extra}"
  if [ ! -x .venv/bin/python ]; then
    # Debian and Ubuntu ship venv's pip bootstrap separately.
    "$python" -m venv .venv 2>/dev/null || { rm -rf .venv; apt_install python3-venv && "$python" -m venv .venv; }
  fi
  # Install the first time and again only when pyproject.toml changes: a restart needs no package index.
  if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".${extra:+[$extra]}" "$@"
    touch "$stamp"
  fi
}
