"""TRL's ``DPOTrainer`` and ``DPOConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/dpo_trainer.py``).

What one DPOTrainer step does, and how each part is estimated:

- ``DataCollatorForPreference.torch_call`` builds ONE batch of ``2B`` rows, the ``B`` prompt+chosen rows then the
  ``B`` prompt+rejected rows, each truncated to ``max_length`` and all right-padded to the longest of the ``2B``
  (``input_ids``, ``attention_mask``, ``completion_mask``: ``[2B, S]`` int64); there is no separate
  ``concatenated_forward`` in 1.16, the collator concatenates (modeled: the policy replay at batch ``2B``, length
  ``S``, a mask where rows differ);
- ``_compute_loss`` runs the policy forward with grad through TRL's fused LM head (``add_fused_lm_head`` with
  ``outputs=("log_probs", "entropy", "mean_logits", "is_top1")``, plus ``"log_sum_sq_probs"`` under
  ``use_weighting``): log-probs in tiles, never the ``(2B, S, V)`` logits (modeled:
  :mod:`kit.estimate.replay.fused_head`, as for SFTTrainer);
- then, unless ``precompute_ref_log_probs``, the reference forward under ``torch.no_grad()`` (and
  ``disable_gradient_checkpointing``), while the policy's saved activations are held: ``self.ref_model`` (a
  separate model, its weights held for the whole run) or, for a PEFT policy with no ``ref_model``, the policy
  itself inside ``use_adapter(model, None)`` (the adapter disabled: no weights of its own). The reference's fused
  head has the default ``outputs=("log_probs",)``. Modeled as its own moment (:func:`reference_moment`): the
  policy's saved tensors and outputs, ``labels`` (``masked_fill``, ``[2B, S]`` int64), the reference head's
  no-grad forward (the ``[min(N, 4096), 32768]`` tile and its fold), or a block's (at most what one block saves
  in training: an upper bound, as :mod:`kit.estimate.evaluation` counts it);
- the loss (every ``loss_type``) works on ``(B,)`` sequence log-probs: nothing per vocabulary entry;
- ``precompute_ref_log_probs=True``: ``_precompute_ref_logps`` runs in ``DPOTrainer.__init__``, before any
  optimizer state, over batches of ``precompute_ref_batch_size`` (else ``per_device_train_batch_size``) pairs,
  with ``ref_model or model`` (the policy itself, before training); then training has no reference forward and,
  with no ``ref_model`` given, no reference weights. Modeled as its own phase (:func:`precompute_peak`).
"""
from __future__ import annotations

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate.inventory import info_of
from kit.estimate.replay import BOOL, F32, FP32, I64, dtype, lookup
from kit.estimate.replay.fused_head import TOKEN_CHUNK, VOCAB_CHUNK, chunked_head
from kit.estimate.trainer_reader import Given, Reading, TrainerReader
from kit.estimate.trl import (SftReader, max_length_bound, model_init, pair_rows, quantized_recipe, refuse_shared,
                              refuser, version_notes)

# DPOConfig fields that change no byte the kit counts, and why (sources say so)
_NO_MEMORY = {
    "beta": "a scalar of the loss", "label_smoothing": "a scalar of the robust/EXO/AOT losses",
    "f_divergence_type": "maps (B,) log-ratios", "f_alpha_divergence_coef": "a scalar of the alpha-divergence",
    "discopop_tau": "a scalar of the DiscoPOP loss", "loss_weights": "scalars that weight the losses",
    "truncation_mode": "which tokens are kept, not how many", "ref_model_mixup_alpha": "a scalar of the sync",
    "ref_model_sync_steps": "when the sync runs",
}


