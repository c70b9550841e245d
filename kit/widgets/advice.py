"""The panel's fit advisor: "largest batch that fits" beside the batch slider, and, when the setup does
not fit, the advisor's top three changes under the verdict, each with an Apply button.

A control change costs what the panel's change budget allows (50 ms median, 200 ms at worst, of CPU at real
size: ``benchmarks/panel_latency.py``), so a change never runs a search or the advisor. It gives the largest
batch that fits (:func:`kit.advise.max_batch_size`: a bisection on the allocated estimate, then the
allocator's model replayed at the answer). The advisor (:func:`kit.advise.advise`, tens of ms to a second:
``benchmarks/advisor_latency.py``) runs when the "What makes it fit?" button is clicked, or once the controls
have rested for :data:`REST_S` seconds, in a thread of its own: a later change calls that search off
(``advise(cancelled=...)``) and the change never waits for it. Both judge the setup's reserved estimate (the
allocated peak plus the caching allocator's modelled gap), as ``python -m kit fit`` does, and say so.

A suggestion may change options the panel has no control for (``--load-dtype``, ``--lora-targets``,
``--grad-accum``, a LoRA rank off the list, LoRA on scenario 1's head). Apply sets the controls it can
and keeps the rest as *extra options*, listed under the advice with a Clear button; the estimate uses
them, and Run stays off while they are set (a run measures the controls' setup).

>>> view = AdviceView(apply=lambda options: None, rest_s=None)
>>> view.update(dict(model="tiny-llama", batch_size=64, seq_len=128, device="cpu"), 80_000_000, fits=False)
>>> view.largest_html.value.split("<b>")[1].split("</b>")[0], view.rows
('5', [])
>>> view.ask(); view.rows[0].cli
'--batch-size 4 --grad-accum 16'
"""
from __future__ import annotations

import gc
import html
import threading

import ipywidgets as W

from kit.inputs import InputError

from kit.advise.core import advise, limit_for, max_batch_size
from kit.advise.search import CLI, Cancelled, cli, cli_value
from kit.units import fmt_bytes

TOP = 3
REST_S = 0.8   # the controls rest this long, then the advisor runs on a setup that does not fit


def extra_text(extra: dict) -> str:
    """The extra options as the estimate CLI writes them.

    >>> extra_text({"load_dtype": "fp16", "lora_targets": ("custom_layer",)})
    '--load-dtype fp16 --lora-targets custom_layer'
    """
    return cli({CLI[k]: cli_value(v) for k, v in extra.items()})


