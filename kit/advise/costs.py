"""What each of the fit advisor's moves (:data:`kit.advise.search.MOVES`) costs, in words: the cost column of
its table. Each figure in them is an estimate's, or says it is a rule of thumb.
"""
from __future__ import annotations

import importlib.util

from kit.inputs import ALL_LINEAR

from kit.advise import levers
from kit.estimate.reserved import HOW_TO
from kit.estimate.trl import SftReader
from kit.units import fmt_bytes

LORA_R = 16              # the rank of a suggested LoRA (an outsized layer gets more: kit.advise.search's _head)


def trains_weights(setup) -> bool:  # weights are trained in the loaded dtype (full fine-tuning, scenario 1's head)
    return not setup["lora_r"]


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found, not imported: the advisor stays light)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):   # a broken or half-removed install: not usable
        return False


def needs(package: str, pip_name: str | None = None) -> str:
    """The words a cost adds for a package: nothing where it is installed here, else how to install it.

    >>> needs("importlib"), needs("no_such_package_kit", "no-such")
    ('', '; needs `pip install no-such` (not installed here)')
    """
    return "" if installed(package) else f"; needs `pip install {pip_name or package}` (not installed here)"


def cost(move, base, setup, base_est, est) -> str:
    """What ``move`` costs, taking the options ``base`` (estimate ``base_est``) to ``setup`` (estimate ``est``)."""
    f, bnb = fmt_bytes, needs("bitsandbytes")
    liger = "" if installed("liger_kernel") else " and `pip install liger-kernel` (not installed here)"
    frozen = bool(setup["lora_r"]) or not base_est.context.trainable["block"]   # the blocks' weights get no grads
    weights = f"weights {f(base_est.weights_bytes)} -> {f(est.weights_bytes)}"
    trained = f"{est.trainable_params:,} trainable parameters instead of {base_est.trainable_params:,}"
    lora = (f"; a rank-{LORA_R} LoRA on every linear layer trains, not the weights"
            if setup["lora_targets"] == ALL_LINEAR and not base["lora_r"] else "") + (
        f"; the other weights load in {setup['load_dtype']}" if setup["load_dtype"] != base["load_dtype"] else "")
    evals = ([f"eval batches of {setup['eval_batch_size']} instead of {base['eval_batch_size']}"]
             if setup["eval_batch_size"] != base["eval_batch_size"] else []) + (
        [f"gathered predictions moved to the CPU every {setup['eval_accumulation_steps']} eval step"]
        if setup["eval_accumulation_steps"] != base["eval_accumulation_steps"] else [])
    fused_head = setup.get('fused_lm_head')
    flce = ", and a fused linear cross-entropy that never builds the (batch, seq, vocab) logits"
    words = {
        "expandable": lambda: (f"none: the same tensors and speed; the allocator grows one segment page by page, so a "
                               f"freed block serves a request of another size: reserved "
                               f"{f(base_est.reserved_bytes)} -> {f(est.reserved_bytes)} (modelled, not measured); "
                               f"{HOW_TO}"),
        "liger": lambda: (f"none in the math: Liger's Triton kernels (RMSNorm, SwiGLU, "
                          f"RoPE{'' if fused_head else flce}); "
                          f"needs a CUDA GPU{liger}; TrainingArguments(use_liger_kernel=True); "
                          "estimated from Liger 0.8.2's source, not yet measured on a GPU"),
        "fused": lambda: "none: the same AdamW update in one fused kernel (optim='adamw_torch_fused'), no temporaries",
        "sdpa": lambda: "none: the same attention through torch's sdpa, without the S x S scores",
        "split": lambda: f"effective batch unchanged ({base['batch_size'] * base['grad_accum']}); "
                         f"{setup['grad_accum']} micro-batches of {setup['batch_size']} per optimizer step instead of "
                         f"{base['grad_accum']} of {base['batch_size']}: slower where the bigger batch kept the GPU "
                         "busy",
        "eval": lambda: "evaluation only: " + "; ".join(evals) + " (slower, same metrics)",
        "ckpt-half": lambda: ("slower, by a rule of thumb (not measured): every other block runs its forward again in "
                              "the backward, about half of full checkpointing's extra time; the others keep what "
                              "they save (activation_checkpointing_kwargs={'every_n_layers': 2})"),
        "ckpt-offload": lambda: (f"slower (not measured): each checkpointed block's input is copied to pinned RAM in "
                                 f"the forward and back in the backward, on the compute stream; "
                                 f"{f(est.offloaded_bytes)} of pinned RAM (activation_checkpointing_kwargs="
                                 "{'offload': True})"
                                 + ("" if base["gradient_checkpointing"] else "; with checkpointing on")),
        "trl-offload": lambda: (f"slower (not measured): TRL copies what checkpointing keeps to pinned RAM on a side "
                                f"stream and back for the backward; {f(est.offloaded_bytes)} of pinned RAM "
                                f"({SftReader.config_name}(activation_offloading=True))"
                                + ("" if base["gradient_checkpointing"] else "; with checkpointing on")),
        "ckpt": lambda: ("slower, by a rule of thumb (not measured): the blocks' forward runs again in the backward; "
                         + ("with the blocks frozen their backward makes no weight grads, about one forward, so a step "
                            "goes from about 2 forward-costs to 3 (+50%)" if frozen else
                            "a backward costs about two forwards, so a step goes from about 3 forward-costs to 4 "
                            "(+33%)")),
        "mixed": lambda: f"numerics: {setup['precision']} autocast (fp32 master weights kept"
                         f"{', loss scaling' if setup['precision'] == 'fp16' else ''}); usually faster on a GPU",
        "adam8": lambda: f"numerics: AdamW state in 8 bits, block-wise; optimizer state "
                         f"{f(base_est.optimizer_bytes)} -> {f(est.optimizer_bytes)}{bnb}",
        "paged-adam": lambda: (f"same numerics (AdamW's state in fp32, bitsandbytes' PagedAdamW32bit): "
                               f"{f(est.paged_optimizer_bytes)} of it in CUDA managed memory, outside this peak, paged "
                               "to RAM when the GPU runs short (slower then, by how much is not measured)" + bnb),
        "paged-adam8": lambda: f"numerics: AdamW state in 8 bits, block-wise, {f(est.paged_optimizer_bytes)} of it in "
                               "CUDA managed memory, outside this peak: paged to RAM under pressure (slower then)"
                               + bnb,
        "lean": lambda: f"numerics: the non-quantized weights stay in {setup['load_dtype']}, not upcast to fp32 (no "
                        "prepare_model_for_kbit_training: turn on checkpointing and input grads yourself)",
        "w16": lambda: (f"numerics: the trained weights, their gradients and AdamW state in bf16, no fp32 master copy "
                        f"(small updates round away); {weights}") if trains_weights(setup) else
                       f"numerics: the frozen weights in {setup['load_dtype']}; {weights}",
        "seq": lambda: f"changes what the model sees: sequences cut from {base['seq_len']} to {setup['seq_len']} "
                       "tokens (truncate or chunk longer texts)",
        "lora": lambda: f"changes what is trained: a rank-{setup['lora_r']} LoRA on peft's default targets, {trained}",
        "lora-all": lambda: f"changes what is trained: a rank-{setup['lora_r']} LoRA on every linear layer, {trained}",
        "padding-free": lambda: levers.cost(base, setup),
        "head-lora": lambda: f"changes the model: {setup['lora_targets'][0]}'s weight is frozen and a "
                             f"rank-{setup['lora_r']} "
                             f"update trains ({trained}); zero the frozen weight first and the layer is a low-rank map "
                             "(scenario 1's fix (b)), whose frozen weight still costs its bytes",
        "8bit": lambda: f"changes the model: base weights in 8 bits (LLM.int8){lora}{bnb}",
        "4bit": lambda: f"changes the model: base weights in NF4 4-bit{lora}{bnb}",
    }
    return words[move]()
