#!/usr/bin/env bash
# Run the widget tests under ipywidgets 7.7.1, the version Colab ships, next to the dev venv's 8.x.
# No second venv: ipywidgets 7.7.1 (and ipython_genutils, which 7.x imports) go into a side folder
# that is put first on PYTHONPATH; everything else comes from the venv. Frontend packages
# (widgetsnbextension, jupyterlab_widgets) are not needed: the tests drive the kernel side.
# Usage: tests/ipywidgets7.sh [pytest args]     (PY=path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=${IPYW7_DIR:-${TMPDIR:-/tmp}/kit-ipywidgets-7.7.1}
if [ ! -f "$DIR/ipywidgets/__init__.py" ]; then
  "$PY" -m pip install -q --no-deps --target "$DIR" "ipywidgets==7.7.1" "ipython_genutils==0.2.0"
fi
KIT_EXPECT_IPYWIDGETS=7.7.1 PYTHONPATH="$DIR${PYTHONPATH:+:$PYTHONPATH}" \
  "$PY" -m pytest tests/test_widgets.py -q -p no:cacheprovider -W "ignore::DeprecationWarning" "$@"
