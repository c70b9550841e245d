"""Real clients for sentence-transformers (``benchmarks/real_clients.py``'s rows), as its training overview writes
them: ``SentenceTransformer(modules=[models.Transformer(path), models.Pooling(dim, mode)])`` on a tiny BERT twin
(``kit/configs/tiny-bert.json``, saved as a ``BertModel`` with the shipped tokenizer beside it),
``SentenceTransformerTrainingArguments`` and ``SentenceTransformerTrainer(model, args, train_dataset, loss=...)``
with ``MultipleNegativesRankingLoss`` (anchor, positive; and anchor, positive, negative), ``CoSENTLoss`` (pairs with
a float score) and ``OnlineContrastiveLoss`` (pairs with a 0/1 label); full fine-tuning, fp32, B4 on rows of one
token length. ``estimate_trainer(trainer, device="cpu")`` against the profiler's meter for step 1 and the steady
step. Skipped, with the reason printed, where sentence-transformers is not installed.
"""
from __future__ import annotations

import importlib.util
import os

import torch

import real_clients as rc

from kit.data import equal_token_rows

MISSING = None if importlib.util.find_spec("sentence_transformers") else \
    "sentence-transformers is not installed (pip install -r requirements-dev.txt)"
# loss name -> the dataset's columns besides the texts' ("score": a float in [0, 1]; "label": 0 or 1)
LOSSES = {"MultipleNegativesRankingLoss": (), "CoSENTLoss": ("score",), "OnlineContrastiveLoss": ("label",)}


def st_twin(work: str, family: str = "tiny-bert") -> str:
    """``kit/configs/<family>.json`` saved as its base model (random weights, seed 0) with the shipped tokenizer, the
    folder a ``models.Transformer`` loads as it would a Hub model."""
    from transformers import AutoModel

    from kit.models import get_config

    path = os.path.join(work, f"{family}-sentence")
    if not os.path.isdir(path):
        torch.manual_seed(0)
        AutoModel.from_config(get_config(family)).save_pretrained(path)
        rc.tokenizer().save_pretrained(path)
    return path


def texts(n_rows: int, n_tokens: int) -> list:
    """Rows of one length: each tokenizes to the same number of tokens, so no column's batch is padded."""
    return equal_token_rows(rc.tokenizer(), n_tokens, n_rows)


def sentence_trainer(work, loss_name="MultipleNegativesRankingLoss", towers=2, B=4, S=32, rows=32, pooling="mean",
                     family="tiny-bert", evaluate=False, anchor_tokens=None):
    """The training overview's model, arguments and trainer, with ``towers`` text columns of ``S`` tokens (the first,
    the anchor, of ``anchor_tokens`` where given: a short query beside longer documents); ``evaluate``: an eval set
    of the first 16 rows (per_device_eval_batch_size 8)."""
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.sentence_transformer import losses, modules

    torch.manual_seed(0)
    transformer = modules.Transformer(st_twin(work, family), max_seq_length=128)
    model = SentenceTransformer(modules=[transformer, modules.Pooling(transformer.get_embedding_dimension(), pooling)])
    pool = texts(rows * towers, S)
    names = ("anchor", "positive", "negative")[:towers] if loss_name == "MultipleNegativesRankingLoss" else \
        ("sentence1", "sentence2")
    columns = {name: pool[i * rows:(i + 1) * rows] for i, name in enumerate(names)}
    if anchor_tokens:
        columns[names[0]] = texts(rows, anchor_tokens)
    for extra in LOSSES[loss_name]:
        columns[extra] = [float(i % 2) if extra == "score" else i % 2 for i in range(rows)]
    args = SentenceTransformerTrainingArguments(output_dir=os.path.join(work, "sentence"),
                                                per_device_train_batch_size=B, per_device_eval_batch_size=8,
                                                use_cpu=True, max_steps=3,
                                                report_to="none", save_strategy="no", logging_strategy="no",
                                                disable_tqdm=True)
    data = Dataset.from_dict(columns)
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                      eval_dataset=data.select(range(16)) if evaluate else None,
                                      loss=getattr(losses, loss_name)(model))


def client_sentence(work, loss_name="MultipleNegativesRankingLoss", towers=2, pooling="mean", B=4, S=32,
                    anchor_tokens=None):
    """One row; at B16 with an eval set (``trainer.evaluate()`` metered after training)."""
    from kit.estimate import estimate_trainer

    trainer = sentence_trainer(work, loss_name, towers, B=B, S=S, rows=4 * B, pooling=pooling, evaluate=B >= 16,
                               anchor_tokens=anchor_tokens)
    columns = towers if loss_name == "MultipleNegativesRankingLoss" else 2
    yield (f"14. sentence-transformers {loss_name}", f"tiny-bert {pooling} pooling, {columns} text columns, full FT, "
           f"B{B} x {S}" + (f" (anchor {anchor_tokens})" if anchor_tokens else "") + (", eval B8" if B >= 16 else ""),
           trainer, lambda: estimate_trainer(trainer, device="cpu"))


def rows(work):
    """(row name, thunk) for real_clients.rows_to_run; none where sentence-transformers is missing (said once)."""
    if MISSING:
        print(f"sentence-transformers rows skipped: {MISSING}")
        return []
    # B4 x 32: the optimizer's first step is step 1's peak; B16 x 64: the backward is, at every step
    runs = (("MultipleNegativesRankingLoss", 2, "mean", 4, 32), ("MultipleNegativesRankingLoss", 3, "mean", 4, 32),
            ("MultipleNegativesRankingLoss", 2, "cls", 4, 32), ("CoSENTLoss", 2, "mean", 4, 32),
            ("OnlineContrastiveLoss", 2, "mean", 4, 32), ("MultipleNegativesRankingLoss", 2, "mean", 16, 64),
            ("MultipleNegativesRankingLoss", 3, "mean", 16, 64), ("CoSENTLoss", 2, "cls", 16, 64))
    out = [(f"sentence-transformers {loss} {towers} columns {pooling} B{B} x {S}",
            lambda m, lo=loss, t=towers, p=pooling, b=B, s=S: rc.run_trainer_client(
                client_sentence(work, lo, t, p, b, s), m))
           for loss, towers, pooling, B, S in runs]
    return out + [("sentence-transformers MultipleNegativesRankingLoss 3 columns mean B16 x 64 anchor 16",
                   lambda m: rc.run_trainer_client(client_sentence(work, towers=3, B=16, S=64, anchor_tokens=16), m))]
