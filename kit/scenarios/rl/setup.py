"""The GRPO run of notebook 04 at each size: TRL's quick start (``GRPOTrainer(model=..., reward_funcs=
reward_num_unique_chars, train_dataset=...)``) with an ungated instruct model, prompts cut from the kit's shipped
text (no download), every completion its full length (``min_new_tokens``, so that the run is the estimate's setup).

- **real** (a GPU, Colab's T4): Qwen2.5-0.5B-Instruct from the Hub, loaded as GRPOTrainer loads a model given by
  id (fp32 weights, fp16 mixed precision: a T4 has no bf16), with a reference model (``beta=0.04``) and
  checkpointing off, as many tutorials write it;
- **smoke** (no GPU): the tiny twin of its family (Qwen2, 2 layers, random weights), fp32 on the CPU, a few rows.

The estimate at real size reads the config the kit ships for Qwen2.5-0.5B (offline): the Instruct model is the same
architecture (its ``config.json`` differs in no field the estimate reads).

>>> SIZES["smoke"].generations, SIZES["real"].completion
(4, 512)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from transformers import PrinterCallback

from kit import data as kdata
from kit.advise.grpo_levers import LEVERS, changed_config, lora_config
from kit.estimate import estimate_from
from kit.units import fmt_bytes, wrap

REAL_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"   # ungated, Apache-2.0
SHIPPED_CONFIG = "Qwen/Qwen2.5-0.5B"        # the same architecture: the config the kit ships, read offline
SMOKE_TWIN = "tiny-qwen2"


@dataclass(frozen=True)
class Size:
    """One size of the run: rows a step (``per_device_train_batch_size``), completions a prompt
    (``num_generations``), tokens a completion (``max_completion_length``) and a prompt, optimizer steps."""
    batch: int
    generations: int
    completion: int
    prompt: int
    steps: int


SIZES = {"real": Size(batch=8, generations=8, completion=512, prompt=64, steps=2),
         "smoke": Size(batch=4, generations=4, completion=16, prompt=12, steps=2)}


def reward_num_unique_chars(completions, **kwargs):
    """TRL's quick-start reward: the number of distinct characters in each completion."""
    return [float(len(set(c))) for c in completions]


def grpo_config(size: str, output_dir: str, **changes):
    """The notebook's GRPOConfig at ``size`` ("real" or "smoke"), with ``changes`` (GRPOConfig fields) set."""
    from trl import GRPOConfig

    s = SIZES[size]
    device = dict(fp16=True, bf16=False) if size == "real" else dict(use_cpu=True, bf16=False)
    cfg = GRPOConfig(output_dir=output_dir, per_device_train_batch_size=s.batch, num_generations=s.generations,
                     max_completion_length=s.completion, generation_kwargs={"min_new_tokens": s.completion},
                     beta=0.04, gradient_checkpointing=False, max_steps=s.steps, report_to="none",
                     save_strategy="no", logging_strategy="no", disable_tqdm=True, **device)
    return changed_config(cfg, changes) if changes else cfg


def real_estimate(cfg, peft_config=None):
    """The estimate at real size on a GPU (ESTIMATED: nothing loads), for ``cfg`` (a real-size GRPOConfig)."""
    return estimate_from(SHIPPED_CONFIG, grpo_config=cfg, peft_config=peft_config, seq_len=SIZES["real"].prompt)


def prompts(tokenizer, n_tokens: int, n_rows: int):
    """A Dataset of ``n_rows`` prompts of exactly ``n_tokens`` tokens each, cut from the shipped text (offline), so
    that no prompt is left-padded and the run is the estimate's setup."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": kdata.equal_token_rows(tokenizer, n_tokens, n_rows)})


def _model_and_tokenizer(size: str, folder: str):
    """(what GRPOTrainer loads, the tokenizer): the Hub id at real size; in smoke mode the twin, saved with
    ``save_pretrained`` so that GRPOTrainer loads it by path as it loads a Hub id (and builds its reference so)."""
    if size == "real":
        from transformers import AutoTokenizer

        return REAL_MODEL, AutoTokenizer.from_pretrained(REAL_MODEL)
    import torch

    from kit.models import build_model, get_config

    path = os.path.join(folder, SMOKE_TWIN)
    if not os.path.isdir(path):
        torch.manual_seed(0)
        build_model(get_config(SMOKE_TWIN)).save_pretrained(path)
    return path, kdata.shipped_tokenizer()


def trainer(size: str, cfg, peft: bool = False):
    """GRPOTrainer as TRL's quick start builds it, on the notebook's prompts; ``peft``: with a LoraConfig."""
    from trl import GRPOTrainer

    s = SIZES[size]
    model, tok = _model_and_tokenizer(size, cfg.output_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    rows = cfg.generation_batch_size // cfg.num_generations * s.steps
    built = GRPOTrainer(model=model, reward_funcs=reward_num_unique_chars, args=cfg, processing_class=tok,
                        train_dataset=prompts(tok, s.prompt, rows), peft_config=lora_config() if peft else None)
    built.remove_callback(PrinterCallback)   # its end-of-run dict of floats; the table says what matters
    return built


SHOWN = ("per_device_train_batch_size", "num_generations", "max_completion_length", "beta", "gradient_checkpointing",
         "fp16", "bf16")


def describe(cfg, peft: bool = False) -> str:
    """The fields of ``cfg`` that the notebook's story turns on, as the user writes them."""
    fields = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in SHOWN)
    return wrap(f"GRPOConfig({fields}, ...)" + (" with a LoraConfig" if peft else ""))


def apply_best(size: str, cfg, advice) -> tuple:
    """(GRPOConfig, peft) of the advisor's best change made to ``cfg`` at ``size``: the same lever(s), by name,
    applied to this size's config (at smoke size "half the batch" halves the twin's batch, not the real one's)."""
    best = advice.suggestions[0]
    est = real_estimate(cfg) if size == "real" else \
        estimate_from(SMOKE_TWIN, grpo_config=cfg, seq_len=SIZES[size].prompt, device="cpu")
    changes, peft = {}, False
    for name in best.name.split(" + "):
        lever = next(lv for lv in LEVERS if lv[0] == name)
        changes.update(lever[1](cfg, est) or {})
        peft = peft or lever[2]
    return changed_config(cfg, changes), peft


def try_completion(cfg, completion: int, device="colab-t4") -> tuple[bool, str]:
    """(fits, a line): ``cfg`` at real size with ``max_completion_length=completion``, ESTIMATED and judged against
    ``device`` as the advisor judges it (peak + the allocator's modelled gap)."""
    from kit.advise import limit_for
    from kit.advise.grpo_levers import judged

    lim = limit_for(device)
    new = changed_config(cfg, {"max_completion_length": completion,
                               "generation_kwargs": {"min_new_tokens": completion}})
    figure = judged(real_estimate(new), lim)
    fits = figure <= lim.usable_bytes
    return fits, (f"max_completion_length={completion}: ESTIMATED {fmt_bytes(figure)} (peak + allocator gap) of "
                  f"{fmt_bytes(lim.usable_bytes)}: " + ("fits" if fits else "does NOT fit"))


def cap_bytes(size: str, device="colab-t4"):
    """The memory cap a run gets: at real size the device's memory for torch (a larger GPU then runs as the T4
    would), in smoke mode none (the twin is far under any device)."""
    from kit.advise import limit_for

    return limit_for(device).limit_bytes if size == "real" else None
