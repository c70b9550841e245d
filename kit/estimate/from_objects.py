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

from kit import inputs as kin
from kit import optimizers
from kit.dtypes import trainer_precision
from kit.estimate import dpo as kd
from kit.estimate import grpo as kg
from kit.estimate import reward as kr
from kit.estimate import sentence_trainer as kst
from kit.estimate import trl as kt
from kit.estimate.core import estimate
from kit.estimate.inventory import info_of, task_of
from kit.estimate.read_model import (
    dtype_name,
    bnb_options,
    model_name,
    read_bnb,
    read_model,
    trainer_reentrant,
)
from kit.estimate.own_head import read_own_head
from kit.estimate.read_peft import read_lora_config, read_task, targets_for
from kit.estimate.read_training import auto_attn, auto_dtype, read_args, read_eval, read_eval_seq_len, \
    read_seq_len
from kit.model_configs import get_config

_ORDER = ("model", "task", "num_labels", "train_head", "batch_size", "seq_len", "padded", "grad_accum", "precision",
          "optimizer", "optim_args", "gradient_checkpointing", "load_dtype", "quantization", "kbit_recipe", "lora_r",
          "lora_targets", "lora_dropout", "attn_implementation", "trainable_params", "tied_weights", "eval_batch_size",
          "eval_accumulation_steps", "eval_gather", "eval_samples", "eval_seq_len", "device")



PACKED_EVAL = "packed-eval-rows"   # the note's code: a flattened evaluation row of another length than training's


def flattened_eval(opts: dict, src: dict, notes: list, rows: int) -> None:
    """Padding-free evaluation: SFTTrainer's collator flattens ``per_device_eval_batch_size`` rows into one, as it
    does the ``rows`` training rows. With as many rows, the evaluation row is the training row: one row, modeled.
    With another count its row has another length, which the estimate does not model: a note says so."""
    be = opts.get("eval_batch_size") or rows
    opts["eval_batch_size"] = 1
    src["eval_batch_size"] = (1, f"{be} evaluation rows flattened into one (padding-free), as in training")
    if be != rows:
        notes.append(kin.Note(f"a padding-free evaluation flattens {be} rows into one, and training {rows}: the "
                              f"evaluation estimate is of a row of {rows} rows' tokens, not {be}",
                              field="eval_batch_size", code=PACKED_EVAL))


