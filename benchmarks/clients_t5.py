"""Flan-T5 fine-tuned with transformers' ``Seq2SeqTrainer`` (issue 48): the tiny twin, built from
``kit/configs/tiny-flan-t5.json`` and saved, loaded with ``AutoModelForSeq2SeqLM.from_pretrained`` as the
Hub model would be; rows of ``SOURCE`` source tokens and ``TARGET`` target tokens (a summarisation's shape: the
target shorter), collated by ``DataCollatorForSeq2Seq(tokenizer, model=model)`` (labels padded with -100,
``decoder_input_ids`` made from them); full fine-tuning, or LoRA on q and v; fp32 on the CPU."""
from __future__ import annotations

import os

import torch

SOURCE, TARGET, ROWS = 48, 24, 16
# the rows of benchmarks/real_clients.py: (kind, evaluate() generates, the twin's vocabulary cut to)
ROWS_RUN = (("full-eval", False, None), ("lora-eval", False, None), ("full-pad-eval", False, None),
            ("full-eval", True, None), ("lora-eval", True, None), ("full-eval", False, 256), ("lora-eval", False, 256))


def rows(n=ROWS, source=SOURCE, target=TARGET, vocab=4096, padded=False):
    """Token rows, ``input_ids`` ending in EOS (1), ``labels`` too: sources of ``source`` tokens (``padded``: every
    fourth row that long, the others 6, 12, 18 shorter, so each batch pads), targets of ``target``."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        length = source - (i % 4) * (source // 8) if padded else source
        src = torch.randint(2, vocab, (length - 1,), generator=gen).tolist() + [1]
        tgt = torch.randint(2, vocab, (target - 1,), generator=gen).tolist() + [1]
        out.append({"input_ids": src, "attention_mask": [1] * length, "labels": tgt})
    return out


def trainer_of(work, kind, *, batch=4, steps=3, generate=False, vocab=None):
    """A Seq2SeqTrainer on the tiny twin: ``kind`` "full" or "lora" (q, v); an eval set of 8 rows where the kind
    ends in "-eval" (with ``predict_with_generate`` and ``generation_max_length`` 12 where ``generate``); ``vocab``:
    the twin's vocabulary made smaller (so that the blocks, not the logits, set the peak)."""
    from peft import LoraConfig, get_peft_model
    from real_clients import tokenizer, twin_dir
    from transformers import AutoModelForSeq2SeqLM, DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_pretrained(twin_dir("tiny-flan-t5", work, **(
        {"vocab_size": vocab} if vocab else {})))
    if kind.startswith("lora"):
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q", "v"], lora_dropout=0.05,
                                                 task_type="SEQ_2_SEQ_LM"))
    tok = tokenizer()
    evaluating = kind.endswith("eval")
    args = Seq2SeqTrainingArguments(output_dir=os.path.join(work, f"t5-{kind}"), use_cpu=True, report_to="none",
                                    max_steps=steps, per_device_train_batch_size=batch,
                                    per_device_eval_batch_size=batch, save_strategy="no", logging_strategy="no",
                                    disable_tqdm=True,
                                    predict_with_generate=generate, generation_max_length=12 if generate else None)
    padded = "pad" in kind
    vocab = vocab or model.config.vocab_size
    return Seq2SeqTrainer(model=model, args=args, train_dataset=rows(padded=padded, vocab=vocab),
                          eval_dataset=rows(8, padded=padded, vocab=vocab) if evaluating else None,
                          data_collator=DataCollatorForSeq2Seq(tok, model=model), processing_class=tok,
                          compute_metrics=exact_match if generate else None)


def exact_match(prediction) -> dict:
    """The share of generated rows equal to their labels (a metric makes evaluate() generate: without one,
    Seq2SeqTrainer's evaluation computes the loss alone)."""
    preds, labels = prediction.predictions, prediction.label_ids
    width = min(preds.shape[1], labels.shape[1])
    return {"exact_match": float((preds[:, :width] == labels[:, :width]).all(axis=1).mean())}


def client_t5(work, kind, generate=False, vocab=None):
    from kit.estimate import estimate_trainer

    trainer = trainer_of(work, kind, generate=generate, vocab=vocab)
    how = "LoRA r8 on q, v (dropout 0.05)" if kind.startswith("lora") else "full FT"
    twin = f"tiny-flan-t5{f' vocab {vocab}' if vocab else ''}"
    setup = (f"{twin}, {how}, Seq2SeqTrainer fp32, B4 x source {SOURCE} / target {TARGET}"
             + (" (sources padded)" if "pad" in kind else "")
             + (", eval B4 x 8 rows" if kind.endswith("eval") else "") + (" with generation" if generate else ""))
    label = f"Seq2SeqTrainer {kind}{' generate' if generate else ''}{f' vocab {vocab}' if vocab else ''}"
    yield label, setup, trainer, lambda: estimate_trainer(trainer, device="cpu")
