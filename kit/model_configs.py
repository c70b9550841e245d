"""Model configs: the shipped ones (``kit/configs/``, by registry name), or a ``config.json`` path.

Memory depends on the architecture, not on the weights: a config is all the estimator and the
twins need. A config is read with ``AutoConfig`` and never with remote code.

>>> get_config("meta-llama/Meta-Llama-3-8B").num_key_value_heads
8
"""
from __future__ import annotations

import copy
from pathlib import Path

import transformers
from transformers import AutoConfig, PretrainedConfig

CONFIG_DIR = Path(__file__).parent / "configs"
# Registry: name -> shipped config file. Hub ids keep their Hub spelling.
_REGISTRY = {
    "distilgpt2": "distilgpt2.json",
    "gpt2": "gpt2.json",
    "meta-llama/Meta-Llama-3-8B": "Meta-Llama-3-8B.json",
    "meta-llama/Llama-3.2-1B": "Llama-3.2-1B.json",
    "tiny-gpt2": "tiny-gpt2.json",
    "tiny-llama": "tiny-llama.json",
}
VOCAB_HEAD = "+vocab-head"
_VOCAB_HEAD_NAMES = ("distilgpt2" + VOCAB_HEAD, "tiny-gpt2" + VOCAB_HEAD)
_TINY = {"tiny-gpt2", "tiny-llama"}
_SMOKE = {"distilgpt2": "tiny-gpt2", "gpt2": "tiny-gpt2",
          "meta-llama/Meta-Llama-3-8B": "tiny-llama", "meta-llama/Llama-3.2-1B": "tiny-llama"}
def known_models() -> list[str]:
    """Every name the offline registry knows.

    >>> "distilgpt2+vocab-head" in known_models()
    True
    """
    return list(_REGISTRY) + list(_VOCAB_HEAD_NAMES)


def smoke_twin(name: str) -> str:
    """The tiny CPU twin that stands in for ``name`` in smoke mode (tiny names map to themselves).

    >>> smoke_twin("meta-llama/Meta-Llama-3-8B"), smoke_twin("distilgpt2+vocab-head")
    ('tiny-llama', 'tiny-gpt2+vocab-head')
    """
    base, head = _split(name)
    if base in _TINY:
        return name
    if base not in _SMOKE:
        raise ValueError(f"No tiny twin for {name!r}. Names with one: {', '.join(_SMOKE)}.")
    return _SMOKE[base] + (VOCAB_HEAD if head else "")


def _split(name: str) -> tuple[str, bool]:
    if isinstance(name, str) and name.endswith(VOCAB_HEAD):
        return name[: -len(VOCAB_HEAD)], True
    return name, False


def get_config(name_or_path: str) -> PretrainedConfig:
    """The config of a registry name, or of a ``config.json`` path (or its folder).

    For a ``+vocab-head`` name it is the base's config after the pad token is added
    (``vocab_size`` + 1, so 50258 for distilgpt2), with ``kit_vocab_head = True``.

    >>> get_config("meta-llama/Meta-Llama-3-8B").num_key_value_heads
    8
    """
    if isinstance(name_or_path, PretrainedConfig):
        return copy.deepcopy(name_or_path)
    base, head = _split(str(name_or_path))
    if base in _REGISTRY:
        if head and base + VOCAB_HEAD not in _VOCAB_HEAD_NAMES:
            raise ValueError(f"{name_or_path!r}: only {', '.join(_VOCAB_HEAD_NAMES)} carry the vocab head.")
        cfg = AutoConfig.from_pretrained(CONFIG_DIR / _REGISTRY[base])
        cfg.kit_name = base
        if head:
            cfg.vocab_size += 1
            cfg.pad_token_id = cfg.vocab_size - 1
            cfg.kit_vocab_head = True
        return cfg
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"The folder {path} holds no config.json: pass the config.json's path, or a known "
                             f"name ({', '.join(known_models())}).")
        path = path / "config.json"
    if path.is_file():
        return _read_config(path)
    raise ValueError(f"Unknown model {name_or_path!r}. Known names: {', '.join(known_models())}. "
                     "A path to a config.json (or the folder holding one) works too.")


def _read_config(path: Path) -> PretrainedConfig:
    """A config.json read with ``AutoConfig`` (never remote code), or one sentence on what is wrong with it."""
    import json

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable config.json ({type(exc).__name__}: {str(exc)[:120]}); it may "
                         "be cut short: download or copy it again.") from exc
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ValueError(f"{path} is not a transformers config.json (it has no \"model_type\"): pass the "
                         "config.json that comes with the model's weights.")
    if data["model_type"] not in CONFIG_MAPPING:
        raise ValueError(f"{path} has model_type {data['model_type']!r}, which this transformers "
                         f"({transformers.__version__}) does not know (its code would have to come from the Hub "
                         "as remote code, which the kit never runs): upgrade transformers, or pass the model "
                         "itself as an nn.Module.")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"transformers could not read {path} as a {data['model_type']} config "
                         f"({type(exc).__name__}: {first}): fix or replace that file.") from exc