def reference_of(trainer=None, cfg=None, peft: bool = False, names=("DPOTrainer", "DPOConfig")):
    """(kind, reference model or None, where): "model" (a separate model, held), "adapter-disabled" (the PEFT
    policy with its adapter off: no weights of its own) or "precomputed" (no reference in training). ``names``: the
    trainer's and its config's classes (another kind whose reference is DPOTrainer's)."""
    trainer_name, config_name = names
    if trainer is not None:
        ref, cfg = trainer.ref_model, trainer.args
        peft = hasattr(trainer.model, "peft_config")
        if peft and "ref" in trainer.model.peft_config:
            raise InputError("ref_model", f"{trainer_name} loaded a second adapter named 'ref' (a PeftModel with a "
                             "pretrained adapter), which the kit does not model: pass the base model and a "
                             "peft_config.", code="trl-ref-adapter")
        if ref is not None:
            return "model", ref, f"{trainer_name}.ref_model (held for the whole run" + \
                (", though the log-probs are precomputed)" if cfg.precompute_ref_log_probs else ")")
    if cfg.precompute_ref_log_probs:
        return "precomputed", None, f"{config_name}.precompute_ref_log_probs: read from the batch, no reference forward"
    if peft:
        return "adapter-disabled", None, f"{trainer_name}: the PEFT policy inside use_adapter(model, None), no weights"
    return "model", None, f"{trainer_name}.__init__: create_model_from_path of the policy's id, same dtype (a copy)"


def refuse_unmodeled(cfg, name: str = "DPOConfig", trainer_name: str = "DPOTrainer", kind: str = "dpo") -> None:
    """Refuse, in one sentence naming the field, what a trainer with DPOTrainer's reference forward does not model
    (``name``: its config's class; ``kind``: the key in the refusal's code)."""
    refuse = refuser(name)
    refuse_shared(cfg, refuse)
    if getattr(cfg, "use_liger_kernel", False):
        refuse("use_liger_kernel", "swaps Liger's kernels into the policy's and the no-grad reference's forwards "
               f"(modeled for Trainer and {SftReader.trainer_name}, not for {trainer_name}'s reference and "
               "precompute phases)",
               "trl-liger")
    if cfg.activation_offloading:
        refuse("activation_offloading", "moves the saved activations to the CPU", "trl-offloading")
    kw = getattr(cfg, "activation_checkpointing_kwargs", None) or getattr(cfg, "gradient_checkpointing_kwargs", None)
    if isinstance(kw, dict) and (kw.get("every_n_layers", 1) != 1 or kw.get("offload")):
        refuse("activation_checkpointing_kwargs", "checkpoints only some blocks or offloads them (every_n_layers / "
               "offload), with a reference forward beside the policy's", f"trl-{kind}-offload")
    if cfg.router_aux_loss_coef:
        refuse("router_aux_loss_coef", "adds a Mixture-of-Experts load-balancing loss (router logits)", "trl-moe")
    if getattr(cfg, "torch_compile", False):
        refuse("torch_compile", "compiles the model, whose fused kernels save other tensors", "trl-compile")


def read_dpo_config(cfg, name: str = "DPOConfig"):
    """(estimate options, sources, notes) of what a DPOConfig changes; refuses in one sentence what is not modeled."""
    refuse_unmodeled(cfg, name)
    src = {"fused_lm_head": (True, "DPOTrainer's add_fused_lm_head (log-probs in tiles, no logits)"),
           "loss_type": (list(cfg.loss_type), f"{name}.loss_type: every variant works on (B,) sequence log-probs "
                         "(sft: the chosen rows' (B, S-1) log-probs), nothing per vocabulary entry"),
           "padding_free": (False, f"{name}.padding_free" + (": TRL 1.16 warns and falls back to padding"
                                                             if cfg.padding_free else " is off")),
           "use_weighting": (cfg.use_weighting, f"{name}.use_weighting: the head also returns log_sum_sq_probs, one "
                             "fp32 per token"),
           "ld_alpha": (cfg.ld_alpha, f"{name}.ld_alpha: (2B, S-1) masks, bytes per token (not counted), nothing per "
                        "vocabulary entry"),
           "sync_ref_model": (cfg.sync_ref_model, f"{name}.sync_ref_model: SyncRefModelCallback mixes the weights in "
                              "place (mul_, add_): no bytes beyond the reference's"),
           "disable_dropout": (cfg.disable_dropout, f"{name}.disable_dropout: zeroes nn.Dropout modules")}
    src.update({k: (getattr(cfg, k), f"{name}.{k}: {why} (no memory of its own)") for k, why in _NO_MEMORY.items()})
    return {"fused_lm_head": True}, src, version_notes("DPOTrainer")


