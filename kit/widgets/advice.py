"""The panel's fit advisor: "largest batch that fits" beside the batch slider, and, when the setup does
not fit, the advisor's top three changes under the verdict, each with an Apply button.

:func:`kit.advise.max_batch_size` runs on every change (a few estimates, about a millisecond each);
the full :func:`kit.advise.advise` only while the setup does not fit (4 to 80 ms warm:
``benchmarks/advisor_latency.py``; the panel's per-change time with it is in
``benchmarks/panel_latency.py``). Where a model's search (after its first, cold one) takes more than
:data:`LAZY_MS`, the panel stops running it on each change and shows a "What makes it fit?" button
instead, saying why. Both judge the setup's reserved estimate (the allocated peak plus the caching
allocator's modelled gap), as ``python -m kit fit`` does, and say so.

A suggestion may change options the panel has no control for (``--load-dtype``, ``--lora-targets``,
``--grad-accum``, a LoRA rank off the list, LoRA on scenario 1's head). Apply sets the controls it can
and keeps the rest as *extra options*, listed under the advice with a Clear button; the estimate uses
them, and Run stays off while they are set (a run measures the controls' setup).

>>> view = AdviceView(apply=lambda options: None)
>>> view.update(dict(model="tiny-llama", batch_size=64, seq_len=128, device="cpu"), 80_000_000, fits=False)
>>> view.largest_html.value.split("<b>")[1].split("</b>")[0], view.rows[0].cli
('6', '--batch-size 4 --grad-accum 16')
"""
from __future__ import annotations

import html
import time

import ipywidgets as W

from kit import inputs as kin
from kit.advise.core import advise, limit_for, max_batch_size
from kit.advise.search import CLI, cli, cli_value
from kit.units import fmt_bytes

TOP = 3
LAZY_MS = 40.0   # of the panel's 50 ms per change; a model whose advice takes longer is advised on request


def extra_text(extra: dict) -> str:
    """The extra options as the estimate CLI writes them.

    >>> extra_text({"load_dtype": "fp16", "lora_targets": ("custom_layer",)})
    '--load-dtype fp16 --lora-targets custom_layer'
    """
    return cli({CLI[k]: cli_value(v) for k, v in extra.items()})


class AdviceView:
    """``largest_html`` (beside the batch slider), ``widget`` (under the verdict): the header, one row per
    suggestion (an Apply button and its text), the extra options with Clear. ``advice``: the last
    :class:`kit.advise.Advice` (None while the setup fits or has no estimate). ``apply(options)`` is
    called with a suggestion's estimate() options in full."""

    def __init__(self, apply, clear=None):
        self._apply, self.advice, self.rows, self._asked, self._extra = apply, None, [], None, None
        self.slow: dict = {}    # model -> ms of its last advise(), where over LAZY_MS
        self._timed: set = set()
        self.largest_html = W.HTML(value="")
        self.header = W.HTML(value="")
        self.buttons = [W.Button(description="Apply", icon="check", layout=W.Layout(width="80px"))
                        for _ in range(TOP)]
        self.texts = [W.HTML(value="", layout=W.Layout(width="780px")) for _ in range(TOP)]
        for i, b in enumerate(self.buttons):
            b.on_click(lambda _b, i=i: self.apply(i))
        self.extra_html = W.HTML(value="")
        self.clear_button = W.Button(description="Clear", icon="times", layout=W.Layout(width="80px"),
                                     tooltip="drop the options the controls cannot show")
        if clear is not None:
            self.clear_button.on_click(lambda _b: clear())
        self._lines = [W.HBox([b, t]) for b, t in zip(self.buttons, self.texts)]
        self._extra_row = W.HBox([self.clear_button, self.extra_html])
        self.ask_button = W.Button(description="What makes it fit?", icon="search", layout=W.Layout(width="180px"))
        self.ask_button.on_click(self.ask)
        self.lazy_html = W.HTML(value="")
        self._ask_row = W.HBox([self.ask_button, self.lazy_html])
        self.widget = W.VBox([])
        self.widget.add_class("kit-advice")

    def apply(self, i: int) -> None:
        """Apply suggestion ``i`` (0 = the cheapest)."""
        if i < len(self.rows):
            self._apply(self.rows[i].options)

    def update(self, options: dict | None, device, *, fits: bool, extra: dict | None = None) -> None:
        """Recompute for estimate() ``options`` (None: no estimate) on ``device`` (a Preset or bytes)."""
        self.advice, self.rows, self._asked, self._extra = None, [], None, extra
        self.largest_html.value = ""
        if options is not None:
            try:
                n = max_batch_size(options, device)
                self.largest_html.value = (
                    f"<span class='kit-largest' style='font-size:85%'>largest batch that fits: <b>{n}</b>"
                    " (judged on its reserved estimate)</span>" if n else
                    "<span class='kit-largest' style='font-size:85%;color:#D55E00'>not even batch 1 fits</span>")
                if not fits:
                    self._asked = (options, device)
                    if options["model"] not in self.slow:
                        self.ask()
                        return
            except (kin.InputError, ValueError) as exc:   # an option the advisor cannot take: said, not raised
                self.largest_html.value = f"<span style='font-size:85%;color:#555'>advisor: {html.escape(str(exc))}</span>"
        self._render(device if options is not None else None)

    def ask(self, _button=None) -> None:
        """Run the advisor on the setup that does not fit (each change does, unless it is slow for this model:
        then the "what makes it fit?" button does)."""
        if self._asked is None:
            return
        options, device = self._asked
        t = time.perf_counter()
        self.advice = advise(options, device)
        ms = 1e3 * (time.perf_counter() - t)
        model = options["model"]
        if ms > LAZY_MS and model in self._timed:   # (a model's first search is cold: not judged by it)
            self.slow[model] = ms                    # more than a panel change may take: on request from now on
        self._timed.add(model)
        self.rows = self.advice.suggestions[:TOP]
        self._render(device)

    def _render(self, device) -> None:
        children = []
        if self.advice is None and self._asked is not None:   # slow for this model: on request
            self.lazy_html.value = (f"<span style='font-size:85%;color:#555'>the advisor took "
                                 f"{self.slow[self._asked[0]['model']]:.0f} ms for this model, more than a panel "
                                 f"change may take ({LAZY_MS:.0f} ms): it runs when asked</span>")
            children.append(self._ask_row)
        if self.advice is not None:
            a, usable = self.advice, limit_for(device).usable_bytes
            head = ("what makes it fit, cheapest first" if self.rows and self.rows[0].fits else
                    "nothing the advisor tried fits; the closest" if self.rows else "the advisor finds no change")
            self.header.value = (f"<div class='kit-advice-head' style='margin-top:6px'><b>{head}</b> "
                                 f"<span style='font-size:85%;color:#555'>(estimated, each reserved figure against "
                                 f"{fmt_bytes(usable)})</span></div>")
            children.append(self.header)
            for s, t, line in zip(self.rows, self.texts, self._lines):
                margin = ("+" if s.margin_bytes >= 0 else "-") + fmt_bytes(abs(s.margin_bytes))
                t.value = (f"<span class='kit-suggestion' style='font-size:85%'><code>{html.escape(s.cli)}</code>: "
                           f"peak {fmt_bytes(s.peak_bytes)}, reserved {fmt_bytes(s.reserved_bytes)} ({margin})<br>"
                           "<span style='color:#555'>"
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
