#!/usr/bin/env bash
# Set up everything the book build and the tests need, on a fresh Debian/Ubuntu machine.
#   scripts/setup.sh            Python venv (.venv) with pinned packages + minikv, and graphviz's `dot`
#   scripts/setup.sh --browser  also Debian's Chromium, for the headless-browser tests
# Re-running is cheap: the venv is rebuilt only when requirements.txt or pyproject.toml change.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1

apt_install() {  # apt_install <binary> <package>
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian package '$2' (for '$1')"
    if [ ! -f /tmp/.minikv-apt-updated ]; then apt-get update -qq && touch /tmp/.minikv-apt-updated; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  else
    echo "setup: '$1' is missing and I cannot install it here (needs root and apt-get)." >&2
    echo "setup: install the package '$2' with your system's package manager, then re-run." >&2
    exit 1
  fi
}

apt_install dot graphviz
[ "$want_browser" = 1 ] && apt_install chromium chromium

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 10), "minikv needs Python >= 3.10"'
stamp=.venv/.minikv-installed
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: creating .venv and installing requirements.txt (about a minute)"
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  touch "$stamp"
fi
