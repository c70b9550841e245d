"""The widget panel: move a slider, see the memory move; then run it and measure.

``panel(scenario)`` shows controls (model; the scenario's own: scenario 1's head, scenario 2's fold loop; batch
size, sequence length, quantization, precision, gradient checkpointing, LoRA rank, optimizer, device preset; the
multi-GPU strategy and the GPUs under an "advanced" switch; a vision-language model's images,
:mod:`kit.widgets.images`), the answer redrawn on every change (fits / does not
fit, with the one figure judged, by name: the reserved figure on a GPU, the training peak on the CPU; the limit and
the margin; the biggest cause; the largest batch that fits beside its slider; in scenario 2 the folds, fold 2's load
against the device), the details in a collapsed "Details" Accordion (the allocated peak, a breakdown bar against the
device's limit, the notes), the fit advisor on a button or once the controls
rest (:mod:`kit.widgets.advice`), a Run button that trains the setup here stage by stage, each stage drawn beside
its estimate as it ends (:mod:`kit.widgets.stages`; scenario 2's story runs its folds), a Sweep button, and a
history of runs.

The model is the scenario's real one in every mode, so the verdict is the notebook's (DistilGPT2 with the V x V head,
Llama-3-8B); in smoke mode Run and Sweep train its tiny twin on this machine, labelled as the twin's. Each scenario's
story is its own piece: :mod:`kit.scenarios.custom_head.panel_head` (the head: V x V, low-rank with its rank, none, the
16-bit V x V head) and :mod:`kit.scenarios.cross_validation.panel_folds` (folds, the model loaded each fold or once,
the old Trainer kept or released, the k-bit recipe); ``.estimate`` stays one training step.

The model list holds the scenario's own models, then every shipped model
(:func:`kit.model_configs.known_models`). A text box under it takes any Hub id or a path to a
``config.json``: on Enter (or the Use button) only its config is read (fetched from the Hub when
reachable), and if the kit can estimate it, it joins the list and becomes the model; if not, the
kit's message shows under the box and the estimate stays as it was. Nothing is fetched per keystroke.

Colab ships ipywidgets 7.7.1 and JupyterLab has 8: this module uses only what both have
(IntSlider, Dropdown, Checkbox, Button, HTML, Output, HBox/VBox, ``observe(names="value")``,
``Layout(width=...)``, ``style={"description_width": ...}``, and Text with ``continuous_update=False``,
whose value arrives on Enter: ``on_submit`` is deprecated in both). The instant breakdown is HTML,
not matplotlib, so a change costs milliseconds; plots of runs use the inline backend in an
``Output`` (``kit.plot.live``), no ipympl. While a run goes, the kernel is busy and every control
is disabled; the notebook's interrupt button stops it, and it still cleans up.

>>> p = panel(scenario=1)                       # doctest: +SKIP
>>> p.controls["batch_size"].value = 8          # doctest: +SKIP
>>> p.estimate.activations_bytes                # the estimate followed   # doctest: +SKIP
>>> p.run_button.click()                        # a few measured steps; p.history grows  # doctest: +SKIP
>>> p.use_model("Qwen/Qwen2.5-0.5B")            # or type it into p.model_box; True if used  # doctest: +SKIP
"""
from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as W
from IPython.display import display

from kit import machine, runtime
from kit.dtypes import run_precision
from kit import models as kmodels
from kit.estimate import INT32_OPTIMIZER, estimate
from kit.inputs import InputError, has_note, whole_number
from kit.measure import device as kdevice
from kit.presets import GPU_PRESETS, OPTIMIZERS, PRESETS, Preset, resolve_device, verdict
from kit.training_setup import TrainingSetup
from kit.widgets import options as panel_options
from kit.widgets import runs as panel_runs
from kit.widgets import images as panel_images
from kit.widgets import views as views
from kit.widgets.advice import AdviceView, accepts
from kit.widgets.gpus import advanced_switch, gpu_controls, launch, launch_problem
from kit.widgets.models import (
    GROUPS,
    MODELS,
    OWN_MODELS,
    is_encoder,
    max_positions,
    model_problem,
    model_type_and_vocab,
    run_problem,
    task_for,
)
from kit.widgets.options import PRESET_CHOICES, SEQ_CAP, control, session_presets, this_machine
from kit.widgets.run_view import PanelRuns

