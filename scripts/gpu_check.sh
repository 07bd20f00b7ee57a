#!/usr/bin/env bash
# The checks only a CUDA machine can run, as one script (for a borrowed GPU, or a Colab shell).
# Needs torch with CUDA and triton already installed (as on Colab); it installs minikv itself.
#   bash scripts/gpu_check.sh [OUT_DIR]
# Writes its log and the CUDA store benchmark to OUT_DIR (default: gpu_check_out/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu_check_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET   # compiled kernels, not the interpreter
{
  python -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))" || exit 1
  python -m pip install -q --no-deps -e . && python -m pip install -q nbval hypothesis pytest graphviz
  # Unit and property tests; the CUDA-only ones (compiled Triton store, CUDA managers) run here.
  python -m pytest -q -p no:cacheprovider tests --ignore=tests/test_book_browser.py --ignore=tests/test_player_browser.py
  # The storage chapter and the Triton exercise on CUDA tensors: every cell must run (outputs differ from the CPU ones).
  python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env book/03_storage.ipynb exercises/ex3_storage.ipynb
  # Compiled Triton against copy bandwidth.
  python benchmarks/store.py --device cuda && cp benchmarks/results/store_cuda.json "$out"/
} 2>&1 | tee "$out/gpu_check.log"
