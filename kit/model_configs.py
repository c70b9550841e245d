"""Model configs: the shipped ones (``kit/configs/``, by registry name), or a ``config.json`` path.

Memory depends on the architecture, not on the weights: a config is all the estimator and the
twins need. A config is read with ``AutoConfig`` and never with remote code.

>>> get_config("meta-llama/Meta-Llama-3-8B").num_key_value_heads
8
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PretrainedConfig

from kit import runtime
from kit.inputs import InputError

CONFIG_DIR = Path(__file__).parent / "configs"
# Registry: name -> shipped config file. Hub ids keep their Hub spelling.
REGISTRY = {
    "distilgpt2": "distilgpt2.json",
    "gpt2": "gpt2.json",
    "meta-llama/Meta-Llama-3-8B": "Meta-Llama-3-8B.json",
    "meta-llama/Llama-3.2-1B": "Llama-3.2-1B.json",
    # Unsloth's ungated mirror on the Hub of meta-llama/Llama-3.2-1B (the same config.json and weights, no
    # licence to accept, no token): an alias of the same shipped config.
    "unsloth/Llama-3.2-1B": "Llama-3.2-1B.json",
    "meta-llama/Llama-3.1-8B": "Llama-3.1-8B.json",
    "meta-llama/Llama-3.2-3B": "Llama-3.2-3B.json",
    "mistralai/Mistral-7B-v0.3": "Mistral-7B-v0.3.json",
    "Qwen/Qwen2.5-0.5B": "Qwen2.5-0.5B.json",
    "Qwen/Qwen2.5-1.5B": "Qwen2.5-1.5B.json",
    "Qwen/Qwen2.5-7B": "Qwen2.5-7B.json",
    "Qwen/Qwen3-0.6B": "Qwen3-0.6B.json",
    "Qwen/Qwen3-8B": "Qwen3-8B.json",
    # Qwen3-MoE: 128 experts, 8 per token (its config.json as published, copied from a public copy: see
    # tests/test_shipped_configs.py), and its twin: 2 layers, 8 experts, top-2
    "Qwen/Qwen3-30B-A3B": "Qwen3-30B-A3B.json",
    "mistralai/Mixtral-8x7B-v0.1": "Mixtral-8x7B-v0.1.json",   # (the same, pinned beside it)
    "openai/gpt-oss-20b": "gpt-oss-20b.json",   # (the same; its experts stored as MXFP4)
    "google/gemma-2-2b": "gemma-2-2b.json",
    "google/gemma-2-9b": "gemma-2-9b.json",
    "google/gemma-3-1b-it": "gemma-3-1b-it.json",
    "microsoft/Phi-3.5-mini-instruct": "Phi-3.5-mini-instruct.json",
    "HuggingFaceTB/SmolLM2-135M": "SmolLM2-135M.json",
    "HuggingFaceTB/SmolLM2-360M-Instruct": "SmolLM2-360M-Instruct.json",
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": "SmolLM2-1.7B-Instruct.json",
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "TinyLlama-1.1B-intermediate-step-1431k-3T.json",
    "EleutherAI/pythia-1b": "pythia-1b.json",
    "allenai/OLMo-2-1124-7B": "OLMo-2-1124-7B.json",
    "stabilityai/stablelm-3b-4e1t": "stablelm-3b-4e1t.json", "tiny-stablelm": "tiny-stablelm.json",
    "tiny-gpt2": "tiny-gpt2.json",
    "tiny-llama": "tiny-llama.json",
    "tiny-qwen2": "tiny-qwen2.json",
    "tiny-qwen3": "tiny-qwen3.json",
    "tiny-olmo2": "tiny-olmo2.json",
    "tiny-phi3": "tiny-phi3.json",
    "tiny-gemma2": "tiny-gemma2.json",
    "tiny-gemma3": "tiny-gemma3.json",
    "tiny-gpt-neox": "tiny-gpt-neox.json",
    "tiny-mistral": "tiny-mistral.json",
    "tiny-qwen3-moe": "tiny-qwen3-moe.json",
    "tiny-mixtral": "tiny-mixtral.json",
    "tiny-olmoe": "tiny-olmoe.json",
    "tiny-qwen3-5": "tiny-qwen3-5.json",   # Qwen3.5 text: Gated DeltaNet x3, then full attention
    "tiny-qwen3-5-moe": "tiny-qwen3-5-moe.json",   # ... its MoE: 8 experts, top-2, a shared expert
    "tiny-gpt-oss": "tiny-gpt-oss.json",
    # Encoders (a classifier head: task seq-cls or token-cls). The real models' config.json as published on the
    # Hub (google-bert/bert-base-uncased, FacebookAI/roberta-base), written from it, and the tiny twin of each family.
    # distilbert/distilbert-base-uncased and microsoft/deberta-v3-base: their published config.json, written from it.
    "bert-base-uncased": "bert-base-uncased.json",
    "google-bert/bert-base-uncased": "bert-base-uncased.json",
    "roberta-base": "roberta-base.json",
    "FacebookAI/roberta-base": "roberta-base.json",
    "tiny-bert": "tiny-bert.json",
    "tiny-roberta": "tiny-roberta.json",
    # answerdotai/ModernBERT-base's config.json as published on the Hub (written from it; transformers 5 reads its
    # global_attn_every_n_layers and global/local_rope_theta into layer_types and rope_parameters), and its twin:
    # 4 layers (global, local, local, global), local_attention 32 so that the local layers' window acts at S 64.
    "answerdotai/ModernBERT-base": "ModernBERT-base.json",
    "tiny-modernbert": "tiny-modernbert.json",
    "distilbert-base-uncased": "distilbert-base-uncased.json",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased.json",
    "microsoft/deberta-v3-base": "deberta-v3-base.json",
    "tiny-distilbert": "tiny-distilbert.json",
    "tiny-deberta-v3": "tiny-deberta-v3.json",
    # Vision-language (a SigLIP vision tower, a pixel-shuffle connector, a Llama text model): HuggingFaceTB/
    # SmolVLM-Instruct's config.json (Idefics3ForConditionalGeneration, model_type idefics3), written from the model
    # card's config.json in the fields of transformers' Idefics3Config, Idefics3VisionConfig and LlamaConfig
    # (2,246,272,880 parameters built), and its twin (model_type smolvlm: the same code op for op): a 2-layer tower
    # of 64-pixel images in 8-pixel patches, scale factor 2 (16 image tokens an image), the 2-layer text of
    # tiny-llama. kit.estimate.replay.smolvlm replays a training step of them, images declared in TrainingSetup.
    "HuggingFaceTB/SmolVLM-Instruct": "SmolVLM-Instruct.json",
    "tiny-smolvlm": "tiny-smolvlm.json",
    # Qwen2.5-VL (a windowed-attention vision tower with 2-D rotary, a patch merger, a Qwen2 text model with M-RoPE):
    # Qwen/Qwen2.5-VL-3B-Instruct's config.json as published on the Hub (flat text fields; transformers_version
    # dropped), copied from the public copy in https://github.com/whaler404/Hf-Learn,
    # transfomers_learn/api/models/multimodal_models/qwen2.5_vl/qwen2.5_vl.md ("model config"), commit
    # 52e20dfe9aaeeab0a40a976a63a36dd695d2b51e (tests/test_qwen2_5_vl.py pins it); and its twin: a 2-layer tower
    # (one windowed layer, one full, 14-pixel patches, merge 2), the 2-layer text of tiny-qwen2.
    # kit.estimate.replay.qwen2_5_vl replays a training step of them, images declared in TrainingSetup.
    "Qwen/Qwen2.5-VL-3B-Instruct": "Qwen2.5-VL-3B-Instruct.json",
    "tiny-qwen2-5-vl": "tiny-qwen2-5-vl.json",
    # Gemma 3 multimodal (Gemma3ForConditionalGeneration: a SigLIP vision tower, an average-pooling projector to
    # mm_tokens_per_image tokens, Gemma 3's text model): google/gemma-3-4b-it's config.json as published
    # (https://huggingface.co/google/gemma-3-4b-it/blob/main/config.json, transformers_version 4.50.0.dev0; the Hub is
    # unreachable here, so written from public copies that quote it: its top level and text_config as vendored in a
    # fixture "GEMMA3_4B" ("the shape of google/gemma-3-4b-it's config.json"), its vision_config as vendored in
    # "parses_gemma3_4b_it_vision_config_from_json"; pinned in tests/test_gemma3_vision.py), and its twin: a 2-layer
    # tower of 64-pixel images in 8-pixel patches pooled to 16 image tokens, the 2-layer text of tiny-gemma3 (its
    # vocabulary grown by the three image tokens, boi 4096, eoi 4097, image 4098, as the twin's tokenizer adds them).
    "google/gemma-3-4b-it": "gemma-3-4b-it.json",
    "tiny-gemma3-vision": "tiny-gemma3-vision.json",
    # Qwen3-VL (a vision tower with a learned position grid and 2-D rotary, deepstack mergers whose features are added
    # to the first text layers, a Qwen3 text model with interleaved M-RoPE): Qwen3-VL-2B's config as transformers
    # 5.1.0 prints it (Qwen3VLConfig), copied from https://github.com/xorbitsai/inference/issues/4592 (its first
    # post; transformers_version dropped; tests/test_qwen3_vl.py pins it); and its twin: a 3-layer tower of
    # 16-pixel patches (merge 2, deepstack after layers 0 and 1), a 3-layer Qwen3 text model.
    # kit.estimate.replay.qwen3_vl replays a training step of them, images declared in TrainingSetup.
    "Qwen/Qwen3-VL-2B-Instruct": "Qwen3-VL-2B-Instruct.json",
    "tiny-qwen3-vl": "tiny-qwen3-vl.json",
    # An encoder-decoder (Seq2SeqTrainer): google/flan-t5-base's config.json as published on the Hub, written from it
    # (transformers' T5Config fields: d_model 768, d_ff 2048, 12 + 12 layers, gated-gelu, untied lm_head), and its
    # twin: 2 + 2 layers, d_model 64, 4 heads of 16.
    "google/flan-t5-base": "flan-t5-base.json",
    "tiny-flan-t5": "tiny-flan-t5.json",
}
# The encoders above: estimated under a classifier head only (task seq-cls or token-cls), so the panel, whose
# setups are causal LMs', does not list them.
ENCODERS = frozenset({"bert-base-uncased", "google-bert/bert-base-uncased", "roberta-base", "FacebookAI/roberta-base",
                      "tiny-bert", "tiny-roberta"})
ENCODERS |= {"answerdotai/ModernBERT-base", "tiny-modernbert", "distilbert-base-uncased",
             "distilbert/distilbert-base-uncased", "microsoft/deberta-v3-base", "tiny-distilbert", "tiny-deberta-v3"}
VOCAB_HEAD = "+vocab-head"
_VOCAB_HEAD_NAMES = ("distilgpt2" + VOCAB_HEAD, "tiny-gpt2" + VOCAB_HEAD)
TINY = {"tiny-gpt2", "tiny-llama"}
TINY |= {"tiny-qwen2", "tiny-qwen3", "tiny-olmo2", "tiny-phi3",  # one tiny twin per replay family
          "tiny-gemma2", "tiny-gemma3", "tiny-gpt-neox", "tiny-mistral", "tiny-bert", "tiny-roberta"}
TINY |= {"tiny-modernbert"}
TINY |= {"tiny-distilbert", "tiny-deberta-v3"}
TINY |= {"tiny-qwen3-moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss"}
TINY |= {"tiny-stablelm"}
TINY |= {"tiny-qwen3-5", "tiny-qwen3-5-moe"}
TINY |= {"tiny-smolvlm", "tiny-flan-t5"}
TINY |= {"tiny-qwen2-5-vl", "tiny-qwen3-vl"}
TINY |= {"tiny-gemma3-vision"}
_SMOKE = {"distilgpt2": "tiny-gpt2", "gpt2": "tiny-gpt2",
          "meta-llama/Meta-Llama-3-8B": "tiny-llama", "meta-llama/Llama-3.2-1B": "tiny-llama",
          "unsloth/Llama-3.2-1B": "tiny-llama"}
_SMOKE |= {"mistralai/Mistral-7B-v0.3": "tiny-mistral",  # each shipped model -> its replay family's twin
           "Qwen/Qwen2.5-0.5B": "tiny-qwen2", "Qwen/Qwen2.5-1.5B": "tiny-qwen2", "Qwen/Qwen2.5-7B": "tiny-qwen2",
           "Qwen/Qwen3-0.6B": "tiny-qwen3", "Qwen/Qwen3-8B": "tiny-qwen3", "allenai/OLMo-2-1124-7B": "tiny-olmo2",
           "microsoft/Phi-3.5-mini-instruct": "tiny-phi3", "google/gemma-2-2b": "tiny-gemma2",
           "google/gemma-2-9b": "tiny-gemma2", "google/gemma-3-1b-it": "tiny-gemma3",
           "EleutherAI/pythia-1b": "tiny-gpt-neox", "meta-llama/Llama-3.1-8B": "tiny-llama",
           "meta-llama/Llama-3.2-3B": "tiny-llama", "HuggingFaceTB/SmolLM2-135M": "tiny-llama",
           "HuggingFaceTB/SmolLM2-360M-Instruct": "tiny-llama", "HuggingFaceTB/SmolLM2-1.7B-Instruct": "tiny-llama",
           "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": "tiny-llama",
           "bert-base-uncased": "tiny-bert", "google-bert/bert-base-uncased": "tiny-bert",
           "roberta-base": "tiny-roberta", "FacebookAI/roberta-base": "tiny-roberta"}
_SMOKE |= {"answerdotai/ModernBERT-base": "tiny-modernbert"}
_SMOKE |= {"Qwen/Qwen3-30B-A3B": "tiny-qwen3-moe", "mistralai/Mixtral-8x7B-v0.1": "tiny-mixtral"}
_SMOKE |= {"stabilityai/stablelm-3b-4e1t": "tiny-stablelm"}
_SMOKE |= {"openai/gpt-oss-20b": "tiny-gpt-oss"}
_SMOKE |= {"HuggingFaceTB/SmolVLM-Instruct": "tiny-smolvlm", "google/flan-t5-base": "tiny-flan-t5"}
_SMOKE |= {"Qwen/Qwen2.5-VL-3B-Instruct": "tiny-qwen2-5-vl", "Qwen/Qwen3-VL-2B-Instruct": "tiny-qwen3-vl"}
_SMOKE |= {"google/gemma-3-4b-it": "tiny-gemma3-vision"}
_SMOKE |= {"distilbert-base-uncased": "tiny-distilbert", "distilbert/distilbert-base-uncased": "tiny-distilbert",
           "microsoft/deberta-v3-base": "tiny-deberta-v3"}
# Hub organisations whose models are gated (a licence to accept, then a token), as on the Hub in 2026-11.
_GATED_ORGS = ("meta-llama/", "google/", "mistralai/")


def gated(name: str) -> bool:
    """Whether a shipped model is gated on the Hub (its real weights need an accepted licence and a token).

    >>> gated("meta-llama/Llama-3.2-1B"), gated("Qwen/Qwen3-8B")
    (True, False)
    """
    return str(name).startswith(_GATED_ORGS)


def known_models() -> list[str]:
    """Every name the offline registry knows.

    >>> "distilgpt2+vocab-head" in known_models()
    True
    """
    return list(REGISTRY) + list(_VOCAB_HEAD_NAMES)


def smoke_twin(name: str) -> str:
    """The tiny CPU twin that stands in for ``name`` in smoke mode (tiny names map to themselves).

    >>> smoke_twin("meta-llama/Meta-Llama-3-8B"), smoke_twin("distilgpt2+vocab-head")
    ('tiny-llama', 'tiny-gpt2+vocab-head')
    """
    base, head = split_name(name)
    if base in TINY:
        return name
    if base not in _SMOKE:
        raise ValueError(f"No tiny twin for {name!r}. Names with one: {', '.join(_SMOKE)}.")
    return _SMOKE[base] + (VOCAB_HEAD if head else "")


def split_name(name: str) -> tuple[str, bool]:
    if isinstance(name, str) and name.endswith(VOCAB_HEAD):
        return name[: -len(VOCAB_HEAD)], True
    return name, False


def get_config(name_or_path: str) -> PretrainedConfig:
    """The config of a registry name, a ``config.json`` path (or its folder), or any Hub id.

    A shipped config is used first. Otherwise, for a Hub id (``"Qwen/Qwen2.5-3B"``), only its
    ``config.json`` is fetched (never weights) and cached by huggingface_hub; it is read with
    ``trust_remote_code`` off, always.

    For a ``+vocab-head`` name it is the base's config after the pad token is added
    (``vocab_size`` + 1, so 50258 for distilgpt2), with ``kit_vocab_head = True``.

    >>> get_config("meta-llama/Meta-Llama-3-8B").num_key_value_heads
    8
    """
    if isinstance(name_or_path, PretrainedConfig):
        return checked_sizes(copy.deepcopy(name_or_path), f"this {name_or_path.model_type} config")
    name_or_path = model_name(name_or_path)
    base, head = split_name(name_or_path)
    if base in REGISTRY:
        if head and base + VOCAB_HEAD not in _VOCAB_HEAD_NAMES:
            raise ValueError(f"{name_or_path!r}: only {', '.join(_VOCAB_HEAD_NAMES)} carry the vocab head.")
        cfg = AutoConfig.from_pretrained(CONFIG_DIR / REGISTRY[base])
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
        return checked_sizes(_read_config(path), str(path))
    if not _HUB_ID.fullmatch(str(name_or_path)):
        raise ValueError(f"Unknown model {name_or_path!r}: it is no known name, no file and no Hub id. Known names: "
                         f"{', '.join(known_models())}. A Hub id (org/name), or a path to a config.json (or the "
                         "folder holding one), works too.")
    if str(name_or_path) not in _HUB_CONFIGS:
        _HUB_CONFIGS[str(name_or_path)] = _hub_config(str(name_or_path))
    return copy.deepcopy(_HUB_CONFIGS[str(name_or_path)])


_HUB_CONFIGS: dict = {}   # Hub id -> its config, fetched once per process


def model_name(value) -> str:
    """A model name or path as text, surrounding spaces dropped (a pasted ``"gpt2 "`` is ``"gpt2"``); anything
    but text or a path is refused in one sentence, named ``model``.

    >>> model_name(" tiny-llama "), model_name(Path("cfg/config.json"))
    ('tiny-llama', 'cfg/config.json')
    >>> model_name(None)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: model must be a shipped name, a Hub id, a config.json path, a PretrainedConfig
    or an nn.Module, not None.
    """
    from os import PathLike, fspath

    if isinstance(value, PathLike):
        value = fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise InputError("model", "model must be a shipped name, a Hub id, a config.json path, a PretrainedConfig or "
                                  f"an nn.Module, not {value!r}.")
    return value.strip()


def config_stamp(name_or_path) -> str:
    """What a cache of a model's build must key on besides its name: for a config.json path, a hash of the
    file's content (an edited file is a new model, however fast the edit); for a shipped name or a Hub id, nothing.

    >>> config_stamp("tiny-llama")
    ''
    """
    try:
        name = model_name(name_or_path)
    except InputError:
        return ""
    if split_name(name)[0] in REGISTRY:
        return ""
    path = Path(name).expanduser()
    path = path / "config.json" if path.is_dir() else path
    try:
        data = path.read_bytes() if path.is_file() else b""
    except OSError:
        return ""
    import hashlib

    return hashlib.sha1(data).hexdigest() if data else ""


# The sizes a model is built from: each a whole number >= 1 where the config sets it (None: the family's default).
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "head_dim", "max_position_embeddings")


def checked_sizes(cfg: PretrainedConfig, where: str) -> PretrainedConfig:
    """``cfg`` as it is, where each of its sizes (:data:`SIZE_FIELDS`, in its text config) is a whole number >= 1;
    else one sentence naming the field as the config spells it (``n_embd`` for GPT-2's hidden size).

    >>> from transformers import LlamaConfig
    >>> checked_sizes(LlamaConfig(num_hidden_layers=0), "my config")
    Traceback (most recent call last):
    ...
    kit.inputs.InputError: my config: num_hidden_layers is 0, and a model needs it a whole number >= 1: fix that \
field.
    """
    text = cfg.get_text_config()
    for name in SIZE_FIELDS:
        value = getattr(text, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            spelled = text.attribute_map.get(name, name)
            raise InputError("model", f"{where}: {spelled} is {value!r}, and a model needs it a whole number >= 1: "
                                      "fix that field.", code="bad-config")
    return cfg


# A Hub repository id: "org/name", or a legacy one-part name such as "gpt2".
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?")


def _hub_config(repo_id: str) -> PretrainedConfig:
    """Only ``config.json`` of a Hub repository (never weights), through huggingface_hub's cache.

    Without a network the cache still answers; a gated, private or missing repository, or no
    network and nothing cached, gets one sentence saying what to do.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )


    own_path = "or download its config.json and pass that file's path"
    online = runtime.hub_reachable()
    try:
        # Offline, ask the cache alone: a Hub call without a network hangs about 47 s before failing.
        path = hf_hub_download(repo_id, "config.json", local_files_only=not online)
    except GatedRepoError as exc:
        raise ValueError(f"{repo_id} is gated on the Hub: accept its licence at https://huggingface.co/{repo_id}, then "
                         f"log in (huggingface_hub.login(), or `hf auth login` in a terminal), {own_path}.") from exc
    except RepositoryNotFoundError as exc:
        raise ValueError(f"{repo_id} is not on the Hub, or it is private (a 401): check the id's spelling, log in "
                         f"(huggingface_hub.login()) if it is yours, {own_path}. Known names: "
                         f"{', '.join(known_models())}.") from exc
    except LocalEntryNotFoundError as exc:
        raise ValueError(f"Unknown model {repo_id!r}: it is no shipped name, "
                         "and the Hugging Face Hub cannot be reached "
                         f"from here to fetch its config.json. Known names: {', '.join(known_models())}. A path to "
                         "its config.json (a file of a few KB) works too.") from exc
    except EntryNotFoundError as exc:
        raise ValueError(f"{repo_id} has no config.json on the Hub (it may hold an adapter or a GGUF file): pass the "
                         "id of the base model it was made from, or a config.json path.") from exc
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            raise ValueError(f"the Hub refused {repo_id}'s config.json ({status}): log in with an account that may "
                             f"read it (huggingface_hub.login()), {own_path}.") from exc
        raise ValueError(f"the Hub could not give {repo_id}'s config.json ({type(exc).__name__}"
                         f"{f' {status}' if status else ''}): try again, {own_path}.") from exc
    cfg = checked_sizes(_read_config(Path(path)), f"{repo_id}'s config.json")
    cfg.kit_name = repo_id
    return cfg


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
    except StrictDataclassError as exc:   # transformers 5 validates a config's fields and their agreement
        cause = str(exc.__cause__ or exc).strip().rstrip(".")
        raise InputError("model", f"{path}: transformers refuses this {data['model_type']} config ({cause}): fix "
                                  "the field it names in that file.", code="bad-config") from exc
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"transformers could not read {path} as a {data['model_type']} config "
                         f"({type(exc).__name__}: {first}): fix or replace that file.") from exc
