"""The estimator against code nobody here wrote, measured by a meter that is not the kit's own.

Run: ``python benchmarks/real_clients.py [--only TEXT] [--out PATH]`` (2 minutes alone on the 2 CPU cores of the
machine it was written on, 6 with other jobs sharing them; ``--only`` runs the rows whose client or setup contains
TEXT). It prints one table and writes it to a new dated file, ``benchmarks/results/real_clients-<date>-cpu.md``
(:func:`results_file.write_table`; an old result is never overwritten).

The clients, each on a CPU tiny twin (random weights, the shapes of ``kit/configs/tiny-*.json``), real steps:

1. scenario 1 as the user wrote it: their ``Custom_GPT2_Model(nn.Module)`` verbatim (as
   ``kit.scenarios.custom_head.user_code`` holds it) around ``AutoModelForCausalLM.from_pretrained`` of a tiny
   GPT-2 twin saved with ``save_pretrained``, their ``tokenize_func`` (padding='max_length', 128), their
   TrainingArguments and a plain ``Trainer``;
   estimated by ``estimate_trainer(trainer, device="cpu")``;
2. scenario 2's ``SFTTrainer`` (TRL) with a ``LoraConfig``: packing on and off, vocabularies of 4096 and 128256,
   fp32 and bitsandbytes NF4 (4-bit, which runs on the CPU); ``estimate_trainer``;
3. TRL's own recipe, ``trl/scripts/sft.py``: ``SFTTrainer(model=<path>)`` with SFTConfig's defaults and
   ``get_peft_config`` off and on; ``estimate_trainer``;
4. peft's documented LoRA causal-LM pattern: ``get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", ...))`` +
   ``Trainer`` + ``DataCollatorForLanguageModeling``; ``estimate_trainer``;
   4b. the same with trained embeddings and head, as Google's Gemma guide writes it (``modules_to_save=["lm_head",
   "embed_tokens"]``: peft's trained copies beside the frozen originals), on an untied (Llama) and a tied (Qwen2) twin;
   4c. peft's DoRA (``LoraConfig(use_dora=True)``, r8, default targets), with and without lora_dropout, fp32 and bf16;
5. a plain PyTorch loop (``outputs = model(**batch); loss = outputs.loss; loss.backward(); optimizer.step();
   optimizer.zero_grad()`` with ``torch.optim.AdamW``); ``estimate(model, batch_size=, seq_len=, device="cpu")``;
6. TRL's ``DPOTrainer`` built as ``tests/test_dpo.py`` builds it (pairs of a 20-token prompt, 30-token chosen and
   20-token rejected completion, ``DPOConfig(use_cpu=True, bf16=False)``, B2): full fine-tuning with an explicit
   ``ref_model`` (a second ``build_model("tiny-llama")``: offline, TRL cannot load a reference by id), and LoRA via
   ``peft_config`` (the reference is the adapter-disabled policy); ``estimate_trainer``. Client 2's SFTTrainer also
   runs with ``loss_type="chunked_nll"`` (packing on; TRL 1.16's SFTConfig rewrites it to "nll", deprecated, so the
   row runs the steps of its "nll" twin, which already computes the loss in tiles) and with ``padding_free=True``
   (packing off, so ``max_length=None``: TRL refuses padding-free rows it cannot truncate), vocab 4096;
   6c. TRL's ``KTOTrainer`` as its quick start writes it (``benchmarks/clients_kto.py``: a tiny Llama twin by path,
   unpaired rows of a 20-token prompt and a 30- or 20-token completion by turns, B2, with an eval set): full
   fine-tuning (the reference copy TRL loads from the path) and LoRA via ``peft_config`` (the adapter-disabled
   reference); ``estimate_trainer``, and ``trainer.evaluate()`` metered after training;
   6b. TRL's ``RewardTrainer`` as its docs' quick start writes it (a model path, a one-label sequence classifier),
   full and with ``LoraConfig(modules_to_save=["score"])``, on the same pairs; ``estimate_trainer``;
7. checkpointing as transformers and TRL offer it, on a 4-block tiny-llama: ``activation_checkpointing_kwargs=
   {"every_n_layers": 2}`` (runs on a CPU as shipped), ``{"offload": True}`` and ``SFTConfig(activation_offloading=
   True)``. The two offloaders need an accelerator, so each runs with the one stand-in
   ``benchmarks/offload_meter.py`` gives it (unpinned host copies; the CPU as TRL's accelerator, with streams that do
   nothing). On a CPU host and device are one memory: those two rows set the meter's reading beside the estimate's
   device + host figure (``offload_meter.expected``), not its device peak;
8. ``optim="paged_adamw_32bit"`` and ``"adamw_bnb_8bit"`` on the same twin: bitsandbytes runs its CPU kernels in
   torch ops inside its custom ops (temporaries a dispatch mode cannot see, this meter does), and its paged state
   is plain tensors on a CPU, counted in the CPU's peak as ``estimate_trainer(..., device="cpu")`` holds them;
9. ``optim="adafactor"`` (transformers' Adafactor as Trainer builds it: factored second moments, no first moment)
   and 10. ``Trainer(optimizers=(torch.optim.Muon(2-D parameters), None))``, full fine-tuning of a 4-block
   tiny-llama in fp32 and bf16, at B4 x 64 (the backward is the peak) and B1 x 16 (the optimizer step is).
11. transformers' task guides for classifiers (decoders: tiny Qwen2 and Llama; encoders: tiny BERT and RoBERTa):
   ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=3)`` + ``DataCollatorWithPadding`` (and
   ``AutoModelForTokenClassification`` + ``DataCollatorForTokenClassification``) + ``Trainer`` with an eval set,
   full fine-tuning and peft's ``LoraConfig(task_type="SEQ_CLS")`` (its ``modules_to_save`` copy of the head,
   ``score`` or ``classifier``, trains); ``estimate_trainer``, and ``trainer.evaluate()`` metered after training
   (``per_device_eval_batch_size`` 8).
12. TRL's quick-start ``GRPOTrainer`` (``benchmarks/clients_grpo.py``): a tiny Qwen2 twin by path, its
   ``reward_num_unique_chars``, prompts of 12 tokens, completions of a fixed length (``min_new_tokens``), fp32:
   beta=0, beta>0 (a reference copy), LoRA (the adapter-disabled reference), steps_per_generation=2, and a long
   completion; the generation phase (``_generate_and_score_completions``) metered apart in the setup cell.
   TRL's quick-start ``RLOOTrainer`` (``benchmarks/clients_rloo.py``), the same way: RLOOConfig's default beta=0.05
   (a reference copy), beta=0, LoRA (the adapter-disabled reference) and steps_per_generation=2.
   TRL's ``DistillationTrainer`` (``benchmarks/clients_distillation.py``), the same way: a tiny Qwen2 student and a
   twice-wider tiny Qwen2 teacher (the same vocabulary, both by path), the default reverse KL (beta=1), the JSD
   (beta=0.5), a LoRA student, gradient_accumulation_steps=2, DistillationConfig's default bf16=True (full and LoRA),
   and prompts of two lengths (left-padded); the teacher's weights held at every step.
12. the user's own head (``benchmarks/clients_own_head.py``): ``AutoModel.from_pretrained`` (tiny Llama, Qwen2, BERT)
   + mean / last-token / first-token pooling + dropout + ``nn.Linear`` layer(s) + ``CrossEntropyLoss`` in a plain
   ``nn.Module`` whose forward returns the loss; under ``Trainer`` (``estimate_trainer``, ``evaluate()`` metered) and
   in a plain loop watched by ``kit.watch_loop`` (``watch.estimate``).
13. loops as PyTorch's recipes write them, watched by ``kit.watch_loop`` with no option given
   (:func:`client_loop_watched`): the AMP recipe (``torch.autocast`` in bf16, a ``GradScaler``, 4 micro-batches per
   optimizer step), whose precision and accumulation the watch reads from what it sees; and plain
   ``torch.optim.SGD`` (no momentum: no optimizer state).
14. a full fine-tune with its bottom half frozen, as the recipes write it (``for p in model.model.embed_tokens
   .parameters(): p.requires_grad = False`` and the same over ``model.model.layers[:2]`` of 4), on an untied (Llama)
   and a tied (Qwen2: its LM head is the frozen embedding) twin; ``Trainer``, ``estimate_trainer``.
15. frozen norms (``requires_grad = False`` on the blocks' RMSNorm weights while their Linear weights train), on the
   same two twins: a Muon run as Muon recipes route it (``torch.optim.Muon`` takes only 2-D parameters, so the norms,
   embeddings and LM head are frozen and Muon given the rest, ``Trainer(optimizers=(muon, None))``), and every norm
   frozen under Trainer's AdamW; ``estimate_trainer``.

The rows are token chunks of one length (re-encoded text that keeps its length), so that every measured step has
the batch shape the estimate reads (``estimate_trainer`` reads the longest batch of the first 64 rows).

The meter (not ``kit.measure.tensor_peak.TensorPeak``): PyTorch's profiler memory events.
``torch.profiler.profile(activities=[CPU], profile_memory=True)`` records each allocation and free of the c10 CPU
allocator as a ``[memory]`` event (signed ``nbytes``, ``start_ns``). ONE profile spans the whole run, and each
optimizer step is a ``record_function`` range (Trainer: opened in ``on_step_begin``, closed in ``on_step_end``;
the loop: around its body). One profile and not one per step because the profiler drops the free of a block
allocated before it started ("Memory block of unknown size was allocated before the profiling started"): a
per-step profile would miss, e.g., the previous iteration's ``outputs`` freed in the middle of the next forward.
A step's peak = the bytes of the unique storages alive when it begins that the step could free (parameters with
bitsandbytes' quant state, buffers, gradients, the optimizer state, the batch: Trainer's prefetched micro-batches,
or the loop's batch and its previous ``outputs``; a DPOTrainer's separate ``ref_model``: its weights and buffers)
+ the highest running sum of the memory events inside its range.
Step 1 (no optimizer state yet during its backward) is compared with ``first_step_peak_bytes``, the steady step
(the larger of steps 2 and 3) with ``peak_bytes``. ``tests/test_real_clients.py`` checks the meter on a matmul chain
whose peak is known to the byte; a full run also measures two clients a second time with TensorPeak (the kit's own
meter) and prints the agreement, byte by byte (``--no-tensor-peak`` skips it).
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import gc
import importlib.util
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch
from results_file import OUT_HELP, write_table
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from kit.data import equal_token_rows

MiB = 2**20
MARK = "real_clients::step"
BAND = (0.98, 1.02)


# ---- the meter -------------------------------------------------------------------------------------------------
def tensors_in(obj, depth=0):
    """Every tensor reachable from ``obj`` through mappings (a collator's BatchFeature or BatchEncoding too), lists,
    tuples, ModelOutputs and a KV cache's layers."""
    if depth > 6 or obj is None:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from tensors_in(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v, depth + 1)
    elif hasattr(obj, "layers") and isinstance(obj.layers, (list, tuple)):  # transformers' Cache
        for layer in obj.layers:
            for name in ("keys", "values"):
                yield from tensors_in(getattr(layer, name, None), depth + 1)


def _with_quant(t):
    """A tensor, and the tensors bitsandbytes keeps beside a 4-bit weight (absmax, code, offset, nested state)."""
    yield t
    qs = getattr(t, "quant_state", None)
    for q in (qs, getattr(qs, "state2", None)):
        for name in ("absmax", "code", "offset"):
            v = getattr(q, name, None)
            if isinstance(v, torch.Tensor):
                yield v


def storage_bytes(tensors) -> int:
    """Bytes of the unique CPU storages behind ``tensors`` (a view counts its whole storage, once)."""
    seen = {}
    for t in tensors:
        for x in _with_quant(t):
            if isinstance(x, torch.Tensor) and not x.is_meta and x.device.type == "cpu":
                st = x.untyped_storage()
                if st.nbytes():
                    seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def optimizer_state(optimizer) -> list:
    opt = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    return [v for s in opt.state.values() for v in tensors_in(s)]


def held_bytes(model, optimizer, *extra) -> int:
    """What is alive when a step begins and the step could free: weights (quant state too), buffers,
    gradients, optimizer state, and ``extra`` (the batch, a loop's previous outputs)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state = optimizer_state(optimizer) if optimizer is not None else []
    return storage_bytes([*params, *model.buffers(), *grads, *state, *(t for e in extra for t in tensors_in(e))])


class ProfilerMeter:
    """Step peaks from the profiler's memory events: ``start()``, then per step ``begin(held)`` ... ``end()``,
    then ``stop()``; ``peaks`` holds one figure per step (held + the highest running sum inside its range)."""

    def __init__(self):
        self.prof, self.held, self.peaks, self._rf = None, [], [], None

    def start(self):
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self.prof.__enter__()

    def begin(self, held: int):
        self.held.append(held)
        self._rf = record_function(f"{MARK}{len(self.held)}")
        self._rf.__enter__()

    def end(self):
        self._rf.__exit__(None, None, None)
        self._rf = None

    def stop(self):
        self.prof.__exit__(None, None, None)
        self.peaks = window_peaks(self.prof, self.held)
        self.prof = None
        return self.peaks


def window_peaks(prof, held) -> list:
    """held[k] + the highest running sum of the ``[memory]`` events inside the k-th ``MARK`` range."""
    events = prof.profiler.kineto_results.events()
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]")
    times = [m[0] for m in mem]
    marks = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name().startswith(MARK)}
    peaks = []
    for k, h in enumerate(held, 1):
        start, end = marks[f"{MARK}{k}"]
        run = top = 0
        for _, _, n in mem[bisect.bisect_left(times, start):bisect.bisect_right(times, end)]:
            run += n
            top = max(top, run)
        peaks.append(h + top)
    return peaks


class TensorPeakMeter:
    """The same step windows read by the kit's TensorPeak instead (only for the cross-check)."""

    def __init__(self):
        self.peaks, self.m, self.h = [], None, 0

    def start(self):
        pass

    def begin(self, held: int):
        from kit.measure.tensor_peak import TensorPeak

        self.h, self.m = held, TensorPeak()
        self.m.__enter__()

    def end(self):
        self.m.__exit__(None, None, None)
        self.peaks.append(self.h + self.m.peak_bytes - self.m.start_bytes)

    def stop(self):
        return self.peaks


def reference_held(trainer, model) -> list:
    """A DPOTrainer's or KTOTrainer's separate reference model's weights and buffers, or a distillation's teacher's,
    held all along (none for a PEFT policy: it is its own reference)."""
    ref = getattr(trainer, "ref_model", None)
    ref = ref if ref is not None else getattr(trainer, "teacher_model", None)
    return [*ref.parameters(), *ref.buffers()] if isinstance(ref, nn.Module) and ref is not model else []


def fetched_ahead(epoch_iterator):
    """The batch accelerate's data loader has fetched ahead (``DataLoaderShard.__iter__`` collates the next batch
    before it yields this one: its ``next_batch``, alive through the step), or None."""
    frame = getattr(epoch_iterator, "gi_frame", None)
    return frame.f_locals.get("next_batch") if frame is not None else None


def meter_trainer(trainer, meter):
    """Measure each optimizer step of ``trainer.train()``: the profile spans the training (``on_train_begin`` to
    ``on_train_end``), each step is a range from ``on_step_begin`` to ``on_step_end``; the batch counted as held is
    the micro-batches Trainer prefetched for the step (``get_batch_samples``, called before ``on_step_begin``) and
    the next batch accelerate's data loader fetched ahead of them (:func:`fetched_ahead`)."""
    from transformers import TrainerCallback

    box = {"batch": None, "ahead": None}
    fetch = trainer.get_batch_samples

    def get_batch_samples(epoch_iterator, *a, **kw):
        out = fetch(epoch_iterator, *a, **kw)
        box["batch"], box["ahead"] = out[0], fetched_ahead(epoch_iterator)
        return out

    trainer.get_batch_samples = get_batch_samples

    class Steps(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            meter.start()

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):
            meter.begin(held_bytes(model, optimizer, box["batch"], box["ahead"], reference_held(trainer, model)))

        def on_step_end(self, args, state, control, **kw):
            meter.end()

        def on_train_end(self, args, state, control, **kw):
            meter.stop()

    trainer.add_callback(Steps())
    return meter


# ---- data and twins ----------------------------------------------------------------------------------------------
def tokenizer():
    from kit import data

    return data.shipped_tokenizer()


def twin_dir(name: str, folder: str, **overrides) -> str:
    """A tiny twin built from ``kit/configs/<name>.json`` (config overrides applied) and saved with
    save_pretrained, so that the client loads it with from_pretrained as it would a Hub model."""
    from kit.models import build_model, get_config

    cfg = get_config(name)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    path = os.path.join(folder, name + "".join(f"-{k}{v}" for k, v in overrides.items()))
    if not os.path.isdir(path):
        build_model(cfg).save_pretrained(path)
    return path


def _bnb4():
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=torch.bfloat16)


