"""transformers' ``Seq2SeqTrainer`` and ``Seq2SeqTrainingArguments`` for the estimator (read from transformers 5.25's
``trainer_seq2seq.py`` and ``training_args_seq2seq.py``), on an encoder-decoder (T5's family replays it whole).

Training is Trainer's: one forward of the encoder and the decoder with the labels, one backward. What differs, and
how each is read:

- the batch: ``DataCollatorForSeq2Seq`` pads ``input_ids`` to the source's longest row and ``labels`` (and the
  ``decoder_input_ids`` it makes from them with the model) to the target's: the estimate takes both lengths, the
  target's as ``target_len`` (:func:`read_target_len`: the collator run on the rows of the longest labels);
- ``evaluate()`` without ``predict_with_generate`` is Trainer's loop on the same forward (the loss and the logits
  over the target length): the evaluation's batch is read at both lengths as training's is;
- ``predict_with_generate=True`` with a ``compute_metrics`` (without one, ``evaluate()`` asks for the loss alone and
  ``prediction_step`` does not generate): ``generate()`` runs first under no_grad (greedy; beams are refused by
  name), then the loss's forward, beside the batch's generated tokens; the loop gathers token ids, not logits: the
  generated rows and the labels, each padded to ``generation_max_length`` (GenerationConfig's ``max_length``, 20,
  where it is None), int64 (:func:`generation_eval`). Generation holds the encoder's output and the decoder's KV
  cache, at most what the loss's forward holds of them where the generated length is no longer than the target
  (the replay's ``forward_held``), and one step's (B, V) fp32 logits and scores.
"""
from __future__ import annotations

import sys

from kit.inputs import InputError

from kit import trainer_kinds
from kit.estimate.trainer_reader import Reading, TrainerReader

# Seq2SeqTrainingArguments' fields beyond TrainingArguments', and how the estimate reads each
MODELED = {"predict_with_generate": "evaluate() generates, then gathers token ids (generation_eval)",
           "generation_max_length": "the generated rows' and the gathered labels' length",
           "generation_num_beams": "greedy (1) modelled; beams refused by name"}
NO_MEMORY = {"sortish_sampler": "orders the rows by length (the longest batch is read all the same)",
             "generation_config": "generate()'s settings: its max_length read where generation_max_length is None"}


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


def generated_length(trainer) -> int:
    """The length ``prediction_step`` pads the generated rows and the labels to: ``generation_max_length``, else the
    model's GenerationConfig ``max_length``; greedy only (beams refused by name)."""
    args = trainer.args
    beams = args.generation_num_beams or getattr(getattr(trainer.model, "generation_config", None), "num_beams", 1)
    if beams and beams > 1:
        raise InputError("generation_num_beams", f"Seq2SeqTrainingArguments.generation_num_beams={beams}: beam search "
                         "keeps a KV cache and scores per beam, which the kit does not model (it models greedy "
                         "generation); estimate with generation_num_beams=1, or measure evaluate() with "
                         "kit.watch(trainer).", code="seq2seq-beams")
    config = getattr(trainer.model, "generation_config", None)
    return args.generation_max_length or getattr(config, "max_length", None) or 20


def generation_eval(draft, *, generated: int, target: int, eval_batch: int, samples: int, vocab: int,
                    device: str) -> int:
    """``evaluate()``'s peak with generation (the module doc), from ``draft``'s evaluation at gather "loss" (the
    loss's forward): beside it, the batch's generated tokens and the token ids gathered before it; or the generation
    itself (the encoder's output and KV cache, one step's logits and scores); or the final concatenation."""
    rp = draft.context.rp
    per_row = 8 * generated + 8 * max(target, generated)   # a generated row and its labels, int64
    before = (samples - eval_batch) * per_row if device == "cpu" else 0   # (moved off a GPU at each step)
    at_loss = draft.eval_peak_bytes + eval_batch * generated * 8 + before
    held = draft.eval_peak_bytes - int(eval_batch / draft.setup["batch_size"] * (
        rp.logits_live + rp.ls + rp.hidden + rp.forward_held))
    generating = held + int(eval_batch / draft.setup["batch_size"] * rp.forward_held) + 2 * eval_batch * vocab * 4 \
        + before
    return max(at_loss, generating, held + 2 * samples * per_row)


class Seq2SeqReader(TrainerReader):
    """Seq2SeqTrainer and Seq2SeqTrainingArguments (the module doc): Trainer's reading, with the target length."""

    trainer_name, config_name = "Seq2SeqTrainer", "Seq2SeqTrainingArguments"

    def __init__(self):
        super().__init__()
        self.generated = 0   # evaluate() generates rows of this length (0: it does not)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        opts, src = reading.opts, reading.src
        length, where = read_target_len(trainer, opts["batch_size"])
        opts["target_len"], src["target_len"] = length, (length, where)
        if getattr(trainer.args, "predict_with_generate", False) and opts.get("eval_gather", "loss") != "loss":
            self.generated = generated_length(trainer)
            opts["eval_gather"] = "loss"   # the draft's evaluation: the loss's forward; compose adds the rest
            src["eval_gather"] = ("token ids", "Seq2SeqTrainingArguments.predict_with_generate: the generated rows "
                                  f"and the labels, {self.generated} int64 each")

    def compose(self, draft, trainer, reading: Reading) -> dict:
        if not self.generated:
            return {}
        opts = reading.opts
        peak = generation_eval(draft, generated=self.generated, target=opts["target_len"],
                               eval_batch=opts.get("eval_batch_size") or 8, samples=opts.get("eval_samples") or 0,
                               vocab=trainer.model.config.vocab_size, device=draft.setup["device"])
        return {"eval_peak_bytes": peak, "eval_moment": "evaluate() with generation (the loss's forward, the "
                "generated tokens and those gathered)"}


trainer_kinds.register_kind("seq2seq", trainer_kinds.library_classes("transformers", "Seq2SeqTrainer",
                                                                     "Seq2SeqTrainingArguments"))
trainer_kinds.register_part("seq2seq", "estimate", Seq2SeqReader)
