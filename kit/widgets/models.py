"""The panel's models: the list it offers, what it reads from a model's config, and what a run needs.

The list holds the scenario's own models first, then every other shipped real model (the encoders too), then
the tiny CPU twins (:func:`kit.model_configs.known_models`); scenario 1's ``+vocab-head`` names only
in scenario 1. A model typed into the panel (any Hub id or ``config.json`` path) joins it. An encoder has no
causal-LM head: the panel's task control takes it under a classifier (:func:`task_for`).

>>> MODELS[2][:3]
['meta-llama/Meta-Llama-3-8B', 'meta-llama/Llama-3.2-1B', 'tiny-llama']
>>> max_positions("tiny-gpt2"), run_problem("tiny-gpt2")
(256, None)
"""
from __future__ import annotations

import functools
from pathlib import Path

from kit import models as kmodels
from kit import runtime
from kit.data import shipped_tokenizer
from kit.estimate import estimate
from kit.estimate.inventory import info_of
from kit.estimate.replay import lookup
from kit.model_configs import ENCODERS

OWN_MODELS = {1: ["distilgpt2+vocab-head", "distilgpt2", "tiny-gpt2+vocab-head", "tiny-gpt2"],
              2: ["meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.2-1B", "tiny-llama"]}
_OTHERS = {s: [m for m in kmodels.known_models() if m not in own and not m.endswith(kmodels.VOCAB_HEAD)]
           for s, own in OWN_MODELS.items()}
# scenario -> (the other shipped real models, the tiny twins), each in the registry's order (grouped by maker)
GROUPS = {s: ([m for m in o if m not in kmodels.TINY], [m for m in o if m in kmodels.TINY])
          for s, o in _OTHERS.items()}
MODELS = {s: OWN_MODELS[s] + real + tiny for s, (real, tiny) in GROUPS.items()}   # the list, in its order
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@functools.lru_cache(maxsize=64)
def max_positions(model: str) -> int:
    """The positions the model takes (2048 when its config names none): the seq_len slider's end."""
    cfg = kmodels.get_config(model).get_text_config()   # (a vision-language model's language model)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None) or 2048


@functools.lru_cache(maxsize=64)
def model_type_and_vocab(model: str) -> tuple[str, int]:
    cfg = kmodels.get_config(model)
    return cfg.model_type, cfg.get_text_config().vocab_size


@functools.lru_cache(maxsize=64)
def is_encoder(model: str) -> bool:
    """Whether ``model`` is an encoder (BERT, RoBERTa, ...), which has no causal-LM head.

    >>> is_encoder("tiny-bert"), is_encoder("tiny-gpt2")
    (True, False)
    """
    family = lookup(kmodels.get_config(model).model_type)
    return model in ENCODERS or bool(family is not None and family.encoder)


def task_for(model: str, task: str | None) -> str:
    """The panel's task for ``model``: an encoder asked for a causal LM is taken as a sequence classifier.

    >>> task_for("tiny-bert", "causal-lm"), task_for("tiny-bert", "token-cls"), task_for("tiny-gpt2", None)
    ('seq-cls', 'token-cls', 'causal-lm')
    """
    task = task or "causal-lm"
    return "seq-cls" if task == "causal-lm" and is_encoder(model) else task


def model_problem(model: str, setup: dict, seq_cap: int, device: str, with_setup: bool = True) -> str | None:
    """The kit's message on why the panel cannot estimate ``model``, or None. Reads its config (fetched
    from the Hub once, if it must be) and builds it on the meta device (cached); ``with_setup``: the
    panel's other settings must work with it too (seq_len clamped as the slider will clamp it).

    >>> model_problem("/no/such/config.json", {}, 32768, "cuda")     # doctest: +ELLIPSIS
    "Unknown model '/no/such/config.json': it is no known name, no file and no Hub id. Known names: ..."
    """

    try:
        info_of(model, task_for(model, setup.get("task")))
        if with_setup:
            s = {k: v for k, v in setup.items() if k != "model"}
            s["seq_len"] = min(s["seq_len"], max_positions(model), seq_cap)
            s["task"] = task_for(model, s.get("task"))
            estimate(model, **s, device=device)
    except ValueError as exc:      # the kit's own messages: unknown, offline, gated, bad file, unsupported
        return str(exc)
    except Exception as exc:       # anything else in one line: never a traceback in the panel
        return f"the kit could not read {model} ({type(exc).__name__}: {exc})"[:600]
    return None


@functools.lru_cache(maxsize=1)
def _shipped_vocab() -> int:

    return len(shipped_tokenizer())


def run_problem(model: str, lora_r: int = 0) -> str | None:
    """Why the panel's Run and Sweep cannot train ``model`` here, or None; known before anything is built.

    A run builds the model (a twin from its config when it is not shipped) and tokenizes text with the
    kit's shipped tokenizer (tiny twins, or no Hub) or the model's own (fetched by name); its LoRA
    adapters take peft's default targets. RAM is checked when Run is clicked (:func:`kit.widgets.runs.refusal`).

    >>> run_problem("microsoft/Phi-3.5-mini-instruct", lora_r=8)[:48]
    'peft has no default LoRA targets for phi3 models'
    """
    model_type, vocab = model_type_and_vocab(model)
    if lora_r:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as targets

        if model_type not in targets:
            return (f"peft has no default LoRA targets for {model_type} models, and a run here takes peft's "
                    "defaults: set the LoRA rank to 0 to run it here, or name LoraConfig(target_modules=...) "
                    "in your own training code")
    base = model.removesuffix(kmodels.VOCAB_HEAD)
    if base in kmodels.known_models():
        return None
    if not runtime.hub_reachable():
        if vocab < _shipped_vocab():
            return (f"without the Hub, a run here tokenizes with the kit's shipped {_shipped_vocab():,}-token "
                    f"tokenizer, and this model's vocabulary has only {vocab:,} tokens")
        return None
    path = Path(base).expanduser()
    if path.is_file():
        return ("with the Hub reachable, a run loads the model's own tokenizer, which a config.json path does "
                "not name: type the folder that holds config.json and the tokenizer files, or the model's Hub id")
    if path.is_dir() and not any((path / f).is_file() for f in TOKENIZER_FILES):
        return (f"with the Hub reachable, a run loads the model's own tokenizer, and {path} holds no tokenizer "
                f"files ({', '.join(TOKENIZER_FILES[:2])}): put them beside config.json, or type the Hub id")
    return None
