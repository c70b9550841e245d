"""Reading the training side for the estimator: ``TrainingArguments`` (batch, accumulation, precision,
optim, checkpointing), the sequence length the data collator really builds, and the dtype and
attention ``from_pretrained`` would pick. Used by :mod:`kit.estimate.from_objects`.
"""
from __future__ import annotations

import itertools
import sys

from kit.inputs import InputError, Refusal

from kit import optimizers
from kit.estimate.launch import read_training_launch
from kit.estimate.offload_options import from_ckpt_kwargs
from kit.estimate.read_model import dtype_name

OPTIMS = optimizers.BY_OPTIM   # TrainingArguments.optim -> the kit's optimizer (sgd: with a momentum, see read_args)
SAMPLE_ROWS = 64   # rows of trainer.train_dataset the collator is run on to read the sequence length


def read_args(args, name: str = "TrainingArguments"):
    """(estimate options, sources, notes) from a TrainingArguments; refuses what is not modeled."""
    refuse = [("torch_compile", "torch.compile (it changes what "
              "the forward saves)")]
    for attr, what in refuse:
        if getattr(args, attr, None):
            raise Refusal(f"TrainingArguments.{attr} is set, and the kit does not model {what}: it predicts one "
                             "GPU with the plain Trainer step; estimate without it.")
    if getattr(args, "label_smoothing_factor", 0):
        raise Refusal("TrainingArguments.label_smoothing_factor > 0 is not modeled (the Trainer then computes "
                         "its own log-softmax over the logits): estimate with 0.")
    attr = "activation_checkpointing_kwargs" if getattr(args, "activation_checkpointing_kwargs", None) else \
        "gradient_checkpointing_kwargs"
    optim = str(getattr(args.optim, "value", args.optim))
    if optim not in OPTIMS:
        raise InputError("optim", f"TrainingArguments.optim={optim!r} is not modeled by the kit, which models "
                                      f"{', '.join(OPTIMS)} (sgd with a momentum): choose one of those.")
    src, notes = {}, []
    if optim == "sgd":
        from transformers.trainer_optimizer import _parse_optim_args

        momentum = float(_parse_optim_args(args.optim_args).get("momentum", 0) or 0)
        if not momentum:
            raise InputError("optim", "TrainingArguments.optim='sgd' without a momentum keeps no state, and the "
                                          "kit's sgd counts a momentum buffer: set optim_args='momentum=0.9'.")
        src["optim_args"] = (f"momentum={momentum:g}", "TrainingArguments.optim_args")
    prec = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    ckpt = bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))
    opts = dict(batch_size=args.per_device_train_batch_size, grad_accum=args.gradient_accumulation_steps,
                precision=prec, optimizer=OPTIMS[optim],
                args_ckpt=f"{name}.activation_checkpointing" if ckpt else None,   # every_n_layers / offload with it:
                args_offload=from_ckpt_kwargs(getattr(args, attr, None), name, attr) if ckpt else ({}, {}))
    src.update(batch_size=(opts["batch_size"], f"{name}.per_device_train_batch_size"),
               grad_accum=(opts["grad_accum"], f"{name}.gradient_accumulation_steps"),
               precision=(prec, f"{name}.{prec}=True" if prec != "fp32" else f"{name}: neither fp16 nor bf16"),
               optimizer=(OPTIMS[optim], f"{name}.optim={optim!r}"))
    opts.update(eval_batch_size=args.per_device_eval_batch_size, eval_accumulation_steps=args.eval_accumulation_steps)
    src.update(eval_batch_size=(opts["eval_batch_size"], f"{name}.per_device_eval_batch_size"),
               eval_accumulation_steps=(opts["eval_accumulation_steps"], f"{name}.eval_accumulation_steps"))

    if getattr(args, "use_liger_kernel", False):   # Liger's kernels, from its source (kit.estimate.replay.liger)
        config = getattr(args, "liger_kernel_config", None)
        opts.update(liger_kernel=True, liger_kernel_config=config)
        src.update(liger_kernel=(True, f"{name}.use_liger_kernel"),
                   liger_kernel_config=(config, f"{name}.liger_kernel_config" + ("" if config else
                                                                             ": None, Liger's defaults")))
    # fsdp / deepspeed: the estimate becomes per GPU (kit.estimate.strategies)
    launch, more = read_training_launch(args)
    opts.update(launch)
    src.update({k: (v, f"{name}.{'fsdp_config' if getattr(args, 'fsdp', None) else 'deepspeed'}"
                + (" and WORLD_SIZE" if k == "num_gpus" else "")) for k, v in launch.items()
                if k in ("strategy", "num_gpus", "cpu_offload")})
    notes += more
    if getattr(args, "auto_find_batch_size", False):
        notes.append("auto_find_batch_size: the Trainer halves the batch after an out-of-memory error; this "
                     "estimate is for the batch size it starts with")
    return opts, src, notes


