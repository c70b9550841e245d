"""TRL's ``SFTTrainer`` and ``SFTConfig`` for the estimator (the behaviour of TRL 1.16, read from its source).

What SFTTrainer (TRL 1.16) does that a plain Trainer does not, and how each is estimated:

- the loss comes from its fused LM head (``add_fused_lm_head``): log-probs in tiles, no ``(B, S, V)`` logits
  (modeled: ``fused_lm_head=True``, :mod:`kit.estimate.replay.fused_head`);
- ``packing`` with the ``bfd``/``bfd_split`` strategy, or ``padding_free``: the collator flattens a micro-batch
  into ONE row whose ``position_ids`` restart per sequence; sdpa then builds a block-diagonal mask from them
  (modeled: batch 1, the row's tokens, a mask); ``wrapped`` packing: full rows, no padding (modeled);
- on a quantized model it casts the trainable adapter weights to bf16 and does not run
  ``prepare_model_for_kbit_training`` (modeled: ``adapter_dtype="bf16"``, ``kbit_recipe="lean"``); with a PEFT
  model and checkpointing it calls ``enable_input_require_grads`` (as the kit assumes under checkpointing);
- ``SFTConfig.gradient_checkpointing`` defaults to True (read as TrainingArguments');
- ``loss_type`` "nll" and "dft" (a product of ``N``-vectors: the same memory) are modeled, and ``estimate()``
  takes them as ``loss_type`` (:func:`sft_loss`). "chunked_nll" is no lever in 1.16: ``SFTConfig.__post_init__``
  rewrites it to "nll" (a FutureWarning: "computes the loss the same way"), whose loss ``SFTTrainer.compute_loss``
  already takes from the fused head, ``-log_probs`` summed over ``num_items_in_batch``; ``dataset_text_field``,
  ``completion_only_loss`` and ``assistant_only_loss`` only choose which tokens are scored (CUDA scores the
  labelled ones only: the estimate counts every position, the most);
- ``use_liger_kernel``: SFTTrainer applies Liger's layer kernels only (``liger_kernel_config`` gets
  ``fused_linear_cross_entropy=False``; True raises), its fused head stays (modeled:
  :mod:`kit.estimate.replay.liger`, read as TrainingArguments');
- ``activation_offloading``: TRL's ``OffloadActivations`` over checkpointed blocks (modeled:
  :mod:`kit.estimate.replay.trl_offload`; without checkpointing it is refused where the options are checked);
- refused, each in one sentence: selective checkpointing,
  ``compute_loss_func`` and label smoothing (a second, full-logits forward), ``model_init_kwargs`` beyond
  ``dtype``/``attn_implementation``/``quantization_config``/``device_map``.
"""
from __future__ import annotations

import sys

from kit.inputs import InputError, Note

from kit import inputs
from kit import trainer_kinds
from kit.estimate.read_model import dtype_name
from kit.estimate.trainer_reader import Given, Reading, TrainerReader, flattened_eval

MODELED = "1.16"   # the TRL version whose SFTTrainer the kit models
INIT_KW = ("dtype", "torch_dtype", "attn_implementation", "quantization_config", "device_map", "trust_remote_code",
            "revision")


def is_sft(obj) -> bool:
    """Whether ``obj`` is of SFT's kind: TRL's SFTTrainer or SFTConfig, or a subclass (TRL imported or not)."""
    return trainer_kinds.kind_of(obj) == "sft"


def version_notes(trainer_name: str = "SFTTrainer") -> list:
    """[one line] where the imported TRL's major version is not the one whose ``trainer_name`` the kit models, else
    []."""
    trl = sys.modules.get("trl")
    if trl is not None and trl.__version__.split(".")[0] != MODELED.split(".")[0]:
        return [Note(f"TRL {trl.__version__} is installed; the kit models {trainer_name} as TRL {MODELED} runs it",
                     field="trl", code="trl-version")]
    return []


