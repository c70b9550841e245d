"""sentence-transformers' ``SentenceTransformerTrainer`` for the estimator (read from sentence-transformers 6.3's
``base/trainer.py``, ``base/data_collator.py`` and its losses). sentence-transformers is an optional extra: it is
read where it is installed, and nothing here imports it.

What one step does, and how each part is estimated:

- the model is a ``SentenceTransformer``, an ``nn.Sequential`` of a ``Transformer`` module (a transformers
  ``AutoModel``: BERT, RoBERTa, ... without a head) and a ``Pooling`` (mean or CLS; ``Normalize``, ``Dense`` where
  the user adds them): the kit's own-head probe (:mod:`kit.estimate.own_head`) calls it as the losses do, with one
  dict of features, and reads what the pooling keeps per token and per row;
- the data collator tokenizes each text column on its own (``anchor_input_ids``, ``positive_input_ids``, ...), each
  padded to its own longest row; the loss embeds them with ``embed_columns``: the first (anchor) column in a forward
  of its own, then the other columns merged into one forward (``merge_feature_batches``: ``(columns - 1) x B`` rows
  padded to the widest), all before one backward, so their saved activations add up (``towers``: the replay's
  :mod:`kit.estimate.replay.towers`), each at its longest batch's length (:func:`read_towers`);
- the loss: :data:`LOSSES` below; its tensors are (B, towers x B) at most, the similarity matrix of the in-batch
  negatives, and (B, H) copies of the embeddings; the estimate counts them as the own head's loss on (rows, H).

Evaluation (an ``eval_dataset``) runs the same two forwards under no_grad: the estimate's ``eval_peak_bytes`` is the
merged columns' forward, the larger.
"""
from __future__ import annotations

import sys

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate.trainer_reader import Reading, TrainerReader

MODELED_VERSION = "6.3"
# loss class -> what its forward keeps beside the towers' activations (bytes of the order of B x (towers x B) and B x H)
LOSSES = {
    "MultipleNegativesRankingLoss": "the (B, towers-1 x B) scaled cosine similarities of each anchor to every "
                                    "positive and negative in the batch, and cross-entropy on them",
    "CoSENTLoss": "the (B,) pair cosines and their (B, B) pairwise differences, and a logsumexp over them",
    "ContrastiveLoss": "the (B,) pair distances and the margin's hinge",
    "OnlineContrastiveLoss": "the (B,) pair distances, the hard positives and negatives picked from them",
}


def read_loss(trainer) -> tuple:
    """(the loss's class name, where it was read); refuses a loss the kit does not model, by name."""
    loss = trainer.loss
    if isinstance(loss, dict):
        raise InputError("loss", "SentenceTransformerTrainer has a loss per dataset (a dict), which the kit does "
                         "not model: estimate each dataset's trainer on its own.", code="st-loss-dict")
    name = type(loss).__name__
    if name not in LOSSES:
        raise InputError("loss", f"SentenceTransformerTrainer's loss is {name}, which the kit does not model (it "
                         f"models {', '.join(LOSSES)}); measure it with kit.watch(trainer).", code="st-loss")
    return name, f"SentenceTransformerTrainer.loss ({name}: {LOSSES[name]})"


def read_towers(trainer, batch_size: int, rows: int = 64) -> tuple:
    """(lengths, padded, where): each text column's longest batch in tokens, in the dataset's order (the first is
    the anchor), from the collator run on the first ``rows`` rows in batches of ``batch_size``."""
    import torch

    ds = trainer.train_dataset
    if ds is None or not len(ds):
        raise InputError("seq_len", "the SentenceTransformerTrainer has no train_dataset rows to read the towers "
                         "and the sequence length from: pass seq_len=....")
    first = [ds[i] for i in range(min(rows, len(ds)))]
    lengths, padded = {}, False
    for start in range(0, len(first), batch_size):
        batch = trainer.data_collator(first[start:start + batch_size])
        for column in (k[:-len("_input_ids")] for k in batch if k.endswith("_input_ids")):
            mask = batch.get(f"{column}_attention_mask")
            tokens = int(torch.as_tensor(batch[f"{column}_input_ids"]).shape[-1])
            lengths[column] = max(lengths.get(column, 0), tokens)
            padded = padded or (mask is not None and not bool(torch.as_tensor(mask).bool().all()))
    if len(lengths) < 2:
        raise InputError("train_dataset", f"SentenceTransformerTrainer's collator made {len(lengths)} text "
                         "column(s) (*_input_ids) from train_dataset, and the kit models its losses on two or more "
                         "(anchor and positive, and negatives): pass a dataset of text columns.", code="st-columns")
    return tuple(lengths.values()), padded, (f"the data collator on the first {len(first)} rows: text columns "
                                             f"{', '.join(lengths)}, each padded to its own longest row")


