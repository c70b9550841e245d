# Two commands do all set-up on a fresh machine:
#   make demo   runs both scenarios end to end and writes a report into report/
#   make test   runs every test: pytest units, the docstring examples, the notebooks under nbval (smoke mode), the
#               estimator's and widget tests again under Colab's versions (ipywidgets 7.7.1 among them)
# Both create .venv and install into it, with the CPU build of torch where there is no GPU.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
OUT    ?= report
# pytest-xdist workers for make test; each test file runs whole in one worker (--dist loadfile)
JOBS   ?= 2

.PHONY: demo test notebooks learner-notebooks gpu-check gpu-wheels venv clean

demo: $(STAMP)
	$(PY) -m kit demo --out $(OUT)

test: $(STAMP)
	$(PY) -m pytest tests notebooks kit --doctest-modules --nbval-lax --nbval-current-env -p no:cacheprovider \
		-n $(JOBS) --dist loadfile
	PY=$(PY) tests/colab_pins.sh -n $(JOBS) --dist load

# Re-run the notebooks in place, in smoke mode and offline, to refresh their committed outputs.
notebooks: $(STAMP)
	KIT_SMOKE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(PY) -m jupyter nbconvert --to notebook \
		--execute --inplace --ExecutePreprocessor.timeout=1800 notebooks/0*.ipynb
	$(PY) -m kit.scenarios.learner  # the learner copies follow the instructor copies

# The learner copies, from the instructor copies in notebooks/ (no kernel runs: a second): notebooks/learner/*.ipynb
# without outputs, instructor notes or solutions (each revealed by teach.solution(key)), kit/assets/solutions.json
# and docs/cheatsheet.md. Run it after editing a notebook; tests/test_learner_notebooks.py fails until you do.
learner-notebooks: $(STAMP)
	$(PY) -m kit.scenarios.learner

# On one CUDA GPU, in at most 9 minutes, setup included: a preflight (torch, CUDA, the driver, the GPU, its free
# memory, the packages, the plan), the GPU tests, the GPU grid, the demo and notebooks 00-03 at real size under a
# Colab T4's 14.56 GiB cap; writes benchmarks/results/gpu-check-<date>-<device>.md/.json. No GPU: one line.
# It creates no venv and pulls nothing from a registry: it runs with the first Python that holds a CUDA torch
# (GPU_PY=... to choose), installing what it lacks from wheels/ when that folder is there (make gpu-wheels).
GPU_PY ?= $(shell for p in "$(PY)" python3 python; do "$$p" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' \
	>/dev/null 2>&1 && { echo "$$p"; exit 0; }; done; if [ -x "$(PY)" ]; then echo "$(PY)"; else echo $(PYTHON); fi)
gpu-check:
	@$(GPU_PY) benchmarks/gpu_check.py

# Where a registry is reachable: the wheels a GPU box without one lacks (bitsandbytes, datasets, ipywidgets, nbval,
# nbclient, ipykernel, trl and their dependencies), for Python $(WHEELS_PY) on manylinux x86_64, into wheels/.
WHEELS_PY ?= 3.12
gpu-wheels:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) benchmarks/gpu_check_wheels.py --python-version $(WHEELS_PY) --out wheels

venv: $(STAMP)

# torch first: without a GPU, the CPU build (a plain `torch` would pull a CUDA build of several GB).
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install -q torch; \
	else \
		$(PY) -m pip install -q torch==2.13.0 || \
		$(PY) -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

clean:
	rm -rf $(VENV) $(OUT)