# Scenario 1: the user's Trainer (batch 1, 128 tokens, fp16, AdamW, checkpointed frozen base).
# Scenario 2: QLoRA as in the user's loop (4-bit NF4, LoRA r=8 on q_proj/v_proj, fp16).
# each scenario's model, device preset and setup (the panel's options: kit.training_setup.PANEL). The model is the
# real one in every mode: the verdict judges what the notebook judges; in smoke mode a Run runs its tiny twin.
DEFAULTS = {
    1: dict(model="distilgpt2+vocab-head", preset="colab-t4",
            **TrainingSetup(batch_size=1, seq_len=128, precision="fp16", gradient_checkpointing=True,
                            task="causal-lm").panel_values()),
    2: dict(model="meta-llama/Meta-Llama-3-8B", preset="colab-t4",
            **TrainingSetup(batch_size=4, seq_len=64, quantization="4bit", precision="fp16",
                            gradient_checkpointing=True, lora_r=8, task="causal-lm").panel_values()),
}
# each scenario's story on the panel: scenario 1's head (kit.scenarios.custom_head.panel_head), scenario 2's fold
# loop (kit.scenarios.cross_validation.panel_folds), and their options
STORY_OPTIONS = {1: ("head", "head_rank"), 2: ("folds", "load", "trainer", "recipe")}
TASK_CHOICES = [("causal LM (vocabulary logits)", "causal-lm"), ("sequence classification", "seq-cls"),
                ("token classification", "token-cls")]
OPTIONS = ("model", "steps", "sweep_sizes", "strategy", "num_gpus") + tuple(k for k in DEFAULTS[1] if k != "model")


# each scenario's story (its own controls and views), registered by kit.scenarios.stories, which registers
# scenario 1's head and scenario 2's fold loop when it is imported (kit.panel imports it), so that the panel, a layer
# below the scenarios, never imports them
STORIES: dict = {}


def register_story(scenario: int, make) -> None:
    """Give ``scenario``'s panel its story: ``make(control, **options)`` returns an object with ``controls``,
    ``options``, ``run_model``, ``run_problem``, ``adjust`` and ``html`` (see kit.scenarios.stories)."""
    STORIES[scenario] = make


def story(scenario: int, options: dict):
    """The scenario's own controls and views, with the panel's ``options`` for them."""
    if scenario not in STORIES:
        raise InputError("scenario", f"scenario {scenario}'s story is registered by kit.scenarios.stories: build "
                                     "the panel with kit.panel(scenario=...), which imports it.")
    return STORIES[scenario](control, **options)