def tower_rows(opts: dict, src: dict, lengths: tuple, loss: str) -> None:
    """Make the options the forwards' (see the module doc): the anchor column alone at its length, then the other
    columns merged into one forward (``embed_columns``) at the longest of theirs, ``B`` rows a column; in evaluation
    the merged forward, the larger (``eval_seq_len`` the longest column)."""
    merged = len(lengths) - 1
    opts["towers"] = ((1, lengths[0]), (merged, max(lengths[1:])))
    src["towers"] = (opts["towers"], f"{loss} embeds the anchor column alone ({lengths[0]} tokens), then the other "
                     f"{merged} text column(s) merged into one forward ({max(lengths[1:])} tokens: embed_columns pads "
                     "them to the widest), and their saved activations add up before one backward")
    be = opts.get("eval_batch_size", 8)
    opts["eval_batch_size"] = merged * be
    src["eval_batch_size"] = (opts["eval_batch_size"], f"{merged} x per_device_eval_batch_size ({be}): the merged "
                              "columns' forward, the larger of evaluation's two under no_grad")


def loss_notes(notes: list, loss: str) -> list:
    """``notes`` with the own head's loss note (a cross-entropy on the logits, assumed where a forward returns no
    loss) said as the trainer's loss is counted, and the version note where another sentence-transformers is
    installed."""
    out = [n for n in notes if getattr(n, "code", None) != "own-head-loss"]
    out.append(Note(f"the embeddings go to {loss}, whose tensors (similarities of B rows to the batch's "
                    "candidates, copies of the (B, H) embeddings) are counted as a cross-entropy on the (rows, H) "
                    "embeddings: the same order of bytes, a few KiB beside the towers' activations",
                    field="loss", code="st-loss-bytes"))
    module = sys.modules.get("sentence_transformers")
    version = getattr(module, "__version__", MODELED_VERSION)
    if version.split(".")[0] != MODELED_VERSION.split(".")[0]:
        out.append(Note(f"sentence-transformers {version} is installed; the kit models SentenceTransformerTrainer "
                        f"as {MODELED_VERSION} runs it", field="trainer", code="st-version"))
    return out


class SentenceReader(TrainerReader):
    """SentenceTransformerTrainer (the module doc): its loss, then the forwards a step runs, one per column group."""

    trainer_name, config_name = "SentenceTransformerTrainer", "SentenceTransformerTrainingArguments"
    reads_eval_rows = False   # evaluation runs the merged columns' forward (tower_rows)
    loss = lengths = padded = where = None

    def read_trainer(self, trainer) -> None:
        self.loss, where = read_loss(trainer)
        self.own.take(src={"loss": (self.loss, where)})

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        """The anchor column's forward, then the others' merged, before one backward."""
        reading.take(src=self.own.src)
        reading.notes[:] = loss_notes(reading.notes, self.loss)
        self.lengths, self.padded, self.where = read_towers(trainer, reading.opts["batch_size"])
        lengths = self.lengths if seq_len is None else (seq_len,) * len(self.lengths)   # seq_len given: each column's
        tower_rows(reading.opts, reading.src, lengths, self.loss)

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        """The longest column (evaluation's, and each forward's in ``towers``)."""
        if seq_len is not None:
            return super().rows(trainer, reading, seq_len)
        seq_len = max(self.lengths)
        reading.src["seq_len"], reading.src["padded"] = (seq_len, self.where), (self.padded, self.where)
        return seq_len, self.padded


# Its trainer only: its config, read by estimate_from, is read as the TrainingArguments it derives from (estimate_from
# has no columns to read the forwards from).
trainer_kinds.register_kind("sentence", trainer_kinds.library_classes("sentence_transformers",
                                                                      "SentenceTransformerTrainer"))
trainer_kinds.register_part("sentence", "estimate", SentenceReader)
