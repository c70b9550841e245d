"""Scenario 1's model as the kit builds it: a DistilGPT2 with a trainable ``Linear(V, V)`` head on its logits
(the registry's ``distilgpt2+vocab-head``), a foundation beside :mod:`kit.models`. :func:`kit.models.build_model`
and :func:`kit.models.load_model` wrap a base with it; the user's own class, which it mirrors, is
``kit.scenarios.custom_head.user_code``.
"""
from __future__ import annotations

import torch.nn as nn


class VocabHeadModel(nn.Module):
    """Scenario 1's model, as the user wrote it: a frozen GPT-2 LM with a pad token added and
    gradient checkpointing, under a trainable ``nn.Linear(V, V)`` head (``V = vocab_size``,
    default the base's + 1). For distilgpt2, V = 50258: the head alone has 2,525,916,822 params.

    >>> from kit.models import build_model
    >>> VocabHeadModel(build_model("distilgpt2", device="meta")).custom_layer.in_features
    50258
    """

    # Like the user's model: Trainer divides the loss by the accumulation steps itself.
    accepts_loss_kwargs = False

    def __init__(self, gpt2: nn.Module, vocab_size: int | None = None):
        super().__init__()
        self.gpt2 = gpt2
        # The user's tokenizer.add_special_tokens({'pad_token': '[PAD]'}) then resize.
        # On meta, skip the mean-of-old-rows init of the new row: it reads values (.item()).
        on_meta = gpt2.get_input_embeddings().weight.is_meta
        self.gpt2.resize_token_embeddings(vocab_size or gpt2.config.vocab_size + 1,
                                          **({"mean_resizing": False} if on_meta else {}))
        for param in self.gpt2.parameters():
            param.requires_grad = False
        self.gradient_checkpointing_enable()
        v = self.gpt2.config.vocab_size
        w = self.gpt2.get_input_embeddings().weight
        self.custom_layer = nn.Linear(v, v, device=w.device, dtype=w.dtype)
        self.config = self.gpt2.config
        tied = self.gpt2.get_output_embeddings().weight is self.gpt2.get_input_embeddings().weight
        self._keys_to_ignore_on_save = ["gpt2.lm_head.weight"] if tied else None

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        """Checkpoint the base's layers (what Trainer calls for ``gradient_checkpointing=True``)."""
        kw = activation_checkpointing_kwargs
        if hasattr(self.gpt2, "activation_checkpointing_enable"):  # transformers >= 5.2x
            self.gpt2.activation_checkpointing_enable(activation_checkpointing_kwargs=kw, **kwargs)
        else:
            self.gpt2.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)   # transformers 4.x's name

    def state_dict(self, *args, **kwargs):
        """The usual state dict, less the GPT-2 LM head's weight when tied to the embeddings: Trainer saves a plain
        ``nn.Module`` with ``safetensors.save_file``, which refuses shared tensors; it reloads with ``strict=False``,
        sees the key in ``_keys_to_ignore_on_save`` and calls :meth:`tie_weights`."""
        sd = super().state_dict(*args, **kwargs)
        for key in [k for k in sd if any(k.endswith(i) for i in self._keys_to_ignore_on_save or ())]:
            del sd[key]
        return sd

    def tie_weights(self):
        self.gpt2.tie_weights()   # re-ties the base's LM head to its embeddings (Trainer, after loading a checkpoint)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        outputs = self.gpt2(input_ids=input_ids, attention_mask=attention_mask)
        logits = self.custom_layer(outputs.logits)
        loss = None
        if labels is not None:   # the user's loss, unshifted, kept as written: memory is what we study here
            loss = nn.CrossEntropyLoss()(logits.view(-1, logits.size(-1)), labels.view(-1))
        return {"loss": loss, "logits": logits}