class Panel(PanelRuns):
    """The panel: ``.controls`` (dict of ipywidgets), ``.estimate`` (current Estimate, or None when
    the setup is invalid, with ``.problem`` saying why), ``.reasons`` (the text beside each control),
    ``.history`` (one dict per run), ``.widget`` (what is displayed). See :func:`panel`."""

    def __init__(self, scenario: int = 1, **kwargs):
        if scenario not in DEFAULTS:
            raise ValueError(f"scenario must be 1 (custom head) or 2 (cross-validation), not {scenario!r}.")
        unknown = set(kwargs) - set(OPTIONS) - set(STORY_OPTIONS[scenario])
        if unknown:
            raise ValueError(f"unknown panel options {sorted(unknown)}; known: {', '.join(OPTIONS)}.")
        self.story = story(scenario, {k: kwargs.pop(k) for k in STORY_OPTIONS[scenario] if k in kwargs})
        d = {**DEFAULTS[scenario], **panel_options.read_all(kwargs)}   # each read, or refused by name
        model = d["model"]
        self.scenario, self.steps = scenario, whole_number("steps", d.get("steps", 3))
        self.sweep_sizes = tuple(d.get("sweep_sizes", (1, 2, 4, 8, 16, 32)))
        n_gpus, d["num_gpus"] = d.get("num_gpus", 1), 1    # the GPUs list takes any count (set below)
        top = min(max_positions(model), SEQ_CAP)
        if "seq_len" in kwargs and d["seq_len"] > top:   # never clamped silently
            raise InputError("seq_len", f"seq_len {d['seq_len']:,} is beyond what the panel's slider takes for {model} "
                             f"({top:,}): pass at most {top:,}, or estimate longer ones with kit.estimate.estimate.")
        runtime_bytes = kdevice.runtime_ram_bytes()   # the runtime's own RAM, for the presets that are this machine
        self.machine, self.here = this_machine(runtime_bytes), session_presets(runtime_bytes)
        self.history: list[dict] = []
        self.estimate = self.problem = self.verdict = self.last_figure = self.last_result = None
        self.run_reason = None
        self._busy = self._running = False
        self._yours = [] if model in MODELS[scenario] else [model]   # typed models, newest first
        self.extra: dict = {}   # options set by an applied suggestion that no control shows
        self._images_for: list = []   # the model the image controls were last set to the defaults of
        self.advice_view = AdviceView(self.apply_options, self.clear_extra)
        self._last_failure = ("", 0.0)
        c = self.controls = {
            "model": control(W.Dropdown, "model", model, options=self._model_options()),
            **self.story.controls,
            "batch_size": control(W.IntSlider, "batch size", d["batch_size"], min=1,
                                   max=max(panel_options.BATCH_MAX, d["batch_size"])),
            "seq_len": control(W.IntSlider, "sequence length", d["seq_len"], min=8, step=8,
                                max=max(d["seq_len"], max_positions(model))),
            **panel_images.image_controls(control),   # shown for a vision-language model only
            "quantization": control(W.Dropdown, "quantization", d["quantization"],
                                     options=[("none", "none"), ("8-bit", "8bit"), ("4-bit (NF4)", "4bit")]),
            "precision": control(W.Dropdown, "precision", d["precision"],
                                  options=[("fp32", "fp32"), ("fp16 mixed", "fp16"), ("bf16 mixed", "bf16")]),
            "gradient_checkpointing": control(W.Checkbox, "gradient checkpointing", d["gradient_checkpointing"]),
            "lora_r": control(W.Dropdown, "LoRA rank", d["lora_r"],
                               options=panel_options.with_value([("0 (full fine-tune)", 0)] + [
                                   (str(r), r) for r in panel_options.LORA_RANKS[1:]], d["lora_r"])),
            "optimizer": control(W.Dropdown, "optimizer", d["optimizer"], options=list(OPTIMIZERS)),
            "task": control(W.Dropdown, "task (head)", task_for(model, d["task"]), options=TASK_CHOICES),
            "preset": control(W.Dropdown, "device", d["preset"],
                               options=panel_options.with_value(PRESET_CHOICES, d["preset"])),
            **gpu_controls(control, d),   # the estimate per GPU of N (kit.widgets.gpus)
        }
        c["num_gpus"].options = panel_options.with_value(list(c["num_gpus"].options), n_gpus)
        c["num_gpus"].value = n_gpus
        self.reasons = {k: W.HTML(value="", layout=W.Layout(width="420px")) for k in c}
        # Any Hub id or config.json path. continuous_update=False: the value (and so the fetch) comes
        # on Enter or leaving the box, never per keystroke (ipywidgets 7.7 and 8 alike; on_submit is deprecated).
        self.model_box = control(W.Text, "or your model", "", continuous_update=False,
                                  placeholder="Hub id (Qwen/Qwen2.5-3B) or path to a config.json, then Enter")
        self.use_button = W.Button(description="Use", icon="check", layout=W.Layout(width="80px"),
                                   tooltip="estimate this model: only its config.json is read (from the Hub if needed)")
        self.model_message = W.HTML(value="")
        self.model_box.observe(lambda change: self.use_model(change["new"]), names="value")
        # Enter on the same text (the file fixed since) changes no value: the box's submit event retries it
        self.model_box.on_msg(lambda _widget, content, _buffers: content.get("event") == "submit" and self.use_model(
            self.model_box.value))
        self.use_button.on_click(self._on_use)
        c["model"].observe(self._model_picked, names="value")
        self.estimate_html = W.HTML(value="")   # the answer: the verdict with the figure judged, the biggest cause
        self.story_html = W.HTML(value="")      # the scenario's own view: scenario 2's folds
        self.details_html = W.HTML(value="")    # the breakdown, the allocated peak, notes: in a collapsed Accordion
        self.details = W.Accordion(children=[self.details_html])
        self.details.set_title(0, "Details: the breakdown bar, the allocated peak, notes")
        self.details.selected_index = None      # collapsed (ipywidgets 7.7 and 8 alike)
        self.run_button = W.Button(description=f"Run {self.steps} steps", button_style="primary", icon="play")
        self.sweep_over = W.Dropdown(options=[("sweep batch size", "batch_size"), ("sweep seq length", "seq_len")],
                                     value="batch_size", layout=W.Layout(width="170px"))
        self.sweep_button = W.Button(description="Sweep", icon="line-chart")
        self.status, self.run_why = W.HTML(value=""), W.HTML(value="")
        self.plot_out, self.history_html = W.Output(), W.HTML(value="")
        self.run_button.on_click(self._on_run)
        self.sweep_button.on_click(self._on_sweep)
        for w in c.values():
            w.observe(self._refresh, names="value")
        self.rows = {k: W.HBox([w, self.reasons[k]] + ([self.advice_view.largest_html] if k == "batch_size" else []))
                     for k, w in c.items()}
        self.advanced = advanced_switch(c, self.rows, self._one_gpu)   # the multi-GPU rows, shown on request
        rows = list(self.rows.values())
        rows[1:1] = [W.HBox([self.model_box, self.use_button]), self.model_message]  # under the model list
        rows.insert(rows.index(self.rows["strategy"]), self.advanced)
        title = W.HTML(value=f"<b>Memory panel, scenario {scenario}</b> &middot; {runtime.mode()} mode "
                             f"({html.escape(runtime.mode_reason())}) &middot; the verdict judges the model chosen "
                             f"on the device chosen; " + ("Run and Sweep run its tiny twin here, on "
                             if runtime.mode() == "smoke" else "Run and Sweep run it here, on ")
                             + machine.device_name())
        buttons = W.HBox([self.run_button, self.sweep_over, self.sweep_button, self.run_why, self.status])
        self.widget = W.VBox([title] + rows + [self.estimate_html, self.story_html, self.advice_view.widget,
                                               self.details, buttons, self.plot_out, self.history_html])
        self.widget.add_class("kit-panel")
        # The first LoRA estimate imports peft (about 0.35 s): pay it while building, not on a change.
        import peft.tuners.tuners_utils  # noqa: F401
        self._refresh()

    # -- the estimate, on every change ----------------------------------------------------
    def setup(self) -> dict:
        """The current settings, as ``kit.estimate.estimate`` and :mod:`kit.widgets.runs` take them."""
        return {k: self.controls[k].value for k in panel_runs.SETUP_KEYS}

    def run_setup(self) -> dict:
        """What Run and Sweep train here: :meth:`setup`, with the model's tiny twin in smoke mode (the verdict
        still judges the model chosen), and ``twin_of`` naming the model it stands in for (None: the model itself)."""
        s = self.setup()
        model = self.story.run_model(s["model"]) or s["model"]
        twin = twin_for(model)
        return {**s, "model": twin or model, "twin_of": model if twin else None}

    def _one_gpu(self) -> None:
        """"advanced" turned off: back to one GPU."""
        self._busy = True
        try:
            self.controls["num_gpus"].value = 1
            self.controls["strategy"].value = "single"
        finally:
            self._busy = False
        self._refresh()

    # -- the advisor's suggestions ---------------------------------------------------------
    def apply_options(self, options: dict) -> None:
        """Set the panel to a suggestion's estimate() ``options``: the controls that can show a change take
        it; the rest become :attr:`extra` options (listed under the advice, used by the estimate)."""
        base = self.advice_view.advice.options if self.advice_view.advice else {**self.setup(), **self.extra}
        self._busy = True
        try:
            for k, v in options.items():
                if k in ("model", "device") or base.get(k) == v:
                    continue
                c = self.controls.get(k)
                if c is not None and not c.disabled and accepts(c, v):
                    c.value = v
                    self.extra.pop(k, None)
                else:
                    self.extra[k] = v
        finally:
            self._busy = False
        self._refresh()

    def clear_extra(self) -> None:
        """Drop the options no control shows; the estimate is the controls' again."""
        self.extra = {}
        self._refresh()

    def preset(self) -> Preset:
        key = self.controls["preset"].value
        if key == "this":
            return self.machine
        return self.here.get(key) or PRESETS.get(key) or resolve_device(key)[0]   # or "16GiB"

    def _where(self) -> str:
        return "cpu" if self.preset().gpu_bytes is None else "cuda"

    def _gpu(self) -> str | None:
        """The GPU preset judged, whose architecture picks the attention kernel (as the CLI's --preset does)."""
        key = self.controls["preset"].value
        return key if key in GPU_PRESETS else None

    # -- your own model: any Hub id or config.json path -------------------------------------
    def _model_options(self) -> list:
        real, tiny = GROUPS[self.scenario]
        return views.model_options(self.scenario, OWN_MODELS[self.scenario], real, tiny, self._yours)

    def _on_use(self, _button=None) -> None:
        if self.model_box.value.strip():
            self.use_model(self.model_box.value)
        else:
            self.model_message.value = views.message_html("type a Hub id or a path to a config.json first", "busy")

    def _model_picked(self, change=None) -> None:
        if not self._busy:   # the user picked another model from the list: an old message is stale
            self.model_message.value = ""
        self.extra = {}      # a suggestion for another model

    def use_model(self, text: str) -> bool:
        """Make ``text`` (a Hub id, a ``config.json`` path or its folder, a shipped name) the panel's
        model, as Enter in :attr:`model_box` or the Use button does. Returns True when it is used.

        Only its config is read (fetched from the Hub once, when the Hub is reachable). If the kit
        cannot estimate it (unknown id offline, gated repo, bad file, not a causal LM), the kit's
        message shows in :attr:`model_message`, and the model and the estimate stay as they were.
        """
        text, c = str(text or "").strip(), self.controls["model"]
        if not text or self._running:
            return False
        if text == c.value:
            self.model_message.value = views.message_html(f"{text} is the model in use", "ok")
            return True
        last, when = self._last_failure
        if text == last and time.monotonic() - when < 1.0:   # Enter, then the Use button: one try is enough
            return False
        fetch = text not in kmodels.known_models() and not Path(text).expanduser().exists()
        self.model_message.value = views.message_html(
            f"reading {text}" + (": fetching its config.json from the Hub" if fetch and runtime.hub_reachable()
                                 else "") + "…", "busy")
        self.use_button.disabled = self.model_box.disabled = True
        try:   # with the settings in use, unless they have no estimate with the model in use either
            problem = model_problem(text, self.setup(), SEQ_CAP, self._where(), self.estimate is not None)
        finally:
            self.use_button.disabled = self.model_box.disabled = False
        if problem:
            self._last_failure = (text, time.monotonic())
            self.model_message.value = views.message_html(problem, "error")
            return False
        added = text not in MODELS[self.scenario] and text not in self._yours
        if added:
            self._yours.insert(0, text)
        self._busy = True        # a new options list may reselect the first option: no estimate for it
        try:
            c.options = self._model_options()
            c.value = text
        finally:
            self._busy = False
        self._refresh()
        self.model_box.value = ""   # it is in the list now; the same text typed again is a new submission
        self.model_message.value = views.message_html(
            f"using {text} ({model_type_and_vocab(text)[0]}, {max_positions(text):,} positions)"
            + (": added to the model list, under 'yours'" if added else ""), "ok")
        return True

    def _refresh(self, change=None) -> None:
        if self._busy:  # our own adjustments (a new slider max) fire observers too
            return
        self._busy = True
        try:
            self._adjust()
            self._estimate()
        finally:
            self._busy = False

    def _adjust(self) -> None:
        """Fit the controls to the model and the machine; say why where one is disabled."""
        c, why = self.controls, {k: "" for k in self.controls}
        if (c["strategy"].value != "single" or c["num_gpus"].value != 1) and not self.advanced.value:
            self.advanced.value = True   # code or a suggestion asked for more than one GPU: its rows show
        name = c["model"].value
        vocab_head, maxpos = name.endswith(kmodels.VOCAB_HEAD), max_positions(name)
        top = min(maxpos, SEQ_CAP)
        if c["seq_len"].max != top:
            c["seq_len"].value = min(c["seq_len"].value, top)
            c["seq_len"].max = top
        why["seq_len"] = f"the model has {maxpos:,} positions" + (f"; the slider stops at {top:,}"
                                                                   if top < maxpos else "")
        if c["task"].value != task_for(name, c["task"].value):   # an encoder has no causal-LM head
            c["task"].value = task_for(name, c["task"].value)
        why["task"] = "an encoder: trained under a classifier head" if is_encoder(name) else ""
        c["task"].disabled = vocab_head
        c["lora_r"].disabled = c["gradient_checkpointing"].disabled = vocab_head
        if vocab_head:
            c["lora_r"].value, c["gradient_checkpointing"].value = 0, True
            why["lora_r"] = "the custom head is a plain nn.Linear trained in full: LoRA does not apply"
            why["gradient_checkpointing"] = "always on: the model checkpoints its frozen base itself, as the user's did"
        bnb = panel_runs.bnb_problem()
        c["quantization"].disabled = bool(bnb)
        if bnb:
            c["quantization"].value = "none"
            why["quantization"] = bnb
        elif vocab_head and c["quantization"].value != "none":
            why["quantization"] = "quantizes the frozen GPT-2 base; the head stays a float nn.Linear"
        if run_precision(c["precision"].value) != c["precision"].value:   # Trainer's rule (kit.dtypes)
            why["precision"] = f"a run here is {run_precision(c['precision'].value)}: Trainer ignores fp16 on a CPU"
        if c["precision"].value == "bf16" and c["preset"].value == "colab-t4":
            why["precision"] = "a T4 (sm_75) has no native bf16: emulated and slow at best; use fp16 there"
        if "8bit" in c["optimizer"].value and bnb:
            why["optimizer"] = bnb
        panel_images.adjust(c, self.rows, why, name, self._images_for)
        self.story.adjust(c, why, self.preset(), name)
        self._why = why

    def _estimate(self) -> None:
        s = {**self.setup(), **launch(self.controls), **self.story.options(self.setup(), self.preset()),
             **panel_images.options(self.controls, self.controls["model"].value), **self.extra}
        why = dict(self._why)
        try:
            self.estimate = estimate(**s, device=self._where(), gpu=self._gpu())
            self.problem, self.verdict = None, verdict(self.estimate, self.preset())
        except Exception as exc:  # a ValueError names a bad combination; anything else is an estimator bug
            msg = str(exc) if isinstance(exc, ValueError) else f"the estimator failed ({type(exc).__name__}: {exc})"
            self.estimate, self.verdict, self.problem = None, None, msg
            name = {"num_gpus": "strategy", "cpu_offload": "strategy"}.get(getattr(exc, "name", None),
                                                                           getattr(exc, "name", None))
            key = name if name in self.reasons else "model"   # the refusal names its field
            why[key] = f"<span style='color:#D55E00'>&#9888; {html.escape(msg)}</span>"
        if self.estimate is not None and has_note(self.estimate.notes, INT32_OPTIMIZER):
            why["optimizer"] = "<span style='color:#D55E00'>&#9888; 8-bit AdamW kills the process on the " \
                               "over-2^31-element head: Run refused</span>"
        for k, w in self.reasons.items():
            text = why.get(k, "")
            text = text if text.startswith("<span") else html.escape(text)
            w.value = f"<span class='kit-reason' style='font-size:85%;color:#555'>{text}</span>" if text else ""
        self.estimate_html.value = views.verdict_html(self.estimate, self.verdict, self.preset(), self.problem)
        self.details_html.value = "" if self.estimate is None else views.details_html(self.estimate, self.preset())
        self.story_html.value = self.story.html(self.estimate, self.preset())
        self.advice_view.update(None if self.problem else {**s, "device": self._where()}, self.preset(),
                                fits=bool(self.verdict and self.verdict.fits), extra=self.extra)
        self.run_reason = "an applied suggestion set options the controls cannot show (Clear them)" if self.extra \
            else None if self.problem else launch_problem(self.controls) or \
            self.story.run_problem(self.setup()["model"]) or \
            ("a run here trains on text batches: measure a vision-language run on your own trainer with "
             "kit.watch(trainer)" if panel_images.is_vision_language(self.controls["model"].value) else None) or \
            run_problem(self.run_setup()["model"], self.controls["lora_r"].value) or \
            ("a run here trains a causal LM: a classifier is estimated, not run" if
             self.controls["task"].value != "causal-lm" else None)
        self.run_why.value = views.message_html(f"Run and Sweep are off: {self.run_reason}", "error") \
            if self.run_reason else ""
        blocked = self.problem is not None or self.run_reason is not None or self._running
        self.run_button.disabled = self.sweep_button.disabled = blocked

    def _ipython_display_(self):
        display(self.widget)