def estimate_trainer(trainer, *, seq_len=None, device: str = "cuda"):
    """Predict the memory of ``trainer.train()`` from the Trainer the user built; nothing trains.

    Read: the model (parameter dtypes, bitsandbytes layers, peft LoRA adapters, what is trainable,
    checkpointing, attention, tied weights), ``trainer.args`` (batch size, accumulation, fp16/bf16,
    optim, checkpointing) and, unless ``seq_len`` is given, the longest batch
    ``trainer.data_collator`` builds from the first 64 rows of ``trainer.train_dataset`` (and
    whether it pads). ``est.sources[option] == (value, where it was read)``.

    >>> est = estimate_trainer(trainer)                                 # doctest: +SKIP
    >>> est.sources["batch_size"]                                       # doctest: +SKIP
    (8, 'TrainingArguments.per_device_train_batch_size')
    """
    args = getattr(trainer, "args", None)
    if args is None or not hasattr(trainer, "model"):
        raise kin.Refusal(f"estimate_trainer reads a transformers Trainer, not a {type(trainer).__name__}: pass "
                         "the Trainer you built (or call estimate_from with your TrainingArguments).")
    sft, given_seq_len = kt.is_sft(trainer), seq_len
    if sft:  # its settings first: SFTConfig is a TrainingArguments, whose readers would refuse more vaguely
        topts, tsrc, tnotes, _ = kt.read_sft_config(args, trainer=trainer)
    if grpo := kg.is_grpo(trainer):  # TRL's GRPOTrainer (kit.estimate.grpo)
        topts, tsrc, tnotes = kg.read_grpo_config(args)
        kd.refuse_dropout(args, trainer.model.config, "GRPOConfig")
    if reward := kr.is_reward(trainer):  # TRL's RewardTrainer (kit.estimate.reward)
        topts, tsrc, tnotes = kr.read_reward_config(args)
        kd.refuse_dropout(args, trainer.model.config, "RewardConfig")
    if dpo := kd.is_dpo(trainer):  # TRL's DPOTrainer (kit.estimate.dpo); its other trainers are refused
        topts, tsrc, tnotes = kd.read_dpo_config(args)
        kd.refuse_dropout(args, trainer.model.config)
    elif not (sft or grpo or reward):
        kd.refuse_other_trl(trainer)
    if sentence := kst.is_sentence_trainer(trainer):   # sentence-transformers' trainer (kit.estimate.sentence_trainer)
        loss, loss_where = kst.read_loss(trainer)
    opts, src, notes = read_args(args, "SFTConfig" if sft else "DPOConfig" if dpo else "GRPOConfig" if grpo
                                 else "RewardConfig" if reward else "SentenceTransformerTrainingArguments" if sentence
                                 else "TrainingArguments")
    if getattr(trainer, "optimizer", None) is not None:   # Trainer(optimizers=(opt, None)), or the one train() made
        given = optimizers.unwrap(trainer.optimizer)
        opts["optimizer"] = optimizers.name_of(given)
        src["optimizer"] = (opts["optimizer"], f"trainer.optimizer ({type(given).__name__})")
    eopts, esrc = read_eval(trainer)
    opts.update(eopts)
    src.update(esrc)
    target, mopts, msrc, mnotes = read_model(trainer.model)
    opts.update(mopts)
    src.update(msrc)
    notes.extend(mnotes)
    if sft:
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        if opts.get("eval_gather", "loss") != "loss":  # a loss-only evaluation runs the fused head: modeled
            notes.append(kin.Note("SFTTrainer's evaluation with compute_metrics (a second, full-logits forward) is "
                                  "not modeled: eval_peak_bytes is its fused forward's alone", field="eval_batch_size",
                                  code="trl-eval-unmodeled"))
    if dpo:
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        pairs = kd.pairs_options(opts, src, notes, "DPOConfig")
    if reward:  # 2B rows (chosen, then rejected) through a one-label classifier
        src.update(tsrc)
        notes.extend(tnotes)
        kr.refuse_other_head(opts)
        pairs = kt.pair_rows(opts, src, "RewardConfig")   # the chosen and rejected rows, as DPO's
    if sentence:  # the anchor column's forward, then the others' merged, before one backward
        src["loss"] = (loss, loss_where)
        notes[:] = kst.loss_notes(notes, loss)
        lengths, st_padded, st_where = kst.read_towers(trainer, opts["batch_size"])
        lengths = lengths if seq_len is None else (seq_len,) * len(lengths)   # seq_len given: every column's
        kst.tower_rows(opts, src, lengths, loss)
    if grpo:  # B rows of prompt + completion a step; G generated at once (kit.estimate.grpo)
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        kg.refuse_unmodeled(opts)
        kg.refuse_reward_models(trainer)
        P, same, at = kg.trainer_prompts(trainer, seq_len)
        rollout = kg.rollout(args, P)
        kg.check_positions(rollout, trainer.model.config)
        gopts, gsrc = kg.seq_options(rollout, same, at)
        opts.update(gopts)
        src.update(gsrc)
        seq_len, padded = opts.pop("seq_len"), opts.pop("padded")
    notes += cpu_fp16(opts, src, device, args)
    args_offload = opts.pop("args_offload")
    if args_ckpt := opts.pop("args_ckpt"):   # Trainer.train enables it anew, every_n_layers / offload as args say
        opts["gradient_checkpointing"] = True
        src["gradient_checkpointing"] = (True, args_ckpt)
        for k in ("ckpt_every_n_layers", "checkpoint_offload"):
            opts.pop(k, None)
            src.pop(k, None)
        opts.update(args_offload[0])
        src.update(args_offload[1])
        reentrant, where = trainer_reentrant(args)  # Trainer turns on its own, over the model's
        opts["checkpoint_reentrant"], src["checkpoint_reentrant"] = reentrant, (reentrant, where)
    if dpo:  # 2B rows padded to the longest pair, and the reference model
        sopts, ssrc, fk = kd.trainer_reference(trainer, pairs, seq_len)
        (seq_len, padded), _ = sopts.values(), src.update(ssrc)
    elif sentence and seq_len is None:   # the longest column (evaluation's, and each forward's in opts["towers"])
        seq_len, padded = max(lengths), st_padded
        src["seq_len"], src["padded"] = (seq_len, st_where), (padded, st_where)
    elif reward and seq_len is None:
        seq_len, padded, where = kr.read_pairs(trainer, pairs)
        src["seq_len"], src["padded"] = (seq_len, where), (padded, where)
    elif seq_len is None and not grpo:
        seq_len, padded, where, batch = read_seq_len(trainer, opts["batch_size"])
        src["seq_len"] = (seq_len, where)
        src["padded"] = (padded, ("rows of different lengths in a batch, or a 0 in its attention_mask" if padded else
                                  "every row of a batch the same length, no 0 in its attention_mask") if batch > 1
                         else "the flattened row's position_ids restart (sdpa builds a block-diagonal mask)")
        if batch != opts["batch_size"]:
            src["batch_size"] = (1, f"{opts['batch_size']} rows flattened into one (padding-free)")
            flattened_eval(opts, src, notes, opts["batch_size"])
            opts.update(batch_size=1, padding_free=True)
    elif not grpo:
        padded = True
        src["seq_len"] = (seq_len, "estimate_trainer(seq_len=...)")
        src["padded"] = (True, "assumed, as estimate() does (seq_len was given, so no batch was read)")
    if not (dpo or grpo or sentence or opts.get("padding_free")):   # evaluate() at its own batches' length
        eval_len, where = read_eval_seq_len(trainer, opts.get("eval_batch_size", 8))
        opts["eval_seq_len"], src["eval_seq_len"] = eval_len or seq_len, (eval_len or seq_len, where)
    est = _run(target, dict(opts, seq_len=seq_len, padded=padded, device=device), src, notes)
    if dpo:
        kd.finish(est, info_of(target, opts.get("task", "causal-lm"), opts.get("num_labels", 2)), **fk)
    if grpo:
        ref = getattr(trainer, "ref_model", None)
        kind, where = kg.reference_of(args, hasattr(trainer.model, "peft_config"), ref)
        kg.finish(est, args, rollout, config=trainer.model.config, reference=kind, where=where,
                  ref_weights=kd.held_bytes(ref) if ref is not None else 0)
    est.inputs = {**trainer_inputs(trainer), "seq_len": given_seq_len, "device": device}
    return est


