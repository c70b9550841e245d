"""The estimator's part of a trainer kind (:mod:`kit.trainer_kinds`): how a kind's trainer, or its config, is read
into :func:`kit.estimate.estimate`'s options, and what the kind adds to the estimate before the result is built.

:class:`TrainerReader` is the plain Trainer's reader, and every kind's base: :mod:`kit.estimate.from_objects` calls its
hooks at fixed points, and a kind's reader (in the kind's own module) overrides the hooks where its trainer reads
more. A user's subclass of a registered trainer is read by that kind's reader (its class MRO);
TRL's trainers that no kind registers are refused by their class name.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate.read_training import read_images, read_seq_len

PACKED_EVAL = "packed-eval-rows"   # the note's code: a flattened evaluation row of another length than training's
# TRL's trainers no kind registers, refused by name (a subclass outside trl's modules too)
OTHER_TRL = ("PPOTrainer", "ORPOTrainer", "CPOTrainer", "BCOTrainer", "OnlineDPOTrainer", "GKDTrainer",
             "XPOTrainer", "NashMDTrainer", "PRMTrainer")


@dataclass
class Reading:
    """What has been read so far: estimate()'s options, where each came from (``(value, where)``), the notes."""

    opts: dict = field(default_factory=dict)
    src: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    target: object = None   # what estimate() is given for the model (read from the trainer's model)

    def take(self, opts: dict | None = None, src: dict | None = None, notes: list | None = None) -> None:
        """Add options, their sources and notes (a kind's config read, a model read)."""
        self.opts.update(opts or {})
        self.src.update(src or {})
        self.notes.extend(notes or [])


@dataclass
class Given:
    """estimate_from's arguments that a kind's config may fill where the caller left them out: the load dtype (and
    where it was read), the attention, the quantization config and the sequence length (and where it was read)."""

    load_dtype: object
    attn_implementation: object
    quantization_config: object
    seq_len: object
    peft_config: object = None
    dtype_source: tuple | None = None
    seq_source: str | None = None


class TrainerReader:
    """The plain Trainer's reader; a kind's reader overrides the hooks where its trainer reads more.

    One reader is made per estimate (its hooks keep what they read between them).
    """

    trainer_name, article = "Trainer", "a"   # the trainer's class, as a refusal names it
    config_name = "TrainingArguments"    # its config's class, as sources name it
    config_keyword = None                # estimate_from's keyword for the kind's config (None: training_args)
    lean_kbit = False                    # no prepare_model_for_kbit_training on a quantized model (TRL's trainers)
    reads_eval_rows = True               # evaluate()'s batch length is read from the trainer's eval data
    keeps_training_args = True           # estimate_from's inputs keep the config as training_args (the advisor's)
    trl = False                          # one of TRL's trainers (a refusal of another lists them)

    def __init__(self):
        self.own = Reading()   # what the kind's config says, read before TrainingArguments' readers

    # a built trainer: estimate_trainer

    def read_trainer(self, trainer) -> None:
        """Read the kind's config from ``trainer.args`` (first: a TRL config is a TrainingArguments, whose readers
        would refuse more vaguely). A Trainer refuses TRL's trainers that no kind registers."""
        refuse_other_trl(trainer)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        """Add the kind's options once TrainingArguments and the model are read."""

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        """(seq_len, padded) of the training batch: the longest batch the collator builds from the first rows, or the
        ``seq_len`` given; a padding-free collator's flattened row is one row of the batch's tokens."""
        opts, src = reading.opts, reading.src
        if seq_len is not None:
            src["seq_len"] = (seq_len, "estimate_trainer(seq_len=...)")
            src["padded"] = (True, "assumed, as estimate() does (seq_len was given, so no batch was read)")
            return seq_len, True
        seq_len, padded, where, batch = read_seq_len(trainer, opts["batch_size"])
        images, read_from = read_images(trainer, opts["batch_size"])
        opts.update(images)
        src.update({k: (v, read_from) for k, v in images.items()})
        src["seq_len"] = (seq_len, where)
        src["padded"] = (padded, ("rows of different lengths in a batch, or a 0 in its attention_mask" if padded else
                                  "every row of a batch the same length, no 0 in its attention_mask") if batch > 1
                         else "the flattened row's position_ids restart (sdpa builds a block-diagonal mask)")
        if batch != opts["batch_size"]:
            src["batch_size"] = (1, f"{opts['batch_size']} rows flattened into one (padding-free)")
            flattened_eval(opts, src, reading.notes, opts["batch_size"])
            opts.update(batch_size=1, padding_free=True)
        return seq_len, padded

    def compose(self, draft, trainer, reading: Reading) -> dict:
        """What the kind adds to the estimate ``draft`` of its training step (its phases, its reference model), as
        the fields of the Estimate built with them; nothing for a Trainer."""
        return {}

    def trainer_inputs(self, trainer) -> dict:
        """The kind's entries in the user's objects the estimate keeps (:func:`kit.advise.objects`)."""
        return {"sft": False}

    # the user's config objects: estimate_from

    def read_config(self, cfg, given: Given) -> None:
        """Read the kind's config (given by ``config_keyword``), and what it says of the model's loading."""

    def after_args(self, reading: Reading, name: str) -> None:
        """Once TrainingArguments' fields are read."""

    def after_quantization(self, opts: dict) -> None:
        """Once the quantization is read (a kind refuses what it does not model)."""

    def finish_options(self, reading: Reading, cfg, config, seq_len, padded) -> tuple:
        """(seq_len, padded) once the model, LoRA and the sequence are read: the kind's options last."""
        return seq_len, padded

    def compose_from(self, draft, cfg, info, config) -> dict:
        """As :meth:`compose`, for estimate_from (``info``: the model's inventory, ``config`` its config)."""
        return {}

    def config_inputs(self, cfg) -> dict:
        """The kind's entries in estimate_from's inputs (the advisor reads them)."""
        return {"sft": False, "sft_config": None, "padding_free": False, "grpo_config": None}


