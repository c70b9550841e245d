"""TRL's ``KTOTrainer`` and ``KTOConfig`` for the estimator (the behaviour of TRL 1.16, read from
``trl/trainer/kto_trainer.py`` and ``kto_config.py``).

What one KTOTrainer step does, and how each part is estimated:

- ``_prepare_dataset`` unpairs paired rows, tokenizes ``prompt_ids`` and ``completion_ids`` and, unless
  ``loss_type="apo_zero_unpaired"``, adds ``KL_completion_ids``: the completions rotated by one inside each batch of
  ``per_device_train_batch_size`` rows, read in that order (``train_sampling_strategy="sequential"``, which TRL
  requires for the KL term). ``DataCollatorForUnpairedPreference`` makes ``B`` rows, each prompt+completion
  truncated to ``max_length`` and right-padded to the batch's longest (``input_ids``, ``attention_mask``,
  ``completion_mask``: ``[B, S]`` int64), the same three ``[B, K]`` for the KL rows, and ``label`` (``[B]`` bool)
  (modeled: the policy replay at batch ``B``, length ``S``; ``K`` read from the KL rows the collator builds);
- ``_compute_loss`` first runs the policy on the KL rows under ``torch.no_grad()`` (``_compute_kl_logps``: the KL
  labels, ``[B, K]`` int64, beside the batch), before anything is saved for backward (modeled: its own moment, the
  policy's fused head at ``B x K``, or a block's, bounded by what one block saves in training);
- then the policy forward with grad on the ``B`` rows, through TRL's fused LM head (``add_fused_lm_head`` with
  ``outputs=("log_probs", "entropy", "mean_logits")``: no ``is_top1``), never the ``(B, S, V)`` logits (modeled:
  the replay with :mod:`kit.estimate.replay.fused_head`, as for DPOTrainer);
- then, unless ``precompute_ref_log_probs``, the reference under ``torch.no_grad()`` (and
  ``disable_gradient_checkpointing``), on the KL rows and then on the rows, while the policy's saved activations,
  its outputs and the ``[B, S]`` completion labels are held: a separate ``ref_model`` (its weights held for the whole
  run; TRL loads a copy of the policy's id when none is given, and its fused head returns log-probs alone) or, for a
  PEFT policy, the policy itself with its adapter disabled (its own fused head: entropy and mean logits too). Modeled
  as one moment (the larger of the two forwards), with DPOTrainer's pieces (:mod:`kit.estimate.dpo`);
- the loss works on ``[B]`` sequence log-probs: nothing per vocabulary entry;
- ``evaluate()`` runs the same four forwards under ``torch.no_grad()`` at ``per_device_eval_batch_size`` rows
  (modeled: the largest of those moments, nothing saved);
- ``precompute_ref_log_probs=True``: ``_precompute_ref_logps`` runs in ``KTOTrainer.__init__``, before any optimizer
  state, over batches of ``precompute_ref_batch_size`` (else the train and the eval batch sizes) of the train and eval
  sets, with ``ref_model or model`` (the policy with its adapter disabled under peft) inside one
  ``accelerator.autocast()``: the rows, then the KL rows, no grad, the next batch fetched ahead; then training has no
  reference forward and, with no ``ref_model`` given, no reference weights. Modeled as its own phase
  (:func:`precompute_moment`).

Every KTOConfig field beyond TrainingArguments' is in one of :data:`MODELED`, :data:`NO_MEMORY` or :data:`REFUSED`.
"""
from __future__ import annotations

from kit.inputs import InputError, Note

from kit import trainer_kinds
from kit.estimate import dpo
from kit.estimate.inventory import info_of
from kit.estimate.replay import BOOL, F32, FP32, I64, dtype
from kit.estimate.trainer_reader import Given, Reading, TrainerReader
from kit.estimate.trl import max_length_bound, model_init, quantized_recipe, refuser, version_notes

