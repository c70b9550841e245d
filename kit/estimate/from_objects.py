"""Read the user's own objects into one :func:`kit.estimate.estimate` call: a built Trainer
(:func:`estimate_trainer`), or the ``TrainingArguments``, ``BitsAndBytesConfig`` and ``LoraConfig``
written before anything is loaded (:func:`estimate_from`). :func:`check` prints the estimate, the
verdict for this GPU and where each setting was read from.

Nothing trains and nothing is loaded. The returned :class:`~kit.estimate.Estimate` carries
``sources``: for each option, ``(value, where it was read from)``. What the kit does not model
(adafactor, DoRA under autocast, ``modules_to_save`` beyond the embeddings and heads, llm_int8_skip_modules ...)
is refused in one sentence (a ``ValueError``), never guessed. ``fsdp``/``fsdp_config`` and ``deepspeed`` make the
estimate per GPU (:mod:`kit.estimate.strategies`), over the launch's ``WORLD_SIZE`` GPUs.

>>> from transformers import TrainingArguments
>>> est = estimate_from("tiny-llama", TrainingArguments(per_device_train_batch_size=2), seq_len=64)
>>> est.sources["batch_size"], est.sources["optimizer"][0]
((2, 'TrainingArguments.per_device_train_batch_size'), 'adamw-fused')
"""
from __future__ import annotations

import dataclasses

from kit.inputs import InputError, Refusal

from kit import inputs as kit_inputs
from kit import optimizers
from kit import trainer_kinds
from kit.dtypes import trainer_precision
from kit.estimate.core import estimate
from kit.estimate.inventory import info_of, task_of
from kit.estimate.read_model import bnb_options, model_name, read_bnb, read_model, trainer_reentrant
from kit.estimate.own_head import read_own_head
from kit.estimate.quantization import recipe_checkpointing
from kit.estimate.read_peft import read_lora_config, read_task, targets_for
from kit.estimate.read_training import auto_attn, auto_dtype, read_args, read_eval, read_eval_seq_len
from kit.estimate.trainer_reader import PACKED_EVAL, Given, Reading, TrainerReader, listed, readers
from kit.model_configs import get_config

__all__ = ["estimate_trainer", "estimate_from", "trainer_inputs", "PACKED_EVAL"]

_ORDER = ("model", "task", "num_labels", "train_head", "batch_size", "seq_len", "padded", "grad_accum", "precision",
          "optimizer", "optim_args", "gradient_checkpointing", "load_dtype", "quantization", "kbit_recipe", "lora_r",
          "lora_targets", "lora_dropout", "attn_implementation", "trainable_params", "tied_weights", "eval_batch_size",
          "eval_accumulation_steps", "eval_gather", "eval_samples", "eval_seq_len", "device")


def reader_of(obj) -> TrainerReader:
    """A new reader of the kind ``obj`` (a trainer or a config) is, by its class MRO (:mod:`kit.trainer_kinds`); the
    plain Trainer's for anything no kind registers."""
    key = trainer_kinds.kind_of(obj)
    return trainer_kinds.part_of(key or "trainer", "estimate", TrainerReader)()