def twin_for(model: str) -> str | None:
    """The tiny twin a Run trains in smoke mode in place of ``model``, or None (real mode, a twin already, or a
    model without one: it runs itself).

    >>> twin_for("distilgpt2+vocab-head") if runtime.mode() == "smoke" else "tiny-gpt2+vocab-head"
    'tiny-gpt2+vocab-head'
    """
    if runtime.mode() != "smoke":
        return None
    try:
        twin = kmodels.smoke_twin(model)
    except ValueError:      # no twin: the model runs itself
        return None
    return None if twin == model else twin


def panel(scenario: int = 1, **kwargs) -> Panel:
    """Build the memory panel of scenario 1 (custom head) or 2 (QLoRA cross-validation).

    Options override the scenario's defaults: ``model`` (a shipped name, a Hub id or a config.json
    path; more can be typed into the panel's box later), ``batch_size``, ``seq_len``,
    ``quantization``, ``precision``, ``gradient_checkpointing``, ``lora_r``, ``optimizer``,
    ``preset`` (colab-t4, l4, a100-40, a100-80, h100, this), scenario 1's ``head`` (vxv, low-rank, none,
    vxv-16bit) and ``head_rank``, scenario 2's ``folds``, ``load`` (each, once), ``trainer`` (kept, released) and
    ``recipe`` (2024, lean), ``strategy`` (single, ddp, fsdp, fsdp-grad-op,
    zero1-3) and ``num_gpus`` (the estimate is then one GPU's), ``steps`` (per Run, default 3),
    ``sweep_sizes`` (batch sizes of a Sweep). Display the result (last line of a cell).

    >>> p = panel(2)                               # doctest: +SKIP
    >>> p.controls["quantization"].value = "none"   # doctest: +SKIP
    """
    return Panel(scenario, **kwargs)