NAMES = ("KTOTrainer", "KTOConfig")
POLICY_OUTPUTS = ("log_probs", "entropy", "mean_logits")   # add_fused_lm_head(policy, outputs=...) in __init__
REF_OUTPUTS = ("log_probs",)                               # a separate ref_model's add_fused_lm_head default
# KTOConfig fields that change the bytes, and how the estimate follows them
MODELED = {
    "max_length": "each prompt+completion row (and KL row) is truncated to it before padding",
    "pad_to_multiple_of": "the rows padded up to a multiple of it (read by running the trainer's collator)",
    "loss_type": "'kto' (default) adds the KL rows and their no-grad forwards; 'apo_zero_unpaired' has none",
    "disable_dropout": "zeroes nn.Dropout modules (refused where the config names a dropout the replay applies)",
    "model_init_kwargs": "the dtype and attention a model given by id loads with (read from the built model)",
    "sync_ref_model": "SyncRefModelCallback mixes the reference's weights in place (mul_, add_): no bytes beyond "
                      "the reference's",
    "precompute_ref_log_probs": "no reference forward in training; a no-grad phase of its own in __init__",
    "precompute_ref_batch_size": "the rows of each batch of the precomputation phase",
}
# KTOConfig fields that change no byte the kit counts, and why
NO_MEMORY = {
    "trust_remote_code": "how the model's code is loaded",
    "dataset_num_proc": "the processes that tokenize the dataset, before training",
    "beta": "a scalar of the loss", "desirable_weight": "a scalar that weights the loss",
    "undesirable_weight": "a scalar that weights the loss", "ref_model_mixup_alpha": "a scalar of the sync",
    "ref_model_sync_steps": "when the sync runs",
}
# KTOConfig fields refused when set: (is it set?, what it does); liger and compile: dpo.refuse_unmodeled
REFUSED = {
    "activation_offloading": (lambda cfg: bool(cfg.activation_offloading), "moves the saved activations to the CPU"),
    "router_aux_loss_coef": (lambda cfg: bool(cfg.router_aux_loss_coef),
                             "adds a Mixture-of-Experts load-balancing loss (router logits)"),
}


def read_kto_config(cfg, name: str = "KTOConfig"):
    """(estimate options, sources, notes) of what a KTOConfig changes; refuses in one sentence what is not
    modeled."""
    refuse = refuser(name)
    for field, (is_set, what) in REFUSED.items():
        if is_set(cfg):
            refuse(field, what, f"kto-{field.replace('_', '-')}")
    dpo.refuse_unmodeled(cfg, name, NAMES[0], "kto")
    src = {k: (getattr(cfg, k), f"{name}.{k}: {why}") for k, why in MODELED.items()}
    src.update({k: (getattr(cfg, k), f"{name}.{k}: {why} (no memory of its own)") for k, why in NO_MEMORY.items()})
    src["fused_lm_head"] = (True, "KTOTrainer's add_fused_lm_head (log-probs in tiles, no logits)")
    return {"fused_lm_head": True}, src, version_notes(NAMES[0])


def with_kl(cfg) -> bool:
    """Whether KTOTrainer builds KL rows (``calculate_KL``: every loss_type but "apo_zero_unpaired")."""
    return cfg.loss_type not in ("apo_zero_unpaired",)


def read_batch(ds, B: int, collator, kl: bool):
    """(S, padded, K) of the longest batch ``collator`` builds from ``ds``: consecutive batches of ``B`` rows (the
    sequential order the KL rows need), else the ``B`` longest rows; K is the longest KL batch's length (0: none)."""
    import torch

    count = len(ds)
    if not count:
        raise InputError("seq_len", "the KTOTrainer's dataset is empty: pass seq_len=....")
    keys = ("prompt_ids", "completion_ids") + (("KL_completion_ids",) if kl else ())
    cols = {name: ds[name] for name in keys}
    rows = [{**{name: col[i] for name, col in cols.items()}, "label": True} for i in range(count)]
    if kl:
        batches = [rows[i:i + B] for i in range(0, count, B)]
    else:
        batches = [sorted(rows, key=lambda row: -len(row["prompt_ids"]) - len(row["completion_ids"]))[:B]]
    made = [collator(batch) for batch in batches]
    main = max(made, key=lambda batch: batch["input_ids"].shape[1])
    K = max(batch["KL_input_ids"].shape[1] for batch in made) if kl else 0
    return int(main["input_ids"].shape[1]), bool((torch.as_tensor(main["attention_mask"]) == 0).any()), K


def no_grad_forward(est, rows: int, S: int, V: int, outputs, *, rp_rows: int, rp_len: int, hidden_dt, weight_dt):
    """(bytes, where) of one no-grad forward beyond what is held: its fused head (``outputs``: the fields it
    returns) or a block, bounded by what one block of the training replay (``rp_rows x rp_len``) saves, scaled."""
    rp = est.context.rp
    head = dpo.head_peak(rows, S, est, V, hidden_dt, weight_dt, top1="is_top1" in outputs) + \
        dpo.fields_bytes(rows * (S - 1), outputs)
    block = max(rp.block, rp.block_in) * rows * S // (rp_rows * rp_len)
    return (head, "its fused head") if head >= block else (block, "a block, bounded")


