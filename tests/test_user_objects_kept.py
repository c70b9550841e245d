"""The user's objects are read, never changed: every estimate of a user's module leaves its parameters, buffers,
train/eval modes and attributes as they were, and kit.free never destroys an object still referenced elsewhere."""
import torch
import torch.nn as nn
from datasets import Dataset
from transformers import AutoModel, Trainer, TrainingArguments

import kit
from kit.estimate import estimate, estimate_from, estimate_trainer
from kit.models import get_config


class NormedHead(nn.Module):
    """A head of one's own with state its forward changes: BatchNorm's running statistics, and an attribute it
    keeps (the pooled vector, as code that logs it does)."""

    def __init__(self):
        super().__init__()
        self.encoder = AutoModel.from_config(get_config("tiny-bert"))
        width = self.encoder.config.hidden_size
        self.norm, self.drop, self.head = nn.BatchNorm1d(width), nn.Dropout(0.1), nn.Linear(width, 3)
        with torch.no_grad():
            self.norm.running_mean.fill_(5.0)

    def forward(self, input_ids, attention_mask=None, labels=None):
        pooled = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]
        self.last_pooled = pooled
        logits = self.head(self.drop(self.norm(pooled)))
        return {"loss": nn.functional.cross_entropy(logits, labels) if labels is not None else None,
                "logits": logits}


def _state(model) -> dict:
    return {"tensors": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
            "modes": {n: m.training for n, m in model.named_modules()},
            "attributes": {n: sorted(m.__dict__) for n, m in model.named_modules()}}


def _assert_as_it_was(model, before):
    after = _state(model)
    assert after["modes"] == before["modes"]
    assert after["attributes"] == before["attributes"]
    changed = [k for k, v in before["tensors"].items() if not torch.equal(v, after["tensors"][k])]
    assert not changed, changed


def _trainer(model, tmp_path):
    rows = Dataset.from_list([{"input_ids": [1, 2, 3, 4], "attention_mask": [1] * 4, "label": i % 3}
                              for i in range(8)])
    return Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2,
                                                       use_cpu=True, report_to="none"), train_dataset=rows)


def test_every_estimate_of_a_users_module_leaves_it_as_it_was(tmp_path, capsys):
    reads = [lambda m: estimate(m, batch_size=2, seq_len=16, device="cpu"),
             lambda m: estimate_from(m, seq_len=16, device="cpu"),
             lambda m: estimate_trainer(_trainer(m, tmp_path), device="cpu"),
             lambda m: kit.check(_trainer(m, tmp_path), device="cpu")]
    for read in reads:   # a new module each time: the first read of a module probes its head
        model = NormedHead()
        model.encoder.eval()   # the user's modes: the head trains, the encoder is in eval()
        before = _state(model)
        read(model)
        _assert_as_it_was(model, before)
        assert model.norm.running_mean.eq(5.0).all() and int(model.norm.num_batches_tracked) == 0
        assert not model.encoder.training and model.training and "last_pooled" not in vars(model)
    capsys.readouterr()


def test_free_never_destroys_a_model_still_held_elsewhere():
    model = nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 64)).sum().backward()
    optimizer.step()
    data, labels = torch.randn(32, 64), torch.zeros(32, dtype=torch.long)
    best_loss = torch.tensor(0.25)
    ns = {"model": model, "optimizer": optimizer, "best_models": {"fold1": model}, "X": data, "y": labels,
          "best_loss": best_loss}
    weights = model.weight.detach().clone()
    text = kit.free(ns)
    assert not model.weight.is_meta and torch.equal(model.weight, weights)
    assert ns["model"] is model and ns["best_models"]["fold1"] is model
    assert "kept model: also held by best_models" in text, text
    assert all(ns[k] is v for k, v in (("X", data), ("y", labels), ("best_loss", best_loss))), text
    assert "kept X: your data on the CPU" in text and "kept best_loss" in text, text
    assert "optimizer" not in ns and text.startswith("freed 1 name (optimizer)"), text


def test_free_still_frees_a_run_held_by_its_names_alone(tmp_path):
    model = NormedHead()
    trainer = _trainer(model, tmp_path)
    ns = {"model": model, "trainer": trainer}
    text = kit.free(ns)
    assert text.startswith("freed 2 names"), text
    assert ns == {} and all(p.is_meta for p in model.parameters())