def trainer_inputs(trainer) -> dict:
    """The user's objects a built Trainer holds, as the fit advisor's suggestions change them
    (:mod:`kit.advise.objects`): ``args`` (its TrainingArguments or SFTConfig), ``sft`` (an SFTTrainer), the model's
    ``peft_config`` (the active LoraConfig) and ``quantization_config`` (None where there is none), and whether its
    micro-batch is one flattened row (``padding_free``: SFTTrainer's padding_free or bfd packing).

    >>> trainer_inputs(trainer)["args"].per_device_train_batch_size      # doctest: +SKIP
    8
    """
    model = getattr(trainer, "model", None)
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, dict):
        active = getattr(model, "active_adapter", "default")
        peft = peft.get(active if isinstance(active, str) else "default", next(iter(peft.values()), None))
    return {"source": "trainer", "args": trainer.args, "sft": kt.is_sft(trainer), "peft_config": peft,
            "quantization_config": getattr(getattr(model, "config", None), "quantization_config", None),
            "padding_free": bool(getattr(trainer, "padding_free", False))}


def _trl_config_slot(training_args, sft_config, dpo_config, grpo_config) -> tuple:
    """(training_args, sft_config, dpo_config, grpo_config) with a TRL config passed as ``training_args`` moved to
    its own keyword, by its type (a GRPOConfig is a TrainingArguments, and read as one it would lose its trainer's
    phases); a TRL config of a trainer the kit does not model is refused by its type."""
    if training_args is None or not type(training_args).__module__.startswith("trl."):
        return training_args, sft_config, dpo_config, grpo_config
    slots = {"sft_config": sft_config, "dpo_config": dpo_config, "grpo_config": grpo_config}
    for keyword, is_kind in (("sft_config", kt.is_sft), ("dpo_config", kd.is_dpo), ("grpo_config", kg.is_grpo)):
        if is_kind(training_args) and slots[keyword] is None:
            slots[keyword] = training_args
            return None, *slots.values()
    raise kin.InputError("training_args", f"training_args is TRL's {type(training_args).__name__}: the kit reads "
                         "SFTConfig, DPOConfig and GRPOConfig (each by its own keyword, or in this one), and models "
                         "no other TRL trainer's forward passes, generation and losses.", code="trl-trainer")


