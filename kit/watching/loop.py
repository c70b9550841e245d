"""Your own PyTorch loop, watched step by step: ``watch = kit.watch_loop(model, optimizer)``, then
``with watch.step():`` around each step.

>>> watch = kit.watch_loop(model, optimizer)          # doctest: +SKIP
>>> for batch in watch.batches(loader):               # doctest: +SKIP
...     with watch.step(batch):                       # one optimizer step: forward, backward, step, zero_grad
...         outputs = model(**batch)
...         outputs.loss.backward()
...         optimizer.step()
...         optimizer.zero_grad()
>>> print(watch.report)                               # doctest: +SKIP
Watched 3 steps of your loop, no out-of-memory error (0.9 s).

Each step's peak is read (CUDA max allocated, reset at each step; on a CPU with ``tensor_peak=True`` a
:class:`kit.measure.tensor_peak.TensorPeak`, every op watched), step 1 (no optimizer state yet) apart from the
later steps, and set beside :func:`kit.estimate.estimate` of the model (read by
:func:`kit.estimate.read_model.read_model`), the first batch's shape and the optimizer, with the same live plot
as ``kit.watch``. What the loop holds beyond what Trainer holds is detected where it can be and said:
``outputs_kept`` (the outputs' logits still alive at ``optimizer.step()``), ``grads_kept`` (gradients not None
when a later step begins: ``zero_grad(set_to_none=False)``), and ``grad_accum`` (the forward passes, with grad,
between two ``optimizer.step()`` calls: micro-batches 2 on hold the accumulated gradients), and ``precision`` (the
dtype the model's forward ran in under ``torch.autocast``, as Trainer's mixed precision). Options given to
:func:`watch_loop` win, and the report's answer says what the loop was judged at where it is not fp32 with one
micro-batch a step. accelerate's ``AcceleratedOptimizer`` is watched through the optimizer it wraps.

**A step is an optimizer step.** ``watch.step()`` may wrap each micro-batch (PyTorch's AMP recipe: ``loss.backward()``
every micro-batch, ``optimizer.step()`` every 4th) or a whole optimizer step. A step is judged once its
``optimizer.step()`` has run, when its micro-batches are counted: its peak is its highest micro-batch's, set beside
the estimate at that count. Step 1 is the first optimizer step this watch sees with no optimizer state; an optimizer
that never keeps state (SGD without momentum) still has one step 1.

**An out-of-memory error inside a step** is caught (never raised; :mod:`kit.watching.core`, as in ``kit.train``):
the report (``watch.report``: the step, the phase, what was alive by component beside the estimate, the largest
tensors and what held them, the advisor's top changes) is printed, the failed step's frames, the gradients and the
optimizer state are released, and :meth:`LoopWatch.batches` ends the loop. The model and the optimizer stay usable
(the optimizer's next step starts its state afresh). **Ctrl-C** (a ``KeyboardInterrupt``) inside a step releases
the step's frames and the gradients, keeps the optimizer's state, says so, and propagates. Any other exception
propagates, after the same tidy-up as ``kit.train``'s.

Phases, as ``kit.train`` names them: a step begins in ``first_forward_backward`` (no optimizer state yet) or
``forward_backward``; ``optimizer.step()`` (a step pre-hook) is ``first_optimizer_step`` / ``optimizer_step``;
after it, ``after_step``.
"""
from __future__ import annotations

import contextlib
import gc
import time
import weakref

import torch

from kit import machine
from kit.estimate import estimate as predict
from kit.estimate.read_model import read_model
from kit.inputs import InputError, flag
from kit.measure import device
from kit.measure.tensor_peak import TensorPeak
from kit.measure.track import Tracker
from kit.presets import resolve_device
from kit.training_setup import KEYWORDS, read_value
from kit.watching.core import (Run, Stops, advise_option, estimate_option, limit_option, live_plot, plot_folder,
                               plot_note, redraw, top_option)
from kit.watching.draw import draw_steps
from kit.watching.objects import StepPeak, batch_shape, has_padding, optimizer_name, own_lengths
from kit.watching.report import TrainReport

_WATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> its LoopWatch (one a model)
_DETECTED = ("outputs_kept", "grads_kept")


class LoopWatch:
    """What :func:`watch_loop` attached to a model and its optimizer (see the module doc).

    ``steps``: a :class:`StepPeak` per completed optimizer step (its micro-batches' highest peak); ``estimate`` (or
    None, with ``estimate_error``); ``assumed``: each loop option the estimate took, ``(value, how it was known)``;
    ``report``: the :class:`~kit.watching.report.TrainReport` (after an OOM, the one that stopped the loop);
    ``tracker`` and ``live`` (the LivePlot, or None); ``options``: what it was made with. ``close()`` removes the
    hooks.
    """

    def __init__(self, model, optimizer, options: dict):
        # held weakly: _WATCHES is keyed by the model, and the hooks hold this watch (the model's lifetime is yours)
        self._model, self._optimizer = weakref.ref(model), weakref.ref(optimizer)
        self.made_optimizer = self.made_scheduler = False       # the user's own: kept (recover.release)
        self.options_given = dict(options)
        self.want_estimate, self.given = options["estimate"], dict(options["setup"])
        self.tensor_peak, self.advise_device = options["tensor_peak"], options["advise_device"]
        self.top = options["top"]
        self.steps: list[StepPeak] = []
        self.estimate, self.estimate_error, self.assumed = None, None, {}
        self.shape, self.padded, self.options = None, None, None
        self.step_no, self.phase, self.stopped, self._oom_report = 0, "setup", False, None
        self._logits, self._kept_seen, self._grads_seen, self._said = None, None, None, False
        self._forwards, self._accum_seen = 0, None     # forwards with grad since the last optimizer step; per step
        self._autocast_seen = None                     # the dtype the model's forward ran under autocast in, or "fp32"
        self._optimizer_steps, self._micro = 0, []     # optimizer steps seen; this one's micro-batches (peak, shape)
        self._step_shape, self._at_shape = None, {}     # this micro-batch's batch shape; estimates at other shapes
        self._inside = False
        self.t0 = time.perf_counter()
        limit_bytes, limit_label = options["limit_bytes"], options["limit_label"]
        if limit_bytes is None:
            here, _ = resolve_device("this", cpu_ok=True)
            limit_bytes, limit_label = (here.gpu_bytes, here.label) if here.gpu_bytes else \
                (here.ram_bytes, "this machine's RAM")
        self.limit_bytes, self.limit_label = limit_bytes, limit_label
        self.tracker = Tracker()
        self.live = live_plot(options["plot"], self.tracker, self.draw, "loop")
        self._hooks = [model.register_forward_pre_hook(self._forward_begins, with_kwargs=True),
                       model.register_forward_hook(self._forward_ends),
                       optimizer.register_step_pre_hook(self._optimizer_begins),
                       optimizer.register_step_post_hook(self._optimizer_ends)]

    @property
    def model(self):
        return self._model()

    @property
    def optimizer(self):
        return self._optimizer()

    # hooks: the phase, the batch's shape, autocast, and whether the outputs outlive the backward -----------------
    def _forward_begins(self, module, args, kwargs):
        if torch.is_grad_enabled():
            self._forwards += 1
            self._read_autocast(module)
        if self.shape is None or self._step_shape is None:
            batch = kwargs if "input_ids" in kwargs else (args[0] if args else None)
            self._step_shape = self._step_shape or batch_shape(batch)
            if self.shape is None:
                self.shape, self.padded = batch_shape(batch), has_padding(batch) if isinstance(batch, dict) else None

    def _read_autocast(self, module) -> None:
        """The dtype the model's matmuls run in under ``torch.autocast`` (on the device its weights are on), as
        Trainer's mixed precision: read at each forward with grad, and the estimate made again when it changes."""
        where = next((p.device.type for p in module.parameters()), "cpu")
        kind = autocast_precision(where)
        if kind != self._autocast_seen and "precision" not in self.given:
            self._autocast_seen, self.estimate = kind, None    # estimated again at the micro-batch's end

    def _forward_ends(self, module, args, output):
        logits = output.get("logits") if isinstance(output, dict) else getattr(output, "logits", None)
        self._logits = weakref.ref(logits) if isinstance(logits, torch.Tensor) else None

    def _optimizer_begins(self, opt, args, kwargs):
        self.phase = "first_optimizer_step" if self.phase == "first_forward_backward" else "optimizer_step"
        if self._forwards and self._forwards != self._accum_seen and "grad_accum" not in self.given:
            self._accum_seen, self.estimate = self._forwards, None     # estimated again at the step's end
        self._forwards = 0
        if self._logits is not None and self._kept_seen is None:
            self._kept_seen = self._logits() is not None     # the outputs outlived loss.backward()

    def _optimizer_ends(self, opt, args, kwargs):
        self.phase = "after_step"
        self._optimizer_steps += 1
        if not self._inside and self._micro:    # optimizer.step() outside watch.step(): its micro-batches end here
            self._close_step()

    # the estimate ---------------------------------------------------------------------------------------------
    def _options(self) -> dict:
        opts, self.assumed = {}, {}
        seen = {"outputs_kept": (self._kept_seen, ("the outputs' logits were alive at optimizer.step()" if
                                 self._kept_seen else "the outputs' logits were freed before optimizer.step()")),
                "grads_kept": (self._grads_seen, "gradients were allocated when a later step began "
                               "(zero_grad(set_to_none=False))" if self._grads_seen else
                               "gradients were None when a later step began (zero_grad(set_to_none=True))")}
        for k in _DETECTED:
            if k in self.given:
                self.assumed[k] = (self.given[k], "given to kit.watch_loop")
            elif seen[k][0] is not None:
                opts[k] = seen[k][0]
                self.assumed[k] = (seen[k][0], f"detected: {seen[k][1]}")
            else:
                self.assumed[k] = (False, "assumed, not seen yet" + (" (known from step 2 on)"
                                                                     if k == "grads_kept" else ""))
        self._accum_option(opts)
        self._precision_option(opts)
        return opts

    def _accum_option(self, opts: dict) -> None:
        if "grad_accum" in self.given:
            self.assumed["grad_accum"] = (self.given["grad_accum"], "given to kit.watch_loop")
        elif self._accum_seen is not None:
            opts["grad_accum"] = self._accum_seen
            passes = f"{self._accum_seen} forward pass{'es' if self._accum_seen > 1 else ''}"
            self.assumed["grad_accum"] = (self._accum_seen, f"detected: {passes} per optimizer step")
        else:
            self.assumed["grad_accum"] = (1, "assumed, not seen yet (known at the first optimizer.step())")

    def _precision_option(self, opts: dict) -> None:
        if "precision" in self.given:
            self.assumed["precision"] = (self.given["precision"], "given to kit.watch_loop")
        elif self._autocast_seen is None:
            self.assumed["precision"] = ("fp32", "assumed, not seen yet (known at the model's first forward)")
        elif self._autocast_seen == "fp32":
            self.assumed["precision"] = ("fp32", "detected: the model's forward ran without torch.autocast")
        else:
            opts["precision"] = self._autocast_seen
            self.assumed["precision"] = (self._autocast_seen, "detected: the model's forward ran under torch.autocast "
                                                              f"({DTYPE_NAMES[self._autocast_seen]})")

    def _make_estimate(self) -> None:
        if self.want_estimate is False or self.shape is None:
            if self.shape is None and self.want_estimate is True:
                self.estimate_error = "no batch shape yet (pass the batch: watch.step(batch))"
            return
        if self.want_estimate is not True:
            self.estimate = self.want_estimate
            return
        try:
            target, mopts, _, mnotes = read_model(self.model)
            opts = {k: v for k, v in mopts.items() if k in KEYWORDS}
            opts.update(self._options())
            if "optimizer" not in self.given:
                opts["optimizer"] = optimizer_name(self.optimizer)
            if self.padded is not None:
                opts["padded"] = self.padded
            opts.update(batch_size=self.shape[0], seq_len=self.shape[1], device=machine.device_name())
            opts.update(self.given)
            self.estimate, self.estimate_error = predict(target, **opts), None
            self.estimate.notes.extend(mnotes)
            # what the advisor is given (it rebuilds the setup); a model read as itself is held weakly: the watch,
            # a value of _WATCHES, must never keep its key (the user's model) alive
            self.options, self._target = opts, _weak(target)
        except ValueError as exc:
            self.estimate, self.estimate_error = None, f"{type(exc).__name__}: {exc}"
            if not self._said:
                print(f"kit.watch_loop: no estimate of this model ({self.estimate_error}); the plot shows the "
                      "measurement alone.", flush=True)
                self._said = True

    # one step ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def step(self, batch=None):
        """Watch one micro-batch, or a whole optimizer step (see the module doc): a step is judged once its
        ``optimizer.step()`` has run, at its highest micro-batch. ``batch`` gives the estimate its shape before the
        step runs (else the model's first forward does, and the estimate comes at the step's end)."""
        if self.stopped:
            raise RuntimeError(f"kit.watch_loop: this watch stopped at step {self._oom_report.step} with an "
                               "out-of-memory error (print(watch.report)); loop over watch.batches(loader) to end "
                               "there, or make a new watch: kit.watch_loop(model, optimizer).")
        n, fresh = self._optimizer_steps + 1, self._fresh()
        # zero_grad(set_to_none=False) left them allocated; read where no micro-batch is accumulating (grad_accum)
        if not fresh and "grads_kept" not in self.given and not self._forwards:
            grads = any(p.grad is not None for p in self.model.parameters() if p.requires_grad)
            if grads != self._grads_seen:
                self._grads_seen, self.estimate = grads, None    # estimated again with what was seen
        self._step_shape = batch_shape(batch) if batch is not None else None
        if batch is not None and self.shape is None:
            self.shape, self.padded = batch_shape(batch), has_padding(batch)
        if self.estimate is None:
            self._make_estimate()
        self.step_no, self.phase = n, "first_forward_backward" if fresh else "forward_backward"
        exact = self.tensor_peak and not machine.has_cuda()
        if machine.has_cuda():
            device.reset_peak()       # counted: the tracker knows the peak was reset
        if exact:
            gc.collect()      # garbage waiting in reference cycles (an earlier model) is not this step's memory
        meter = TensorPeak() if exact else contextlib.nullcontext()
        self._inside = True
        with Stops(LoopRun(self)) as stops:
            try:
                with meter:
                    yield self
            finally:
                self._inside = False
        if stops.report is not None:
            self._stopped(stops.report)
            return
        self._micro.append((meter.peak_bytes if exact else device.peak_allocated_bytes(), self._step_shape, fresh))
        if self._optimizer_steps >= n:           # its optimizer.step() ran: the step is complete
            self._close_step()

    def _fresh(self) -> bool:
        """Whether the step about to run is a first one: no optimizer step seen by this watch, and no optimizer state
        (an optimizer stepped before the watch has some). SGD without momentum keeps none: its first step is still
        the first only."""
        return self._optimizer_steps == 0 and len(getattr(self.optimizer, "state", {})) == 0

    def _close_step(self) -> None:
        """One optimizer step done: its peak is its micro-batches' highest, judged with the micro-batches counted."""
        n = self._optimizer_steps
        peaks = [p for p, _, _ in self._micro if p is not None]
        shapes = [s for _, s, _ in self._micro if s is not None]
        first = self._micro[0][2]
        self._micro = []
        if self.estimate is None or (n == 1 and self._kept_seen and "outputs_kept" not in self.given):
            self.estimate = None
            self._make_estimate()
        shape = max(shapes, key=lambda s: s[0] * s[1], default=None)
        self.steps.append(StepPeak(n, first, max(peaks, default=None), time.time(), shape,
                                   self._estimate_at(shape, first)))
        self.tracker.sample(n, live_tensors=False, event="step")
        if n <= 2:    # the first step and the first later one, always drawn
            redraw(self.live)

    def _estimate_at(self, shape, first: bool) -> int | None:
        """The estimate's figure (step 1's, or the later steps') at a step's own batch shape: the watch's estimate
        where the shape is the one it was made at, else the same options at this shape (once per shape)."""
        est = self.estimate
        if est is None or shape is None:
            return None
        if shape != (est.setup.get("batch_size"), est.setup.get("seq_len")) and self.options is not None:
            key = (shape, repr(sorted(self.options.items(), key=str)))
            if key not in self._at_shape:
                try:
                    self._at_shape[key] = predict(self._target(), **dict(self.options, batch_size=shape[0],
                                                                           seq_len=shape[1]))
                except ValueError:
                    self._at_shape[key] = None
            est = self._at_shape[key]
        if est is None:
            return None
        return est.first_step_peak_bytes if first else est.peak_bytes

    def batches(self, iterable):
        """Yield from ``iterable`` until an out-of-memory error stops the watch (then the loop ends).

        >>> w = LoopWatch.__new__(LoopWatch); w.stopped = False
        >>> list(w.batches([1, 2]))
        [1, 2]
        """
        for item in iterable:
            if self.stopped:
                return
            yield item

    def _restart_accumulation(self) -> None:
        """After Ctrl-C or an OOM the gradients are gone: the micro-batches of the step they held start again."""
        self._forwards, self._micro = 0, []

    def _stopped(self, report: TrainReport) -> None:
        self._restart_accumulation()
        self.stopped, self._oom_report = True, report
        print(report, flush=True)

    def _assumption_notes(self) -> list:
        return [f"the estimate took {k}={v!r}: {how}" for k, (v, how) in self.assumed.items()]

    def _judged_at(self) -> str | None:
        """What the answer says the loop was judged at, where it is not plain fp32 with one micro-batch a step."""
        said = []
        accum, how = self.assumed.get("grad_accum", (1, ""))
        if accum and accum != 1:
            said.append(f"{accum} micro-batches per optimizer step ({how.split(':')[0]})")
        precision, how = self.assumed.get("precision", ("fp32", ""))
        if precision != "fp32":
            said.append(f"{precision} autocast ({how.split(':')[0]})")
        return ", ".join(said) or None

    # what it read -------------------------------------------------------------------------------------------
    @property
    def report(self) -> TrainReport:
        """The run so far: each part's peak beside the estimate, or the out-of-memory report that stopped it."""
        if self._oom_report is not None:
            return self._oom_report
        est, exact = self.estimate, self.tensor_peak or machine.has_cuda()
        r = TrainReport(oom=False, error=None, step=len(self.steps), phase=self.phase, reading=device.best_reading(),
                        seconds=time.perf_counter() - self.t0, tracker=self.tracker, by="kit.watch_loop")
        r.judged_at = self._judged_at()
        first = [s.peak_bytes for s in self.steps if s.first and s.peak_bytes is not None]
        later = [s.peak_bytes for s in self.steps if not s.first and s.peak_bytes is not None]
        r.first_step_peak_bytes, r.later_steps_peak_bytes = max(first, default=None), max(later, default=None)
        train = [x for x in (r.first_step_peak_bytes, r.later_steps_peak_bytes) if x is not None]
        r.measured_peak_bytes, r.peak_exact = max(train, default=None), bool(exact and train)
        if est is not None:
            r.estimate_peak_bytes, r.estimate_first_step_bytes = est.peak_bytes, est.first_step_peak_bytes
        r.notes += self._assumption_notes() + own_lengths(self.steps) + plot_note(self.live)
        if self._micro:
            r.notes.append(f"{len(self._micro)} micro-batch{'es' if len(self._micro) > 1 else ''} since the last "
                           "optimizer.step() are not judged yet: a step is judged once its optimizer.step() has run")
        if est is None:
            r.notes.append(f"no estimate beside the measurement: {self.estimate_error or 'not asked for'}")
        return r

    def draw(self, tracker=None):
        """The live plot: :func:`kit.watching.draw.draw_watch` with each step's measured peak marked."""
        return draw_steps(tracker or self.tracker, self.steps, self.estimate, self.limit_bytes, self.limit_label)

    def close(self) -> None:
        """Remove the hooks from the model and the optimizer, and draw the plot one last time."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.tracker.samples:
            redraw(self.live)
        if _WATCHES.get(self.model) is self:
            del _WATCHES[self.model]

    def __repr__(self) -> str:
        return f"<kit.watch_loop: {len(self.steps)} steps{', stopped by an OOM' if self.stopped else ''}>"


class LoopRun(Run):
    """What :mod:`kit.watching.core` needs of a loop's watch: it holds the model and the optimizer itself, keeps the
    optimizer's state on Ctrl-C (the loop trains on), and its report carries what the estimate assumed."""

    by = "kit.watch_loop"
    keeps_state = True
    after_interrupt = ("The kernel is usable; the optimizer's state is kept (your training so far), and the model and "
                       "the optimizer train on.")

    def __init__(self, watch: LoopWatch):
        super().__init__(watch, watch, top=watch.top, advise_device=watch.advise_device)
        self.t0 = watch.t0

    def where(self) -> tuple[int, str]:
        return self.watch.step_no, self.watch.phase

    def prepare(self) -> None:
        if self.watch.estimate is None:
            self.watch._make_estimate()

    def advice_input(self):
        w = self.watch
        return dict(w.options, model=w._target()) if w.options is not None else w.estimate

    def notes(self) -> list:
        return self.watch._assumption_notes() + plot_note(self.watch.live)

    def on_interrupt(self) -> None:
        self.watch._restart_accumulation()


