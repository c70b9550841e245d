"""TRL's ``RewardTrainer`` and ``RewardConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/reward_trainer.py`` and ``reward_config.py``).

What one RewardTrainer step does, and how each part is estimated:

- the model is a sequence classifier with one label (``AutoModelForSequenceClassification``, ``num_labels=1``: TRL
  loads a model given by id so, and refuses a built one with another count); with a ``peft_config`` it is wrapped by
  ``get_peft_model`` (``modules_to_save=["score"]``: the head's trained copy), read from the built model as any
  classifier is (modeled: task ``seq-cls``, one label);
- ``DataCollatorForPreference.torch_call`` builds ONE batch of ``2B`` rows, the ``B`` chosen then the ``B`` rejected
  rows (each prompt + completion + EOS, filtered out beyond ``max_length``, never truncated), right-padded to the
  longest of the ``2B`` (modeled: the replay at batch ``2B``, the length of the longest pairs' batch, read by running
  the trainer's collator on them);
- ``compute_loss``: one forward (``use_cache=False``) whose pooled logits are ``[2B, 1]``, then
  ``-logsigmoid(chosen - rejected [- margin]).mean()`` (+ ``center_rewards_coefficient`` x the rewards' mean square):
  ``[B]`` vectors, nothing per token (no bytes the kit counts);
- ``disable_dropout`` (default on) zeroes the ``nn.Dropout`` modules: refused where the config names a dropout the
  replay applies (as for DPO and GRPO).

Every RewardConfig field beyond TrainingArguments' is in one of :data:`MODELED`, :data:`NO_MEMORY` or
:data:`REFUSED`.
"""
from __future__ import annotations

from kit.inputs import InputError

from kit import trainer_kinds
from kit.estimate.dpo import refuse_dropout
from kit.estimate.trainer_reader import Reading, TrainerReader
from kit.estimate.trl import SftReader, pair_rows, refuse_shared, refuser, version_notes

# RewardConfig fields that change the bytes, and how the estimate follows them
MODELED = {
    "max_length": "rows beyond it are filtered out of the dataset, never truncated: the longest pair is read from "
                  "the rows that stay",
    "pad_to_multiple_of": "the 2B rows padded up to a multiple of it (read by running the trainer's collator)",
    "disable_dropout": "zeroes nn.Dropout modules (refused where the config names a dropout the replay applies)",
    "model_init_kwargs": "the dtype and attention a model given by id loads with (read from the built model)",
}
# RewardConfig fields that change no byte the kit counts, and why
NO_MEMORY = {
    "trust_remote_code": "how the model's code is loaded",
    "chat_template_path": "how the rows are rendered (their lengths are read from the tokenized dataset)",
    "dataset_num_proc": "the processes that tokenize the dataset, before training",
    "eos_token": "the token that ends each row (in the tokenized rows' lengths)",
    "center_rewards_coefficient": "a scalar times the mean square of the [2B] rewards",
    "pad_token": "deprecated: the tokenizer's pad token",
}
# RewardConfig fields refused when set: (is it set?, what it does)
REFUSED = {
    "activation_offloading": (lambda cfg: bool(cfg.activation_offloading),
                              "moves the saved activations to the CPU around each step (modeled for "
                              f"{SftReader.trainer_name} on a causal LM, not for a reward model's classifier head)"),
}


def read_reward_config(cfg, name: str = "RewardConfig"):
    """(estimate options, sources, notes) of what a RewardConfig changes; refuses in one sentence what is not
    modeled."""
    refuse = refuser(name)
    refuse_shared(cfg, refuse)
    for field, (is_set, what) in REFUSED.items():
        if is_set(cfg):
            refuse(field, what, f"reward-{field.replace('_', '-')}")
    if getattr(cfg, "use_liger_kernel", False):
        refuse("use_liger_kernel", "swaps Liger's kernels into a reward model's forward", "trl-liger")
    src = {k: (getattr(cfg, k), f"{name}.{k}: {why}") for k, why in MODELED.items()}
    src.update({k: (getattr(cfg, k), f"{name}.{k}: {why} (no memory of its own)") for k, why in NO_MEMORY.items()})
    return {}, src, version_notes("RewardTrainer")


def refuse_other_head(opts: dict) -> None:
    """A reward model is a sequence classifier with one label (TRL refuses a built one with another count)."""
    if (opts.get("task"), opts.get("num_labels")) != ("seq-cls", 1):
        raise InputError("task", f"RewardTrainer's model is a {opts.get('task', 'causal-lm')} model with "
                         f"{opts.get('num_labels', 'no')} labels; the kit models a reward model as TRL builds "
                         "one: AutoModelForSequenceClassification with num_labels=1.", code="reward-head")


def read_pairs(trainer, B: int):
    """(S, padded, where) of the longest batch DataCollatorForPreference builds: the B pairs whose longer row is the
    longest, 2B rows right-padded to the longest."""
    import torch

    ds = trainer.train_dataset
    n = len(ds) if ds is not None else 0
    if not n:
        raise InputError("seq_len", "trainer.train_dataset is empty: pass seq_len=....")
    chosen, rejected = ds["chosen_ids"], ds["rejected_ids"]
    longest = [max(len(c), len(r)) for c, r in zip(chosen, rejected)]
    top = sorted(range(n), key=lambda i: -longest[i])[:B]
    rows = [{"chosen_ids": chosen[i], "rejected_ids": rejected[i]} for i in top]
    mask = torch.as_tensor(trainer.data_collator(rows)["attention_mask"])
    return int(mask.shape[1]), bool((mask == 0).any()), \
        f"DataCollatorForPreference on the {B} longest pairs: {2 * B} rows (chosen, then rejected), padded to the " \
        "longest"


class RewardReader(TrainerReader):
    """RewardTrainer and RewardConfig (the module doc): 2B rows through a one-label classifier."""

    trainer_name, config_name = "RewardTrainer", "RewardConfig"
    trl = True
    pairs = None   # B, the pairs a step

    def read_trainer(self, trainer) -> None:
        self.own.take(*read_reward_config(trainer.args))
        refuse_dropout(trainer.args, trainer.model.config, self.config_name)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        """2B rows (chosen, then rejected) through a one-label classifier."""
        reading.take(src=self.own.src, notes=self.own.notes)
        refuse_other_head(reading.opts)
        self.pairs = pair_rows(reading.opts, reading.src, self.config_name)   # the chosen and rejected rows

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        if seq_len is not None:
            return super().rows(trainer, reading, seq_len)
        seq_len, padded, where = read_pairs(trainer, self.pairs)
        reading.src["seq_len"], reading.src["padded"] = (seq_len, where), (padded, where)
        return seq_len, padded


trainer_kinds.register_kind("reward", trainer_kinds.library_classes("trl", "RewardTrainer", "RewardConfig"))
trainer_kinds.register_part("reward", "estimate", RewardReader)