def flattened_eval(opts: dict, src: dict, notes: list, rows: int) -> None:
    """Padding-free evaluation: SFT's collator flattens ``per_device_eval_batch_size`` rows into one, as it
    does the ``rows`` training rows. With as many rows, the evaluation row is the training row: one row, modeled.
    With another count its row has another length, which the estimate does not model: a note says so."""
    be = opts.get("eval_batch_size") or rows
    opts["eval_batch_size"] = 1
    src["eval_batch_size"] = (1, f"{be} evaluation rows flattened into one (padding-free), as in training")
    if be != rows:
        notes.append(Note(f"a padding-free evaluation flattens {be} rows into one, and training {rows}: the "
                          f"evaluation estimate is of a row of {rows} rows' tokens, not {be}",
                          field="eval_batch_size", code=PACKED_EVAL))


def readers() -> list:
    """Every registered kind's reader class, in the order the kinds were registered."""
    return [r for r in (trainer_kinds.part_of(key, "estimate") for key in trainer_kinds.keys()) if r is not None]


def listed(names: list) -> str:
    """``"a, b and c"``.

    >>> listed(["a", "b", "c"]), listed(["a"])
    ('a, b and c', 'a')
    """
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)


def refuse_other_trl(trainer) -> None:
    """Refuse, in one sentence, a TRL trainer no kind registers (the kit models the registered ones)."""
    name = type(trainer).__name__
    if type(trainer).__module__.startswith("trl.") or name in OTHER_TRL:
        others = [r for r in readers() if r.trl]
        modeled = listed([r.trainer_name for r in others])
        raise InputError("trainer", f"estimate_trainer models TRL's {modeled}, not {name}, whose own forward "
                         "passes, generation and losses the kit does not model.",
                         code="trl-trainer", instead="the same model and data in a transformers Trainer, "
                         + ", ".join(f"{r.article} {r.trainer_name}" for r in others[:-1])
                         + f" or {others[-1].article} {others[-1].trainer_name} are estimated")


trainer_kinds.register_kind("trainer", trainer_kinds.library_classes("transformers", "Trainer", "TrainingArguments"))
trainer_kinds.register_part("trainer", "estimate", TrainerReader)
