"""Models: the real one from the Hub when it is reachable, else an architecture twin.

An *architecture twin* has random weights and exactly the real model's shapes, so exactly its memory. Its config
ships in ``kit/configs/``. Tiny twins (2 layers, small width) make CPU smoke runs fast. Twin and real models load
through the same ``from_pretrained`` call: the twin is saved once into a cache folder (:func:`write_twin`, a shard
at a time) and loaded from there with the user's own arguments (dtype, quantization, device map).

>>> build_model("distilgpt2", device="meta").num_parameters()
81912576
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.nn as nn
import transformers
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, PretrainedConfig

from kit import dtypes, machine, runtime
from kit.inputs import InputError

# Configs are model_configs' room; these names stay part of kit.models' API.
from kit.model_configs import CONFIG_DIR, REGISTRY, TINY, VOCAB_HEAD, get_config, known_models, smoke_twin, split_name
# part of kit.models' API: load_model and build_model wrap with it
from kit.vocab_head import VocabHeadModel  # noqa: F401

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
           "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def as_dtype(dtype) -> torch.dtype:
    """``torch.float32`` / ``"fp32"`` / ``"bf16"`` ... -> a ``torch.dtype``: ``as_dtype("bf16")`` is torch.bfloat16."""
    if isinstance(dtype, torch.dtype) or (isinstance(dtype, str) and dtype.lower() in _DTYPES):
        return dtype if isinstance(dtype, torch.dtype) else _DTYPES[dtype.lower()]
    raise ValueError(f"Unknown dtype {dtype!r}: use one of {sorted(_DTYPES)} or a torch.dtype.")


def set_checkpointing(model: nn.Module, enabled: bool = True, kwargs: dict | None = None) -> nn.Module:
    """Activation checkpointing on (with ``kwargs``, e.g. ``{"use_reentrant": False}``) or off, by the name this
    transformers has: ``activation_checkpointing_enable`` / ``_disable`` since 5.25, where the older
    ``gradient_checkpointing_*`` names warn that v6 removes them; those older names before."""
    if hasattr(model, "activation_checkpointing_enable"):
        if enabled:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.activation_checkpointing_disable()
    elif enabled:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_disable()
    return model


def _build_device(device) -> str:
    """``device`` for :func:`build_model`: "cpu", "meta", "cuda" or "cuda:N", refused in one sentence otherwise
    (and "cuda" where torch sees no GPU)."""
    text = str(device)
    if not re.fullmatch(r"cpu|meta|cuda(:\d+)?", text):
        raise ValueError(f"build_model builds on 'cpu', 'meta' or 'cuda' (or 'cuda:N'), not {device!r}.")
    if text.startswith("cuda") and not machine.has_cuda():
        raise ValueError(f"build_model(device={text!r}) needs a CUDA GPU, and torch sees none here: "
                         "pass device='cpu' (or machine.device_name()).")
    return text


def build_model(name_or_config, *, device: str = "cpu", dtype=torch.float32, task: str = "causal-lm",
                num_labels: int = 2) -> nn.Module:
    """A random-weight twin built from a config, on ``"cpu"``, ``"cuda"`` (built where it runs: no copy in RAM)
    or ``"meta"`` (no memory, instant).

    >>> build_model("meta-llama/Meta-Llama-3-8B", device="meta").num_parameters()
    8030261248
    >>> build_model("tiny-gpt2+vocab-head").custom_layer        # doctest: +ELLIPSIS
    Linear(in_features=4097, out_features=4097, bias=True)
    """
    device = _build_device(device)
    dtype = as_dtype(dtype)
    cfg = get_config(name_or_config)
    head = getattr(cfg, "kit_vocab_head", False)
    if head and task != "causal-lm":
        raise InputError("task", f"{cfg.kit_name}{VOCAB_HEAD} is scenario 1's model, a Linear(V, V) head on a causal "
                                 f"LM's logits, and has no {task} head: drop the task, or pass the base model "
                                 f"({cfg.kit_name}) with task {task!r}.", code="contradicts")
    if head:  # build the base as shipped; the wrapper adds the pad token like the user did
        del cfg.kit_vocab_head
        cfg.vocab_size -= 1
        cfg.pad_token_id = None
    auto = _auto_class(cfg, task)
    if task != "causal-lm":
        cfg.num_labels = num_labels
    try:
        with torch.device(device):
            model = auto.from_config(cfg, **_dtype_kw(dtype))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ZeroDivisionError, AssertionError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ValueError(f"transformers could not build a {cfg.model_type} model from this config "
                         f"({type(exc).__name__}: {first}): check its sizes (hidden size, heads, layers).") from exc
    return VocabHeadModel(model) if head else model


def _auto_class(cfg: PretrainedConfig, task: str):
    """The Auto class that builds ``task``'s model (a classifier head for "seq-cls" and "token-cls"; else a causal
    LM), refusing in one sentence a config that transformers cannot build so."""
    import transformers.models.auto.modeling_auto as auto

    if task not in ("seq-cls", "token-cls"):
        if getattr(cfg, "is_encoder_decoder", False) and type(cfg) in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING:
            return transformers.AutoModelForSeq2SeqLM   # an encoder-decoder's LM head (T5's), as Seq2SeqTrainer's
        if type(cfg) in auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING and type(cfg) not in auto.MODEL_FOR_CAUSAL_LM_MAPPING:
            return transformers.AutoModelForImageTextToText   # a vision-language model, as TRL's VLM docs load it
        _check_causal_lm(cfg)
        return AutoModelForCausalLM
    what = "Sequence" if task == "seq-cls" else "Token"
    if type(cfg) not in getattr(auto, f"MODEL_FOR_{what.upper()}_CLASSIFICATION_MAPPING"):
        raise ValueError(f"{cfg.model_type} ({type(cfg).__name__}) has no AutoModelFor{what}Classification class in "
                         "transformers: estimate it as another task.")
    return getattr(transformers, f"AutoModelFor{what}Classification")


def _check_causal_lm(cfg: PretrainedConfig) -> None:
    """Refuse, in one sentence, a config that transformers cannot build as a causal LM (an encoder, a vision model)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if type(cfg) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(f"{cfg.model_type} ({type(cfg).__name__}) is not a causal language model (transformers "
                         "has no AutoModelForCausalLM or AutoModelForSeq2SeqLM class for it: an encoder, or a vision "
                         "model): pass a decoder-only LM such as GPT-2, Llama or Mistral.")