def _sft_kw(out):
    return dict(output_dir=out, use_cpu=True, max_steps=3, report_to="none", save_strategy="no",
                logging_strategy="no", disable_tqdm=True)


# ---- the clients ------------------------------------------------------------------------------------------------
# Each returns (label, setup, estimate or refusal, meter). ``meter`` is the measuring class to use.
def client_s1(work, meter_cls):
    """Scenario 1 as written: the user's class, verbatim, their tokenize_func and TrainingArguments."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tokenizer = tok = globals()["tokenizer"]()
    # The user's GPT-2 had one token fewer than their tokenizer once they added [PAD]: the twin too, so that
    # resize_token_embeddings grows it by one row, as it did for them (4095 -> 4096).
    model_name = twin_dir("tiny-gpt2", work, vocab_size=len(tok) - 1)

    # The user's class, verbatim from the post, as the kit ships it; it reads their module-level model_name.
    from kit.scenarios.custom_head import user_code

    user_code.model_name = model_name
    Custom_GPT2_Model = user_code.Custom_GPT2_Model

    def tokenize_func(examples):  # the user's: padded to max_length 128
        return tokenizer(examples["text"], padding="max_length", truncation=True, max_length=128)

    # Rows of 100 tokens padded to 128 (every batch has padding, as the user's wikitext lines had).
    ds = Dataset.from_dict({"text": equal_token_rows(tok, 100, 64)}).map(tokenize_func, batched=True,
                                                                         remove_columns=["text"])
    torch.manual_seed(0)
    model = Custom_GPT2_Model(tokenizer)
    training_args = TrainingArguments(
        output_dir=os.path.join(work, "s1"),
        per_device_train_batch_size=1,
        gradient_accumulation_steps=16,
        learning_rate=0.1,
        warmup_steps=2500,
        # logging_dir="./logs": dropped, transformers 5 refuses it
        # fp16=True: dropped, a CPU has no fp16 mixed precision (Trainer ignores it there; the run is fp32)
        use_cpu=True, max_steps=3, report_to="none", save_strategy="no", disable_tqdm=True,  # added: a short CPU run
    )
    # The user's post passes no collator; their forward needs labels: the LM collator, as the kit's scenario runs it.
    trainer = Trainer(model=model, args=training_args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    yield ("1. scenario 1 as written", "Custom_GPT2_Model (VxV head, frozen ckpt GPT-2), B1 x 128 padded, accum 16",
           trainer, lambda: estimate_trainer(trainer, device="cpu"))


def client_s2(work, vocab, packing, quant, **sft_extra):
    """Scenario 2; ``sft_extra`` (e.g. loss_type="chunked_nll", padding_free=True) goes to SFTConfig as well."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    path = twin_dir("tiny-llama", work, vocab_size=vocab)
    torch.manual_seed(0)
    if quant:
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=_bnb4(), dtype=torch.bfloat16,
                                                     device_map={"": "cpu"})
    else:
        model = AutoModelForCausalLM.from_pretrained(path)
    model.config.use_cache = False  # as the user did
    rows = Dataset.from_dict({"text": equal_token_rows(tok, 40, 96)})  # truncated (or packed) to 30 tokens
    peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                             task_type="CAUSAL_LM")
    kw = {"dataset_text_field": "text", "max_length": 30, "packing": packing, "gradient_checkpointing": True,
          "per_device_train_batch_size": 4, "bf16": False, "learning_rate": 2e-4, **_sft_kw(os.path.join(work, "s2"))}
    kw.update(sft_extra)  # (may override max_length: TRL refuses padding_free without packing under a max_length)
    args = SFTConfig(**kw)
    trainer = SFTTrainer(model=model, train_dataset=rows, peft_config=peft_config, args=args, processing_class=tok)
    setup = (f"LoRA r8 q,v, {'NF4 4-bit' if quant else 'fp32'}, vocab {vocab}, packing {'on' if packing else 'off'},"
             f" B4, max_length {kw['max_length']}, ckpt") + "".join(f", {k}={v!r}" for k, v in sft_extra.items()
                                                                  if k != "max_length")
    yield "2. scenario 2 SFTTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_trl_recipe(work, use_peft, bf16=None):
    """trl/scripts/sft.py: SFTTrainer(model=<path>, args=SFTConfig defaults, quantization_config=
    get_quantization_config(model_args), peft_config=get_peft_config(model_args))."""
    from datasets import Dataset
    from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config, get_quantization_config

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    model_args = ModelConfig(model_name_or_path=twin_dir("tiny-llama", work), use_peft=use_peft)
    extra = {} if bf16 is None else {"bf16": bf16}
    training_args = SFTConfig(**_sft_kw(os.path.join(work, "trl")), **extra)
    # sft.py's model_init_kwargs, built from ModelConfig's defaults
    training_args.model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.
                                           trust_remote_code, attn_implementation=model_args.attn_implementation,
                                           dtype=model_args.dtype)
    torch.manual_seed(0)
    trainer = SFTTrainer(model=model_args.model_name_or_path, args=training_args, processing_class=tok,
                         train_dataset=Dataset.from_dict({"text": equal_token_rows(tok, 100, 64)}),
                         quantization_config=get_quantization_config(model_args),
                         peft_config=get_peft_config(model_args))
    mp = "bf16 autocast (SFTConfig's default)" if bf16 is None else f"bf16={bf16}"
    setup = (f"{'use_peft (LoRA r16, peft default targets)' if use_peft else 'full FT'}, SFTConfig defaults: B8, "
             f"max_length 1024, ckpt, {mp}; rows of 100 tokens")
    yield "3. TRL sft.py recipe", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_peft(work):
    """peft's README/quicktour LoRA pattern, with a transformers Trainer and the LM collator."""
    from datasets import Dataset
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tokenizer_ = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(twin_dir("tiny-qwen2", work))
    peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, inference_mode=False, r=8, lora_alpha=32,
                             lora_dropout=0.1)
    model = get_peft_model(model, peft_config)

    def tokenize(examples):
        return tokenizer_(examples["text"], truncation=True, max_length=64)

    ds = Dataset.from_dict({"text": equal_token_rows(tokenizer_, 64, 64)}).map(tokenize, batched=True,
                                                                               remove_columns=["text"])
    training_args = TrainingArguments(output_dir=os.path.join(work, "peft"), learning_rate=1e-3,
                                      per_device_train_batch_size=8, num_train_epochs=2, weight_decay=0.01,
                                      # quicktour's eval_strategy/save_strategy "epoch" + load_best_model_at_end:
                                      # no eval set here, so no evaluation and no checkpoints
                                      use_cpu=True, max_steps=3, report_to="none", save_strategy="no",
                                      disable_tqdm=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer_, mlm=False))
    yield ("4. peft LoRA example", "tiny-qwen2, LoRA r8 (peft default targets), dropout 0.1, B8 x 64, Trainer + "
           "LM collator", trainer, lambda: estimate_trainer(trainer, device="cpu"))


