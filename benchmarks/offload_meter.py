"""Measuring activation offloading where a CPU can: the offloaders' own code, run on the CPU, with the host copies
they make counted apart from the rest.

Neither offloader runs on a CPU as shipped, so each is given the one stand-in it needs, and nothing else changes:

- transformers' ``activation_checkpointing_kwargs={"offload": True}`` runs each checkpoint under
  ``save_on_cpu(pin_memory=True)``, whose ``pack_to_cpu`` pins where ``torch.cpu.is_available()`` (True on a CPU)
  and then fails: torch 2.13 has no pinned allocator without an accelerator ("pin_memory=True requires a CUDA or
  other accelerator backend"). :func:`save_on_cpu_unpinned` makes ``torch.cpu.is_available()`` False, so the same
  ``pack_to_cpu`` takes its other branch: ``torch.empty(...)`` and ``copy_``, a plain host copy.
- TRL's ``OffloadActivations`` reads ``torch.accelerator.current_accelerator().type`` (None on a CPU) and uses the
  accelerator's streams and pinned memory. :func:`trl_on_cpu` names the CPU its accelerator, gives it streams that
  do nothing (one CPU stream is already in order) and builds it with ``use_pin_memory=False``; its pack, stash,
  dedup and unpack logic run as on a GPU.

On a CPU the host is the device: a copy brought back for the backward is the host tensor itself
(``tensor.to("cpu")`` returns it). :class:`SplitPeak` counts the storages made while an offloader packs as host
copies, the rest as the device's, so a step gives the device's peak, the host's and their sum, which
:func:`expected` reads off the estimate (``kit.estimate.replay.cpu_figures``).
"""
from __future__ import annotations

import contextlib
import unittest.mock as um

import torch
from transformers import TrainerCallback

import estimate_vs_measured as bench
from kit.estimate import replay as act
from kit.measure.tensor_peak import TensorPeak


class SplitPeak(TensorPeak):
    """:class:`TensorPeak`, with the storages made while ``packing`` is set counted as host copies: the peaks of
    the rest (``device_peak``), of them (``host_peak``) and of both (``peak_bytes``); ``made``: their bytes."""

    def __init__(self):
        super().__init__()
        self.packing, self._host = False, set()
        self.host_current = self.host_peak = self.device_peak = self.made = 0

    def _add(self, storage) -> None:
        key = id(storage)
        new, old = key not in self._sizes, self._sizes.get(key, 0)
        super()._add(storage)
        if self.packing and new:
            self._host.add(key)
        if key in self._host:
            grown = self._sizes.get(key, 0) - old
            self.host_current += grown
            self.made += grown
        self.host_peak = max(self.host_peak, self.host_current)
        self.device_peak = max(self.device_peak, self.current_bytes - self.host_current)

    def _free(self, key: int) -> None:
        if key in self._host:
            self.host_current -= self._sizes.get(key, 0)
            self._host.discard(key)
        super()._free(key)


class SplitSteps(TrainerCallback):
    """Per optimizer step: ``device``, ``host`` and ``total`` peaks (the first two apart, as :class:`SplitPeak`),
    each on top of the weights, buffers and optimizer state held when the step begins, and ``made``: the host
    copies' bytes made in the step."""

    active = []   # the meter an offloader's pack reports to (one at a time)

    def __init__(self):
        self.steps, self.m = [], None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
        self.base = bench._held_bytes(model.parameters(), model.buffers(), bench._state_tensors(optimizer))
        self.m = SplitPeak()
        self.m.__enter__()

    def on_step_end(self, args, state, control, **kw):
        m, self.m = self.m, None
        m.__exit__(None, None, None)
        self.steps.append(dict(device=self.base + m.device_peak - m.start_bytes, host=m.host_peak,
                               total=self.base + m.peak_bytes - m.start_bytes, made=m.made))


