#!/usr/bin/env bash
# Run the estimator's and the widgets' tests under the versions of Colab's GPU image (its package list of 2026-08):
# transformers 5.15.0, peft 0.20.0, accelerate 1.14.0, ipywidgets 7.7.1, matplotlib 3.10.0, next to the dev venv's
# newer ones. No second venv: the pinned packages go into a side folder put first on
# PYTHONPATH (pip install --no-deps --target); everything else (torch, trl, ...) comes from the venv. transformers
# 5.15 checks two of its dependencies' versions at import, so the folder also holds a tokenizers and a
# huggingface_hub inside its ranges (Colab has such ones too); ipywidgets 7 imports ipython_genutils.
# Time: the first run downloads about 160 MB into the folder (2 minutes here); then the 96 tests took 37 s under
# pytest -n 2 (make test's JOBS; 47 s wall, the check included) on 2 CPU cores with nothing else running
# (2026-12-03); under a load of 9 they once took 341 s.
# Usage: tests/colab_pins.sh [pytest args]     (PY=path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PINS=("transformers==5.15.0" "peft==0.20.0" "accelerate==1.14.0" "ipywidgets==7.7.1" "matplotlib==3.10.0"
      "ipython_genutils==0.2.0" "tokenizers>=0.22.0,<=0.23.0" "huggingface_hub>=1.5.0,<2.0")
DIR=${COLAB_PINS_DIR:-${TMPDIR:-/tmp}/kit-colab-pins-2026-08}
if [ ! -f "$DIR/.complete" ]; then
  "$PY" -m pip install -q --no-deps --upgrade --target "$DIR" "${PINS[@]}"
  touch "$DIR/.complete"
fi
export PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}" KIT_EXPECT_IPYWIDGETS=7.7.1
"$PY" - <<'PYEOF'
import accelerate, ipywidgets, matplotlib, peft, transformers
got = {m.__name__: m.__version__ for m in (transformers, peft, accelerate, ipywidgets, matplotlib)}
want = {"transformers": "5.15.0", "peft": "0.20.0", "accelerate": "1.14.0", "ipywidgets": "7.7.1",
        "matplotlib": "3.10.0"}
assert got == want, f"the side folder did not take: {got}"
print("Colab pins:", ", ".join(f"{k} {v}" for k, v in got.items()))
PYEOF
"$PY" -m pytest tests/test_estimate.py tests/test_widgets.py -q -p no:cacheprovider -W "ignore::DeprecationWarning" "$@"