def _trl_model_init(config, name: str, load_dtype, attn_implementation, quantization_config) -> tuple:
    """(load_dtype, its source, attn_implementation, quantization_config): a TRL config's ``model_init_kwargs`` (how
    the trainer loads a model given by its id), where the caller did not pass its own."""
    model_dtype, attn, quant, where = kt.read_sft_model(config, name)
    source = None
    if load_dtype is None and model_dtype is not None:
        load_dtype, source = model_dtype, (dtype_name(model_dtype), f"{where}['dtype'] (TRL's default: float32)")
    return (load_dtype, source, attn if attn_implementation is None else attn_implementation,
            quant if quantization_config is None else quantization_config)


def estimate_from(model_id_or_config, training_args=None, quantization_config=None, peft_config=None, *,
                  seq_len=None, padded: bool | None = None, load_dtype=None, attn_implementation=None,
                  device: str = "cuda", sft_config=None, dpo_config=None, task=None, num_labels=None,
                  grpo_config=None):
    """Predict the memory of a setup from the objects users write, before anything is loaded.

    ``model_id_or_config``: what ``estimate`` takes (a registry name, Hub id, config.json path or
    ``PretrainedConfig``). ``training_args``: a ``TrainingArguments`` (None: its defaults);
    ``quantization_config``: a ``BitsAndBytesConfig``; ``peft_config``: a ``LoraConfig``;
    ``seq_len``: the longest batch's length (needed). ``load_dtype`` is from_pretrained's ``dtype``
    (None: ``"auto"``, the config's dtype, as transformers 5 loads); ``attn_implementation`` None:
    the config's, else sdpa where the model supports it. ``task`` ("causal-lm", "seq-cls", "token-cls") and
    ``num_labels``: the head (None: from ``peft_config.task_type``, SEQ_CLS or TOKEN_CLS, and the config).
    ``grpo_config``: TRL's GRPOConfig (:mod:`kit.estimate.grpo`), where ``seq_len`` is the longest prompt in tokens
    (GRPOTrainer does not truncate prompts; the completion adds ``max_completion_length``).

    >>> from transformers import TrainingArguments
    >>> from peft import LoraConfig
    >>> estimate_from("meta-llama/Meta-Llama-3-8B", TrainingArguments(per_device_train_batch_size=1),
    ...               peft_config=LoraConfig(r=16, target_modules="all-linear"), seq_len=512).sources["lora_r"]
    (16, 'LoraConfig.r')
    """
    training_args, sft_config, dpo_config, grpo_config = _trl_config_slot(training_args, sft_config, dpo_config,
                                                                          grpo_config)
    sft, dsrc, ssrc = sft_config is not None, None, None
    given = {"source": "estimate_from", "sft": sft, "sft_config": sft_config,
             "quantization_config": quantization_config, "peft_config": peft_config, "seq_len": seq_len,
             "load_dtype": load_dtype, "attn_implementation": attn_implementation, "padded": padded, "device": device}
    if sft and training_args is not None:
        raise kin.InputError("sft_config", "pass the SFTConfig alone: it is SFTTrainer's TrainingArguments.")
    if sft and not kt.is_sft(sft_config):
        raise kin.InputError("sft_config", f"sft_config is a {type(sft_config).__name__}, not a trl SFTConfig.")
    if dpo := dpo_config is not None:  # TRL's DPOTrainer (kit.estimate.dpo)
        if training_args is not None or sft or not kd.is_dpo(dpo_config):
            raise kin.InputError("dpo_config", "pass a trl DPOConfig alone: it is DPOTrainer's TrainingArguments.")
        topts, tsrc, tnotes = kd.read_dpo_config(dpo_config)
        load_dtype, dsrc, attn_implementation, quantization_config = _trl_model_init(
            dpo_config, "DPOConfig", load_dtype, attn_implementation, quantization_config)
        if seq_len is None and dpo_config.max_length:
            m = dpo_config.pad_to_multiple_of if isinstance(dpo_config.pad_to_multiple_of, int) else 1
            seq_len = -(-dpo_config.max_length // m) * m
            ssrc = ("DPOConfig.max_length: each prompt+completion row is truncated to it (padded up to "
                    "pad_to_multiple_of), so it is the longest a row can be")  # (an upper bound)
    if grpo := grpo_config is not None:  # TRL's GRPOTrainer (kit.estimate.grpo)
        if training_args is not None or sft or dpo or not kg.is_grpo(grpo_config):
            raise kin.InputError("grpo_config", "pass a trl GRPOConfig alone: it is GRPOTrainer's TrainingArguments.")
        topts, tsrc, tnotes = kg.read_grpo_config(grpo_config)
        load_dtype, dsrc, attn_implementation, quantization_config = _trl_model_init(
            grpo_config, "GRPOConfig", load_dtype, attn_implementation, quantization_config)
        if seq_len is None:
            raise kin.InputError("seq_len", "estimate_from(grpo_config=...) needs seq_len: the longest prompt in "
                                 "tokens (GRPOTrainer does not truncate prompts).")
    if sft:
        topts, tsrc, tnotes, free = kt.read_sft_config(sft_config)
        load_dtype, dsrc, attn_implementation, quantization_config = _trl_model_init(
            sft_config, "SFTConfig", load_dtype, attn_implementation, quantization_config)
        if seq_len is None and sft_config.max_length:
            seq_len, ssrc = sft_config.max_length, ("SFTConfig.max_length: rows are truncated (or packed) to it, so "
                                                    "it is the longest a row can be")  # (an upper bound)
    if seq_len is None:
        raise kin.InputError("seq_len", "estimate_from needs seq_len (the longest batch's length in tokens); "
                                        "estimate_trainer reads it from a built Trainer's data.")
    name = "TrainingArguments"
    if sft or dpo or grpo:
        training_args, name = (sft_config, "SFTConfig") if sft else (dpo_config, "DPOConfig") if dpo else \
            (grpo_config, "GRPOConfig")
    if training_args is None:
        from transformers import TrainingArguments

        training_args, name = TrainingArguments(), "TrainingArguments()"
    elif not (sft or dpo or grpo):   # a dict of TrainingArguments' keywords is read into one; else refused by name
        training_args = kin.training_arguments("training_args", training_args)
    given["training_args"] = None if sft or grpo or name == "TrainingArguments()" else training_args
    opts, src, notes = read_args(training_args, name)
    if dpo:
        pairs = kd.pairs_options(opts, src, notes, name)
    ckpt, (aopts, asrc) = opts.pop("args_ckpt"), opts.pop("args_offload")
    opts.update(aopts)
    src.update(asrc)
    opts["gradient_checkpointing"] = bool(ckpt)
    src["gradient_checkpointing"] = (bool(ckpt), ckpt or f"{name}.activation_checkpointing is off")
    if ckpt:
        reentrant, where = trainer_reentrant(training_args, name)
        opts["checkpoint_reentrant"], src["checkpoint_reentrant"] = reentrant, (reentrant, where)
    if hasattr(model_id_or_config, "named_modules"):
        from transformers import PreTrainedModel

        # a module of the user's own under a head of its own (kit.estimate.own_head): its base's config, its task
        own = None if isinstance(model_id_or_config, PreTrainedModel) else read_own_head(model_id_or_config)
        cfg = model_id_or_config.get_submodule(own.base).config if own else model_id_or_config.config
        if own and task is None:   # its head says its labels: a num_labels given is checked against them
            task, num_labels = "seq-cls", own.labels if num_labels is None else num_labels
        by_class = task is None and task_of(model_id_or_config) != "causal-lm"
        task = task_of(model_id_or_config) if by_class else task   # a classifier's class says its head
    else:
        cfg, by_class = get_config(model_id_or_config), False
    task, labels, train_head, task_src = read_task(peft_config, task, num_labels, cfg)
    if by_class:
        task_src["task"] = (task, f"the model's class ({type(model_id_or_config).__name__})")
    opts.update({k: v for k, v in (("task", task), ("num_labels", labels), ("train_head", train_head))
                 if v is not None})
    src.update(task_src)
    info = info_of(model_id_or_config, task, labels or 2)
    src["model"] = (model_name(model_id_or_config, cfg), "estimate_from(model_id_or_config)")
    quant = read_bnb(quantization_config, "BitsAndBytesConfig")
    opts["quantization"] = quant
    src["quantization"] = (quant, "BitsAndBytesConfig.load_in_4bit/8bit" if quantization_config is not None
                           else "no quantization_config")
    if quant == "4bit":
        q4 = bnb_options(quantization_config)
        opts.update(q4)
        src.update({k: (v, f"BitsAndBytesConfig.bnb_4bit_{a}") for (k, v), a in
                    zip(q4.items(), ("quant_type", "use_double_quant", "compute_dtype"))})
    src["load_dtype"] = auto_dtype(cfg, load_dtype, quant)
    if dsrc:
        src["load_dtype"] = dsrc
    src["attn_implementation"] = auto_attn(cfg, attn_implementation)
    opts["load_dtype"], opts["attn_implementation"] = src["load_dtype"][0], src["attn_implementation"][0]
    if grpo:
        kg.refuse_unmodeled(opts)
    if quant != "none" and (sft or dpo):
        opts["quantization"] = quant
    elif quant != "none":
        opts["kbit_recipe"] = "standard"
        src["kbit_recipe"] = ("standard", "assumed: prepare_model_for_kbit_training, the peft recipe")
        if not opts["gradient_checkpointing"]:  # prepare_model_for_kbit_training turns it on
            opts["gradient_checkpointing"] = True
            src["gradient_checkpointing"] = (True, "prepare_model_for_kbit_training (use_gradient_checkpointing=True)")
            opts["checkpoint_reentrant"] = True
            src["checkpoint_reentrant"] = (True, "prepare_model_for_kbit_training passes no use_reentrant: torch's "
                                                 "default, reentrant")
    if peft_config is not None:
        r, names, dropout = read_lora_config(peft_config, info)
        targets, tnote = targets_for(info, names)
        opts.update(lora_r=r, lora_targets=targets, lora_dropout=dropout)
        src.update(lora_r=(r, "LoraConfig.r"), lora_targets=(targets, "LoraConfig.target_modules, matched as peft "
                   "matches them"), lora_dropout=(dropout, "LoraConfig.lora_dropout"))
        notes += tnote
        if peft_config.use_dora:
            opts["use_dora"], src["use_dora"] = True, (True, "LoraConfig.use_dora")
        if info.task == "causal-lm" and peft_config.modules_to_save:   # trained copies (the plan checks the names)
            opts["modules_to_save"] = tuple(peft_config.modules_to_save)
            src["modules_to_save"] = (opts["modules_to_save"], "LoraConfig.modules_to_save")
    src["seq_len"] = (seq_len, "estimate_from(seq_len=...)")
    src["padded"] = (True, "assumed: padded, as estimate() does") \
        if padded is None else (padded, "estimate_from(padded=...)")
    padded = True if padded is None else padded
    if sft:
        if ssrc:
            src["seq_len"] = (seq_len, ssrc)
        kt.quantized_recipe(opts, src, "SFTTrainer")
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        if free:  # one flattened row of batch x seq_len tokens at most; a block-diagonal mask from position_ids
            B = opts["batch_size"]
            seq_len, padded = B * seq_len, True
            flattened_eval(opts, src, notes, B)
            opts.update(batch_size=1, padding_free=True)
            src["batch_size"] = (1, f"{B} rows flattened into one (padding-free)")
            src["seq_len"] = (seq_len, f"{B} x {src['seq_len'][0]} ({src['seq_len'][1]}): the flattened row")
            src["padded"] = (True, "the flattened row's position_ids restart: sdpa builds a block-diagonal mask")
    if dpo:
        src["seq_len"] = (seq_len, ssrc or src["seq_len"][1])
        kt.quantized_recipe(opts, src, "DPOTrainer")
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        kd.refuse_dropout(dpo_config, cfg)
        kind, _, rwhere = kd.reference_of(cfg=dpo_config, peft=peft_config is not None)
    if grpo:  # B rows of prompt + completion a step; G generated at once
        opts.update(topts)
        src.update(tsrc)
        notes.extend(tnotes)
        kd.refuse_dropout(grpo_config, cfg, "GRPOConfig")
        rollout = kg.rollout(grpo_config, seq_len)
        kg.check_positions(rollout, cfg)
        gopts, gsrc = kg.seq_options(rollout, not padded, "estimate_from(seq_len=...)")
        seq_len, padded = gopts.pop("seq_len"), gopts.pop("padded")
        opts.update(gopts)
        src.update(gsrc)
        kind, rwhere = kg.reference_of(grpo_config, peft_config is not None)
    notes += cpu_fp16(opts, src, device, training_args)
    src["eval_gather"] = ("loss", "assumed: with no Trainer there is no compute_metrics (evaluate() keeps the loss)")
    est = _run(model_id_or_config, dict(opts, seq_len=seq_len, padded=padded, device=device), src, notes)
    if dpo:  # the reference: a copy as loaded, the adapter-disabled policy, or precomputed log-probs
        kd.finish(est, info, kind=kind, where=rwhere, pairs=pairs, S=seq_len, V=cfg.get_text_config().vocab_size,
                  ref_weights=est.loaded_weights_bytes if kind == "model" else 0, ref_model=None,
                  precompute_pairs=dpo_config.precompute_ref_batch_size or pairs, precompute_model=None,
                  weighting=dpo_config.use_weighting)
    if grpo:  # the reference (a copy as loaded, or the adapter-disabled policy), the generation phase
        kg.finish(est, grpo_config, rollout, config=cfg, reference=kind, where=rwhere,
                  ref_weights=est.loaded_weights_bytes if kind == "model" else 0)
    est.inputs = dict(given, padding_free=bool(sft and free), grpo_config=grpo_config)
    return est


def cpu_fp16(opts, src, device, args) -> list:
    """On a CPU (``device``, or ``args.use_cpu``), the precision Trainer runs (:func:`kit.dtypes.trainer_precision`:
    fp16=True is ignored there), and its note."""
    run, note = trainer_precision(opts.get("precision"), "cpu" if getattr(args, "use_cpu", False) else device)
    if note is None:
        return []
    opts["precision"] = run
    src["precision"] = (run, f"{src['precision'][1]}, which Trainer ignores on a CPU: the run is {run}")
    return [note]


def _run(target, opts, src, notes):
    est = estimate(target, **opts)
    src["device"] = (opts["device"], "the device argument (whose kernels are predicted)")
    trainable = src.get("trainable_params", (None,))[0]
    idle = src.get("idle_params", (0,))[0]   # requires_grad, and no gradient reaches them (kit.estimate.read_model)
    if trainable is not None and trainable != est.trainable_params + idle:
        notes.append(f"the model has {trainable:,} trainable parameters now, the estimate counts "
                     f"{est.trainable_params:,}: check what is frozen")
    est.notes.extend(notes)
    est.setup["model"] = src["model"][0]
    first = [k for k in _ORDER if k in src]
    est.sources = {k: src[k] for k in first + [k for k in src if k not in first]}
    return est