def client_peft_saved(work, family="tiny-llama"):
    """LoRA with trained embeddings and head, as Google's Gemma fine-tuning guide (and anyone adding chat tokens)
    writes it: ``LoraConfig(..., modules_to_save=["lm_head", "embed_tokens"])``; peft trains a copy of each beside
    the frozen original (``ModulesToSaveWrapper``). Trainer + the LM collator, as client 4."""
    from datasets import Dataset
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tokenizer_ = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(twin_dir(family, work))
    peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16, lora_dropout=0.05,
                             target_modules="all-linear", modules_to_save=["lm_head", "embed_tokens"])
    model = get_peft_model(model, peft_config)

    def tokenize(examples):
        return tokenizer_(examples["text"], truncation=True, max_length=64)

    ds = Dataset.from_dict({"text": equal_token_rows(tokenizer_, 64, 64)}).map(tokenize, batched=True,
                                                                               remove_columns=["text"])
    args = TrainingArguments(output_dir=os.path.join(work, "peft-saved"), learning_rate=2e-4,
                             per_device_train_batch_size=4, use_cpu=True, max_steps=3, report_to="none",
                             save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer_, mlm=False))
    yield ("4b. LoRA + trained embeddings and head", f"{family}, LoRA r8 all-linear, dropout 0.05, "
           "modules_to_save=[lm_head, embed_tokens], B4 x 64, Trainer + LM collator", trainer,
           lambda: estimate_trainer(trainer, device="cpu"))