def refuse_dropout(cfg, config, name: str = "DPOConfig") -> None:
    """disable_dropout zeroes nn.Dropout modules, while the replay reads dropout from the config: refused where
    the config names a dropout the model applies with nn.Dropout (GPT-2's *_pdrop, ...)."""
    if not cfg.disable_dropout:
        return
    declared = lookup(getattr(config, "model_type", None))
    named = [k for k in (declared.dropout_modules if declared else ()) if (getattr(config, k, 0) or 0) > 0]
    if named:
        raise InputError("disable_dropout", f"{name}.disable_dropout=True zeroes the nn.Dropout modules that the "
                         f"config's {', '.join(named)} still names, which the kit does not model: estimate with "
                         "disable_dropout=False or a config without dropout.", code="trl-dropout")


def read_pairs(trainer):
    """(S, padded, where) of the longest batch DataCollatorForPreference builds: the B pairs with the longest
    prompt+completion, 2B rows right-padded to the longest (each truncated to max_length first)."""
    import torch

    ds, B = trainer.train_dataset, trainer.args.per_device_train_batch_size
    pairs = len(ds)
    if not pairs:
        raise InputError("seq_len", "trainer.train_dataset is empty: pass seq_len=....")
    cols = {name: ds[name] for name in ("prompt_ids", "chosen_ids", "rejected_ids")}
    longest = [len(prompt) + max(len(chosen), len(rejected)) for prompt, chosen, rejected in zip(*cols.values())]
    top = sorted(range(pairs), key=lambda i: -longest[i])[:B]
    rows = [{name: col[i] for name, col in cols.items()} for i in top]
    out = trainer.data_collator(rows)
    mask = torch.as_tensor(out["attention_mask"])
    return int(mask.shape[1]), bool((mask == 0).any()), \
        f"DataCollatorForPreference on the {B} longest pairs: {2 * B} rows (chosen, then rejected), " \
        "padded to the longest"


def cast_copies(info, half, load, ref_model=None) -> int:
    """Autocast's cached half copies of a model's fp32 block Linear weights that require grad, alive while
    ``compute_loss``'s autocast lasts (torch caches casts of fp32 leaves that require grad, no_grad or not)."""
    if not half or load != "fp32":
        return 0
    if ref_model is not None:   # (the fused head casts lm_head's weight with .to(): not autocast's, not cached)
        head = ref_model.get_output_embeddings()
        return sum(module.weight.numel() * half for module in ref_model.modules() if type(module).__name__ == "Linear"
                   and module is not head and module.weight.requires_grad and module.weight.dtype.itemsize == 4)
    return sum(leaf.weight * half for leaf in info.leaves if leaf.kind == "linear" and leaf.part == "block")


def head_peak(rows, S, est, V, hidden_dt, weight_dt, top1: bool = True) -> int:
    """TRL's fused head, no grad (``_fused_forward`` under ``torch.no_grad()``): the kernel's forward moment
    (:func:`chunked_head`) beside the ``reshape(-1, H)`` copy of ``[:, :-1]`` (2B x (S-1) x H) and the clamped
    targets (int64), which the autograd-free call holds as arguments. ``top1``: the head returns ``is_top1`` (the
    policy's); a separate reference's ``add_fused_lm_head(ref_model)`` asks log_probs alone, so torch's
    ``_forward_tile`` makes no ``before_target`` mask (bool, one per tile element)."""
    half = dtype(est.setup["precision"]) if est.setup["precision"] != "fp32" else None
    fh = chunked_head(B=rows, S=S, H=est.context.H, V=V, hidden_dt=hidden_dt, weight_dt=weight_dt,
                      compute_dt=half or hidden_dt, head_trainable=False, hidden_grad=False, device=est.setup["device"])
    N = rows * (S - 1)
    mask = 0 if top1 or est.setup["device"] == "cuda" else min(N, TOKEN_CHUNK) * min(V, VOCAB_CHUNK) * BOOL
    return fh["forward"] + fh["saved"] - 2 * N * F32 - mask  # (saved's log_z, entropy: made once the tiles are freed)


