"""The checkpointing and offloading options, read and checked: ``ckpt_every_n_layers`` and ``checkpoint_offload``
(transformers' ``activation_checkpointing_kwargs`` ``every_n_layers`` / ``offload``), ``activation_offloading``
(TRL's ``SFTConfig.activation_offloading``); the rules are :mod:`kit.estimate.replay.offload` and
:mod:`kit.estimate.replay.trl_offload`. What the user's objects say is read here too (:func:`from_ckpt_kwargs`,
:func:`from_model`).

>>> read({"ckpt_every_n_layers": 2, "checkpoint_offload": False, "activation_offloading": None})
{'ckpt_every_n_layers': 2}
"""
from __future__ import annotations

from kit.inputs import InputError, Note

from kit import inputs
from kit.units import fmt_bytes

OPTIONS = ("ckpt_every_n_layers", "checkpoint_offload", "activation_offloading")


def read(options: dict) -> dict:
    """The options as given to ``estimate()``, checked; only those that differ from the defaults."""
    every = inputs.whole_number("ckpt_every_n_layers", options.get("ckpt_every_n_layers", 1))
    out = {"ckpt_every_n_layers": every} if every != 1 else {}
    for k in OPTIONS[1:]:
        if inputs.flag(k, options.get(k) or False):
            out[k] = True
    return out


def refuse_offload(opts: dict, *, ckpt: bool) -> None:
    """Refuse, in one sentence, what these options cannot do (TRL's activation offloading is refused where it is
    not modeled by :func:`kit.estimate.trl.refuse_activation_offloading`)."""
    for k in ("ckpt_every_n_layers", "checkpoint_offload"):
        if opts.get(k) and not ckpt:
            raise InputError(k, f"{k} applies to gradient checkpointing, which is off here: set "
                                    "gradient_checkpointing=True, or leave it out.", code="offload-needs-ckpt")


def offload_notes(replay, opts: dict, host: int, device: str) -> list:
    """What the estimate took from these options, with the figures (``host``: the offloaded bytes)."""
    notes, L = [], replay.L
    every = opts.get("ckpt_every_n_layers", 1)
    if every > 1:
        on = [str(i) for i, l in enumerate(replay.layers, 1) if l.ckpt]
        which = ", ".join(on) if len(on) <= 4 else f"{', '.join(on[:3])}, ..., {on[-1]}"
        notes.append(Note(f"every_n_layers={every}: blocks {which} ({len(on)} of {L}) are checkpointed "
                          "(transformers: layer index % every_n_layers == 0); the others keep all they save",
                          field="ckpt_every_n_layers", code="ckpt-every-n-layers"))
    if opts.get("checkpoint_offload"):
        notes.append(Note(f"checkpoint offload: each checkpointed block's input goes to pinned host memory "
                          f"(save_on_cpu), {fmt_bytes(host)} at the forward's end (offloaded_bytes); the GPU "
                          "holds one block's copy back at its recompute", field="checkpoint_offload",
                          code="checkpoint-offload"))
    if opts.get("activation_offloading"):
        notes.append(Note(f"activation_offloading (TRL): {fmt_bytes(host)} of saved tensors in pinned host "
                          "memory at the forward's end (offloaded_bytes): each checkpointed block's input and "
                          "what the final norm, fused head and loss save; the GPU keeps tensors under 1 KiB, "
                          "second saves of a storage and the last five offloaded, and in backward one node's "
                          "copies brought back beside the last one's", field="activation_offloading",
                          code="trl-activation-offloading"))
    if device == "cpu":
        notes.append(Note("offload on a CPU: save_on_cpu(pin_memory=True) and TRL's offloader need an "
                          "accelerator; these are the figures of their rules with host and device one memory",
                          field="device", code="offload-on-cpu"))
    return notes


def from_ckpt_kwargs(ckpt_kwargs, name: str, attr: str) -> tuple:
    """(options, sources) from ``activation_checkpointing_kwargs``: ``every_n_layers`` and ``offload``, which
    ``Trainer.train`` pops before the rest goes to ``torch.utils.checkpoint`` (transformers trainer.py)."""
    opts, src = {}, {}
    if not isinstance(ckpt_kwargs, dict):
        return opts, src
    every = ckpt_kwargs.get("every_n_layers", 1)
    if every != 1:
        opts["ckpt_every_n_layers"] = inputs.whole_number("ckpt_every_n_layers", every)
        src["ckpt_every_n_layers"] = (every, f"{name}.{attr}['every_n_layers']")
    if ckpt_kwargs.get("offload"):
        opts["checkpoint_offload"] = True
        src["checkpoint_offload"] = (True, f"{name}.{attr}['offload'] (save_on_cpu around each checkpointed block)")
    return opts, src


def from_model(layers: list, checkpointed: list) -> tuple:
    """(options, sources) of a model whose checkpointing is on: which of its ``layers`` checkpoint
    (``checkpointed``), and whether their checkpoint function is transformers' offloading one (``checkpoint_func``
    under save_on_cpu)."""
    opts, src = {}, {}
    if checkpointed and len(checkpointed) != len(layers):
        flags = [m in checkpointed for m in layers]
        every = next((n for n in range(2, len(layers) + 1) if flags == [i % n == 0 for i in range(len(layers))]), None)
        if every is None:
            raise InputError("ckpt_every_n_layers",
                             f"{len(checkpointed)} of {len(layers)} blocks are checkpointed, not "
                             "every n-th from the first (activation_checkpointing_enable(every_n_layers=n)): the "
                             "kit models that pattern only; enable checkpointing with every_n_layers.")
        opts["ckpt_every_n_layers"] = every
        src["ckpt_every_n_layers"] = (every,
                                      f"the model's layers: {len(checkpointed)} of {len(layers)} checkpoint, every "
                                             f"{every}-th from the first")
    f = getattr(checkpointed[0], "_gradient_checkpointing_func", None) if checkpointed else None
    if getattr(getattr(f, "func", f), "__name__", "") == "checkpoint_func":
        opts["checkpoint_offload"] = True
        src["checkpoint_offload"] = (True, "the layers' checkpoint function (transformers' offload: save_on_cpu)")
    return opts, src