def client_dora(work, lora_dropout=0.05, bf16=False):
    """peft's DoRA (``LoraConfig(use_dora=True)``, as peft's ``examples/dora_finetuning``: r8, alpha 16, the
    family's default targets) on a tiny Llama, with the peft LoRA pattern of client 4."""
    from datasets import Dataset
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tokenizer_ = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(twin_dir("tiny-llama", work))
    model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=16,
                                             lora_dropout=lora_dropout, use_dora=True))
    ds = Dataset.from_dict({"text": equal_token_rows(tokenizer_, 64, 64)}).map(
        lambda rows: tokenizer_(rows["text"], truncation=True, max_length=64), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir=os.path.join(work, "dora"), per_device_train_batch_size=4, use_cpu=True,
                             max_steps=3, report_to="none", save_strategy="no", disable_tqdm=True, bf16=bf16)
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer_, mlm=False))
    yield ("4c. DoRA", f"tiny-llama, LoRA r8 use_dora=True (peft default targets), dropout {lora_dropout}, B4 x 64, "
           f"{'bf16 autocast' if bf16 else 'fp32'}, Trainer + LM collator", trainer,
           lambda: estimate_trainer(trainer, device="cpu"))


def _dpo_pairs(n=16, P=20, C=30, R=20):
    """tests/test_dpo.py's pairs: a P-token prompt, a C-token chosen and an R-token rejected completion (one token
    per word with the shipped tokenizer), so that every step is one batch padded to the same length."""
    from datasets import Dataset

    def w(k):
        return " the" * k

    return Dataset.from_dict({"prompt": ["the" + w(P - 1)] * n, "chosen": [w(C)] * n, "rejected": [w(R)] * n})


def client_dpo(work, lora):
    """TRL's DPOTrainer on a tiny-llama twin, as tests/test_dpo.py builds it: full FT with an explicit ref_model
    (a second twin; offline TRL cannot load one by id), or LoRA via peft_config (reference: the policy, adapter off)."""
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    from kit.estimate import estimate_trainer
    from kit.models import build_model

    torch.manual_seed(0)
    extra = {} if lora else {"gradient_checkpointing": False}
    args = DPOConfig(output_dir=os.path.join(work, "dpo"), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                     per_device_train_batch_size=2, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                     **extra)
    model = build_model("tiny-llama")
    ref_model = None if lora else build_model("tiny-llama")
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if lora else None
    trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=_dpo_pairs(),
                         processing_class=tokenizer(), peft_config=peft_config)
    setup = ("LoRA r8 q,v, ckpt (DPOConfig default), reference = the adapter-disabled policy" if lora else
             "full FT, no ckpt, separate ref_model (a second tiny-llama)") + \
        ", fp32, B2 pairs (4 rows) x 51, prompt 20 / chosen 30 / rejected 20"
    yield "6. TRL DPOTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_reward(work, lora, family="tiny-qwen2", bf16=False):
    """TRL's RewardTrainer as its docs' quick start writes it: ``RewardTrainer(model=<path>, train_dataset=...)`` (TRL
    loads AutoModelForSequenceClassification with num_labels=1), and with ``peft_config=LoraConfig(
    modules_to_save=["score"])``; the pairs of :func:`_dpo_pairs` (chosen rows of 51 tokens, rejected of 41, so
    every step is 2B rows padded to 51); RewardConfig's defaults, fp32 on the CPU (``bf16=False``) unless ``bf16``
    (its default: bf16 autocast)."""
    from peft import LoraConfig
    from trl import RewardConfig, RewardTrainer

    from kit.estimate import estimate_trainer

    torch.manual_seed(0)
    args = RewardConfig(output_dir=os.path.join(work, "reward"), use_cpu=True, bf16=bf16, report_to="none",
                        max_steps=3, per_device_train_batch_size=2, save_strategy="no", logging_strategy="no",
                        disable_tqdm=True)
    peft_config = LoraConfig(modules_to_save=["score"]) if lora else None
    trainer = RewardTrainer(model=twin_dir(family, work), args=args, train_dataset=_dpo_pairs(),
                            processing_class=tokenizer(), peft_config=peft_config)
    setup = (f"{family}, " + ("LoRA (peft default targets) + modules_to_save=[score]" if lora else "full FT") +
             f", RewardConfig defaults (ckpt){', bf16 autocast' if bf16 else ' but fp32'}, B2 pairs (4 rows) x 51, "
             "prompt 20 / chosen 30 / rejected 20")
    yield "6b. TRL RewardTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_offload(work, kind):
    """transformers' checkpointing of every 2nd block, its ``offload=True``, or TRL's ``activation_offloading``, on
    a 4-block tiny-llama (B4 x 64, fp32); the offloaders with their CPU stand-ins (benchmarks/offload_meter.py),
    open while the trainer is built and trained."""
    from types import SimpleNamespace

    from datasets import Dataset
    from offload_meter import expected, save_on_cpu_unpinned, trl_on_cpu
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tok, path = tokenizer(), twin_dir("tiny-llama", work, num_hidden_layers=4)
    stand_in = {"trl": trl_on_cpu, "offload": save_on_cpu_unpinned}.get(kind, contextlib.nullcontext)()
    stand_in.__enter__()
    torch.manual_seed(0)
    out = os.path.join(work, f"offload-{kind}")
    optim = {"paged": "paged_adamw_32bit", "adam8": "adamw_bnb_8bit"}.get(kind)   # the bitsandbytes rows (8.)
    if kind == "trl":
        from trl import SFTConfig, SFTTrainer

        rows = Dataset.from_dict({"text": equal_token_rows(tok, 64, 32)})
        args = SFTConfig(dataset_text_field="text", max_length=64, packing=False, gradient_checkpointing=True,
                         activation_offloading=True, per_device_train_batch_size=4, bf16=False, **_sft_kw(out))
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path), train_dataset=rows, args=args,
                             processing_class=tok)
        setup = "SFTTrainer full FT, ckpt, activation_offloading=True (TRL's OffloadActivations), B4 x 64, 4 blocks"
    else:
        ds = Dataset.from_dict({"text": equal_token_rows(tok, 64, 32)}).map(
            lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
        kw = {"every_n_layers": 2} if kind == "every2" else {"offload": True} if kind == "offload" else None
        more = dict(gradient_checkpointing=True, activation_checkpointing_kwargs=kw) if kw else \
            dict(optim=optim)   # bitsandbytes' optimizers: their paged state is plain tensors on a CPU
        args = TrainingArguments(output_dir=out, use_cpu=True, per_device_train_batch_size=4, max_steps=3,
                                 report_to="none", save_strategy="no", disable_tqdm=True, **more)
        trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=ds,
                          data_collator=DataCollatorForLanguageModeling(tokenizer=tok, mlm=False))
        setup = (f"Trainer full FT, activation_checkpointing_kwargs={kw}" if kw else
                 f"Trainer full FT, optim={optim!r} (bitsandbytes' CPU kernels)") + ", B4 x 64, 4 blocks"

    def estimated():
        e = estimate_trainer(trainer, device="cpu")
        if kind in ("every2", "paged", "adam8"):
            return e
        return SimpleNamespace(first_step_peak_bytes=expected(e, True)["total"], peak_bytes=expected(e)["total"],
                               peak_moment=e.peak_moment + " (device + host, one memory on a CPU)", notes=e.notes)

    try:
        yield ("8. bitsandbytes optimizers" if optim else "7. checkpointing, offloaded or partial"), setup, \
            trainer, estimated
    finally:
        stand_in.__exit__(None, None, None)