def _dtype_kw(dtype: torch.dtype) -> dict:
    # transformers < 4.56 names it torch_dtype (Colab may still have one of those).
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def bnb_config(quantization: str = "none", compute_dtype=None, quant_type: str = "nf4",
               double_quant: bool = True) -> BitsAndBytesConfig | None:
    """The ``BitsAndBytesConfig`` of a quantization choice: 4bit = NF4 + double quant, computing by default
    in :mod:`kit.dtypes`' 16 bits for this GPU (fp16 below compute capability 8.0, such as a T4; else bf16,
    and bf16 on a CPU); ``quant_type``, ``double_quant`` and ``compute_dtype`` are estimate()'s 4-bit options.

    >>> c = bnb_config("4bit", compute_dtype="fp32", quant_type="fp4", double_quant=False)
    >>> c.bnb_4bit_quant_type, c.bnb_4bit_use_double_quant, c.bnb_4bit_compute_dtype
    ('fp4', False, torch.float32)
    """
    if quantization in (None, "none"):
        return None
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization == "4bit":
        compute_dtype = dtypes.for_this_device()[0] if compute_dtype is None else compute_dtype
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                  bnb_4bit_use_double_quant=bool(double_quant),
                                  bnb_4bit_compute_dtype=as_dtype(compute_dtype))
    raise ValueError(f"quantization must be 'none', '8bit' or '4bit', not {quantization!r}.")


def _check_bnb(device: str) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("4-bit/8-bit loading needs bitsandbytes, which is not installed (Colab lacks "
                           "it): run `pip install bitsandbytes`, or use quantization='none'.") from exc
    if device == "cpu" and tuple(int(x) for x in bitsandbytes.__version__.split(".")[:2]) < (0, 46):
        raise RuntimeError(f"bitsandbytes {bitsandbytes.__version__} has no CPU backend: 4-bit/8-bit on a CPU "
                           "needs bitsandbytes >= 0.46 (or use a GPU, or quantization='none').")


def cache_root() -> Path:
    """The folder the twins are saved under: ``$KIT_CACHE`` (``~`` expanded, as a shell would), else
    ``$HF_HOME/kit-twins``; one sentence, naming the variable, where a file stands in the way of that folder.

    >>> from unittest import mock
    >>> with mock.patch.dict(os.environ, {"KIT_CACHE": "~/kitcache"}):
    ...     cache_root() == Path("~/kitcache").expanduser()
    True
    """
    given = os.environ.get("KIT_CACHE")
    root = Path(given or os.path.join(os.environ.get("HF_HOME") or "~/.cache/huggingface", "kit-twins")).expanduser()
    blocked = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        variable = "KIT_CACHE" if given else "HF_HOME"
        raise InputError(variable, f"{variable} is {os.environ[variable]!r}, and {blocked} is a file, not a folder: "
                                   f"point {variable} at a folder (made if missing), or unset it.", code="bad-cache")
    return root