def read_eval(trainer):
    """(options, sources) of Trainer.evaluate(): what it gathers, and over how many rows."""
    args, ds = trainer.args, trainer.eval_dataset
    if args.prediction_loss_only or getattr(args, "batch_eval_metrics", False):
        why = "TrainingArguments.prediction_loss_only" if args.prediction_loss_only else \
            "TrainingArguments.batch_eval_metrics (metrics per batch, nothing gathered)"
        gather = "loss"
    elif trainer.compute_metrics is None:
        gather, why = "loss", "trainer.compute_metrics is None (evaluate() then keeps the loss only)"
    elif getattr(trainer, "preprocess_logits_for_metrics", None) is not None:
        gather, why = "preprocessed", "trainer.preprocess_logits_for_metrics (one id per token assumed, as argmax)"
    else:
        gather, why = "logits", "trainer.compute_metrics, with no preprocess_logits_for_metrics"
    parts = list(ds.values()) if isinstance(ds, dict) else [ds] if ds is not None else []
    sizes = [len(d) for d in parts if hasattr(d, "__len__")]
    samples = max(sizes) if sizes else None
    src = {"eval_gather": (gather, why),
           "eval_samples": (samples, "len(trainer.eval_dataset)" + (", the largest" if len(sizes) > 1 else "")
                            if samples else "no eval_dataset with a length")}
    if gather != "loss" and samples is None and args.eval_accumulation_steps is None:
        gather = "loss"
        src["eval_gather"] = (gather, f"{why}; but no eval_dataset length to count the gathered rows: loss only")
    return {"eval_gather": gather, "eval_samples": samples}, src


def read_seq_len(trainer, batch_size: int, dataset=None, description: str = "training"):
    """(seq_len, padded, where, batch) of the longest micro-batch ``trainer.data_collator`` builds from
    ``trainer.train_dataset``, or from ``dataset`` (``description``: "evaluation", as Trainer's eval dataloader names
    it when it drops the columns the model does not take).

    Every row's length is scanned (a column read); the collator is then run on the ``batch_size`` longest rows,
    the largest batch the shuffled sampler can draw. A padding-free collator (TRL) flattens them into one row:
    ``batch`` is 1 and ``seq_len`` that row's tokens, and its ``position_ids`` restarting per sequence make
    sdpa build a mask. Rows without ``input_ids`` (the collator tokenizes) are collated in batches, all of them;
    an iterable dataset, its first :data:`SAMPLE_ROWS` rows.
    """
    import torch

    ds, collate = trainer.train_dataset if dataset is None else dataset, trainer.data_collator
    name = "trainer.train_dataset" if dataset is None else "trainer.eval_dataset"
    if ds is None:
        raise InputError("seq_len", "the Trainer has no train_dataset to read the sequence length from: pass "
                                        "seq_len=... (the longest batch's length in tokens).")
    hf = sys.modules.get("datasets")
    lengths, scanned = None, "all"
    if hf and isinstance(ds, hf.Dataset):
        part = trainer._remove_unused_columns(ds, description=description) if hasattr(
            trainer, "_remove_unused_columns") else ds   # as Trainer's dataloader does
        get, n = part.__getitem__, len(part)
        if "input_ids" in part.column_names:
            lengths = [len(r) for r in part["input_ids"]]
    else:
        if hasattr(trainer, "_get_collator_with_removed_columns"):
            collate = trainer._get_collator_with_removed_columns(collate, description=description)
        if not hasattr(ds, "__getitem__") or isinstance(ds, torch.utils.data.IterableDataset):
            first = list(itertools.islice(iter(ds), SAMPLE_ROWS))
            get, n, scanned = first.__getitem__, len(first), f"the first {len(first)}"
        else:
            get, n = ds.__getitem__, len(ds)
    if not n:
        raise InputError("seq_len", f"{name} is empty: pass seq_len=....")
    if lengths is None and n and isinstance(get(0), dict) and "input_ids" in get(0):
        lengths = [len(get(i)["input_ids"]) for i in range(n)]
    if lengths is not None:
        top = sorted(range(n), key=lambda index: -lengths[index])[:batch_size]
        batches = [[get(i) for i in top]]
    else:
        batches = [[get(i) for i in range(j, min(j + batch_size, n))] for j in range(0, n, batch_size)]
    seq, padded, batch, free = 0, False, batch_size, False
    for rows in batches:
        out = collate(rows)
        if "input_ids" not in out:
            raise InputError("seq_len", "trainer.data_collator's batches have no input_ids: pass seq_len=....")
        ids = torch.as_tensor(out["input_ids"])
        mask, pos = out.get("attention_mask"), out.get("position_ids")
        if mask is None and pos is not None and ids.shape[0] == 1:   # padding-free: one flattened row
            free, batch = True, 1
            padded = padded or int((torch.as_tensor(pos)[0] == 0).sum()) > 1   # several sequences: a mask
        padded = padded or (mask is not None and not bool(torch.as_tensor(mask).bool().all()))
        seq = max(seq, int(ids.shape[-1]))
    if lengths is not None and not free and batch_size > 1 and len(set(lengths)) > 1:
        padded = True   # batches of rows of different lengths are padded
    where = (f"the {len(batches[0])} longest of {scanned} {n} rows of {name}, as trainer.data_collator "
             f"builds them" + (" (padding-free: one flattened row)" if free else "")) if lengths is not None else \
        f"the longest batch trainer.data_collator builds from {scanned} {n} rows of {name}"
    return seq, padded, where, batch


