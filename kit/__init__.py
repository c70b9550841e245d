"""The memory kit: predict, measure and fix memory when fine-tuning language models.

One package per concept (docs/layout.md is the map): ``estimate`` (the prediction), ``measure`` (the
readings, stages, cleanup and leaks), ``advise`` (what fits, and ``check``), ``plot``, ``watching`` (the
user's own run), ``widgets`` (the panel), ``scenarios`` (the worked cases), ``cli`` (``python -m kit``), over
the foundations (``units``, ``inputs``, ``training_setup``, ``presets``, ``dtypes``, ``machine``, ``runtime``,
``models``, ``vocab_head``, ``model_configs``, ``data``). The faces: ``kit.panel(scenario=1)`` builds the widget
panel; ``kit.check(trainer)`` prints what a built Trainer will need; ``kit.watch(trainer)`` adds a live memory plot to
it and ``kit.train(trainer)`` runs it, returning a report on an out-of-memory error; ``kit.watch_loop(model,
optimizer)`` watches a plain PyTorch loop (``with watch.step(batch):`` each step); ``kit.free(globals())``
releases what a notebook made; ``%load_ext kit`` prints a
memory reading under each notebook cell. ``from kit.estimate import estimate`` predicts one setup.
"""
import functools
import logging as _logging

__version__ = "0.1.0"

# Where the kit is published. The notebooks' Open-in-Colab badges and install cells
# use this URL; tests/test_notebooks.py checks that they agree with it.
REPO_URL = "https://github.com/memory-kit/memory-kit"

# bitsandbytes on an AVX512-bf16 CPU looks for an optional 4-bit kernel on the Hub when it is first imported (peft
# and transformers import it) and, without it, logs a warning to stderr and runs its plain CPU path, with the same
# results. The line depends on the machine, not the run, and a notebook cell's stderr fails nbval, so it is quieted
# here, before anything imports bitsandbytes: the logger is only named, not imported.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)


class _OptionalBitsandbytesKernel(_logging.Filter):
    """Where the `kernels` package is installed (transformers >= 5.25 requires it), that Hub lookup goes through it,
    and offline it first logs that it skips the publisher trust check for bitsandbytes' optional kernel. Only that
    line is dropped: the check skipped for any other kernel is still said."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return "kernels-community/quantization-bitsandbytes" not in record.getMessage()


_logging.getLogger("kernels._internals.hf_hub").addFilter(_OptionalBitsandbytesKernel())


def __getattr__(name):
    # `kit.panel(scenario=1|2)` (the contract docs/cli-and-api.md documents), imported on first use so that
    # `import kit` stays light (no ipywidgets, no torch.cuda).
    if name == "panel":
        import kit.scenarios.stories  # noqa: F401  (gives each scenario's panel its story)
        from kit.widgets import panel

        return panel
    if name == "check":  # `kit.check(trainer)`: the estimate, its verdict and where each setting was read
        from kit.advise import check

        return _judged_here(check)
    if name in ("watch", "train"):  # `kit.watch(trainer)`, `report = kit.train(trainer)`: the user's own run
        # (the module is kit.watching.trainer: a submodule named kit.watch would take the function's name on import)
        from kit.watching import trainer as watching

        return getattr(watching, name)
    if name == "free":  # `print(kit.free(globals()))`: release what a notebook made, and say what came back
        from kit.measure.cleanup import free

        return free
    if name in ("watch_loop", "step"):  # your own PyTorch loop: `with kit.watch_loop(model, opt).step(batch):`
        from kit.watching import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext kit``: a one-line memory reading under each cell (see :mod:`kit.measure.cells`)."""
    from kit.measure.cells import load

    load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext kit``: stop the cell readings."""
    from kit.measure.cells import unload

    unload(ipython)


@functools.cache
def _judged_here(check):
    """``kit.check``: :func:`kit.advise.check.check` (its signature and doc), judged with the runtime's own RAM
    measured in this session where the session runs on the machine judged (:func:`kit.measure.session.
    session_preset`); prediction itself never measures."""

    @functools.wraps(check)
    def judged_here(trainer_or_estimate, device=None, **options):
        from kit.measure.session import session_preset

        return check(trainer_or_estimate, session_preset(device), **options)

    return judged_here