def fields_bytes(N: int, outputs) -> int:
    """``_fused_forward``'s returned per-token fields, each ``masked_fill`` of a ``[rows, S-1]`` view: those of
    ``outputs`` (TRL's names: fp32 each, ``is_top1`` bool) and the ``label_mask`` (bool) it always returns."""
    return N * (sum(BOOL if name == "is_top1" else F32 for name in outputs) + BOOL)


def outputs_bytes(N: int, weighting: bool, policy: bool = True) -> int:
    """DPOTrainer's head fields (:func:`fields_bytes`): log_probs, entropy, mean_logits (fp32), is_top1 (bool) for
    the policy (+ log_sum_sq_probs under use_weighting); the reference returns log_probs."""
    if not policy:
        return fields_bytes(N, ("log_probs",))
    return fields_bytes(N, ("log_probs", "entropy", "mean_logits", "is_top1") + (("log_sum_sq_probs",) if weighting
                                                                               else ()))


def reference_moment(est, *, rows, S, V, ref_weights, ref_copies, weighting, hidden_dt, weight_dt):
    """The reference forward's moment: held weights and optimizer state, the four ``[2B, S]`` int64 arrays
    (input_ids, attention_mask, completion_mask, labels), everything the policy forward saved and its autocast
    cache, its outputs, and the reference's no-grad peak (its fused head, or a block bounded by what one block
    saves in training)."""
    rp = est.context.rp
    N = rows * (S - 1)
    held = est.weights_bytes + ref_weights + est.optimizer_bytes - est.paged_optimizer_bytes + 4 * rows * S * I64
    policy = rp.saved_bytes() + rp.cache + outputs_bytes(N, weighting)
    separate = ref_weights > 0   # a separate reference model: its own fused head, log_probs alone
    head = head_peak(rows, S, est, V, hidden_dt, weight_dt, top1=not separate) + outputs_bytes(N, False, not separate)
    block = max(rp.block, rp.block_in)
    where = "reference forward (at the fused head)" if head >= block else "reference forward (a block, bounded)"
    return held + policy + ref_copies + max(head, block), where


def precompute_peak(est, *, pairs, S, V, ref_weights, copies, hidden_dt, weight_dt, batch):
    """``_precompute_ref_logps`` in ``DPOTrainer.__init__``: no optimizer state yet, no grads; one no-grad forward
    of ``2 * pairs`` rows (the policy's fused head outputs, or the reference's), beside its batch's four int64
    arrays (labels from ``masked_fill``); a block's moment scales from the training replay's (``2 * batch`` rows)."""
    rp, rows = est.context.rp, 2 * pairs
    N = rows * (S - 1)
    separate = ref_weights > 0   # ref_model or model: the reference's head (log_probs alone), else the policy's
    head = head_peak(rows, S, est, V, hidden_dt, weight_dt, top1=not separate) + outputs_bytes(N, False, not separate)
    block = max(rp.block, rp.block_in) * pairs // batch
    return est.weights_bytes + ref_weights + copies + 4 * rows * S * I64 + max(head, block)