def max_length_bound(cfg, given: Given, where: str) -> None:
    """Where seq_len is not given: the config's ``max_length``, padded up to ``pad_to_multiple_of``, bounds every
    row (``where``: what the source says)."""
    if given.seq_len is None and cfg.max_length:
        multiple = cfg.pad_to_multiple_of if isinstance(cfg.pad_to_multiple_of, int) else 1
        given.seq_len = -(-cfg.max_length // multiple) * multiple
        given.seq_source = where


def sft_loss(loss_type, fused: bool) -> tuple[bool, object, object]:
    """(whether the fused LM head computes the loss, the loss type, a note or None) for ``estimate(loss_type=...)``:
    any TRL loss runs SFTTrainer's fused head (:mod:`kit.estimate.replay.fused_head`); "chunked_nll" is "nll",
    said in a note.

    >>> sft_loss(None, False), sft_loss("NLL", False)
    ((False, None, None), (True, 'nll', None))
    >>> sft_loss("chunked_nll", False)[2].code
    'trl-chunked-nll'
    """
    if loss_type is None:
        return fused, None, None
    loss_type = inputs.choice("loss_type", loss_type, ("nll", "dft", "chunked_nll"))
    return True, loss_type, loss_type == "chunked_nll" and Note(
        f"loss_type='chunked_nll': in TRL {MODELED} a deprecated alias of 'nll' (SFTConfig.__post_init__ rewrites "
        "it), whose loss already comes from the fused LM head in tiles: the same bytes as 'nll', no saving",
        field="loss_type", code="trl-chunked-nll") or None


def refuser(name: str):
    """``refuse(field, what, code)``: the one sentence that refuses a TRL config's setting the kit does not model."""

    def refuse(field, what, code):
        raise InputError(field, f"{name}.{field} {what}, which the kit does not model: estimate without it.",
                         code=code)

    return refuse


def refuse_shared(cfg, refuse) -> None:
    """What SFTConfig and DPOConfig share that the kit does not model: selective checkpointing, and
    ``model_init_kwargs`` beyond the ones read (``INIT_KW``)."""
    if (getattr(cfg, "gradient_checkpointing_kwargs", None) or {}).get("selective"):
        refuse("gradient_checkpointing_kwargs", "asks for selective checkpointing (selective=True)", "trl-selective")
    extra = sorted(set(cfg.model_init_kwargs or {}) - set(INIT_KW)) if isinstance(cfg.model_init_kwargs, dict) else []
    if extra:
        refuse("model_init_kwargs", f"holds {', '.join(extra)}", "trl-init-kwargs")


def read_sft_config(cfg, name: str = "SFTConfig", *, trainer=None):
    """(estimate options, sources, notes) of what an SFTConfig changes; refuses in one sentence what is not modeled.

    ``trainer``: the built SFTTrainer, whose ``padding_free`` and ``compute_loss_func`` are read as it resolved them.
    """
    refuse = refuser(name)
    refuse_shared(cfg, refuse)
    if getattr(cfg, "label_smoothing_factor", 0) or (trainer is not None and trainer.compute_loss_func is not None):
        refuse("label_smoothing_factor" if getattr(cfg, "label_smoothing_factor", 0) else "compute_loss_func",
               "runs a second forward that builds the full logits", "trl-full-logits")
    if cfg.loss_type not in ("nll", "dft"):
        raise InputError("loss_type", f"{name}.loss_type={cfg.loss_type!r} is not one TRL {MODELED} runs "
                                          "('nll' or 'dft'; SFTConfig turns 'chunked_nll' into 'nll' only when it "
                                          "is built).", code="trl-loss-type")
    free = trainer.padding_free if trainer is not None else \
        cfg.padding_free or (cfg.packing and cfg.packing_strategy in ("bfd", "bfd_split"))
    how = ("padding_free=True" if cfg.padding_free else f"packing=True, packing_strategy={cfg.packing_strategy!r}")
    src = {"fused_lm_head": (True, "SFTTrainer's add_fused_lm_head (log-probs in tiles, no logits)"),
           "loss_type": (cfg.loss_type, f"{name}.loss_type"),
           "packing": ((cfg.packing, cfg.packing_strategy) if cfg.packing else False, f"{name}.packing"),
           "padding_free": (bool(free), f"{name}.{how}: one flattened row per micro-batch" if free
                            else f"{name}: neither padding_free nor bfd packing")}
    if getattr(cfg, "use_liger_kernel", False):   # read as TrainingArguments' (kit.estimate.read_training.read_args)
        src["liger_kernel_config"] = (cfg.liger_kernel_config, f"{name}.liger_kernel_config; SFTTrainer sets "
                                      "fused_linear_cross_entropy=False there (its fused LM head stays)")
    if getattr(cfg, "activation_offloading", False):   # modeled: kit.estimate.replay.trl_offload
        src["activation_offloading"] = (True, f"{name}.activation_offloading (TRL's OffloadActivations around each "
                                              "training step)")
    if cfg.dataset_text_field:
        src["dataset_text_field"] = (cfg.dataset_text_field, f"{name}.dataset_text_field (which column is "
                                     "tokenized: no memory of its own)")
    notes = []
    if cfg.completion_only_loss or cfg.assistant_only_loss:
        notes.append(Note("completion_only_loss / assistant_only_loss: on CUDA the fused head scores the labelled "
                          "positions only; the estimate counts every position (the most it can be)",
                          field="completion_only_loss", code="trl-scored-positions"))
    notes.extend(version_notes())
    return {"fused_lm_head": True, "loss_type": cfg.loss_type,
            **({"activation_offloading": True} if getattr(cfg, "activation_offloading", False) else {})}, src, notes, \
        bool(free)


def read_sft_model(cfg, name: str = "SFTConfig"):
    """(load_dtype, attn_implementation, quantization_config) that ``SFTTrainer(model="id")`` loads with, and where
    each comes from: ``model_init_kwargs``, whose dtype defaults to float32 in TRL (not transformers' "auto")."""
    kw = cfg.model_init_kwargs if isinstance(cfg.model_init_kwargs, dict) else {}
    dtype = kw.get("dtype", kw.get("torch_dtype", "float32"))
    return (None if dtype in ("auto", None) else str(dtype).replace("torch.", ""), kw.get("attn_implementation"),
            kw.get("quantization_config"), f"{name}.model_init_kwargs")


def quantized_recipe(opts: dict, src: dict, name: str = "SFTTrainer") -> None:
    """What SFTTrainer does to a quantized model: no prepare_model_for_kbit_training, bf16 adapters."""
    if opts.get("quantization", "none") == "none":
        return
    opts["kbit_recipe"] = "lean"
    src["kbit_recipe"] = ("lean", f"{name} (TRL {MODELED}) does not run prepare_model_for_kbit_training")
    if opts.get("lora_r"):
        opts["adapter_dtype"] = "bf16"
        src["adapter_dtype"] = ("bf16", f"{name} casts the trainable adapter weights to bf16 on a quantized model")


def pair_rows(opts: dict, src: dict, name: str) -> int:
    """Make the options a preference trainer's (DPO, Reward): 2B rows a step, the chosen and the rejected rows in one
    batch (TRL's DataCollatorForPreference), and 2 x per_device_eval_batch_size in evaluation; returns B."""
    B = opts["batch_size"]
    opts["batch_size"] = 2 * B
    src["batch_size"] = (2 * B, f"2 x {name}.per_device_train_batch_size ({B}): the chosen and the rejected rows, "
                                "one batch (DataCollatorForPreference)")
    opts["eval_batch_size"] = 2 * opts["eval_batch_size"]
    src["eval_batch_size"] = (opts["eval_batch_size"], f"2 x {name}.per_device_eval_batch_size: pairs, as in training")
    return B


def refuse_activation_offloading(opts: dict, *, ckpt: bool, reentrant: bool, fused: bool) -> None:
    """Refuse, in one sentence, SFTConfig's activation_offloading where the kit does not model it (modeled: over
    every block checkpointed, non-reentrant, under the fused LM head: :mod:`kit.estimate.replay.trl_offload`)."""
    if not opts.get("activation_offloading"):
        return
    why = None
    if not fused:
        why = (f"is TRL's {SftReader.trainer_name}'s, whose loss comes from its fused LM head: set "
               f"fused_lm_head=True (or a loss_type), as {SftReader.trainer_name} runs it")
    elif not ckpt:
        why = ("without gradient checkpointing is not modeled (every tensor the blocks save would pass TRL's "
               "offloader in torch's per-op order): estimate it with gradient_checkpointing=True, "
               f"{SftReader.config_name}'s default")
    elif opts.get("ckpt_every_n_layers", 1) != 1:
        why = ("with ckpt_every_n_layers > 1 is not modeled (the unchecked blocks' saves would pass TRL's offloader "
               "op by op): estimate it with every block checkpointed")
    elif reentrant:
        why = ("with reentrant checkpointing is not modeled (its recompute saves under TRL's offloader in "
               "backward): estimate it with checkpoint_reentrant=False, transformers' default")
    if why:
        raise InputError("activation_offloading", f"activation_offloading {why}.", code="trl-offloading")


def model_init(cfg, name: str, given: Given) -> None:
    """Fill ``given`` from a TRL config's ``model_init_kwargs`` (how the trainer loads a model given by its id), where
    the caller did not pass its own: the load dtype (and where it was read), the attention, the quantization."""
    model_dtype, attn, quant, where = read_sft_model(cfg, name)
    if given.load_dtype is None and model_dtype is not None:
        given.load_dtype, given.dtype_source = model_dtype, (dtype_name(model_dtype),
                                                             f"{where}['dtype'] (TRL's default: float32)")
    given.attn_implementation = attn if given.attn_implementation is None else given.attn_implementation
    given.quantization_config = quant if given.quantization_config is None else given.quantization_config


class SftReader(TrainerReader):
    """SFTTrainer and SFTConfig (the module doc): its fused LM head, padding-free rows, its k-bit recipe."""

    trainer_name, config_name, config_keyword, article = "SFTTrainer", "SFTConfig", "sft_config", "an"
    trl = True
    lean_kbit, keeps_training_args = True, False
    free = False   # padding_free, or bfd packing: one flattened row per micro-batch

    def read_trainer(self, trainer) -> None:
        self.own.take(*read_sft_config(trainer.args, trainer=trainer)[:3])

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        reading.take(self.own.opts, self.own.src, self.own.notes)
        if reading.opts.get("eval_gather", "loss") != "loss":  # a loss-only evaluation runs the fused head: modeled
            reading.notes.append(Note("SFTTrainer's evaluation with compute_metrics (a second, full-logits "
                                      "forward) is not modeled: eval_peak_bytes is its fused forward's alone",
                                      field="eval_batch_size", code="trl-eval-unmodeled"))

    def trainer_inputs(self, trainer) -> dict:
        return {"sft": True}

    def read_config(self, cfg, given: Given) -> None:
        *own, self.free = read_sft_config(cfg)
        self.own.take(*own)
        model_init(cfg, self.config_name, given)
        if given.seq_len is None and cfg.max_length:
            given.seq_len, given.seq_source = cfg.max_length, ("SFTConfig.max_length: rows are truncated (or "
                                                               "packed) to it, so it is the longest a row can be")

    def finish_options(self, reading: Reading, cfg, config, seq_len, padded) -> tuple:
        opts, src = reading.opts, reading.src
        quantized_recipe(opts, src, self.trainer_name)
        reading.take(self.own.opts, self.own.src, self.own.notes)
        if not self.free:
            return seq_len, padded
        # one flattened row of batch x seq_len tokens at most; a block-diagonal mask from position_ids
        B = opts["batch_size"]
        flattened_eval(opts, src, reading.notes, B)
        opts.update(batch_size=1, padding_free=True)
        src["batch_size"] = (1, f"{B} rows flattened into one (padding-free)")
        src["seq_len"] = (B * seq_len, f"{B} x {src['seq_len'][0]} ({src['seq_len'][1]}): the flattened row")
        src["padded"] = (True, "the flattened row's position_ids restart: sdpa builds a block-diagonal mask")
        return B * seq_len, True

    def config_inputs(self, cfg) -> dict:
        return {"sft": True, "sft_config": cfg, "padding_free": bool(self.free), "grpo_config": None}


trainer_kinds.register_kind("sft", trainer_kinds.library_classes("trl", "SFTTrainer", "SFTConfig"))
trainer_kinds.register_part("sft", "estimate", SftReader)
