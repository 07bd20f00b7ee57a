#!/usr/bin/env bash
# Download, on a machine with network access, the wheels scripts/gpu_check.py installs on an
# offline GPU machine (the packages in scripts/gpu_check_requirements.txt and what they need;
# never torch or triton, which the GPU image has). Then carry the folder to the GPU machine:
#   scripts/prepare_gpu_wheels.sh [DIR] [PYTHON_VERSION] [--print]
#   bash scripts/gpu_check.sh OUT --wheels DIR
# DIR defaults to gpu_wheels/, PYTHON_VERSION to the GPU image's 3.12. --print only prints the command.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=gpu_wheels; py=3.12; print_only=0; positional=()
for arg in "$@"; do
  case "$arg" in
    --print) print_only=1 ;;
    *) positional+=("$arg") ;;
  esac
done
[ "${#positional[@]}" -ge 1 ] && dir=${positional[0]}
[ "${#positional[@]}" -ge 2 ] && py=${positional[1]}
mapfile -t packages < <(sed -e 's/#.*//' -e 's/ .*//' -e '/^$/d' scripts/gpu_check_requirements.txt)
command=("${PYTHON:-python3}" -m pip download --dest "$dir" --only-binary=:all: --implementation cp
         --python-version "$py" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
         --platform manylinux2014_x86_64 --platform any "${packages[@]}")
if [ "$print_only" = 1 ]; then
  printf '%q ' "${command[@]}"; echo
  exit 0
fi
mkdir -p "$dir"
"${command[@]}"
echo "wheels in $dir: $(ls "$dir" | wc -l) files"