def finish(est, info, *, kind, where, pairs, S, V, ref_weights, ref_model, precompute_pairs, precompute_model,
           weighting, precomputed) -> dict:
    """The fields of ``est`` with the reference in: its weights (held through every phase), its forward's moment in
    a step (the peak where it is the largest) or, with precomputed log-probs (``precomputed``: a separate reference
    model's too, which then runs in the precomputation only), the precomputation's own phase (``setup``).
    ``ref_model``/``precompute_model``: the real models where a Trainer was built (None: from ``info``)."""
    load, prec = est.setup["load_dtype"], est.setup["precision"]
    hidden_dt = weight_dt = dtype(load) if load in ("fp32", "bf16", "fp16") else FP32
    half = dtype(prec) if prec != "fp32" else None
    lora = bool(est.setup.get("lora_r"))
    ref_copies = cast_copies(info, half, load, ref_model) if kind == "model" else 0
    copies = 0 if lora and precompute_model is None or hasattr(precompute_model, "peft_config") else \
        cast_copies(info, half, load, precompute_model)
    opt = est.optimizer_bytes - est.paged_optimizer_bytes
    setup = dict(est.setup, reference=kind, reference_weights_bytes=ref_weights, dpo_pairs=pairs)
    notes = list(est.notes)
    if not precomputed:
        ref, moment = reference_moment(est, rows=2 * pairs, S=S, V=V, ref_weights=ref_weights, ref_copies=ref_copies,
                                       weighting=weighting, hidden_dt=hidden_dt, weight_dt=weight_dt)
        setup["reference_forward_peak_bytes"] = ref
        if moment.endswith("bounded)"):
            notes.append(Note("the reference forward's moment is set by a block, where the kit counts at most what "
                              "one block saves in training: an upper bound", field="ref_model",
                              code="dpo-ref-upper-bound"))
    else:
        pre = precompute_peak(est, pairs=precompute_pairs, S=S, V=V, ref_weights=ref_weights, copies=copies,
                              hidden_dt=hidden_dt, weight_dt=weight_dt, batch=pairs)
        setup["precompute_peak_bytes"] = pre
        notes.append(Note(f"precompute_ref_log_probs: DPOTrainer.__init__ first runs a no-grad forward over "
                          f"every pair ({precompute_pairs} pairs a batch), its own phase, whose peak is "
                          "setup['precompute_peak_bytes']", field="precompute_ref_log_probs",
                          code="dpo-precompute"))
    weights = est.weights_bytes + ref_weights   # the reference's weights, held all along
    out = dict(peak_bytes=est.peak_bytes + ref_weights, first_step_peak_bytes=est.first_step_peak_bytes + ref_weights,
               weights_bytes=weights, eval_peak_bytes=est.eval_peak_bytes + ref_weights, setup=setup, notes=notes,
               _parts={**est._parts, "weights": est._parts.get("weights", 0) + ref_weights},
               sources={**est.sources, "reference": (kind, where)})
    if not precomputed:
        out["first_step_peak_bytes"] = max(out["first_step_peak_bytes"], ref - opt)  # step 1's forward: no state yet
        if ref > out["peak_bytes"]:
            out.update(peak_bytes=ref, peak_phase="forward/backward", peak_moment=moment,
                       _parts={"weights": weights, "optimizer state": opt, "temporaries": ref - weights - opt})
    elif pre > out["peak_bytes"]:
        out.update(peak_bytes=pre, peak_phase="precomputing reference log-probs",
                   peak_moment="reference forward (precompute)",
                   _parts={"weights": weights, "temporaries": pre - weights})
    return out


def held_bytes(model) -> int:
    """Bytes of a model's unique parameter and buffer storages (the reference's weights, as loaded)."""
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def one_gpu_reference(opts: dict, notes: list, name: str, trainer_name: str = "DPOTrainer",
                      kind: str = "dpo") -> None:
    """What a trainer with a reference model reads of TrainingArguments beyond Trainer's: evaluation with
    compute_metrics (a note), and one GPU (another strategy is refused)."""
    if opts.get("eval_gather", "loss") != "loss":
        notes.append(Note(f"{trainer_name}'s evaluation with compute_metrics (return_outputs=True: a second, "
                          "full-logits forward) is not modeled: eval_peak_bytes is its fused forwards' alone",
                          field="eval_batch_size", code="trl-eval-unmodeled"))
    if opts.get("strategy", "single") != "single":
        raise InputError("strategy", f"{name} under {opts['strategy']} (the reference model prepared by "
                         f"DeepSpeed or FSDP) is not modeled: the kit estimates {trainer_name} on one GPU.",
                         code=f"{kind}-strategy")


def pairs_options(opts: dict, src: dict, notes: list, name: str) -> int:
    """Make the options DPO's: 2B rows a step (and 2 x per_device_eval_batch_size in evaluation); returns B."""
    one_gpu_reference(opts, notes, name)
    return pair_rows(opts, src, name)