def autocast_precision(device_type: str) -> str:
    """The kit's precision for the autocast state now on ``device_type``: "bf16" or "fp16" where ``torch.autocast``
    is on (the dtype matmuls run in), else "fp32".

    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     autocast_precision("cpu")
    'bf16'
    >>> autocast_precision("cpu")
    'fp32'
    """
    if not torch.is_autocast_enabled(device_type):
        return "fp32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(torch.get_autocast_dtype(device_type), "fp32")


DTYPE_NAMES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_DEFAULTS = dict(plot=None, estimate=True, limit_bytes=None, limit_label="limit", tensor_peak=False,
                 advise_device=None, top=5)


def watch_loop(model, optimizer, *, plot=None, estimate=True, limit_bytes: int | None = None,
               limit_label: str = "limit", tensor_peak: bool = False, advise_device=None, top: int = 5,
               **setup) -> LoopWatch:
    """Watch a plain PyTorch training loop of ``model`` and ``optimizer``: ``with watch.step(batch):`` around each
    micro-batch, or each optimizer step (see the module doc). Every option is checked here, before the loop runs.

    A second call for the same model and optimizer returns the first watch, unless it stopped (an OOM) or was closed,
    or the call gives an option the first did not have: then a new watch with the new options replaces the first
    (whose hooks come off; its steps stay in its own report), and one line says so.

    - ``plot``: None draws in a notebook only; a folder saves PNGs there; False draws nothing.
    - ``estimate``: True estimates from the model, the first batch and the optimizer; an Estimate is used as
      given; False sets none beside the readings.
    - ``tensor_peak``: on the CPU, watch every op, so each step's peak is exact (slower); on CUDA, max allocated.
    - ``**setup``: :func:`kit.estimate.estimate` options that win over what is read or detected
      (``precision="bf16"``, ``grad_accum=4``, ``outputs_kept=True``, ``grads_kept=True``, ...). Without them the
      precision is read from ``torch.autocast`` around the model's forward, and the micro-batches are counted
      between two ``optimizer.step()`` calls.

    >>> model = kit.models.build_model("tiny-llama"); opt = torch.optim.AdamW(model.parameters())   # doctest: +SKIP
    >>> watch = watch_loop(model, opt, tensor_peak=True)                                        # doctest: +SKIP
    >>> with watch.step(batch):                                                                 # doctest: +SKIP
    ...     model(**batch).loss.backward(); opt.step(); opt.zero_grad()
    >>> watch.steps[0].first                                                                    # doctest: +SKIP
    True
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError("model", f"kit.watch_loop takes the torch.nn.Module you train, not a {type(model).__name__}.")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InputError("optimizer", "kit.watch_loop takes the torch.optim.Optimizer your loop steps, not a "
                                      f"{type(optimizer).__name__}.")
    optimizer = _stepped(optimizer)
    options = _checked(plot=plot, estimate=estimate, limit_bytes=limit_bytes, limit_label=limit_label,
                       tensor_peak=tensor_peak, advise_device=advise_device, top=top, setup=setup)
    old = _WATCHES.get(model)
    if old is not None and old.optimizer is optimizer and not old.stopped and old._hooks:
        changed = _changed(old.options_given, options)
        if not changed:
            return old
        old.close()
        print(f"kit.watch_loop: a new watch of this model replaces the one made before, for "
              f"{', '.join(f'{k}={v!r}' for k, v in changed.items())} (the old watch's {len(old.steps)} steps stay in "
              "its own report).", flush=True)
    w = LoopWatch(model, optimizer, options)
    _WATCHES[model] = w
    return w


def _checked(*, setup: dict, **options) -> dict:
    """Every option of :func:`watch_loop`, checked now (each refused in one sentence that names it)."""
    unknown = sorted(set(setup) - set(KEYWORDS))
    if unknown:
        raise InputError(unknown[0], f"kit.watch_loop does not know {', '.join(unknown)}: its estimate options are "
                                     f"{', '.join(KEYWORDS)}.")
    limit_bytes, limit_label = limit_option(options["limit_bytes"], options["limit_label"])
    return dict(plot=plot_folder(options["plot"], "kit.watch_loop"),
                estimate=estimate_option(options["estimate"], "kit.watch_loop"), limit_bytes=limit_bytes,
                limit_label=limit_label, tensor_peak=flag("tensor_peak", options["tensor_peak"]),
                advise_device=advise_option(options["advise_device"]), top=top_option(options["top"]),
                setup={name: read_value(name, value) for name, value in setup.items()})


def _changed(old: dict, new: dict) -> dict:
    """The options of ``new`` given (not left at their default) that differ from ``old``'s: a call with none given
    (``kit.step(model, optimizer, batch)``) finds the watch as it is."""
    out = {k: v for k, v in new.items() if k != "setup" and v is not _DEFAULTS[k] and v != _DEFAULTS[k]
           and v != old[k]}
    out.update({k: v for k, v in new["setup"].items() if old["setup"].get(k, _UNSEEN) != v})
    return out


_UNSEEN = object()


def step(model, optimizer, batch=None, **kwargs):
    """``with kit.step(model, optimizer, batch):`` around one step: :func:`watch_loop`'s watch of this model and
    optimizer (made at the first call, reused after), its :meth:`LoopWatch.step`. Read it with
    ``kit.watch_loop(model, optimizer).report``.

    >>> with step(model, optimizer, batch):          # doctest: +SKIP
    ...     model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
    """
    return watch_loop(model, optimizer, **kwargs).step(batch)


def _weak(obj):
    """A function returning ``obj``: through a weak reference where ``obj`` is a module."""
    return weakref.ref(obj) if isinstance(obj, torch.nn.Module) else lambda: obj


def _stepped(optimizer):
    """The optimizer whose step runs. accelerate's ``AcceleratedOptimizer`` passes ``isinstance(torch.optim.Optimizer)``
    but never ran ``Optimizer.__init__``, so it has no step hooks of its own: its ``.optimizer`` is hooked instead (its
    ``step()`` calls that one's)."""
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and not hasattr(optimizer, "_optimizer_step_pre_hooks"):
        return inner
    return optimizer
