#!/usr/bin/env bash
# setup.sh — installs what the build and tests need; idempotent and cheap when
# everything is already there.
#   scripts/setup.sh system   Debian packages (compilers, cmake, ninja, gtest, benchmark, ccache)
#   scripts/setup.sh python   the Python venv with torch==2.14.* (outside the source tree)
# The venv lives in $TORCHNEURON_VENV (default ~/.cache/torchneuron/venv) and
# pip's cache in ~/.cache/pip, so reinstalls on the same machine are fast.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"

system() {
  # clang and its runtime libraries (libFuzzer, sanitizers): the runtime fuzzer.
  local pkgs=(g++ cmake ninja-build libgtest-dev libbenchmark-dev ccache python3-venv clang
              libclang-rt-dev)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  # python3-venv is not needed when the interpreter already has venv.
  if python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing=("${missing[@]/python3-venv}")
  fi
  missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

python_env() {
  local venv="${TORCHNEURON_VENV:-$HOME/.cache/torchneuron/venv}"
  local req="$here/requirements-dev.txt"
  local stamp="$venv/.torchneuron-requirements"
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating venv $venv"
    python3 -m venv "$venv"
  fi
  if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    echo "setup: installing Python requirements into $venv (torch is large; cached after the first time)"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$req"
    cp "$req" "$stamp"
  fi
}

case "${1:-all}" in
  system) system ;;
  python) python_env ;;
  all) system; python_env ;;
  *) echo "usage: $0 [system|python|all]" >&2; exit 2 ;;
esac