def trainer_reference(trainer, B: int, seq_len=None):
    """(sequence options, sources, finish keywords) of a built DPOTrainer: its longest pair batch and its
    reference model, for :func:`finish`."""
    kind, ref, where = reference_of(trainer)
    if seq_len is None:
        S, padded, at = read_pairs(trainer)
    else:
        S, padded, at = seq_len, True, "estimate_trainer(seq_len=...): the concatenated rows' padded length"
    args = trainer.args
    runs = ref if ref is not None else trainer.model   # the model _precompute_ref_logps runs
    finishing = dict(kind=kind, where=where, pairs=B, S=S, V=trainer.model.config.get_text_config().vocab_size,
                     ref_weights=held_bytes(ref) if ref is not None else 0, ref_model=ref,
                     precompute_pairs=args.precompute_ref_batch_size or B, precompute_model=runs,
                     weighting=args.use_weighting, precomputed=args.precompute_ref_log_probs)
    return {"seq_len": S, "padded": padded}, {"seq_len": (S, at), "padded": (padded, "rows of different lengths "
                                              "(chosen/rejected) in the batch" if padded else "no padding")}, finishing


class DpoReader(TrainerReader):
    """DPOTrainer and DPOConfig (the module doc): 2B rows a step, the reference model and its phases."""

    trainer_name, config_name, config_keyword = "DPOTrainer", "DPOConfig", "dpo_config"
    trl = True
    lean_kbit, reads_eval_rows = True, False
    pairs = finishing = None   # B (the pairs a step); finish()'s keywords
    peft = False               # estimate_from was given a peft_config

    def read_trainer(self, trainer) -> None:
        self.own.take(*read_dpo_config(trainer.args))
        refuse_dropout(trainer.args, trainer.model.config)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        reading.take(self.own.opts, self.own.src, self.own.notes)
        self.pairs = pairs_options(reading.opts, reading.src, reading.notes, self.config_name)

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        """2B rows padded to the longest pair, and the reference model."""
        options, sources, self.finishing = trainer_reference(trainer, self.pairs, seq_len)
        reading.src.update(sources)
        return options["seq_len"], options["padded"]

    def compose(self, draft, trainer, reading: Reading) -> dict:
        opts = reading.opts
        return finish(draft, info_of(reading.target, opts.get("task", "causal-lm"), opts.get("num_labels", 2)),
                      **self.finishing)

    def read_config(self, cfg, given: Given) -> None:
        self.own.take(*read_dpo_config(cfg))
        model_init(cfg, self.config_name, given)
        max_length_bound(cfg, given, "DPOConfig.max_length: each prompt+completion row is truncated to it (padded up "
                         "to pad_to_multiple_of), so it is the longest a row can be")  # (an upper bound)
        self.peft = given.peft_config is not None

    def after_args(self, reading: Reading, name: str) -> None:
        self.pairs = pairs_options(reading.opts, reading.src, reading.notes, name)

    def finish_options(self, reading: Reading, cfg, config, seq_len, padded) -> tuple:
        quantized_recipe(reading.opts, reading.src, self.trainer_name)
        reading.take(self.own.opts, self.own.src, self.own.notes)
        refuse_dropout(cfg, config)
        kind, _, where = reference_of(cfg=cfg, peft=self.peft)
        self.finishing = dict(kind=kind, where=where, pairs=self.pairs, S=seq_len, ref_model=None,
                              precompute_pairs=cfg.precompute_ref_batch_size or self.pairs, precompute_model=None,
                              weighting=cfg.use_weighting, precomputed=cfg.precompute_ref_log_probs)
        return seq_len, padded

    def compose_from(self, draft, cfg, info, config) -> dict:
        # the reference: a copy as loaded, the adapter-disabled policy, or precomputed log-probs
        kind = self.finishing["kind"]
        return finish(draft, info, V=config.get_text_config().vocab_size, **self.finishing,
                      ref_weights=draft.loaded_weights_bytes if kind == "model" else 0)


trainer_kinds.register_kind("dpo", trainer_kinds.library_classes("trl", "DPOTrainer", "DPOConfig"))
trainer_kinds.register_part("dpo", "estimate", DpoReader)
