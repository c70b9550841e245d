"""transformers' ``Seq2SeqTrainer`` and ``Seq2SeqTrainingArguments`` for the estimator (read from transformers 5.25's
``trainer_seq2seq.py`` and ``training_args_seq2seq.py``), on an encoder-decoder (T5's family replays it whole).

Training is Trainer's: one forward of the encoder and the decoder with the labels, one backward. What differs, and
how each is read:

- the batch: ``DataCollatorForSeq2Seq`` pads ``input_ids`` to the source's longest row and ``labels`` (and the
  ``decoder_input_ids`` it makes from them with the model) to the target's: the estimate takes both lengths, the
  target's as ``target_len`` (:func:`read_target_len`: the collator run on the rows of the longest labels);
- ``evaluate()`` without ``predict_with_generate`` is Trainer's loop on the same forward (the loss and the logits
  over the target length): the evaluation's batch is read at both lengths as training's is;
- ``predict_with_generate=True``: ``prediction_step`` calls ``generate()`` (``generation_max_length``,
  ``generation_num_beams``) before the loss's forward; that generation is not modelled yet, so the evaluation's
  estimate is refused by name (training's stands).
"""
from __future__ import annotations

import sys

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate.trainer_reader import Reading, TrainerReader

# Seq2SeqTrainingArguments' fields beyond TrainingArguments', and how the estimate reads each
MODELED = {"predict_with_generate": "evaluate() generates (refused in the evaluation's estimate, by name)"}
NO_MEMORY = {"sortish_sampler": "orders the rows by length (the longest batch is read all the same)",
             "generation_max_length": "generate()'s length: read only with predict_with_generate",
             "generation_num_beams": "generate()'s beams: read only with predict_with_generate",
             "generation_config": "generate()'s settings: read only with predict_with_generate"}
GENERATE = "seq2seq-generate"   # the note's code: evaluate() with generation, not estimated


def read_target_len(trainer, batch_size: int) -> tuple:
    """(target length, where): the labels' length of the longest batch the collator builds, from the
    ``batch_size`` rows of ``trainer.train_dataset`` with the longest labels."""
    import torch

    ds = trainer.train_dataset
    if ds is None or not hasattr(ds, "__getitem__") or not len(ds):
        raise InputError("target_len", "the Seq2SeqTrainer has no train_dataset rows to read the target length from: "
                         "pass target_len=... (the labels' length in tokens).")
    hf = sys.modules.get("datasets")
    rows = [ds[i] for i in range(len(ds))] if not (hf and isinstance(ds, hf.Dataset)) else list(ds)
    if not all(isinstance(r, dict) and "labels" in r for r in rows):
        raise InputError("target_len", "the Seq2SeqTrainer's train_dataset rows have no labels column to read the "
                         "target length from: pass target_len=... (the labels' length in tokens).")
    top = sorted(rows, key=lambda r: -len(r["labels"]))[:batch_size]
    batch = trainer.data_collator(top)
    length = int(torch.as_tensor(batch["labels"]).shape[-1])
    return length, (f"the labels of the longest batch trainer.data_collator builds from the {len(top)} rows of "
                    "trainer.train_dataset with the longest labels")


class Seq2SeqReader(TrainerReader):
    """Seq2SeqTrainer and Seq2SeqTrainingArguments (the module doc): Trainer's reading, with the target length."""

    trainer_name, config_name = "Seq2SeqTrainer", "Seq2SeqTrainingArguments"

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        opts, src = reading.opts, reading.src
        length, where = read_target_len(trainer, opts["batch_size"])
        opts["target_len"], src["target_len"] = length, (length, where)
        if getattr(trainer.args, "predict_with_generate", False) and trainer.eval_dataset is not None:
            reading.notes.append(Note("Seq2SeqTrainingArguments.predict_with_generate=True: evaluate() runs "
                                      "generate() before the loss's forward, which the kit does not model yet, so its "
                                      "evaluation figure is the loss's forward alone; measure evaluate() with "
                                      "kit.watch(trainer)", field="predict_with_generate", code=GENERATE))


trainer_kinds.register_kind("seq2seq", trainer_kinds.library_classes("transformers", "Seq2SeqTrainer",
                                                                     "Seq2SeqTrainingArguments"))
trainer_kinds.register_part("seq2seq", "estimate", Seq2SeqReader)
