"""The panel's GPUs control and strategy choice (kit.estimate.strategies): the estimate becomes one GPU's of N.

The two controls go beside the device, shown under an "advanced" switch (:func:`advanced_switch`):
``controls["strategy"]`` (one GPU, DDP, FSDP, FSDP grad-op, ZeRO-1/2/3) and ``controls["num_gpus"]`` (1 to 64).
A Run stays one process on this machine, so it is refused while they describe more than one GPU
(``benchmarks/multi_gpu.py`` measures those).

>>> import ipywidgets as W
>>> c = gpu_controls(lambda kind, label, value, **kw: kind(value=value, description=label, **kw), {})
>>> c["num_gpus"].value = 4
>>> launch(c), launch_problem(c)[:30]
({'strategy': 'ddp', 'num_gpus': 4}, 'a Run here is one process: the')
"""
from __future__ import annotations

STRATEGY_CHOICES = [("one GPU", "single"), ("DDP (replicated)", "ddp"), ("FSDP (full shard)", "fsdp"),
                    ("FSDP grad-op (SHARD_GRAD_OP)", "fsdp-grad-op"), ("DeepSpeed ZeRO-1", "zero1"),
                    ("DeepSpeed ZeRO-2", "zero2"), ("DeepSpeed ZeRO-3", "zero3")]
GPU_CHOICES = (1, 2, 4, 8, 16, 32, 64)


def gpu_controls(control, setup: dict) -> dict:
    """``{"strategy": Dropdown, "num_gpus": Dropdown}``, made with the panel's ``control`` factory; ``setup``: the
    panel's options (``strategy``, ``num_gpus``). More than one GPU on "one GPU" switches to DDP, as
    ``accelerate launch --num_processes N`` does; back to one GPU, DDP switches back."""
    import ipywidgets as W

    c = {"strategy": control(W.Dropdown, "multi-GPU strategy", setup.get("strategy", "single"),
                             options=STRATEGY_CHOICES),
         "num_gpus": control(W.Dropdown, "GPUs", setup.get("num_gpus", 1), options=list(GPU_CHOICES))}

    def follow(change):
        if change["new"] > 1 and c["strategy"].value == "single":
            c["strategy"].value = "ddp"
        elif change["new"] == 1 and c["strategy"].value == "ddp":
            c["strategy"].value = "single"
    c["num_gpus"].observe(follow, names="value")
    return c


def advanced_switch(controls: dict, rows: dict, back_to_one):
    """The "advanced: more than one GPU" Checkbox: on, the strategy and GPUs ``rows`` show; off, they hide and
    ``back_to_one()`` is called. More than one GPU is for those who ask (a learner in smoke mode is not offered
    ZeRO-3 on 64 GPUs), so it starts off, unless the controls already describe more than one GPU."""
    import ipywidgets as W

    many = controls["strategy"].value != "single" or controls["num_gpus"].value != 1
    switch = W.Checkbox(value=many, description="advanced: more than one GPU", indent=False,
                        layout=W.Layout(width="440px"))

    def show(shown: bool) -> None:
        for k in ("strategy", "num_gpus"):
            rows[k].layout.display = None if shown else "none"

    def changed(change) -> None:
        show(change["new"])
        if not change["new"]:
            back_to_one()
    switch.observe(changed, names="value")
    show(many)
    return switch


def launch(controls: dict) -> dict:
    """estimate()'s ``strategy`` and ``num_gpus`` from the controls."""
    return {"strategy": controls["strategy"].value, "num_gpus": controls["num_gpus"].value}


def launch_problem(controls: dict) -> str | None:
    """Why a Run cannot measure this setup here (more than one GPU), or None."""
    s, n = controls["strategy"].value, controls["num_gpus"].value
    if s == "single" and n == 1:
        return None
    return (f"a Run here is one process: the estimate is per GPU of {n} under {s} (benchmarks/multi_gpu.py "
            "measures DDP and FSDP ranks)")