def _dtypes(est) -> dict:
    load = est.setup["load_dtype"]
    hidden_dt = weight_dt = dtype(load) if load in ("fp32", "bf16", "fp16") else FP32
    return dict(rp_rows=est.setup["batch_size"], rp_len=est.setup["seq_len"], hidden_dt=hidden_dt,
                weight_dt=weight_dt)


def batch_bytes(rows: int, S: int, K: int) -> int:
    """The collator's arrays (``[rows, S]`` and ``[rows, K]`` int64, three each) and the labels (bool)."""
    return 3 * rows * (S + K) * I64 + rows * BOOL


def step_moments(est, *, rows, S, K, V, ref_weights, ref_outputs, ref_copies, policy_copies, held_policy: bool,
                 reference: bool = True):
    """The no-grad moments of a KTO step (or of an evaluation, ``held_policy=False``: nothing saved) as
    ``{name: bytes}``: the policy on the KL rows, and (``reference``: not precomputed) the reference on the KL rows
    and the rows, with the policy's saved tensors (training), its outputs and the completion labels held. The
    training replay is at ``est.setup``'s batch and length. Under mixed precision accelerate wraps each model's
    forward in its own autocast, whose cache of half copies (``policy_copies``, ``ref_copies``) lives while that
    forward runs: the policy's is gone when the reference runs."""
    rp = est.context.rp
    kw = dict(V=V, **_dtypes(est))
    held = est.weights_bytes + ref_weights + est.optimizer_bytes - est.paged_optimizer_bytes + \
        batch_bytes(rows, S, K) + (0 if reference else 2 * rows * F32)   # (or the precomputed log-probs, fp32)
    out = {}
    if K:   # _compute_kl_logps(model): the KL labels beside the batch, before the policy forward
        fwd, where = no_grad_forward(est, rows, K, outputs=POLICY_OUTPUTS, **kw)
        out[f"policy on the KL rows ({where})"] = held + rows * K * I64 + policy_copies + fwd
    labels = rows * S * I64   # completion_labels, held through compute_loss
    if not held_policy:   # evaluation: the policy's own forward, no grad
        fwd, where = no_grad_forward(est, rows, S, outputs=POLICY_OUTPUTS, **kw)
        out[f"policy forward ({where})"] = held + labels + policy_copies + fwd
    if not reference:
        return out
    policy = (rp.saved_bytes() if held_policy else 0) + dpo.fields_bytes(rows * (S - 1), POLICY_OUTPUTS)
    ref_held = held + labels + policy + rows * F32 + ref_copies   # + the policy's KL log-probs, [B] fp32
    if K:
        fwd, where = no_grad_forward(est, rows, K, outputs=ref_outputs, **kw)
        out[f"reference on the KL rows ({where})"] = ref_held + rows * K * I64 + fwd
    fwd, where = no_grad_forward(est, rows, S, outputs=ref_outputs, **kw)
    out[f"reference forward ({where})"] = ref_held + rows * F32 * bool(K) + fwd   # + the reference's KL log-probs
    return out


def precompute_moment(est, *, rows, S, K, V, ref_weights, outputs, copies) -> int:
    """``compute_ref_log_probs`` over one batch of ``_precompute_ref_logps`` in ``KTOTrainer.__init__``: no optimizer
    state, no grads; the batch and the next one (accelerate's loader fetches it ahead); the rows' labels, then
    their log-probs (``[rows, S-1]`` fp32) held through the KL rows' forward; one autocast around both, so the
    running model's half copies (``copies``) stay cached."""
    kw = dict(V=V, **_dtypes(est))
    held = est.weights_bytes + ref_weights + 2 * batch_bytes(rows, S, K) + rows * S * I64 + copies
    main = held + no_grad_forward(est, rows, S, outputs=outputs, **kw)[0]
    if not K:
        return main
    return max(main, held + rows * (S - 1) * F32 + rows * K * I64 + no_grad_forward(est, rows, K, outputs=outputs,
                                                                                       **kw)[0])