def client_optimizer(work, optimizer, dtype=None, batch=4, seq=64):
    """A Trainer full fine-tune of a 4-block tiny-llama with one of the optimizers the kit added last:
    ``optimizer="adafactor"`` is ``TrainingArguments(optim="adafactor")`` (Trainer builds transformers' Adafactor
    with its own defaults: no beta1, a fixed lr); ``"muon"`` is ``Trainer(optimizers=(torch.optim.Muon(...), None))``
    built as torch's docs say, with the 2-D parameters only (it refuses others): a Trainer takes one optimizer, so the
    norms keep their gradients and no state. ``dtype``: the weights' (None: fp32). ``batch`` x ``seq`` tokens: B1 x 16
    makes the optimizer step the peak, B4 x 64 the backward."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    tok, path = tokenizer(), twin_dir("tiny-llama", work, num_hidden_layers=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, **({"dtype": dtype} if dtype else {}))
    ds = Dataset.from_dict({"text": equal_token_rows(tok, seq, 8 * batch)}).map(
        lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    kw = {"optim": optimizer} if optimizer != "muon" else {}
    args = TrainingArguments(output_dir=os.path.join(work, optimizer), use_cpu=True, per_device_train_batch_size=batch,
                             max_steps=3, report_to="none", save_strategy="no", disable_tqdm=True, **kw)
    given = (torch.optim.Muon([q for q in model.parameters() if q.ndim == 2], lr=0.02), None) \
        if optimizer == "muon" else (None, None)
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=given,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tok, mlm=False))
    how = "optim='adafactor' (Trainer's Adafactor)" if optimizer != "muon" else \
        "optimizers=(torch.optim.Muon(2-D params), None), the norms in no optimizer"
    setup = f"Trainer full FT {dtype or 'fp32'}, {how}, B{batch} x {seq}, 4 blocks"
    label = "9. Adafactor" if optimizer != "muon" else "10. torch.optim.Muon"
    yield label, setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_frozen_bottom(work, family="tiny-llama", batch=4, seq=64):
    """A Trainer full fine-tune of a 4-block twin loaded by path, its input embeddings and first two blocks frozen
    by ``requires_grad = False`` (a tied LM head, Qwen2's, is frozen with them)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    types = {"layer_types": ["full_attention"] * 4} if family == "tiny-qwen2" else {}
    tok, path = tokenizer(), twin_dir(family, work, num_hidden_layers=4, **types)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    for param in model.model.embed_tokens.parameters():
        param.requires_grad = False
    for layer in model.model.layers[:2]:
        for param in layer.parameters():
            param.requires_grad = False
    ds = Dataset.from_dict({"text": equal_token_rows(tok, seq, 8 * batch)}).map(
        lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir=os.path.join(work, "frozen-" + family), use_cpu=True,
                             per_device_train_batch_size=batch, max_steps=3, report_to="none", save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tok, mlm=False))
    setup = f"{family}, Trainer full FT fp32, embeddings + blocks 0-1 of 4 frozen, B{batch} x {seq}"
    yield "14. frozen bottom half", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def client_frozen_norms(work, family="tiny-llama", optimizer="muon", batch=4, seq=64):
    """A Trainer full fine-tune of a 4-block twin loaded by path whose norms are frozen by ``requires_grad = False``:
    ``optimizer="muon"`` as Muon recipes route it, every parameter ``torch.optim.Muon`` does not take (the 1-D norms)
    and the embeddings and LM head frozen, Muon given the rest (``Trainer(optimizers=(muon, None))``); ``"adamw"``:
    every norm frozen (the blocks' and the final one), Trainer's own AdamW on the rest."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from kit.estimate import estimate_trainer

    types = {"layer_types": ["full_attention"] * 4} if family == "tiny-qwen2" else {}
    tok, path = tokenizer(), twin_dir(family, work, num_hidden_layers=4, **types)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path)
    for name, param in model.named_parameters():
        routed = param.ndim != 2 or "embed_tokens" in name or "lm_head" in name
        param.requires_grad = not (routed if optimizer == "muon" else "norm" in name)
    ds = Dataset.from_dict({"text": equal_token_rows(tok, seq, 8 * batch)}).map(
        lambda b: tok(b["text"]), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir=os.path.join(work, f"norms-{optimizer}-{family}"), use_cpu=True,
                             per_device_train_batch_size=batch, max_steps=3, report_to="none", save_strategy="no",
                             disable_tqdm=True)
    given = (torch.optim.Muon([q for q in model.parameters() if q.requires_grad], lr=0.02), None) \
        if optimizer == "muon" else (None, None)
    trainer = Trainer(model=model, args=args, train_dataset=ds, optimizers=given,
                      data_collator=DataCollatorForLanguageModeling(tokenizer=tok, mlm=False))
    how = "torch.optim.Muon, embeddings + LM head + norms frozen" if optimizer == "muon" else \
        "Trainer's AdamW, every norm frozen"
    setup = f"{family}, Trainer full FT fp32, {how}, B{batch} x {seq}, 4 blocks"
    yield "15. frozen norms", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def loop_option():
    """The estimate option for "outputs kept through backward", if kit/training_setup.py declares one."""
    from kit.training_setup import FIELDS

    return next((k for k in FIELDS if "output" in k.lower()), None)


def client_loop(work, meter_cls, use_cache=None, B=4, S=64, steps=3, with_option=False):
    """A plain PyTorch loop, as users write it; returns the row directly (no Trainer)."""
    from transformers import AutoModelForCausalLM, default_data_collator

    from kit.estimate import estimate

    tok = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(twin_dir("tiny-llama", work))
    if use_cache is not None:
        model.config.use_cache = use_cache
    ids = [tok(t)["input_ids"] for t in equal_token_rows(tok, S, B * steps)]
    rows = [{"input_ids": i, "attention_mask": [1] * S, "labels": i} for i in ids]  # run_clm's group_texts rows
    loader = torch.utils.data.DataLoader(rows, batch_size=B, shuffle=True, collate_fn=default_data_collator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    meter = meter_cls()
    model.train()
    meter.start()
    outputs = loss = None
    for batch in loader:
        meter.begin(held_bytes(model, optimizer, batch, outputs, loss))
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        meter.end()
    meter.stop()
    kw = dict(batch_size=B, seq_len=S, device="cpu", optimizer="adamw", padded=False)
    opt = loop_option()
    if with_option and opt:
        kw[opt] = True
    cache = "use_cache as the config has it (True)" if use_cache is None else f"use_cache={use_cache}"
    setup = f"tiny-llama full FT fp32, torch AdamW, B{B} x {S}, {cache}" + (f", {opt}=True" if with_option else "")
    try:
        est = estimate(model, **kw)
    except ValueError as e:
        est = e
    return ("5. plain PyTorch loop", setup, est, meter.peaks)


def client_loop_watched(work, meter_cls, *, autocast=None, accum=1, optimizer="adamw", B=4, S=64, steps=3,
                        watch_box=None):
    """A plain loop as PyTorch's recipes write it, watched by ``kit.watch_loop`` with no option given: the AMP recipe
    (``autocast`` a dtype: ``torch.autocast`` around the forward and the loss, a ``GradScaler``, ``accum``
    micro-batches per optimizer step, the loss divided by it) or a plain one; ``optimizer`` "adamw" or "sgd"
    (``torch.optim.SGD(lr=...)``: no momentum, no state). The meter's window is one optimizer step (its micro-batches
    and its ``scaler.step``); the estimate is the watch's own, made from what it saw."""
    import kit
    from transformers import AutoModelForCausalLM, default_data_collator

    tok = tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(twin_dir("tiny-llama", work))
    ids = [tok(t)["input_ids"] for t in equal_token_rows(tok, S, B * steps * accum)]
    rows = [{"input_ids": i, "attention_mask": [1] * S, "labels": i} for i in ids]
    loader = torch.utils.data.DataLoader(rows, batch_size=B, shuffle=True, collate_fn=default_data_collator)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3) if optimizer == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=5e-5)
    scaler = torch.amp.GradScaler("cpu", enabled=autocast is not None)
    watch = kit.watch_loop(model, opt, plot=False)
    if watch_box is not None:
        watch_box.append(watch)
    meter = meter_cls()
    model.train()
    meter.start()
    outputs = loss = None
    for i, batch in enumerate(watch.batches(loader)):
        with watch.step(batch):
            if i % accum == 0:
                meter.begin(held_bytes(model, opt, batch, outputs, loss))
            with torch.autocast("cpu", dtype=autocast or torch.float32, enabled=autocast is not None):
                outputs = model(**batch)
                loss = outputs.loss / accum
            scaler.scale(loss).backward()
            if (i + 1) % accum == 0:
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                meter.end()
    meter.stop()
    est = watch.estimate if watch.estimate is not None else ValueError(watch.estimate_error)
    watch.close()
    how = (f"torch.autocast({autocast}) + GradScaler, {accum} micro-batches per step" if autocast else
           f"{accum} micro-batch{'es' if accum > 1 else ''} per step")
    name = "torch SGD (no momentum)" if optimizer == "sgd" else "torch AdamW"
    return ("13. loop as PyTorch writes it, kit.watch_loop", f"tiny-llama fp32, {name}, {how}, B{B} x {S}, no option "
            "given", est, meter.peaks)


