"""Scenario 1's user's code, as they posted it: their model class, their ``tokenize_func``, their
``TrainingArguments`` and ``Trainer``. The kit is called around it (``kit.check(trainer)``,
``kit.train(trainer)``), never in its place.

Every line is theirs except where today's libraries renamed or refuse something, and where a short workshop
run needs fewer steps; each such line ends with a comment ``# ADAPTED: why``. The renames:

- ``load_dataset("wikitext", ...)`` now lives at ``"Salesforce/wikitext"``: the caller passes the dataset in
  (:func:`kit.data.load_text_dataset`, the shipped sample offline).
- ``model_name`` is ``"distilgpt2"`` where the Hub serves it; offline it is the folder of the architecture twin
  (:func:`kit.models.pretrained_source`), and the tokenizer the shipped one (:func:`kit.data.load_tokenizer`).
- ``logging_dir`` is refused by transformers 5 (a ``TypeError``): dropped (logs go under ``output_dir``).
- ``fp16=True`` stays; on a CPU the Trainer trains in fp32 (:func:`kit.dtypes.run_precision`).
- ``save_strategy="no"``: the Trainer saves a bare ``nn.Module`` with ``safetensors``, which refuses GPT-2's tied
  embedding and LM-head weights, so the end-of-training checkpoint would fail after the run.

The class and ``tokenize_func`` read module-level ``model_name`` and ``tokenizer``, as the user's script did;
:func:`user_trainer` sets them, then runs the user's lines.

>>> import inspect
>>> "self.custom_layer = nn.Linear(self.gpt2.config.vocab_size" in inspect.getsource(Custom_GPT2_Model)
True
"""
from __future__ import annotations

import dataclasses

import torch.nn as nn
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

model_name = "distilgpt2"  # the user's; user_trainer(model_name=...) sets it (offline: the twin's folder)
tokenizer = None           # the user's module-level tokenizer; user_trainer(tokenizer=...) sets it


class Custom_GPT2_Model(nn.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.gpt2 = AutoModelForCausalLM.from_pretrained(model_name)
        self.gpt2.resize_token_embeddings(len(tokenizer))
        for param in self.gpt2.parameters():
            param.requires_grad = False
        self.gpt2.gradient_checkpointing_enable()
        self.custom_layer = nn.Linear(self.gpt2.config.vocab_size, self.gpt2.config.vocab_size)

    def forward(self, input_ids, attention_mask=None, labels=None):
        outputs = self.gpt2(input_ids=input_ids, attention_mask=attention_mask)
        logits = self.custom_layer(outputs.logits)
        loss = None
        if labels is not None:
            loss_func = nn.CrossEntropyLoss()
            # loss = loss_func(logits, labels)
            loss = loss_func(logits.view(-1, logits.size(-1)), labels.view(-1))
        return {'loss': loss, 'logits': logits}


def tokenize_func(examples):
    return tokenizer(examples['text'], padding='max_length', truncation=True, max_length=128, return_tensors='pt')


def user_training_args(**workshop):
    """The user's ``TrainingArguments``, then ``workshop``'s keywords for a short run (``max_steps``,
    ``gradient_accumulation_steps``, ``output_dir``, ``report_to``...) put over them: each said by the caller."""
    training_args = TrainingArguments(
        output_dir='./results',
        num_train_epochs=0.5,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=16,
        fp16=True,  # kept: on a CPU the Trainer ignores it and trains in fp32 (kit.dtypes.run_precision)
        warmup_steps=2500,
        learning_rate=0.1,
        weight_decay=0.01,
        # logging_dir='./logs',  # ADAPTED: transformers 5 refuses logging_dir (TypeError); logs go to output_dir
        logging_steps=5000,
        save_strategy="no",  # ADAPTED: safetensors refuses the bare nn.Module's tied GPT-2 weights at the end save
    )
    return dataclasses.replace(training_args, **workshop)  # ADAPTED: the workshop's short run (none: theirs)


def user_trainer(model_name, tokenizer, dataset, **workshop):
    """The user's script from ``tokenizer.add_special_tokens`` to ``Trainer(...)``: returns the Trainer, untrained.

    ``model_name``: ``"distilgpt2"`` or the folder :func:`kit.models.pretrained_source` gives; ``tokenizer``: theirs
    (or :func:`kit.data.load_tokenizer`'s); ``dataset``: wikitext-2's ``DatasetDict`` (or the shipped sample).
    ``workshop``: :func:`user_training_args`' overrides (``max_steps=2`` for a short run)."""
    globals().update(model_name=model_name, tokenizer=tokenizer)  # the user's module-level names
    tokenizer.add_special_tokens({'pad_token': '[PAD]'})
    model = Custom_GPT2_Model(tokenizer)
    tokenized_dataset = dataset.map(tokenize_func, batched=True, remove_columns=['text'])
    training_args = user_training_args(**workshop)
    return Trainer(
        model = model,
        args = training_args,
        train_dataset = tokenized_dataset['train'].select(range(100)),
        eval_dataset = tokenized_dataset['test'].select(range(100)),
        data_collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
    )