def finish(est, info, *, kind, where, S, K, V, ref_weights, ref_model, policy_model, eval_rows, eval_S,
           eval_K, precompute=None) -> dict:
    """The fields of ``est`` with KTO's moments in: the reference's weights (held all along), the no-grad forwards
    of a step (the peak where one is the largest; step 1 has no optimizer state) and of evaluate(), and the
    precomputation's phase (``precompute``: its batches' ``(rows, S, K)``, None where the log-probs are not
    precomputed). ``ref_model``, ``policy_model``: the real models where a trainer was built (None: from
    ``info``)."""
    load, prec = est.setup["load_dtype"], est.setup["precision"]
    half = dtype(prec) if prec != "fp32" else None
    separate = ref_weights > 0   # a separate reference model (its own fused head, log-probs alone)
    lora = bool(est.setup.get("lora_r"))
    ref_copies = dpo.cast_copies(info, half, load, ref_model) if separate else 0   # (disabled adapters cast nothing)
    if policy_model is None and lora:   # the adapters: fp32 Linear weights that train
        policy_copies = est.trainable_params * half if half and load == "fp32" else 0
    else:
        policy_copies = dpo.cast_copies(info, half, load, policy_model)
    common = dict(V=V, ref_weights=ref_weights, ref_outputs=REF_OUTPUTS if separate else POLICY_OUTPUTS,
                  ref_copies=ref_copies, policy_copies=policy_copies, reference=precompute is None)
    moments = step_moments(est, rows=est.setup["batch_size"], S=S, K=K, held_policy=True, **common)
    evals = step_moments(est, rows=eval_rows, S=eval_S, K=eval_K, held_policy=False, **common)
    opt = est.optimizer_bytes - est.paged_optimizer_bytes
    weights = est.weights_bytes + ref_weights
    moment, top = max(moments.items(), key=lambda kv: kv[1])
    notes = list(est.notes)
    if moment.endswith("bounded)"):
        notes.append(Note("KTOTrainer's largest no-grad pass is set by a block, where the kit counts at most what one "
                          "block saves in training: an upper bound", field="ref_model", code="kto-no-grad-upper-bound"))
    refs = [peak for moment_name, peak in moments.items() if moment_name.startswith("reference")]
    setup = dict(est.setup, reference=kind, reference_weights_bytes=ref_weights, kl_seq_len=K,
                 no_grad_moments_bytes=moments, **({"reference_forward_peak_bytes": max(refs)} if refs else {}))
    out = dict(peak_bytes=est.peak_bytes + ref_weights,
               first_step_peak_bytes=max(est.first_step_peak_bytes + ref_weights, top - opt),
               weights_bytes=weights, eval_peak_bytes=max(evals.values()), setup=setup, notes=notes,
               _parts={**est._parts, "weights": est._parts.get("weights", 0) + ref_weights},
               sources={**est.sources, "reference": (kind, where),
                        "kl_seq_len": (K, "the KL rows' padded length (DataCollatorForUnpairedPreference)" if K else
                                       "no KL rows (loss_type='apo_zero_unpaired')")})
    if top > out["peak_bytes"]:
        out.update(peak_bytes=top, peak_phase="forward/backward", peak_moment=moment,
                   _parts={"weights": weights, "optimizer state": opt, "temporaries": top - weights - opt})
    if precompute is not None:   # ref_model or the policy (its adapter disabled under peft: nothing cast)
        runs = dict(outputs=REF_OUTPUTS, copies=ref_copies) if separate else \
            dict(outputs=POLICY_OUTPUTS, copies=0 if lora else policy_copies)
        pre = max(precompute_moment(est, rows=r, S=s, K=k, V=V, ref_weights=ref_weights, **runs)
                  for r, s, k in precompute)
        setup["precompute_peak_bytes"] = pre
        notes.append(Note("precompute_ref_log_probs: KTOTrainer.__init__ first runs a no-grad pass over every row, "
                          "its own phase, whose peak is setup['precompute_peak_bytes']",
                          field="precompute_ref_log_probs", code="kto-precompute"))
        if pre > out["peak_bytes"]:
            out.update(peak_bytes=pre, peak_phase="precomputing reference log-probs",
                       peak_moment="reference forward (precompute)",
                       _parts={"weights": weights, "temporaries": pre - weights})
    return out