def classifier_trainer(work, task, *, lora=False, family="tiny-qwen2", B=4, lengths=(64,), labels=3, rows=32,
                       sequential=False, lora_dropout=0.1, eval_lengths=None):
    """A classifier as transformers' task guides build it (see 9. in the module doc), for ``task`` "seq-cls" or
    "token-cls"; row i has ``lengths[i % len(lengths)]`` tokens; ``sequential``: the rows are trained in order
    (``train_sampling_strategy="sequential"``), so a test knows each step's batch. The eval set is the first 16
    rows, or, with ``eval_lengths``, 16 rows of their own, row i ``eval_lengths[i % len(eval_lengths)]`` tokens."""
    from datasets import Dataset
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification,
                              DataCollatorForTokenClassification, DataCollatorWithPadding, Trainer, TrainingArguments)

    tok = tokenizer()
    auto = AutoModelForSequenceClassification if task == "seq-cls" else AutoModelForTokenClassification
    torch.manual_seed(0)
    model = auto.from_pretrained(twin_dir(family, work), num_labels=labels)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS" if task == "seq-cls" else "TOKEN_CLS", r=8,
                                                 lora_alpha=16, lora_dropout=lora_dropout))
    def rows_of(lengths, rows):
        texts = {n: equal_token_rows(tok, n, rows) for n in set(lengths)}
        enc = tok([texts[lengths[i % len(lengths)]][i] for i in range(rows)])
        enc["labels"] = [i % labels for i in range(rows)] if task == "seq-cls" else \
            [[j % labels for j in range(len(ids))] for ids in enc["input_ids"]]
        return Dataset.from_dict(dict(enc))

    collator = DataCollatorWithPadding(tok) if task == "seq-cls" else DataCollatorForTokenClassification(tok)
    ds = rows_of(lengths, rows)
    args = TrainingArguments(output_dir=os.path.join(work, task), per_device_train_batch_size=B,
                             per_device_eval_batch_size=8, use_cpu=True, max_steps=3, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             train_sampling_strategy="sequential" if sequential else "random")
    eval_ds = ds.select(range(min(16, rows))) if eval_lengths is None else rows_of(eval_lengths, 16)
    return Trainer(model=model, args=args, train_dataset=ds, eval_dataset=eval_ds, data_collator=collator)


def client_classifier(work, task, lora=False, family="tiny-qwen2", lora_dropout=0.1):
    from kit.estimate import estimate_trainer

    trainer = classifier_trainer(work, task, lora=lora, family=family, lora_dropout=lora_dropout)
    head = "AutoModelForSequenceClassification" if task == "seq-cls" else "AutoModelForTokenClassification"
    how = f"LoRA r8 dropout {lora_dropout} (SEQ_CLS: the head in modules_to_save)" if lora else "full FT"
    yield (f"9. {task} task guide", f"{family} {head}, 3 labels, {how}, B4 x 64, eval B8 x 16 rows", trainer,
           lambda: estimate_trainer(trainer, device="cpu"))


# The MoE twins widened so that their blocks, not the logits, set the peak (tests/test_moe.py's WIDE): a small
# vocabulary, wide experts, top-4. Qwen3-MoE names one expert's width moe_intermediate_size, the others
# intermediate_size.
MOE_WIDE = {"tiny-qwen3-moe": dict(vocab_size=256, moe_intermediate_size=384, num_experts_per_tok=4)}
MOE_WIDE |= {twin: dict(vocab_size=256, intermediate_size=384, num_experts_per_tok=4)
             for twin in ("tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss")}


def client_moe(work, twin, lora=False, bf16=False):
    """transformers' causal-LM task guide with Trainer on a mixture-of-experts twin (widened: ``MOE_WIDE``), rows all
    96 tokens long, an eval set: full FT, or LoRA r8 on the attention projections (the experts and the router
    frozen); ``bf16``: the model loaded in bf16 and ``TrainingArguments(bf16=True)``."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from estimate_vs_measured import _Batches
    from kit.estimate import estimate_trainer
    from kit.model_configs import get_config

    cfg = get_config(twin)
    for k, v in MOE_WIDE[twin].items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16 if bf16 else torch.float32)
    if lora:
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    args = TrainingArguments(os.path.join(work, f"moe-{twin}"), per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, max_steps=3, use_cpu=True, bf16=bf16, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    rows = _Batches(12, 96, cfg.vocab_size, padded=False)
    trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=_Batches(8, 96, cfg.vocab_size, False))
    how = ("LoRA r8 q/k/v/o" if lora else "full FT") + (", bf16 weights + bf16=True" if bf16 else "")
    yield ("10. MoE task guide", f"{twin} widened ({', '.join(f'{k} {v}' for k, v in MOE_WIDE[twin].items())}), "
           f"{how}, B4 x 96, eval B4 x 8 rows", trainer, lambda: estimate_trainer(trainer, device="cpu"))


def client_moe_real_width(work):
    """Qwen/Qwen3-30B-A3B at its real widths (hidden 2048, 128 experts of width 768, top-8, vocabulary 151,936) in
    2 layers, LoRA r8 on q_proj and v_proj as peft's MoE examples train it, rows of 64 tokens, batch 1: Trainer's
    steps, as a user on a small machine would try the model before renting a GPU (about 8 GiB of RAM)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from estimate_vs_measured import _Batches
    from kit.estimate import estimate_trainer
    from kit.model_configs import get_config

    cfg = get_config("Qwen/Qwen3-30B-A3B")
    cfg.num_hidden_layers = 2
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(cfg), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    args = TrainingArguments(os.path.join(work, "moe-real-width"), per_device_train_batch_size=1, max_steps=3,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_Batches(3, 64, cfg.vocab_size, padded=False))
    yield ("10. MoE task guide", "Qwen/Qwen3-30B-A3B real widths, 2 layers, LoRA r8 q/v, fp32, B1 x 64", trainer,
           lambda: estimate_trainer(trainer, device="cpu"))


# ---- running ----------------------------------------------------------------------------------------------------
class StepPeaks(list):
    """Each optimizer step's measured peak, and ``evaluate``: the measured ``trainer.evaluate()`` after training
    (None where the client has no eval set)."""

    evaluate = None


def meter_evaluate(trainer, meter_cls) -> int:
    """``trainer.evaluate()`` in one metered window: held = the weights, buffers, (no) grads and optimizer state
    alive when it begins (as during training: Trainer evaluates after ``zero_grad``), a separate reference's too."""
    meter = meter_cls()
    meter.start()
    meter.begin(held_bytes(trainer.model, trainer.optimizer, reference_held(trainer, trainer.model)))
    trainer.evaluate()
    meter.end()
    return meter.stop()[0]


def run_trainer_client(gen, meter_cls):
    label, setup, trainer, make_estimate = next(gen)
    try:
        est = make_estimate()
    except ValueError as e:  # InputError is a ValueError: a refusal is a row
        est = e
    meter = meter_trainer(trainer, meter_cls())
    trainer.train()
    peaks = StepPeaks(meter.peaks)
    if trainer.eval_dataset is not None:
        peaks.evaluate = meter_evaluate(trainer, meter_cls)
    gen.close()   # a client's stand-ins, open through the training, close here
    del trainer
    gc.collect()
    return label, setup, est, peaks