def twin_dir(name: str, dtype) -> Path:
    """Where the saved twin of ``name`` lives: under ``$KIT_CACHE``, else ``$HF_HOME/kit-twins``.

    The folder name carries the dtype and a hash of the config, so an edited config
    never reuses a stale twin.
    """
    root = cache_root()
    digest = hashlib.sha1(get_config(name).to_json_string().encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "--", str(name))
    return Path(root) / f"{safe}-{str(as_dtype(dtype)).replace('torch.', '')}-{digest}"


SHARD_BYTES = 512 * 2**20   # a twin is written one safetensors shard of about this size at a time
_FILL = 1_000_003          # the repeated block of random values: a prime length, so rows never align with it


def _twin_tensors(cfg: PretrainedConfig, dtype: torch.dtype) -> tuple[nn.Module, dict]:
    """A model with its parameters on ``meta`` (no memory, no init; buffers real), and name -> tensor of its
    state dict, each storage once (a tied weight under its first name)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), **_dtype_kw(dtype))
    seen, out = set(), {}
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) not in seen:
            seen.add(id(v))
            out[k] = v
    return model, out


def twin_bytes(cfg: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of a twin's weights on disk (and in memory once loaded unquantized), from the shapes alone."""
    return sum(t.numel() * t.element_size() for t in _twin_tensors(cfg, dtype)[1].values())


def write_twin(cfg: PretrainedConfig, folder: Path, dtype: torch.dtype) -> Path:
    """Save an architecture twin for ``from_pretrained`` without building it: the shapes come from a ``meta``
    model and each shard of about :data:`SHARD_BYTES` is filled and written in turn, so RAM holds one shard,
    never the model. The fill is cheap (a block of N(0, 0.02) values repeated; norm weights 1, biases 0):
    memory depends on shapes and dtypes, not values. transformers' ``normal_`` init of every element runs at
    64-76 M elements/s on a 2-core CPU, 2 minutes for an 8B model."""
    from safetensors.torch import save_file

    model, tensors = _twin_tensors(cfg, dtype)
    shards, size, block, gen = [{}], 0, {}, torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        shards, size = (shards + [{}], 0) if shards[-1] and size + t.numel() * t.element_size() > SHARD_BYTES \
            else (shards, size)
        shards[-1][name], size = t, size + t.numel() * t.element_size()
    folder.mkdir(parents=True, exist_ok=True)
    index: dict = {}
    for i, shard in enumerate(shards, 1):
        fname, out = f"model-{i:05d}-of-{len(shards):05d}.safetensors", {}
        for name, t in shard.items():
            if not t.is_meta:                                   # a real buffer keeps its values
                out[name] = t.detach().to(dtype if t.is_floating_point() else t.dtype).contiguous()
                continue
            x = out[name] = torch.empty(t.shape, dtype=t.dtype)   # [*shape] in the twin's dtype
            if t.dim() < 2:
                x.fill_(1.0 if "norm" in name or ".ln" in name else 0.0)
                continue
            b = block.setdefault(t.dtype, torch.randn(_FILL, generator=gen).mul_(0.02).to(t.dtype))
            for j in range(0, x.numel(), _FILL):
                x.view(-1)[j:j + _FILL].copy_(b[:min(_FILL, x.numel() - j)])
        save_file(out, str(folder / fname), metadata={"format": "pt"})
        index.update(dict.fromkeys(out, fname))
        del out
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index_json = json.dumps({"metadata": {"total_size": total}, "weight_map": index})
    (folder / "model.safetensors.index.json").write_text(index_json)
    model.config.save_pretrained(folder)
    return folder


def saved_twin(name: str, dtype: torch.dtype) -> Path:
    """The folder holding the saved architecture twin of ``name`` in ``dtype``, written first if it is not there
    (:func:`write_twin`): what ``from_pretrained`` loads in place of the real model.

    >>> (saved_twin("tiny-llama", torch.float32) / "config.json").is_file()
    True
    """
    folder = twin_dir(name, dtype)
    if not (folder / "config.json").is_file():
        if problem := twin_problem(name, dtype):
            raise RuntimeError(problem)
        # Written into a temporary folder, then renamed: an interrupted save leaves no half twin.
        tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        write_twin(get_config(name), tmp, as_dtype(dtype))
        try:
            tmp.rename(folder)
        except OSError:  # another process saved it first
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def twin_problem(name: str, dtype) -> str | None:
    """Why the twin of ``name`` cannot be written here (not enough free disk for its weights), or None,
    also when it is saved already. It is written one shard at a time, so RAM holds one shard
    (:data:`SHARD_BYTES`), never the model."""
    folder = twin_dir(name, dtype)
    if (folder / "config.json").is_file():
        return None
    need = twin_bytes(get_config(name), as_dtype(dtype))
    free = shutil.disk_usage(next(p for p in [folder, *folder.parents] if p.exists())).free
    if need + SHARD_BYTES > free:
        return (f"the architecture twin of {name} needs {need / 2**30:.1f} GiB of disk in {folder.parent} and "
                f"{free / 2**30:.1f} GiB is free: set KIT_CACHE to a folder with more room, or pick a smaller model.")
    return None