class KtoReader(TrainerReader):
    """KTOTrainer and KTOConfig (the module doc): B rows and their KL rows a step, the reference model."""

    trainer_name, config_name, config_keyword = NAMES[0], NAMES[1], "kto_config"
    trl = True
    lean_kbit, reads_eval_rows = True, False
    finishing = None   # finish()'s keywords
    peft = False       # estimate_from was given a peft_config

    def read_trainer(self, trainer) -> None:
        self.own.take(*read_kto_config(trainer.args))
        dpo.refuse_dropout(trainer.args, trainer.model.config, self.config_name)

    def after_model(self, trainer, reading: Reading, seq_len) -> None:
        reading.take(self.own.opts, self.own.src, self.own.notes)
        dpo.one_gpu_reference(reading.opts, reading.notes, self.config_name, self.trainer_name, "kto")

    def rows(self, trainer, reading: Reading, seq_len) -> tuple:
        """B rows padded to the longest batch, its KL rows, and the reference model."""
        args, kl = trainer.args, with_kl(trainer.args)
        kind, ref, where = dpo.reference_of(trainer, names=NAMES)
        if seq_len is None:
            S, padded, K = read_batch(trainer.train_dataset, args.per_device_train_batch_size, trainer.data_collator,
                                      kl)
            at = f"DataCollatorForUnpairedPreference on the longest batch of {args.per_device_train_batch_size} rows"
        else:
            S, padded, K, at = seq_len, True, seq_len if kl else 0, "estimate_trainer(seq_len=...)"
        eval_S, eval_K = S, K
        if trainer.eval_dataset is not None and seq_len is None and not isinstance(trainer.eval_dataset, dict):
            eval_S, _, eval_K = read_batch(trainer.eval_dataset, args.per_device_eval_batch_size,
                                           trainer.data_collator, kl)
        reading.src.update({"seq_len": (S, at), "padded": (padded, "rows of different lengths in the batch"
                                                           if padded else "no padding")})
        self.finishing = dict(kind=kind, where=where, S=S, K=K, V=trainer.model.config.get_text_config().vocab_size,
                              ref_weights=dpo.held_bytes(ref) if ref is not None else 0, ref_model=ref,
                              policy_model=trainer.model, precompute=self.precomputed_batches(trainer, seq_len),
                              eval_rows=args.per_device_eval_batch_size, eval_S=eval_S, eval_K=eval_K)
        return S, padded

    @staticmethod
    def precomputed_batches(trainer, seq_len) -> list | None:
        """``(rows, S, K)`` of the longest batch _precompute_ref_logps ran over in the train set and the eval set
        (None where the log-probs are not precomputed)."""
        args, kl = trainer.args, with_kl(trainer.args)
        if not args.precompute_ref_log_probs:
            return None
        out = []
        for ds, rows in ((trainer.train_dataset, args.per_device_train_batch_size),
                         (trainer.eval_dataset, args.per_device_eval_batch_size)):
            rows = args.precompute_ref_batch_size or rows
            if seq_len is not None:
                out.append((rows, seq_len, seq_len if kl else 0))
            elif ds is not None and not isinstance(ds, dict):
                S, _, K = read_batch(ds, rows, trainer.data_collator, kl)
                out.append((rows, S, K))
        return out

    def compose(self, draft, trainer, reading: Reading) -> dict:
        opts = reading.opts
        info = info_of(reading.target, opts.get("task", "causal-lm"), opts.get("num_labels", 2))
        return finish(draft, info, **self.finishing)

    def read_config(self, cfg, given: Given) -> None:
        self.own.take(*read_kto_config(cfg))
        model_init(cfg, self.config_name, given)
        max_length_bound(cfg, given, "KTOConfig.max_length: each prompt+completion row (and KL row) is truncated to "
                         "it (padded up to pad_to_multiple_of), so it is the longest a row can be")  # (a bound)
        self.peft = given.peft_config is not None

    def after_args(self, reading: Reading, name: str) -> None:
        dpo.one_gpu_reference(reading.opts, reading.notes, name, self.trainer_name, "kto")

    def finish_options(self, reading: Reading, cfg, config, seq_len, padded) -> tuple:
        quantized_recipe(reading.opts, reading.src, self.trainer_name)
        reading.take(self.own.opts, self.own.src, self.own.notes)
        dpo.refuse_dropout(cfg, config, self.config_name)
        kind, _, where = dpo.reference_of(cfg=cfg, peft=self.peft, names=NAMES)
        K = seq_len if with_kl(cfg) else 0   # (the KL rows are truncated to max_length too)
        rows = cfg.precompute_ref_batch_size or reading.opts["batch_size"]
        pre = [(rows, seq_len, K)] if cfg.precompute_ref_log_probs else None
        self.finishing = dict(kind=kind, where=where, S=seq_len, K=K, ref_model=None, policy_model=None, precompute=pre,
                              eval_rows=reading.opts.get("eval_batch_size") or reading.opts["batch_size"],
                              eval_S=seq_len, eval_K=K)
        return seq_len, padded

    def compose_from(self, draft, cfg, info, config) -> dict:
        # the reference: a copy as loaded, or the adapter-disabled policy
        kind = self.finishing["kind"]
        return finish(draft, info, V=config.get_text_config().vocab_size, **self.finishing,
                      ref_weights=draft.loaded_weights_bytes if kind == "model" else 0)


trainer_kinds.register_kind("kto", trainer_kinds.library_classes("trl", *NAMES))
trainer_kinds.register_part("kto", "estimate", KtoReader)
