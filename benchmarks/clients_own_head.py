"""real_clients' rows for the user's own head on a transformers base model (the sentence-transformers pattern):
``AutoModel.from_pretrained`` (a LlamaModel, BertModel, ...: no LM or classifier head) + pooling over the attention
mask (mean, the first token, or the last non-pad token) + dropout + ``nn.Linear`` layer(s) + ``CrossEntropyLoss``,
written as such code is written, trained by a ``Trainer`` (its forward returns the loss) and by a plain PyTorch loop
watched by ``kit.watch_loop``. Each is measured by ``real_clients``' independent meter (PyTorch's profiler memory
events), and estimated by ``estimate_trainer(trainer, device="cpu")`` / ``watch.estimate``.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn

import real_clients as rc

from kit.data import equal_token_rows


class PooledClassifier(nn.Module):
    """An AutoModel under a pooled head of the user's own: ``pooling`` "mean" (the sentence-transformers mean over
    the attention mask), "cls" (the first token) or "last" (the last non-pad token); ``hidden`` > 0 puts a
    ``Linear(H, hidden)`` + ReLU before the classifier."""

    def __init__(self, path: str, labels: int = 3, pooling: str = "mean", hidden: int = 0, dropout: float = 0.1):
        super().__init__()
        from transformers import AutoModel

        self.encoder = AutoModel.from_pretrained(path)
        width = self.encoder.config.hidden_size
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        layers = [nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, labels)] if hidden else \
            [nn.Linear(width, labels)]
        self.head = nn.Sequential(*layers)
        self.loss_fn = nn.CrossEntropyLoss()

    def pool(self, hidden, mask):
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "last":
            last = mask.sum(dim=1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        expanded = mask.unsqueeze(-1).expand(hidden.size()).float()   # sentence-transformers' mean_pooling
        return torch.sum(hidden * expanded, 1) / torch.clamp(expanded.sum(1), min=1e-9)

    def forward(self, input_ids, attention_mask=None, labels=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        logits = self.head(self.dropout(self.pool(out.last_hidden_state, attention_mask)))
        loss = self.loss_fn(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def _rows(tok, labels, rows, S):
    return [{"input_ids": ids, "attention_mask": [1] * len(ids), "labels": i % labels}
            for i, ids in enumerate(tok(equal_token_rows(tok, S, rows))["input_ids"])]


def own_head_trainer(work, family="tiny-llama", pooling="mean", hidden=0, B=4, S=64, rows=32, labels=3):
    from datasets import Dataset
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

    tok = rc.tokenizer()
    torch.manual_seed(0)
    model = PooledClassifier(rc.twin_dir(family, work), labels, pooling, hidden)
    ds = Dataset.from_list(_rows(tok, labels, rows, S))
    args = TrainingArguments(output_dir=os.path.join(work, "own-head"), per_device_train_batch_size=B,
                             per_device_eval_batch_size=8, use_cpu=True, max_steps=3, report_to="none",
                             save_strategy="no", logging_strategy="no", disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=ds, eval_dataset=ds.select(range(min(16, rows))),
                   data_collator=DataCollatorWithPadding(tok))


def client_own_head(work, family="tiny-llama", pooling="mean", hidden=0):
    from kit.estimate import estimate_trainer

    trainer = own_head_trainer(work, family, pooling, hidden)
    head = f"Linear(H, {hidden}) + ReLU + Linear({hidden}, 3)" if hidden else "Linear(H, 3)"
    yield ("12. own head, Trainer", f"{family} AutoModel + {pooling} pooling + dropout + {head}, CrossEntropyLoss, "
           "full FT, B4 x 64, eval B8 x 16 rows", trainer, lambda: estimate_trainer(trainer, device="cpu"))


def client_own_head_loop(work, meter_cls, family="tiny-llama", pooling="mean", B=4, S=64, steps=3, lengths=None,
                         watch_box=None):
    """The same model in a plain PyTorch loop watched by ``kit.watch_loop``: its estimate against the meter.
    ``lengths``: step i's batch has ``lengths[i]`` tokens (else ``S``); ``watch_box``: a list the watch is put in."""
    import kit

    tok = rc.tokenizer()
    torch.manual_seed(0)
    model = PooledClassifier(rc.twin_dir(family, work), 3, pooling)
    rows = [r for i, n in enumerate(lengths or [S] * steps) for r in _rows(tok, 3, B, n)]
    loader = torch.utils.data.DataLoader(rows, batch_size=B, collate_fn=lambda r: {
        k: torch.tensor([x[k] for x in r]) for k in r[0]})
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    watch = kit.watch_loop(model, optimizer, plot=False)
    if watch_box is not None:
        watch_box.append(watch)
    meter = meter_cls()
    model.train()
    meter.start()
    for batch in watch.batches(loader):
        with watch.step(batch):
            meter.begin(rc.held_bytes(model, optimizer, batch))
            loss = model(**batch)["loss"]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            meter.end()
    meter.stop()
    est = watch.estimate if watch.estimate is not None else ValueError(watch.estimate_error)
    watch.close()
    setup = f"{family} AutoModel + {pooling} pooling + dropout + Linear(H, 3), torch AdamW, B{B} x {S}"
    return ("12. own head, kit.watch_loop", setup, est, meter.peaks)