def estimate_trainer(trainer, *, seq_len=None, device: str = "cuda"):
    """Predict the memory of ``trainer.train()`` from the Trainer the user built; nothing trains.

    Read: the model (parameter dtypes, bitsandbytes layers, peft LoRA adapters, what is trainable,
    checkpointing, attention, tied weights), ``trainer.args`` (batch size, accumulation, fp16/bf16,
    optim, checkpointing) and, unless ``seq_len`` is given, the longest batch
    ``trainer.data_collator`` builds from the first 64 rows of ``trainer.train_dataset`` (and
    whether it pads). ``est.sources[option] == (value, where it was read)``. The trainer's kind (its class, or the
    nearest registered class it derives from: :mod:`kit.trainer_kinds`) reads what its trainer does beyond Trainer's.

    >>> est = estimate_trainer(trainer)                                 # doctest: +SKIP
    >>> est.sources["batch_size"]                                       # doctest: +SKIP
    (8, 'TrainingArguments.per_device_train_batch_size')
    """
    args = getattr(trainer, "args", None)
    if args is None or not hasattr(trainer, "model"):
        raise Refusal(f"estimate_trainer reads a transformers Trainer, not a {type(trainer).__name__}: pass "
                         "the Trainer you built (or call estimate_from with your TrainingArguments).")
    reader = reader_of(trainer)
    reader.read_trainer(trainer)
    reading = Reading(*read_args(args, reader.config_name))
    opts, src = reading.opts, reading.src
    if getattr(trainer, "optimizer", None) is not None:   # Trainer(optimizers=(opt, None)), or the one train() made
        given = optimizers.unwrap(trainer.optimizer)
        opts["optimizer"] = optimizers.name_of(given)
        src["optimizer"] = (opts["optimizer"], f"trainer.optimizer ({type(given).__name__})")
    reading.take(*read_eval(trainer))
    reading.target, *model = read_model(trainer.model)
    reading.take(*model)
    reader.after_model(trainer, reading, seq_len)
    reading.notes += cpu_fp16(opts, src, device, args)
    args_offload = opts.pop("args_offload")
    if args_ckpt := opts.pop("args_ckpt"):   # Trainer.train enables it anew, every_n_layers / offload as args say
        opts["gradient_checkpointing"] = True
        src["gradient_checkpointing"] = (True, args_ckpt)
        for k in ("ckpt_every_n_layers", "checkpoint_offload"):
            opts.pop(k, None)
            src.pop(k, None)
        reading.take(*args_offload)
        reentrant, where = trainer_reentrant(args)  # Trainer turns on its own, over the model's
        opts["checkpoint_reentrant"], src["checkpoint_reentrant"] = reentrant, (reentrant, where)
    rows, padded = reader.rows(trainer, reading, seq_len)
    if reader.reads_eval_rows and not opts.get("padding_free"):   # evaluate() at its own batches' length
        eval_len, where = read_eval_seq_len(trainer, opts.get("eval_batch_size", 8))
        opts["eval_seq_len"], src["eval_seq_len"] = eval_len or rows, (eval_len or rows, where)
    draft = _run(reading.target, dict(opts, seq_len=rows, padded=padded, device=device), reading)
    return dataclasses.replace(draft, **reader.compose(draft, trainer, reading), kind=trainer_kinds.kind_of(trainer),
                               inputs={**trainer_inputs(trainer), "seq_len": seq_len, "device": device})


def trainer_inputs(trainer) -> dict:
    """The user's objects a built Trainer holds, as the fit advisor's suggestions change them
    (:mod:`kit.advise.objects`): ``args`` (its TrainingArguments or its kind's config), ``sft`` (whether it is
    SFT's kind), the model's ``peft_config`` (the active LoraConfig) and ``quantization_config`` (None where there is
    none), and whether its micro-batch is one flattened row (``padding_free``: SFT's padding_free or bfd packing).

    >>> trainer_inputs(trainer)["args"].per_device_train_batch_size      # doctest: +SKIP
    8
    """
    model = getattr(trainer, "model", None)
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, dict):
        active = getattr(model, "active_adapter", "default")
        peft = peft.get(active if isinstance(active, str) else "default", next(iter(peft.values()), None))
    return {"source": "trainer", "args": trainer.args, **reader_of(trainer).trainer_inputs(trainer),
            "peft_config": peft,
            "quantization_config": getattr(getattr(model, "config", None), "quantization_config", None),
            "padding_free": bool(getattr(trainer, "padding_free", False))}