def pretrained_source(name: str, dtype=None) -> tuple[str, str]:
    """``(what to pass to from_pretrained, the line that says which it is)`` for a user's own
    ``AutoModelForCausalLM.from_pretrained(model_name, ...)``: the Hub id where the Hub serves it, else
    the folder of its architecture twin (gated without a token, unreachable, or a tiny twin). Asking for the
    model's ``config.json`` is the check: a gated repo refuses it as it would refuse the weights.

    >>> path, line = pretrained_source("tiny-llama")
    >>> line
    'MODEL: tiny TWIN tiny-llama (random weights) — tiny twins never come from the Hub'
    """
    base, _ = split_name(name)
    get_config(base)  # fails early, with the known names, on a typo
    why = _twin_without_asking(base)
    if why is None:
        from huggingface_hub import hf_hub_download

        try:
            hf_hub_download(base, "config.json")
            return base, f"MODEL: REAL {base}, pretrained weights from the Hub"
        except OSError as exc:  # GatedRepoError and every other Hub refusal are OSErrors
            why = _refused(exc)
    kind, shapes = _twin_words(base)
    folder = saved_twin(base, as_dtype(dtype) if dtype is not None else torch.float32)
    return str(folder), f"MODEL: {kind} {base} ({shapes}) — {why}"


def _twin_without_asking(base: str) -> str | None:
    """Why ``base`` is a twin before the Hub is asked (a tiny twin, a config not in the registry, no Hub), or None."""
    if base in TINY or base not in REGISTRY:
        return "tiny twins never come from the Hub" if base in TINY else f"built from {base}"
    return None if runtime.hub_reachable() else "the Hub is not reachable"


def _refused(exc: OSError) -> str:
    first = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"the Hub refused it ({type(exc).__name__}: {first})"


def _twin_words(base: str) -> tuple[str, str]:
    return ("tiny TWIN", "random weights") if base in TINY else ("architecture TWIN of", "random weights, real shapes")


def load_model(name: str, *, quantization="none", load_dtype=None, device: str | None = None,
               tokenizer=None) -> nn.Module:
    """The real model from the Hub when reachable, else its architecture twin, both through
    ``from_pretrained``. Prints which it is, and sets ``model.kit_source`` to "real" or "twin".

    ``quantization``: "none", "8bit", "4bit" (:func:`bnb_config`, computing in :mod:`kit.dtypes`' 16 bits:
    fp16 on a GPU without native bf16, such as a T4, else bf16), or a ``BitsAndBytesConfig``.
    ``load_dtype`` defaults to fp32, or with quantization to those 16 bits (for the unquantized parts).
    ``device`` defaults to CUDA when there is a GPU, else the CPU. For ``+vocab-head``
    names the base loads this way and is then wrapped (V = ``len(tokenizer)`` if given)."""
    base, head = split_name(name)
    get_config(base)  # fails early, with the known names, on a typo
    quant = None
    if isinstance(quantization, BitsAndBytesConfig):
        quant = quantization
        quantization = "4bit" if quant.load_in_4bit else "8bit" if quant.load_in_8bit else "none"
        if quantization == "none":
            raise ValueError("The BitsAndBytesConfig loads neither in 4-bit nor in 8-bit: set load_in_4bit or "
                             "load_in_8bit, or pass quantization='none'.")
    from kit.machine import device_name  # lazily: the estimate builds on meta and never needs torch.cuda

    device = device or device_name()
    sixteen = as_dtype(dtypes.for_this_device()[0] if str(device).startswith("cuda") else "bf16")  # a T4: fp16
    if quant is None:
        quant = bnb_config(quantization, compute_dtype=sixteen)
    dtype = as_dtype(load_dtype) if load_dtype is not None else (sixteen if quant else torch.float32)
    kwargs = dict(_dtype_kw(dtype), device_map={"": device}, **({"quantization_config": quant} if quant else {}))
    if quant is not None:
        _check_bnb(device)
    label = f"{base}{' ' + quantization if quant else ''}, {str(dtype).replace('torch.', '')}, on {device}"
    model, source, why = None, "twin", _twin_without_asking(base)
    if why is None:
        try:
            model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
            source = "real"
        except OSError as exc:  # gated (Llama needs a login) or missing: say so, use the twin
            why = _refused(exc)
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(saved_twin(base, dtype), **kwargs)
        kind, shapes = _twin_words(base)
        runtime.say(f"MODEL: {kind} {label} ({shapes}) — {why}")
    else:
        runtime.say(f"MODEL: REAL {label}, pretrained weights from the Hub")
    if head:
        model = VocabHeadModel(model, len(tokenizer) if tokenizer is not None else None)
    model.kit_source, model.kit_name = source, name
    return model