def _metered(hooks):
    """``hooks`` (a saved_tensors_hooks) whose pack tells the active meter that what it makes is a host copy."""
    inner = hooks.pack_hook

    def pack(t):
        m = SplitSteps.active[-1].m if SplitSteps.active else None
        if m is not None:
            m.packing = True
        try:
            return inner(t)
        finally:
            if m is not None:
                m.packing = False

    hooks.pack_hook = pack
    return hooks


@contextlib.contextmanager
def save_on_cpu_unpinned():
    """transformers' ``offload=True`` on a CPU: ``save_on_cpu``'s own code, its pinning branch off."""
    import transformers.modeling_utils as mu

    class Metered(mu.save_on_cpu):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            _metered(self)

    with um.patch.object(torch.cpu, "is_available", lambda: False), um.patch.object(mu, "save_on_cpu", Metered):
        yield


class _Stream:
    def wait_stream(self, s):
        pass

    def record_event(self):
        return object()

    def wait_event(self, e):
        pass

    def synchronize(self):
        pass


class _CpuStreams:
    """The CPU as TRL's accelerator module: streams that do nothing."""

    Stream, _current = _Stream, _Stream()
    stream = staticmethod(lambda s: contextlib.nullcontext())
    current_stream = staticmethod(lambda: _CpuStreams._current)
    empty_cache = staticmethod(lambda: None)
    # accelerate 1.16's free_memory asks torch.accelerator.is_available(), which asks the current accelerator's
    # module: the CPU stands in for TRL's streams only, so accelerate finds no device cache to empty
    is_available = staticmethod(lambda: False)


@contextlib.contextmanager
def trl_on_cpu():
    """TRL's ``OffloadActivations`` on a CPU (build the SFTTrainer inside): the CPU as its accelerator, no pinning."""
    import trl.trainer.sft_trainer as sft

    build, device_module, record = sft.get_act_offloading_ctx_manager, torch.get_device_module, \
        torch.Tensor.record_stream

    def offloader(model, **kw):
        return _metered(build(model, use_pin_memory=False, **kw))

    with um.patch.object(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu")), \
            um.patch.object(torch, "get_device_module",
                            lambda d=None: _CpuStreams if str(d) == "cpu" else device_module(d)), \
            um.patch.object(torch.Tensor, "record_stream",
                            lambda t, s: None if t.device.type == "cpu" else record(t, s)), \
            um.patch.object(sft, "get_act_offloading_ctx_manager", offloader):
        yield


def measure(trainer) -> list:
    """Train ``trainer`` (its offloader set up by one of the stand-ins above) and return :class:`SplitSteps`'s."""
    meter = SplitSteps()
    SplitSteps.active.append(meter)
    trainer.add_callback(meter)
    try:
        trainer.train()
    finally:
        SplitSteps.active.remove(meter)
    return meter.steps


def expected(est, first: bool = False) -> dict:
    """What :class:`SplitSteps` should read for ``est`` (a ``device="cpu"`` estimate): the steady step's peaks, or
    the first's (no optimizer state in its backward), and ``host``, the copies alive at once.

    A later step's meter counts from what is alive when the step begins, less the weights, buffers and optimizer
    state it adds back: what TRL's offloader keeps from the last step (``trl_offload.Offloaded.later``) is alive
    then, so the meter reads it nowhere, where ``max_memory_allocated`` (reset at the step's start) counts it."""
    c = est.context
    g = c.grads
    ms = act.step_moments(c.rp, act.moments(
        c.rp, grads_embed=g["embed"], grads_block=g["block"] // c.L, grads_head=g["head"], wtemp_block=c.wtemp["block"],
        wtemp_head=c.wtemp["head"], head_half=c.wtemp["head"], tied=c.moved), not first)
    f = act.cpu_figures(ms)
    left = 0 if first or c.rp.trl is None else c.rp.trl.leftover
    held = est.weights_bytes + (0 if first else est.optimizer_bytes) + c.inputs - left
    return dict(device=max(held + f["device"], c.step), host=f["host"], total=max(held + f["total"], c.step))