def _kind_config(training_args, configs: dict) -> tuple:
    """(the kind's reader, its config or None, training_args): a kind's config passed by its keyword, or as
    ``training_args`` (moved to its kind by its type: a TRL config is a TrainingArguments, and read as one it would
    lose its trainer's phases). A TRL config of a kind the kit does not model is refused by its type; a kind's config
    is passed alone."""
    by_keyword = {r.config_keyword: r for r in readers() if r.config_keyword}
    unknown = sorted(set(configs) - set(by_keyword))
    if unknown:
        raise InputError(unknown[0], f"estimate_from takes no {unknown[0]}=: a trainer kind's config is one of "
                         f"{', '.join(k + '=' for k in by_keyword)}.", code="unknown-config")
    configs = {k: v for k, v in configs.items() if v is not None}
    if training_args is not None and type(training_args).__module__.startswith("trl."):
        reader = reader_of(training_args)
        if reader.config_keyword is None or reader.config_keyword in configs:
            said = listed([r.config_name for r in by_keyword.values()])
            raise InputError("training_args", f"training_args is TRL's {type(training_args).__name__}: the kit "
                             f"reads {said} (each by its own keyword, or in this one), and models no other TRL "
                             "trainer's forward passes, generation and losses.", code="trl-trainer")
        training_args, configs = None, {**configs, reader.config_keyword: training_args}
    if not configs:
        return TrainerReader(), None, training_args
    keyword, cfg = list(configs.items())[-1]
    reader = by_keyword[keyword]()
    if training_args is not None or len(configs) > 1:
        raise InputError(keyword, f"pass the {reader.config_name} alone: it is {reader.trainer_name}'s "
                         "TrainingArguments.")
    if type(reader_of(cfg)) is not type(reader):   # (exactly: RLOO's reader extends GRPO's, its config does not)
        raise InputError(keyword, f"{keyword} is a {type(cfg).__name__}, not a trl {reader.config_name}.")
    return reader, cfg, None