class AdviceView:
    """``largest_html`` (beside the batch slider), ``widget`` (under the verdict): the header, one row per
    suggestion (an Apply button and its text), the extra options with Clear. ``advice``: the last
    :class:`kit.advise.Advice` (None until the advisor ran on this setup, or while it fits). ``apply(options)`` is
    called with a suggestion's estimate() options in full. ``rest_s``: seconds of rest before the advisor runs by
    itself (None: only on the button)."""

    def __init__(self, apply, clear=None, rest_s: float | None = REST_S):
        self._apply, self.advice, self.rows, self._asked, self._extra = apply, None, [], None, None
        self.rest_s = rest_s
        self._generation = 0          # bumped by every update: a search of an older one is called off
        self._timer = None            # the pending rest timer (a threading.Timer), or None
        self._lock = threading.Lock()
        self.largest_html = W.HTML(value="")
        self.header = W.HTML(value="")
        self.buttons = [W.Button(description="Apply", icon="check", layout=W.Layout(width="80px"))
                        for _ in range(TOP)]
        self.texts = [W.HTML(value="", layout=W.Layout(width="780px")) for _ in range(TOP)]
        for i, b in enumerate(self.buttons):
            b.on_click(lambda _button, index=i: self.apply(index))
        self.extra_html = W.HTML(value="")
        self.clear_button = W.Button(description="Clear", icon="times", layout=W.Layout(width="80px"),
                                     tooltip="drop the options the controls cannot show")
        if clear is not None:
            self.clear_button.on_click(lambda _button: clear())
        self._lines = [W.HBox([b, t]) for b, t in zip(self.buttons, self.texts)]
        self._extra_row = W.HBox([self.clear_button, self.extra_html])
        self.ask_button = W.Button(description="What makes it fit?", icon="search", layout=W.Layout(width="180px"),
                                   tooltip="run the fit advisor on this setup now")
        self.ask_button.on_click(self.ask)
        self.wait_html = W.HTML(value="")
        self._ask_row = W.HBox([self.ask_button, self.wait_html])
        self.widget = W.VBox([])
        self.widget.add_class("kit-advice")

    def apply(self, index: int) -> None:
        """Apply suggestion ``index`` (0 = the cheapest)."""
        if index < len(self.rows):
            self._apply(self.rows[index].options)

    def update(self, options: dict | None, device, *, fits: bool, extra: dict | None = None) -> None:
        """A control changed: the largest batch for estimate() ``options`` (None: no estimate) on ``device`` (a
        Preset or bytes), and the advisor called off; where the setup does not fit, it is asked again once the
        controls rest (or on the button)."""
        self._call_off()
        self.advice, self.rows, self._asked, self._extra = None, [], None, extra
        self.largest_html.value = ""
        if options is not None:
            try:
                n = max_batch_size(options, device)
                self.largest_html.value = (
                    f"<span class='kit-largest' style='font-size:85%'>largest batch that fits: <b>{n}</b>"
                    " (its reserved estimate judged, the margin kept)</span>" if n else
                    "<span class='kit-largest' style='font-size:85%;color:#D55E00'>not even batch 1 fits</span>")
                if not fits:
                    self._asked = (options, device)
                    self._rest_then_ask()
            except (InputError, ValueError) as exc:   # an option the advisor cannot take: said, not raised
                self.largest_html.value = (f"<span style='font-size:85%;color:#555'>advisor: "
                                           f"{html.escape(str(exc))}</span>")
        self._render(device if options is not None else None)

    def _call_off(self) -> None:
        """A control moved: the pending rest timer stops, and a search under way stops at its next estimate."""
        with self._lock:
            self._generation += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _rest_then_ask(self) -> None:
        if self.rest_s is None:
            return
        generation = self._generation
        with self._lock:
            self._timer = threading.Timer(self.rest_s, self._search, args=(generation,))
            self._timer.daemon = True
            self._timer.start()

    def wait(self, timeout: float | None = 60.0) -> None:
        """Wait for the advisor that the rest of the controls started (tests and scripts; a notebook never waits)."""
        timer = self._timer
        if timer is not None:
            timer.join(timeout)

    def ask(self, _button=None) -> None:
        """Run the advisor on the setup that does not fit, now (the button; the rest timer runs it in a thread)."""
        self._call_off()
        self._search(self._generation)

    def _search(self, generation: int) -> None:
        if self._asked is None or generation != self._generation:
            return
        options, device = self._asked
        self.wait_html.value = "<span style='font-size:85%;color:#555'>the advisor is searching…</span>"
        try:
            advice = advise(options, device, cancelled=lambda: generation != self._generation)
        except Cancelled:
            return
        finally:
            self.wait_html.value = ""
            # The search leaves many objects behind for Python's cycle collector; collected here, while the controls
            # rest, its full pass (hundreds of ms in a kernel holding transformers) does not fall on the next change.
            gc.collect()
        with self._lock:
            if generation != self._generation:   # a control moved while it searched: not this setup's advice
                return
            self.advice, self.rows = advice, advice.suggestions[:TOP]
        self._render(device)

    def _render(self, device) -> None:
        children = []
        if self.advice is None and self._asked is not None:   # not advised yet: the button, or the rest
            children.append(self._ask_row)
        if self.advice is not None:
            a, lim = self.advice, limit_for(device)
            head = ("what makes it fit, cheapest first" if self.rows and self.rows[0].fits else
                    "nothing the advisor tried fits; the closest" if self.rows else "the advisor finds no change")
            self.header.value = (f"<div class='kit-advice-head' style='margin-top:6px'><b>{head}</b> "
                                 f"<span style='font-size:85%;color:#555'>(estimated, each reserved figure against "
                                 f"{fmt_bytes(lim.usable_bytes)}: {fmt_bytes(lim.limit_bytes)} less the "
                                 f"{lim.margin_fraction:.0%} margin kept while it is modelled)</span></div>")
            children.append(self.header)
            for s, t, line in zip(self.rows, self.texts, self._lines):
                margin = ("+" if s.margin_bytes >= 0 else "-") + fmt_bytes(abs(s.margin_bytes))
                tight = " <b style='color:#E69F00'>TIGHT</b>" if s.tight else ""
                t.value = (f"<span class='kit-suggestion' style='font-size:85%'><code>{html.escape(s.cli)}</code>"
                           f"{tight}: reserved {fmt_bytes(s.reserved_bytes)} ({margin}), peak "
                           f"{fmt_bytes(s.peak_bytes)} "
                           "allocated<br><span style='color:#555'>"
                           + "<br>".join(html.escape(c) for c in s.costs) + "</span></span>")
                children.append(line)
            children += [W.HTML(value=f"<span style='font-size:85%;color:#555'>note: {html.escape(n)}</span>")
                         for n in a.notes]
        extra = self._extra
        if extra:
            self.extra_html.value = (f"<span class='kit-extra' style='font-size:85%'>also set by a suggestion (no "
                                     f"control here): <code>{html.escape(extra_text(extra))}</code>; Run is off "
                                     f"while they are set</span>")
            children.append(self._extra_row)
        self.widget.children = tuple(children)


def accepts(control, value) -> bool:
    """Whether ``control`` can show ``value`` (a Dropdown lists it; a slider's range holds it)."""
    if isinstance(control, W.Dropdown):
        return value in [o[1] if isinstance(o, tuple) else o for o in control.options]
    if isinstance(control, W.IntSlider):
        return isinstance(value, int) and control.min <= value <= control.max
    return isinstance(control, W.Checkbox) and isinstance(value, bool)