def rows_to_run(work, only=None):
    """(client, setup-hint, thunk) for every row."""
    R = []
    R.append(("scenario 1", lambda m: run_trainer_client(client_s1(work, m), m)))
    for vocab in (4096, 128256):
        for packing in (True, False):
            R.append((f"SFTTrainer fp32 vocab {vocab} packing {packing}",
                      lambda m, v=vocab, p=packing: run_trainer_client(client_s2(work, v, p, False), m)))
    for vocab, packing in ((4096, True), (4096, False), (128256, True), (128256, False)):
        R.append((f"SFTTrainer 4bit vocab {vocab} packing {packing}",
                  lambda m, v=vocab, p=packing: run_trainer_client(client_s2(work, v, p, True), m)))
    R.append(("SFTTrainer chunked_nll fp32 vocab 4096 packing True",
              lambda m: run_trainer_client(client_s2(work, 4096, True, False, loss_type="chunked_nll"), m)))
    R.append(("SFTTrainer padding_free fp32 vocab 4096 packing False",
              lambda m: run_trainer_client(client_s2(work, 4096, False, False, padding_free=True,
                                                         max_length=None), m)))
    R.append(("TRL recipe full", lambda m: run_trainer_client(client_trl_recipe(work, False), m)))
    R.append(("TRL recipe peft", lambda m: run_trainer_client(client_trl_recipe(work, True), m)))
    R.append(("TRL recipe full bf16=False", lambda m: run_trainer_client(client_trl_recipe(work, False, False), m)))
    R.append(("peft example", lambda m: run_trainer_client(client_peft(work), m)))
    for family in ("tiny-llama", "tiny-qwen2"):
        R.append((f"peft LoRA modules_to_save lm_head embed_tokens {family}",
                  lambda m, f=family: run_trainer_client(client_peft_saved(work, f), m)))
    for drop, bf16 in ((0.05, False), (0.0, False), (0.05, True)):
        R.append((f"peft DoRA dropout {drop}{' bf16' if bf16 else ''}",
                  lambda m, d=drop, b=bf16: run_trainer_client(client_dora(work, d, b), m)))
    R.append(("plain loop as written", lambda m: client_loop(work, m)))
    R.append(("plain loop use_cache=False", lambda m: client_loop(work, m, use_cache=False)))
    if loop_option():
        R.append(("plain loop as written + outputs option", lambda m: client_loop(work, m, with_option=True)))
        R.append(("plain loop use_cache=False + outputs option",
                  lambda m: client_loop(work, m, use_cache=False, with_option=True)))
    R.append(("DPOTrainer full FT ref_model", lambda m: run_trainer_client(client_dpo(work, False), m)))
    R.append(("DPOTrainer LoRA peft_config", lambda m: run_trainer_client(client_dpo(work, True), m)))
    for lora, bf16 in ((False, False), (True, False), (False, True), (True, True)):
        R.append((f"RewardTrainer {'LoRA modules_to_save score' if lora else 'full FT'}{' bf16' if bf16 else ''}",
                  lambda m, lo=lora, b=bf16: run_trainer_client(client_reward(work, lo, bf16=b), m)))
    for kind in ("every2", "offload", "trl"):
        R.append((f"checkpointing {kind}", lambda m, k=kind: run_trainer_client(client_offload(work, k), m)))
    R.append(("paged AdamW 32-bit", lambda m: run_trainer_client(client_offload(work, "paged"), m)))
    R.append(("bitsandbytes 8-bit AdamW", lambda m: run_trainer_client(client_offload(work, "adam8"), m)))
    for optimizer in ("adafactor", "muon"):
        for dtype, batch, seq in ((None, 4, 64), (None, 1, 16), ("bfloat16", 4, 64), ("bfloat16", 1, 16)):
            R.append((f"{optimizer} {dtype or 'fp32'} B{batch} x {seq}", lambda m, o=optimizer, d=dtype, b=batch, s=seq:
                      run_trainer_client(client_optimizer(work, o, d, b, s), m)))
    for task, lora, family, drop in (("seq-cls", False, "tiny-qwen2", 0), ("seq-cls", True, "tiny-qwen2", 0.1),
                                     ("token-cls", False, "tiny-llama", 0), ("seq-cls", False, "tiny-llama", 0),
                                     ("seq-cls", False, "tiny-bert", 0), ("token-cls", False, "tiny-bert", 0),
                                     ("seq-cls", True, "tiny-bert", 0.0), ("seq-cls", True, "tiny-bert", 0.1),
                                     ("seq-cls", False, "tiny-roberta", 0), ("seq-cls", True, "tiny-roberta", 0.0)):
        R.append((f"classifier {task} {'LoRA' if lora else 'full'} {family} {drop}",
                  lambda m, t=task, lo=lora, f=family, d=drop: run_trainer_client(
                      client_classifier(work, t, lo, f, d), m)))
    from clients_modernbert import client_modernbert   # ModernBERT's twin, saved as a masked LM (its module doc)
    for task in ("seq-cls", "token-cls"):
        R.append((f"classifier {task} full tiny-modernbert",
                  lambda m, t=task: run_trainer_client(client_modernbert(work, t), m)))
    import clients_encoders   # DistilBERT and DeBERTa-v3 classifiers (benchmarks/clients_encoders.py)
    R += clients_encoders.rows(work)
    from clients_grpo import client_grpo, run_grpo_client   # issue 38: TRL's GRPOTrainer
    for kind in ("beta0", "beta", "lora", "spg2", "long"):
        R.append((f"GRPOTrainer {kind}", lambda m, k=kind: run_grpo_client(client_grpo(work, k), m)))
    from clients_rloo import KINDS as RLOO_KINDS, client_rloo   # issue 47: TRL's RLOOTrainer, generating as GRPO's
    for kind in RLOO_KINDS:
        R.append((f"RLOOTrainer {kind}", lambda m, k=kind: run_grpo_client(client_rloo(work, k), m)))
    from clients_distillation import KINDS as DISTILLATION_KINDS, client_distillation   # issue 47: on-policy, a teacher
    for kind in DISTILLATION_KINDS:
        R.append((f"DistillationTrainer {kind}", lambda m, k=kind: run_grpo_client(client_distillation(work, k), m)))
    from clients_kto import KINDS as KTO_KINDS, client_kto   # issue 47: TRL's KTOTrainer, its KL rows and reference
    for kind, bf16 in [*((k, False) for k in KTO_KINDS), ("full", True), ("skew", True)]:
        R.append((f"KTOTrainer {kind}{' bf16' if bf16 else ''}", lambda m, k=kind, b=bf16: run_trainer_client(
            client_kto(work, k, bf16=b), m)))
    import clients_own_head as own   # the user's own head (AutoModel + pooling + Linear): Trainer and kit.watch_loop
    for family, pooling in (("tiny-llama", "mean"), ("tiny-qwen2", "last"), ("tiny-bert", "cls")):
        R.append((f"own head {family} {pooling}", lambda m, f=family, p=pooling: run_trainer_client(
            own.client_own_head(work, f, p), m)))
    R.append(("own head tiny-llama mean 2 layers", lambda m: run_trainer_client(own.client_own_head(
        work, hidden=32), m)))
    R.append(("own head loop tiny-llama mean", lambda m: own.client_own_head_loop(work, m)))
    import clients_embeddings   # sentence-transformers' SentenceTransformerTrainer (skipped where not installed)
    R += clients_embeddings.rows(work)
    R.append(("watched loop AMP bf16 GradScaler accum 4", lambda m: client_loop_watched(
        work, m, autocast=torch.bfloat16, accum=4)))
    R.append(("watched loop plain SGD", lambda m: client_loop_watched(work, m, optimizer="sgd")))
    for twin, lora, bf16 in (("tiny-qwen3-moe", False, False), ("tiny-qwen3-moe", True, False),
                             ("tiny-mixtral", False, False), ("tiny-mixtral", True, False),
                             ("tiny-olmoe", False, False), ("tiny-olmoe", True, False),
                             ("tiny-gpt-oss", False, False), ("tiny-gpt-oss", True, True)):
        R.append((f"MoE {twin} {'LoRA' if lora else 'full'}{' bf16' if bf16 else ''}",
                  lambda m, t=twin, lo=lora, b=bf16: run_trainer_client(client_moe(work, t, lo, b), m)))
    R.append(("MoE real width Qwen3-30B-A3B LoRA", lambda m: run_trainer_client(client_moe_real_width(work), m)))
    for family in ("tiny-llama", "tiny-qwen2"):
        R.append((f"frozen bottom half {family}", lambda m, f=family: run_trainer_client(
            client_frozen_bottom(work, f), m)))
    for family in ("tiny-llama", "tiny-qwen2"):
        for optimizer in ("muon", "adamw"):
            R.append((f"frozen norms {optimizer} {family}", lambda m, f=family, o=optimizer: run_trainer_client(
                client_frozen_norms(work, f, o), m)))
    import clients_t5   # issue 48: Flan-T5 (an encoder-decoder) with transformers' Seq2SeqTrainer
    for kind, generate, vocab in clients_t5.ROWS_RUN:
        R.append((f"Seq2SeqTrainer {kind}{' generate' if generate else ''}{f' vocab {vocab}' if vocab else ''}",
                  lambda m, k=kind, g=generate, v=vocab: run_trainer_client(clients_t5.client_t5(work, k, g, v), m)))
    import clients_smolvlm   # issue 48: SmolVLM (Idefics3) with TRL's SFTTrainer on image + text messages
    for kind, per_row, side, ckpt in clients_smolvlm.ROWS_RUN:
        R.append((f"SmolVLM SFTTrainer {kind} {per_row}x{side}px{'' if ckpt else ' no-ckpt'}",
                  lambda m, k=kind, n=per_row, s=side, c=ckpt: run_trainer_client(
                      clients_smolvlm.client_smolvlm(work, k, n, s, c), m)))
    import clients_qwen2_5_vl   # issue 48: Qwen2.5-VL with TRL's SFTTrainer, where its processor imports
    if importlib.util.find_spec("torchvision") is not None:
        for kind, per_row, side, ckpt in clients_qwen2_5_vl.ROWS_RUN:
            R.append((clients_qwen2_5_vl.label_of(kind, per_row, side, ckpt),
                      lambda m, k=kind, n=per_row, s=side, c=ckpt: run_trainer_client(
                          clients_qwen2_5_vl.client_qwen2_5_vl(work, k, n, s, c), m)))
    else:
        print("Qwen2.5-VL's rows need torchvision (its processor's video processor), which this venv lacks: run them "
              "with benchmarks/vl_env.sh", file=sys.stderr)
    import clients_gemma3_vision   # issue 48: Gemma 3 multimodal with TRL's SFTTrainer on image + text messages
    for kind, per_row, ckpt, tower in clients_gemma3_vision.ROWS_RUN:
        R.append((f"Gemma3 SFTTrainer {kind} {per_row} image{'s' if per_row > 1 else ''}{'' if ckpt else ' no-ckpt'}"
                  f"{f' tower {tower}px' if tower else ''}", lambda m, k=kind, n=per_row, c=ckpt, t=tower:
                  run_trainer_client(clients_gemma3_vision.client_gemma3_vision(work, k, n, c, t), m)))
    import clients_qwen3_vl   # issue 48: Qwen3-VL with TRL's SFTTrainer where its processor imports, and a plain
    if importlib.util.find_spec("torchvision") is not None:   # Trainer on batches made as its processor makes them
        for kind, per_row, side, ckpt in clients_qwen3_vl.ROWS_RUN:
            R.append((clients_qwen3_vl.sft_label_of(kind, per_row, side, ckpt),
                      lambda m, k=kind, n=per_row, s=side, c=ckpt: run_trainer_client(
                          clients_qwen3_vl.client_sft_qwen3_vl(work, k, n, s, c), m)))
    for kind, per_row, side, ckpt in clients_qwen3_vl.PLAIN:
        R.append((clients_qwen3_vl.label_of(kind, per_row, side, ckpt),
                  lambda m, k=kind, n=per_row, s=side, c=ckpt: run_trainer_client(
                      clients_qwen3_vl.client_qwen3_vl(work, k, n, s, c), m)))
    return [r for r in R if not only or only.lower() in r[0].lower()]