def estimate_from(model_id_or_config, training_args=None, quantization_config=None, peft_config=None, *,
                  seq_len=None, padded: bool | None = None, load_dtype=None, attn_implementation=None,
                  device: str = "cuda", task=None, num_labels=None, **configs):
    """Predict the memory of a setup from the objects users write, before anything is loaded.

    ``model_id_or_config``: what ``estimate`` takes (a registry name, Hub id, config.json path or
    ``PretrainedConfig``). ``training_args``: a ``TrainingArguments`` (None: its defaults);
    ``quantization_config``: a ``BitsAndBytesConfig``; ``peft_config``: a ``LoraConfig``;
    ``seq_len``: the longest batch's length (needed). ``load_dtype`` is from_pretrained's ``dtype``
    (None: ``"auto"``, the config's dtype, as transformers 5 loads); ``attn_implementation`` None:
    the config's, else sdpa where the model supports it. ``task`` ("causal-lm", "seq-cls", "token-cls") and
    ``num_labels``: the head (None: from ``peft_config.task_type``, SEQ_CLS or TOKEN_CLS, and the config).
    ``configs``: a trainer kind's config by its keyword (:mod:`kit.trainer_kinds`), in place of ``training_args``:
    ``sft_config=`` (TRL's SFTConfig), ``dpo_config=`` (DPOConfig), ``grpo_config=`` (GRPOConfig) and
    ``rloo_config=`` (RLOOConfig; for these two ``seq_len`` is the longest prompt in tokens: their trainers do not
    truncate prompts; the completion adds ``max_completion_length``).

    >>> from transformers import TrainingArguments
    >>> from peft import LoraConfig
    >>> estimate_from("meta-llama/Meta-Llama-3-8B", TrainingArguments(per_device_train_batch_size=1),
    ...               peft_config=LoraConfig(r=16, target_modules="all-linear"), seq_len=512).sources["lora_r"]
    (16, 'LoraConfig.r')
    """
    reader, cfg, training_args = _kind_config(training_args, configs)
    inputs = {"source": "estimate_from", "quantization_config": quantization_config, "peft_config": peft_config,
              "seq_len": seq_len, "load_dtype": load_dtype, "attn_implementation": attn_implementation,
              "padded": padded, "device": device}
    given = Given(load_dtype, attn_implementation, quantization_config, seq_len, peft_config=peft_config)
    if cfg is not None:
        reader.read_config(cfg, given)
    load_dtype, attn_implementation, quantization_config = given.load_dtype, given.attn_implementation, \
        given.quantization_config
    if given.seq_len is None:
        raise InputError("seq_len", "estimate_from needs seq_len (the longest batch's length in tokens); "
                                        "estimate_trainer reads it from a built Trainer's data.")
    if cfg is not None:
        training_args, name = cfg, reader.config_name
    elif training_args is None:
        from transformers import TrainingArguments

        training_args, name = TrainingArguments(), "TrainingArguments()"
    else:   # a dict of TrainingArguments' keywords is read into one; else refused by name
        training_args, name = kit_inputs.training_arguments("training_args", training_args), "TrainingArguments"
    inputs["training_args"] = training_args if reader.keeps_training_args and name != "TrainingArguments()" else None
    reading = Reading(*read_args(training_args, name))
    opts, src, notes = reading.opts, reading.src, reading.notes
    reader.after_args(reading, name)
    ckpt, (aopts, asrc) = opts.pop("args_ckpt"), opts.pop("args_offload")
    reading.take(aopts, asrc)
    opts["gradient_checkpointing"] = bool(ckpt)
    src["gradient_checkpointing"] = (bool(ckpt), ckpt or f"{name}.activation_checkpointing is off")
    if ckpt:
        reentrant, where = trainer_reentrant(training_args, name)
        opts["checkpoint_reentrant"], src["checkpoint_reentrant"] = reentrant, (reentrant, where)
    if hasattr(model_id_or_config, "named_modules"):
        from transformers import PreTrainedModel

        # a module of the user's own under a head of its own (kit.estimate.own_head): its base's config, its task
        own = None if isinstance(model_id_or_config, PreTrainedModel) else read_own_head(model_id_or_config)
        config = model_id_or_config.get_submodule(own.base).config if own else model_id_or_config.config
        if own and task is None:   # its head says its labels: a num_labels given is checked against them
            task, num_labels = "seq-cls", own.labels if num_labels is None else num_labels
        by_class = task is None and task_of(model_id_or_config) != "causal-lm"
        task = task_of(model_id_or_config) if by_class else task   # a classifier's class says its head
    else:
        config, by_class = get_config(model_id_or_config), False
    task, labels, train_head, task_src = read_task(peft_config, task, num_labels, config)
    if by_class:
        task_src["task"] = (task, f"the model's class ({type(model_id_or_config).__name__})")
    opts.update({k: v for k, v in (("task", task), ("num_labels", labels), ("train_head", train_head))
                 if v is not None})
    src.update(task_src)
    info = info_of(model_id_or_config, task, labels or 2)
    src["model"] = (model_name(model_id_or_config, config), "estimate_from(model_id_or_config)")
    quant = read_bnb(quantization_config, "BitsAndBytesConfig")
    opts["quantization"] = quant
    src["quantization"] = (quant, "BitsAndBytesConfig.load_in_4bit/8bit" if quantization_config is not None
                           else "no quantization_config")
    if quant == "4bit":
        q4 = bnb_options(quantization_config)
        opts.update(q4)
        src.update({k: (v, f"BitsAndBytesConfig.bnb_4bit_{a}") for (k, v), a in
                    zip(q4.items(), ("quant_type", "use_double_quant", "compute_dtype"))})
    src["load_dtype"] = auto_dtype(config, load_dtype, quant)
    if given.dtype_source:
        src["load_dtype"] = given.dtype_source
    src["attn_implementation"] = auto_attn(config, attn_implementation)
    opts["load_dtype"], opts["attn_implementation"] = src["load_dtype"][0], src["attn_implementation"][0]
    reader.after_quantization(opts)
    if quant != "none" and not reader.lean_kbit:   # (a lean kind's own recipe is read with its options)
        opts["kbit_recipe"] = "standard"
        src["kbit_recipe"] = ("standard", "assumed: prepare_model_for_kbit_training, the peft recipe")
        if not opts["gradient_checkpointing"]:  # prepare_model_for_kbit_training turns it on
            opts["gradient_checkpointing"] = True
            src["gradient_checkpointing"] = (True, "prepare_model_for_kbit_training (use_gradient_checkpointing=True)")
            src["checkpoint_reentrant"] = recipe_checkpointing()
            opts["checkpoint_reentrant"] = src["checkpoint_reentrant"][0]
    if peft_config is not None:
        _read_lora(reading, peft_config, info)
    seq_len = given.seq_len
    src["seq_len"] = (seq_len, given.seq_source or "estimate_from(seq_len=...)")
    src["padded"] = (True, "assumed: padded, as estimate() does") \
        if padded is None else (padded, "estimate_from(padded=...)")
    seq_len, padded = reader.finish_options(reading, cfg, config, seq_len, True if padded is None else padded)
    notes += cpu_fp16(opts, src, device, training_args)
    src["eval_gather"] = ("loss", "assumed: with no Trainer there is no compute_metrics (evaluate() keeps the loss)")
    draft = _run(model_id_or_config, dict(opts, seq_len=seq_len, padded=padded, device=device), reading)
    kind = trainer_kinds.kind_of(cfg) if cfg is not None else "trainer"
    return dataclasses.replace(draft, **reader.compose_from(draft, cfg, info, config), kind=kind,
                               inputs={**inputs, **reader.config_inputs(cfg)})


