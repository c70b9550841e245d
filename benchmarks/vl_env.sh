#!/usr/bin/env bash
# Qwen2.5-VL's and Qwen3-VL's SFTTrainer rows in a benchmark-only environment. Their processors (Qwen2_5_VLProcessor,
# Qwen3VLProcessor) need torchvision for their video processors; PyPI's torchvision does not import beside the CPU
# torch 2.13 of the project's venv, and only torch 2.14.1 with torchvision 0.29.1 does (a CUDA build, about 6 GB in a
# venv). So that stays out of the project's install: this script builds a side venv (KIT_VL_VENV, default .venv-vl)
# with those two first, then the kit's requirements less torch (pip keeps the torch it has: checked after), and runs
# there, with the worktree on PYTHONPATH (no install of the kit): the SFTTrainer tests of tests/test_qwen2_5_vl.py,
# then the rows of benchmarks/real_clients.py whose name holds "Qwen2.5-VL", written to OUT; then Qwen3-VL's the same
# way (its tests, its rows, written to OUT3). `make test` skips the first loudly where the venv is missing
# (tests/test_qwen2_5_vl.py, tests/test_qwen3_vl.py). The estimate itself needs no torchvision: the kit computes both
# models' image tokens from their image processors' arithmetic.
# Time: building the venv takes a few minutes (pip on Python 3.11; here both wheels came from the local disk); the
# tests and the rows about 4 minutes on 2 CPU cores.
# Usage: benchmarks/vl_env.sh [OUT] [OUT3]     (PYTHON=python3.11 to pick the interpreter that builds the venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KIT_VL_VENV:-.venv-vl}
OUT=${1:-benchmarks/results/real_clients-$(date +%F)-qwen2-5-vl-cpu.md}
OUT3=${2:-benchmarks/results/real_clients-$(date +%F)-qwen3-vl-cpu.md}
PY="$VENV/bin/python"
if [ ! -f "$VENV/.complete" ]; then
  test -x "$PY" || "${PYTHON:-python3}" -m venv "$VENV"
  "$PY" -m pip install -q torch==2.14.1 torchvision==0.29.1
  grep -v '^torch' requirements.txt > "$VENV/requirements-less-torch.txt"
  "$PY" -m pip install -q -r "$VENV/requirements-less-torch.txt" "pytest>=8"
  touch "$VENV/.complete"
fi
"$PY" - <<'PYEOF'
import torch, torchvision, transformers
assert torch.__version__.startswith("2.14.1") and torchvision.__version__.startswith("0.29.1"), \
    f"the side venv's torch was replaced: torch {torch.__version__}, torchvision {torchvision.__version__}"
from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor  # noqa: F401  (need torchvision)
print(f"benchmark-only venv: torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}")
PYEOF
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pytest tests/test_qwen2_5_vl.py -k sft_trainer_on_image -q -p no:cacheprovider -W "ignore::DeprecationWarning"
"$PY" benchmarks/real_clients.py --only Qwen2.5-VL --no-tensor-peak --out "$OUT"
"$PY" -m pytest tests/test_qwen3_vl.py -k sft_trainer_on_image -q -p no:cacheprovider -W "ignore::DeprecationWarning"
"$PY" benchmarks/real_clients.py --only Qwen3-VL --no-tensor-peak --out "$OUT3"