def ratio(est_bytes, got):
    return est_bytes / got if got else float("nan")


def step_ratios(est, peaks) -> tuple:
    """Estimate / measured for step 1, the steady step (the larger of the later ones) and ``evaluate()``."""
    return (est.first_step_peak_bytes / peaks[0], est.peak_bytes / max(peaks[1:]),
            est.eval_peak_bytes / peaks.evaluate)


def format_row(label, setup, est, peaks) -> tuple[str, list]:
    """One table line, and the flags it raises."""
    meas1 = peaks[0] if peaks else None
    steady = max(peaks[1:]) if len(peaks) > 1 else None
    ev = getattr(peaks, "evaluate", None)
    m1, ms, me = (f"{x / MiB:.2f}" if x else "not taken" for x in (meas1, steady, ev))
    if isinstance(est, Exception):
        first = str(est).strip().splitlines()[0]
        return (f"| {label} | {setup} | refused: \"{first}\" | {m1} | — | refused | {ms} | — | refused | {me} | — | "
                "refused |", [])
    r1, rs = ratio(est.first_step_peak_bytes, meas1), ratio(est.peak_bytes, steady)
    checked = (("step 1", r1), ("steady", rs)) + ((("evaluate", ratio(est.eval_peak_bytes, ev)),) if ev else ())
    flags = [f"{what} {r:.4f}" for what, r in checked if not BAND[0] <= r <= BAND[1]]
    eval_cells = f"{est.eval_peak_bytes / MiB:.2f} | {me} | {checked[2][1]:.4f}" if ev else "— | not taken | —"
    return (f"| {label} | {setup} | {est.first_step_peak_bytes / MiB:.2f} | {m1} | {r1:.4f} | "
            f"{est.peak_bytes / MiB:.2f} | {ms} | {rs:.4f} | {eval_cells} | "
            f"{'OUTSIDE 2%: ' + ', '.join(flags) if flags else 'ok'} |", flags)


def report(lines, details, seconds, cross) -> str:
    import bitsandbytes
    import peft
    import transformers
    import trl

    from kit import machine

    opt = loop_option()
    st = sys.modules.get("sentence_transformers")   # an optional extra (benchmarks/clients_embeddings.py)
    sentence = f", sentence-transformers {st.__version__}" if st else ""
    out = ["# The estimator on real clients (CPU tiny twins, an independent meter)", "",
           f"- date: {datetime.date.today().isoformat()}",
           f"- device: CPU; hardware: {machine.hardware()}",
           f"- libraries: torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
           f"trl {trl.__version__}, bitsandbytes {bitsandbytes.__version__}{sentence}",
           f"- command: `{' '.join(['python benchmarks/real_clients.py', *sys.argv[1:]])}` ({seconds:.0f} s)", "",
           "Measured: PyTorch profiler memory events (`profile_memory=True`, one profile over the run, each optimizer "
           "step a `record_function` range): the storages alive at the step's start that it could free (weights, "
           "quant state, buffers, grads, optimizer state, the batch; the loop's previous outputs) + the highest "
           "running sum of the allocator's events in the step. Step 1 against `first_step_peak_bytes`; steady = the "
           "larger of steps 2 and 3, against `peak_bytes`; where the client has an eval set, `trainer.evaluate()` "
           "after training, one window from the weights, buffers and optimizer state alive, against `eval_peak_bytes`. "
           "Estimates: `estimate_trainer(trainer, device=\"cpu\")`; "
           "the loop: `estimate(model, batch_size=, seq_len=, device=\"cpu\", optimizer=\"adamw\", padded=False)`. "
           f"Band: estimate/measured in [{BAND[0]}, {BAND[1]}].", "",
           "| client | setup | est. step 1 (MiB) | measured step 1 (MiB) | ratio step 1 | est. steady (MiB) | "
           "measured steady (MiB) | ratio steady | est. evaluate (MiB) | measured evaluate (MiB) | ratio evaluate | "
           "flag |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|", *lines, ""]
    out.append("- the loop's \"outputs kept through backward\" estimate option: "
               + (f"`{opt}` (kit/training_setup.py), passed in the rows that name it" if opt else
                  "not in kit/training_setup.py when this ran, so the loop rows are estimated without it"))
    if cross:
        out += ["", "Cross-check of the meter against the kit's TensorPeak (the same client run twice, the same held "
                "bytes at each step's start, the rise read by each meter):", "", *cross, "",
                "(`torch.utils.checkpoint` saves the CPU RNG state, `torch.get_rng_state()`, "
                f"{torch.get_rng_state().nbytes:,} bytes per checkpointed block (the SFTTrainer twin has 2), made in "
                "C++ outside any aten op: TensorPeak's dispatch mode never sees it, the allocator's events do. It is "
                "no device memory on a GPU.)"]
    out += ["", "Per row: the measured steps (MiB), the estimate's peak moment, its notes:", ""] + details
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help=OUT_HELP)
    p.add_argument("--only", default=None, help="run the rows whose name contains this")
    p.add_argument("--no-tensor-peak", action="store_true", help="skip the cross-check against TensorPeak")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    work = tempfile.mkdtemp(prefix="kit-real-clients-")
    os.environ.setdefault("KIT_CACHE", os.path.join(work, "twins"))
    t0 = time.time()
    lines, details, flagged = [], [], []
    for name, thunk in rows_to_run(work, a.only):
        t = time.time()
        label, setup, est, peaks = thunk(ProfilerMeter)
        line, flags = format_row(label, setup, est, peaks)
        lines.append(line)
        flagged += [f"{label} ({setup}): {f}" for f in flags]
        moment = "" if isinstance(est, Exception) else f"; peak moment {est.peak_moment}"
        notes = "" if isinstance(est, Exception) else "; notes: " + (" / ".join(str(n) for n in est.notes) or "none")
        details.append(f"- {label}, {setup}: steps {', '.join(f'{x / MiB:.2f}' for x in peaks)}{moment}{notes} "
                       f"[{time.time() - t:.0f} s]")
        print(line, f"[{time.time() - t:.0f} s]", flush=True)
        gc.collect()
    cross = []
    if not a.no_tensor_peak and not a.only:
        for name, run in (("plain loop, use_cache=False", lambda m: client_loop(work, m, use_cache=False)),
                          ("SFTTrainer fp32 vocab 4096 packing on",
                           lambda m: run_trainer_client(client_s2(work, 4096, True, False), m))):
            prof, tp = run(ProfilerMeter)[3], run(TensorPeakMeter)[3]
            agree = ", ".join(f"step {i + 1}: {x:,} vs {y:,} bytes ({x - y:+,} bytes, ratio {x / y:.6f})"
                              for i, (x, y) in enumerate(zip(prof, tp)))
            cross.append(f"- {name}: profiler vs TensorPeak {agree}")
            print(cross[-1], flush=True)
    text = report(lines, details, time.time() - t0, cross)
    if flagged:
        text += "\nOutside the 2% band:\n\n" + "\n".join(f"- {f}" for f in flagged) + "\n"
    print(text)
    path = write_table(text, a.out, "real_clients", "cpu")
    if path:
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