def _read_lora(reading: Reading, peft_config, info) -> None:
    """A LoraConfig's rank, targets (matched as peft matches them), dropout, DoRA and trained copies."""
    opts, src = reading.opts, reading.src
    r, names, dropout = read_lora_config(peft_config, info)
    targets, tnote = targets_for(info, names)
    opts.update(lora_r=r, lora_targets=targets, lora_dropout=dropout)
    src.update(lora_r=(r, "LoraConfig.r"), lora_targets=(targets, "LoraConfig.target_modules, matched as peft "
               "matches them"), lora_dropout=(dropout, "LoraConfig.lora_dropout"))
    reading.notes += tnote
    if peft_config.use_dora:
        opts["use_dora"], src["use_dora"] = True, (True, "LoraConfig.use_dora")
    if info.task == "causal-lm" and peft_config.modules_to_save:   # trained copies (the plan checks the names)
        opts["modules_to_save"] = tuple(peft_config.modules_to_save)
        src["modules_to_save"] = (opts["modules_to_save"], "LoraConfig.modules_to_save")


def cpu_fp16(opts, src, device, args) -> list:
    """On a CPU (``device``, or ``args.use_cpu``), the precision Trainer runs (:func:`kit.dtypes.trainer_precision`:
    fp16=True is ignored there), and its note."""
    run, note = trainer_precision(opts.get("precision"), "cpu" if getattr(args, "use_cpu", False) else device)
    if note is None:
        return []
    opts["precision"] = run
    src["precision"] = (run, f"{src['precision'][1]}, which Trainer ignores on a CPU: the run is {run}")
    return [note]


def _run(target, opts, reading: Reading):
    """The estimate of ``opts``, with the notes and where each option was read (``sources``): the draft a kind's
    reader composes its own parts into."""
    src, notes = reading.src, list(reading.notes)
    est = estimate(target, **opts)
    src["device"] = (opts["device"], "the device argument (whose kernels are predicted)")
    trainable = src.get("trainable_params", (None,))[0]
    idle = src.get("idle_params", (0,))[0]   # requires_grad, and no gradient reaches them (kit.estimate.read_model)
    if trainable is not None and trainable != est.trainable_params + idle:
        notes.append(f"the model has {trainable:,} trainable parameters now, the estimate counts "
                     f"{est.trainable_params:,}: check what is frozen")
    first = [k for k in _ORDER if k in src]
    return dataclasses.replace(est, notes=est.notes + notes, setup={**est.setup, "model": src["model"][0]},
                               sources={k: src[k] for k in first + [k for k in src if k not in first]})