def read_eval_seq_len(trainer, eval_batch: int):
    """(eval_seq_len, where) of ``Trainer.evaluate()``'s longest batch: the longest ``trainer.data_collator`` builds
    from ``trainer.eval_dataset`` (the longest of a dict of them) at ``eval_batch`` rows, as :func:`read_seq_len`
    reads the training batches; (None, why) where there is no eval dataset whose batches can be read that way (a
    padding-free collator flattens them: :func:`kit.estimate.from_objects.flattened_eval`), and evaluate() is then
    estimated at the training length."""
    ds = trainer.eval_dataset
    parts = list(ds.values()) if isinstance(ds, dict) else [ds] if ds is not None else []
    if not parts:
        return None, "no trainer.eval_dataset: the training length"
    found = []
    for part in parts:
        try:
            seq, _, where, batch = read_seq_len(trainer, eval_batch, part, "evaluation")
        except InputError as exc:
            return None, f"trainer.eval_dataset's batches cannot be read ({exc}): the training length"
        if batch != eval_batch:
            return None, "trainer.data_collator flattens the eval rows (padding-free): the training length"
        found.append((seq, where))
    return max(found)


def read_images(trainer, batch_size: int) -> tuple:
    """(the image options, where they were read) of a trainer whose model is a vision-language model its family
    declares (:class:`kit.estimate.replay.families.ImageModel`); ({}, "") for any other. The collator is run on
    the first ``batch_size`` rows, and the family reads its batch and the processor's image options
    (``images.from_batch``) back into images a row."""
    from kit.estimate.replay import lookup

    cfg = getattr(trainer.model, "config", None)
    declared = lookup(getattr(cfg, "model_type", None))
    if declared is None or declared.images is None:
        return {}, ""
    ds = trainer.train_dataset
    rows = [ds[i] for i in range(min(batch_size, len(ds)))] if ds is not None else []
    batch = trainer.data_collator(rows) if rows else {}
    images = getattr(getattr(trainer, "processing_class", None), "image_processor", None)
    if batch.get("pixel_values") is None or images is None:
        raise InputError("images_per_row", "the trainer's vision-language batches could not be read (no "
                         "processing_class with an image_processor, or no pixel_values in the collated batch): pass "
                         "images_per_row and image_size.")
    options, read_from = declared.images.from_batch(cfg, images, batch)
    return options, f"trainer.data_collator's batch of the first {len(rows)} rows ({read_from})"


def auto_dtype(cfg, load_dtype, quant):
    if load_dtype is not None:
        return dtype_name(str(load_dtype)), "estimate_from(load_dtype=...)"
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        return ("fp16", "from_pretrained's default with bitsandbytes (transformers 4)") if quant != "none" else \
            ("fp32", "from_pretrained's default (transformers 4)")
    d = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if d is None:
        return "fp32", "the config names no dtype: fp32 assumed (from_pretrained's 'auto' reads the checkpoint)"
    return dtype_name(d), "the config's dtype (from_pretrained's dtype='auto' in transformers 5)"


def auto_attn(cfg, attn):
    if attn is not None:
        return attn, "estimate_from(attn_implementation=...)"
    attn = getattr(cfg, "_attn_implementation", None)
    if attn:
        return attn, "config._attn_implementation"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)] if type(cfg) in MODEL_FOR_CAUSAL_LM_MAPPING else None
    sdpa = getattr(cls, "_supports_sdpa", True)
    return ("sdpa" if sdpa else "eager"), "transformers' default for this model"
