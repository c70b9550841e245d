"""Test settings: offline, smoke sizes, and every tool's cache out of $HOME."""
import os
import tempfile

_tmp = tempfile.mkdtemp(prefix="kit-tests-")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KIT_SMOKE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
for var, sub in [
    ("HF_HOME", "hf"),
    ("MPLCONFIGDIR", "mpl"),
    ("IPYTHONDIR", "ipython"),
    ("JUPYTER_CONFIG_DIR", "jupyter-config"),
    ("JUPYTER_DATA_DIR", "jupyter-data"),
    ("JUPYTER_RUNTIME_DIR", "jupyter-runtime"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ("XDG_CACHE_HOME", "cache"),
]:
    os.environ.setdefault(var, os.path.join(_tmp, sub))
# Under pytest-xdist (make test runs one worker per core), one torch thread per worker: two workers of two
# threads each on two cores would fight over them. Notebook kernels and subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")

import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped without one")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # in case a plugin imported torch before the variables were set
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def work(tmp_path_factory, request):
    """A folder for one module's real-client runs (``benchmarks/real_clients.py``), with the tiny twins it saves
    under it (``KIT_CACHE``), restored when the module ends so that no other module reads those twins."""
    path = str(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KIT_CACHE", os.path.join(path, "twins"))
        yield path


@pytest.fixture
def run_kit(capsys, monkeypatch):
    """``python -m kit ARGS`` run in this process (``kit.cli.parser.main``, what ``kit/__main__.py`` runs), without
    the seconds a new process spends importing torch and transformers: ``run(*argv)`` -> (exit status, stdout,
    stderr). A test of the entry point itself (exit codes of the process, a closed pipe) runs a real process."""
    from kit.cli.parser import main

    monkeypatch.delenv("KIT_TRACEBACK", raising=False)

    def run(*argv):
        capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:   # argparse's own errors exit with 2
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run

