"""How :func:`kit.estimate.estimate` puts an estimate together, in three stages:

1. :func:`~kit.estimate.counts.count_parameters` walks the model's layers once: weights as loaded and as trained
   (4-bit, 8-bit, LoRA adapters, the k-bit recipe's fp32 upcast), gradients, optimizer state and the CPU RAM to
   build it;
2. :func:`replay_setup` turns the config and those counts into the :class:`~kit.estimate.replay.Setup` the
   activation replay runs on;
3. :func:`phases` finds the peak of the forward/backward phase (from the replay's backward timeline) and of
   the optimizer step, and of ``Trainer.evaluate()``, and writes the :class:`~kit.estimate.result.Estimate`.

:class:`Plan` is what the options decide before anything is counted. Bytes are ints, per part of the model
(``"embed"``, ``"block"``, ``"head"``) where a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from kit.inputs import ALL_LINEAR, InputError, Note

from kit import optimizers
from kit.estimate import quantization as kit_quantization
from kit.estimate import replay
from kit.estimate.replay import moe
from kit.estimate import reserved
from kit.estimate.evaluation import block_forward_bytes, eval_peak
from kit.estimate.inventory import Info, default_targets, in_module, lora_matches
from kit.estimate.offload_options import offload_notes, refuse_offload
from kit.estimate.result import Context, Estimate
from kit.estimate.trl import refuse_activation_offloading
from kit.estimate.counts import Counts


class SetupOption(property):
    """A :class:`Plan` property that reads one option of the plan's setup, as read."""

    def __init__(self, option: str, doc: str):
        super().__init__(lambda plan: plan.setup[option], doc=doc)


@dataclass
class Plan:
    """The setup as read (``setup``: :func:`kit.training_setup.read`'s options, TrainingSetup's names), and what it
    decides against the model before anything is counted (where the setup says None, resolved: checkpointing, the
    load dtype, the head, the LoRA modules). The options it takes as given are properties of ``setup``."""

    setup: dict
    model: str                # the model's name (a registry name or path), or its class's
    lora_modules: set         # names of the Linear modules that get adapters
    gradient_checkpointing: bool  # checkpointing on, the model's default resolved
    checkpoint_reentrant: bool    # ... and reentrant
    vocab_head: bool          # a head on the logits (Info.vocab_head): trained as loaded, no k-bit recipe
    load_dtype: str           # the load dtype's name (the default resolved: bf16 with quantization, else fp32)
    evaluation: dict          # evaluate()'s batch size, gather, samples, length (seq_len) and accumulation
    bnb: kit_quantization.Bnb
    fused_lm_head: bool = False   # TRL's fused LM head (kit.estimate.replay.fused_head), as its loss type decides
    adapter_dtype: replay.Dt = replay.FP32  # LoRA adapters' dtype (fp32; TRL casts them to bf16 on k-bit models)
    liger_kernels: tuple = ()     # Liger's kernels that run (kit.estimate.replay.liger.kernels)
    offload: dict = field(default_factory=dict)  # ckpt_every_n_layers, checkpoint_offload, activation_offloading
    task: str = "causal-lm"   # the head (Info.task): "causal-lm", "seq-cls", "token-cls"
    train_head: bool = False  # LoRA on a classifier: peft's modules_to_save copy of its head trains
    saved_copies: frozenset = frozenset()  # LoRA on a causal LM: the embedding / output head leaves whose
    # modules_to_save copy trains beside the frozen original (saved_copies_of)
    sm: tuple | None = None   # the GPU's compute capability (None: not known): SDPA's kernel (replay.kernels)
    target_len: int = 0       # an encoder-decoder's target length (seq_len: its source's); 0: none
    images: tuple = ()        # a vision-language model's vision tower rows for a batch row and their side; (): none

    batch_size = SetupOption("batch_size", "per-device rows a step")
    seq_len = SetupOption("seq_len", "tokens a row")
    precision = SetupOption("precision", "fp32, or autocast's fp16/bf16")
    quantization = SetupOption("quantization", "none, 8bit or 4bit")
    lora_r = SetupOption("lora_r", "LoRA's rank (0: none)")
    optimizer = SetupOption("optimizer", "the optimizer's kit name")
    grad_accum = SetupOption("grad_accum", "gradient accumulation steps")
    attn_implementation = SetupOption("attn_implementation", "sdpa or eager")
    kbit_recipe = SetupOption("kbit_recipe", "standard: prepare_model_for_kbit_training (see kbit_prepared); lean")
    lora_dropout = SetupOption("lora_dropout", "LoraConfig.lora_dropout")
    padded = SetupOption("padded", "the batches have padding (an attention mask is built)")
    device = SetupOption("device", "whose kernels: cuda or cpu")
    input_require_grads = SetupOption("input_require_grads", "enable_input_require_grads ran (None: "
                                      "input_requires_grad decides)")
    towers = SetupOption("towers", "forwards a step before one backward, (rows / batch_size, tokens) "
                          "(replay.towers)")
    dora = SetupOption("use_dora", "the adapters are peft's DoRA (a magnitude vector per layer)")

    @classmethod
    def setup_options(cls) -> tuple:
        """The names of the properties that read the setup (:class:`SetupOption`): with the fields, what the plan
        says (counts.count_key keys the counts on both)."""
        return tuple(name for name, attr in vars(cls).items() if isinstance(attr, SetupOption))

    # The dtypes are replay.Dt: bytes per element (ints, for the byte counts) that tell bf16 from fp16.
    @property
    def load_bytes(self) -> replay.Dt:        # the loaded weights' dtype
        return replay.dtype(self.load_dtype)

    @property
    def half(self) -> replay.Dt | None:       # autocast's dtype (None: fp32, no autocast)
        return replay.dtype(self.precision) if self.precision != "fp32" else None

    @property
    def kbit_prepared(self) -> bool:       # prepare_model_for_kbit_training runs: quantized, standard, no vocab head
        return self.quantization != "none" and self.kbit_recipe == "standard" and not self.vocab_head

    @property
    def trained_bytes(self) -> replay.Dt:     # the dtype of the parameters that are not 4-bit/8-bit, after the recipe
        return replay.FP32 if self.kbit_prepared else self.load_bytes  # (the recipe casts fp16/bf16 ones to fp32)


def plan(info: Info, setup: dict, *, model, load_dtype, evaluation, bnb=kit_quantization.Bnb(), fused_lm_head=False,
         liger_kernels=(), offload=None, sm=None, target_len=0, images=()) -> Plan:
    """Read the options (``setup``, as :func:`kit.training_setup.read` read them) against the model: which layers
    get LoRA, whether the k-bit recipe and checkpointing run; refuse what cannot be trained. The keywords are what
    the setup decided before: the load dtype and evaluation with their defaults, the 4-bit options, TRL's fused
    head, Liger's kernels, the offload options, the GPU's capability, an encoder-decoder's target length and a
    vision-language model's vision tower rows for a batch row and their side (``images``)."""
    quantization, lora_r, lora_targets, precision, device = (setup[k] for k in (
        "quantization", "lora_r", "lora_targets", "precision", "device"))
    kbit_recipe, gradient_checkpointing, use_dora = setup["kbit_recipe"], setup["gradient_checkpointing"], \
        setup["use_dora"]
    vh, leaves = info.vocab_head, info.leaves
    if quantization != "none" and not lora_r and not vh:
        raise InputError("quantization", "4-bit/8-bit weights cannot be trained directly (Trainer refuses a "
                         "purely quantized model): add LoRA adapters with lora_r > 0.", code="quantized-needs-lora")
    if lora_targets and not lora_r:
        raise InputError("lora_targets", "lora_targets needs lora_r > 0: set lora_r (e.g. 16), or leave "
                                             "lora_targets out.", code="targets-need-lora")
    lora = set()
    if lora_r and lora_targets == ALL_LINEAR:  # peft: every Linear/Conv1D but a PreTrainedModel's output
        lora = {l.name for l in leaves if l.kind == "linear" and l.name != info.output_head}
    elif lora_r:
        targets = lora_targets or tuple(default_targets(info))
        lora = set(lora_matches(tuple(l.name for l in leaves if l.kind == "linear"), targets))
        if not lora:
            names = sorted({l.short.split(".")[-1] for l in leaves if l.kind == "linear"})
            raise InputError("lora_targets", f"lora_targets {list(targets)} match no Linear module of this "
                             f"model (its Linear modules: {', '.join(names)}): name some of those, or pass "
                             f"'{ALL_LINEAR}'.", code="targets-match-nothing")
    std = quantization != "none" and kbit_recipe == "standard" and not vh  # Plan.kbit_prepared: the k-bit recipe runs
    # (8-bit layers keep their inputs through non-reentrant checkpointing)
    reentrant = bnb.reentrant_for(gradient_checkpointing, std)
    checkpointing = (vh or std) if gradient_checkpointing is None else bool(gradient_checkpointing)
    head_trains = vh and not set(info.head_layers) & lora   # a head on the logits, not adapted, trains as loaded
    if precision == "fp16" and load_dtype == "fp16" and device == "cuda" and not std and (not lora_r or head_trains):
        raise InputError("load_dtype", "fp16 trainable weights under fp16 mixed precision fail at the first "
                         "optimizer step (GradScaler: 'Attempting to unscale FP16 gradients'): load the model in "
                         "fp32, or in bf16 on a GPU that has it.", code="fp16-trainable-weights")
    if fused_lm_head and (vh or getattr(info.config, "final_logit_softcapping", None)):
        raise InputError("fused_lm_head", "TRL's fused LM head is modeled on a plain causal LM without final-logit "
                         "soft-capping or a head on the logits: estimate this model without it.",
                         code="fused-head-not-modeled")
    if "flce" in liger_kernels and info.output_head in lora:
        raise InputError("lora_targets", "Liger's fused linear cross-entropy reads lm_head.weight directly, past "
                         "a LoRA adapter on it: leave lm_head out of lora_targets.", code="liger-head-lora")
    refuse_dora(use_dora, lora_r=lora_r, quantization=quantization, precision=precision, load_dtype=load_dtype)
    refuse_offload(offload or {}, ckpt=checkpointing)
    refuse_activation_offloading(offload or {}, ckpt=checkpointing, reentrant=reentrant, fused=fused_lm_head)
    refuse_for_classifier(info, fused=fused_lm_head, liger=liger_kernels)
    head_copy = bool(info.classifier and lora_r and not any(in_module(n, info.classifier) for n in lora)
                     and setup["train_head"] is not False)
    return Plan(setup=setup, model=model, lora_modules=lora, gradient_checkpointing=checkpointing,
                checkpoint_reentrant=reentrant, vocab_head=bool(vh), load_dtype=load_dtype, evaluation=evaluation,
                bnb=bnb, fused_lm_head=fused_lm_head, adapter_dtype=replay.dtype(setup["adapter_dtype"]),
                liger_kernels=tuple(liger_kernels), offload=offload or {}, task=info.task, train_head=head_copy,
                saved_copies=saved_copies_of(info, setup["modules_to_save"], lora_r=lora_r, lora=lora,
                                             fused=fused_lm_head or "flce" in liger_kernels),
                sm=sm, target_len=target_len, images=images)


def refuse_dora(use_dora: bool, *, lora_r: int, quantization: str, precision: str, load_dtype: str) -> None:
    """DoRA is modelled on LoRA adapters over fp32 weights, in fp32 or under bf16 autocast (as measured); the rest
    is refused by name."""
    if not use_dora:
        return
    if not lora_r:
        raise InputError("use_dora", "use_dora is a kind of LoRA adapter: set lora_r, or leave it out.",
                         code="dora-needs-lora")
    modelled = {"quantization": ("none",), "precision": ("fp32", "bf16"), "load_dtype": ("fp32",)}
    given = {"quantization": quantization, "precision": precision, "load_dtype": load_dtype}
    what = next((f"{k}={v!r}" for k, v in given.items() if v not in modelled[k]), None)
    if what:
        raise InputError("use_dora", f"DoRA with {what} (the weight dequantized or cast inside each adapted "
                         "layer's forward) is not modelled: the kit models DoRA on fp32 weights, in fp32 or "
                         "under bf16 autocast; measure it with kit.watch(trainer).", code="dora-not-modelled")


def saved_copies_of(info: Info, names, *, lora_r: int, lora: set, fused: bool) -> frozenset:
    """The leaves whose peft ``modules_to_save`` copy trains (``ModulesToSaveWrapper``: a trained copy beside the
    frozen original, the copy alone in the forward), from module names matched as peft matches them (the name, or
    its last parts); the kit models the copies of a causal LM's input embeddings and output head, with LoRA."""
    if isinstance(names, str):
        names = (names,)
    names = tuple(names or ())
    if not names:
        return frozenset()
    copyable = {l.name: l for l in info.leaves if (l.kind == "embedding" and l.part == "embed")
                or (l.name == info.output_head and info.task == "causal-lm")}
    found = set()
    for name in names:
        hits = [n for n in copyable if n == name or n.endswith("." + name)]
        if not hits:
            raise InputError("modules_to_save", f"modules_to_save names {name!r}, which is not this causal LM's "
                             f"input embeddings or output head ({', '.join(sorted(copyable))}): the kit models "
                             "trained copies of those only; measure it with kit.watch(trainer).",
                             code="modules-to-save-not-modelled")
        found.update(hits)
    if not lora_r:
        raise InputError("modules_to_save", "modules_to_save is peft's, beside LoRA adapters: set lora_r, or "
                         "leave it out (a full fine-tune trains every module already).",
                         code="modules-to-save-needs-lora")
    if found & lora:
        raise InputError("modules_to_save", f"{', '.join(sorted(found & lora))} both gets LoRA and is in "
                         "modules_to_save, which peft refuses: keep it in one of them.",
                         code="modules-to-save-and-lora")
    if fused and info.output_head in found:
        raise InputError("modules_to_save", "a fused LM head (TRL's or Liger's) with a trained copy of the "
                         "head is not modelled: estimate it without the fused head.",
                         code="modules-to-save-fused-head")
    return frozenset(found)


def refuse_for_classifier(info: Info, *, fused: bool, liger) -> None:
    """A classifier head has no vocabulary logits: TRL's fused LM head and Liger's fused cross-entropy have none to
    fuse, and are refused there in one sentence."""
    if info.task == "causal-lm":
        return
    if fused or "flce" in liger:
        name = "fused_lm_head" if fused else "liger_kernel"
        raise InputError(name, f"{name} fuses a causal LM's vocabulary head, and this {info.task} model has a "
                         f"classifier head ({info.classifier}) instead: estimate it without {name}.",
                         code="fused-head-classifier")


def input_requires_grad(plan: Plan) -> bool:
    """Whether the embeddings' output requires grad: ``enable_input_require_grads`` registered its hook (read
    from a real model where there is one: ``Plan.input_require_grads``), else as the libraries and the kit's loaders do.

    ``PreTrainedModel.gradient_checkpointing_enable`` runs it for a model fed ``input_ids`` (transformers
    ``modeling_utils.py``), and ``peft.prepare_model_for_kbit_training`` only with its checkpointing
    (``use_gradient_checkpointing``, peft ``utils/other.py``); ``get_peft_model`` alone does not, unless the
    model already checkpoints (peft ``PeftModel.__init__``: ``if getattr(model, "is_gradient_checkpointing",
    True)``). So: with checkpointing, and otherwise not (a trained embedding makes its output require grad
    anyway: the replay's own rule).
    """
    return plan.input_require_grads if plan.input_require_grads is not None else plan.gradient_checkpointing


def block_index(leaf) -> int:
    """The index of the block a ``part == "block"`` leaf sits in (``model.layers.3.mlp.up_proj``: 3)."""
    return int(leaf.name[:-len(leaf.short) - 1].rsplit(".", 1)[-1])


def block_states(leaves, found: str) -> dict:
    """Each block's state, read from its leaves' ``requires_grad``, by block index: "trained", "frozen", or "norms
    frozen" (its norms frozen, its other weights trained); a block frozen any other way is refused, naming the
    modules frozen in it. ``found``: the sentence's opening, what was found frozen in the model."""
    flags = {}
    for leaf in (l for l in leaves if l.part == "block"):
        flags.setdefault(block_index(leaf), {}).setdefault(leaf.kind == "norm", set()).add(leaf.trainable)
    states = {}
    for i, by_kind in sorted(flags.items()):
        norms, rest = by_kind.get(True, set()), by_kind.get(False, set())
        states[i] = "trained" if norms | rest == {True} else "frozen" if norms | rest == {False} else \
            "norms frozen" if (norms, rest) == ({False}, {True}) else ""
        if not states[i]:
            names = [l.short for l in leaves if l.part == "block" and block_index(l) == i and not l.trainable]
            raise InputError("model", f"{found}: block {i} is partly frozen ({', '.join(names[:4])}"
                             f"{', ...' if len(names) > 4 else ''}), and the kit replays a block whole, frozen or "
                             "trained, or trained with all its norms frozen (its saved activations follow which "
                             "weights train); freeze or train each block whole, or measure the run with "
                             "kit.watch(trainer).", code="partly-frozen-block")
    return states


def refuse_frozen_norms(info: Info, plan: Plan, states: dict, found: str) -> None:
    """Frozen norms in the trained blocks are replayed where every trained block has them frozen, in a family whose
    block follows them (its declaration's ``frozen_norms``), with transformers' norms (Liger's kernel keeps its
    input for the weight's grad all the same): refuse the rest, naming what was found."""
    frozen = [i for i, state in states.items() if state == "norms frozen"]
    trained = [i for i, state in states.items() if state == "trained"]
    if frozen and trained:
        raise InputError("model", f"{found}: the norms of blocks {frozen} are frozen while those of blocks {trained} "
                         "train, and the kit replays frozen norms only in every trained block alike; freeze the norms "
                         "of every trained block or of none, or measure the run with kit.watch(trainer).",
                         code="partly-frozen-block")
    if frozen and not replay.family(info.family).frozen_norms:
        follow = ", ".join(t for f in replay.declared() if f.frozen_norms for t in f.model_types)
        raise InputError("model", f"{found}: the norms of blocks {frozen} are frozen, and the kit replays frozen norms "
                         f"only in the blocks of {follow}, not {info.config.model_type}'s; train the norms, or measure "
                         "the run with kit.watch(trainer).", code="partly-frozen-block")
    if frozen and "rms_norm" in plan.liger_kernels:
        raise InputError("liger_kernel", f"{found}: the norms of blocks {frozen} are frozen, and the kit replays "
                         "frozen norms with transformers' RMSNorm, not Liger's kernel; estimate it without Liger's "
                         "rms_norm, or measure the run with kit.watch(trainer).", code="partly-frozen-block")


def frozen_parts(info: Info, plan: Plan) -> dict:
    """A full fine-tune's frozen parts, read from each leaf's ``requires_grad``, as the replay's Setup fields:
    the embeddings, the bottom blocks (``frozen_below``: they run with no graph, where no input grad reaches them),
    the trained blocks' norms, the final norm and the LM head. A pattern the replay does not follow is refused,
    naming what was found."""
    leaves = info.leaves
    if plan.lora_r or info.vocab_head or info.own_head:
        return {}
    bitfit = [l.name for l in leaves if l.frozen_param == "weight"]
    if bitfit:   # its input saved for nothing but the weight's grad, which the replay counts with the bias's
        raise InputError("model", f"{len(bitfit)} modules ({', '.join(bitfit[:3])}{', ...' if len(bitfit) > 3 else ''})"
                         " have a frozen weight and a trained bias, and the kit replays a module's weight trained "
                         "with its bias, or frozen with it; freeze or train the two together, or measure the run "
                         "with kit.watch(trainer).", code="frozen-weight-trained-bias")
    if all(l.trainable for l in leaves):
        return {}
    embed = {l.trainable for l in leaves if l.part == "embed"}
    found = f"{sum(not l.trainable for l in leaves)} of the model's {len(leaves)} modules with weights are frozen"
    if len(embed) > 1:
        raise InputError("model", f"{found}, among them some of the input embeddings but not all: the kit replays "
                         "frozen embeddings only whole; freeze or train all of them, or measure the run with "
                         "kit.watch(trainer).", code="partly-frozen-embeddings")
    states = block_states(leaves, found)
    refuse_frozen_norms(info, plan, states, found)
    trained = sorted(i for i, state in states.items() if state != "frozen")
    first = trained[0] if trained else len(states)
    above = sorted(i for i, state in states.items() if state == "frozen" and i > first)
    if above or not trained or (first and embed == {True}):
        what = f"blocks {above} are frozen above trained block {first}" if above else \
            "no block trains" if not trained else f"blocks 0-{first - 1} are frozen above trained embeddings"
        raise InputError("model", f"{found}: {what}, and the kit replays only a frozen bottom (the embeddings, or "
                         "them and the first blocks) below trained blocks exactly; freeze the bottom instead, or "
                         "measure the run with kit.watch(trainer).", code="frozen-blocks-not-modelled")
    if first and input_requires_grad(plan) and not plan.gradient_checkpointing:
        raise InputError("input_require_grads", f"{found}: blocks 0-{first - 1} are frozen, and with the input "
                         "embeddings' output requiring grad (enable_input_require_grads) they still save for backward, "
                         "which the kit does not replay for frozen blocks; remove the hook, or measure the run with "
                         "kit.watch(trainer).", code="frozen-blocks-with-input-grads")
    norms = [l.trainable for l in leaves if l.part == "head" and l.kind == "norm"]
    head = next((l.trainable for l in leaves if l.name == info.output_head), True)
    # with checkpointing and the input-grads hook, each block keeps only its input, frozen or not: replayed as trained
    return dict(embed_frozen=embed == {False}, frozen_below=0 if input_requires_grad(plan) else first,
                final_norm_frozen=bool(norms) and not any(norms), lm_head_frozen=not head,
                block_norms_frozen="norms frozen" in states.values())


def refuse_frozen_prefix(setup: replay.Setup) -> None:
    """A frozen bottom is replayed on blocks of one kind, with plain checkpointing (or none): refuse the rest."""
    mixed = 0 < setup.sliding < setup.L or setup.sliding_at or setup.linear_at or \
        replay.family(setup.family).block.first_layer
    offloaded = setup.ckpt_every > 1 or setup.ckpt_offload or setup.trl_offload
    if setup.frozen_below and (mixed or offloaded):
        only = "on blocks that are all alike" if mixed else "without offloading or partial checkpointing"
        raise InputError("model", f"blocks 0-{setup.frozen_below - 1} are frozen, and the kit replays a frozen "
                         f"bottom only {only}; measure the run with kit.watch(trainer).",
                         code="frozen-blocks-not-modelled")


def replay_setup(info: Info, plan: Plan) -> replay.Setup:
    """Stage 2: the shapes, dtypes and layers the activation replay runs on."""
    cfg = info.config
    own_names = replay.family(info.family).shapes   # a config that names its shapes its own way (GPT-2's)
    if own_names:
        shapes = own_names(cfg)
    else:
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        shapes = dict(H=H, F=getattr(cfg, "intermediate_size", 0), nh=nh,   # (DistilBERT's F: config_shapes)
                      kvh=getattr(cfg, "num_key_value_heads", None) or nh,
                      hd=getattr(cfg, "head_dim", None) or H // nh, L=cfg.num_hidden_layers,
                      p_attn=getattr(cfg, "attention_dropout", 0.0))
        shapes |= moe.config_shapes(cfg)   # experts, top-k, one expert's width ({} for a dense model)
        shapes |= replay.config_shapes(cfg, info.family, shapes["hd"])  # windows, soft-caps, the family's own, ...
    # a head on the logits (scenario 1's Linear(V, V), or the V->r->V of its fix (b)), in forward order
    head = [next(l for l in info.leaves if l.name == n) for n in info.head_layers]
    lora = {l.short: plan.lora_r for l in info.leaves if l.name in plan.lora_modules and l.part == "block"} \
        | {l.name.split(".")[-1]: plan.lora_r for l in info.leaves if l.name in plan.lora_modules and l.part == "head"}
    setup = replay.Setup(family=info.family, B=plan.batch_size, S=plan.seq_len, S_dec=plan.target_len,
                         V=cfg.vocab_size, w=plan.load_bytes,
                         w_other=plan.trained_bytes, ac=plan.half,
                         base_trainable=not plan.lora_r and not info.vocab_head,
                         quant=plan.quantization, compute=replay.dtype(plan.bnb.compute_dtype),
                         # (the replay: at each layer's backward)
                         dequant=kit_quantization.dequant_bytes(plan.bnb, plan.load_dtype),
                         reentrant=plan.checkpoint_reentrant, lora=lora, lora_dropout=plan.lora_dropout,
                         input_grad=input_requires_grad(plan), attn=plan.attn_implementation, padded=plan.padded,
                         ckpt=plan.gradient_checkpointing, device=plan.device, sm=plan.sm,
                         head=tuple((l.name, l.fout) for l in head), head_w=plan.load_bytes,
                         head_trainable=bool(head) and all(l.trainable for l in head) and not plan.lora_r,
                         fused_head=plan.fused_lm_head, adapter=plan.adapter_dtype, dora=plan.dora,
                         liger=plan.liger_kernels,
                         task=info.task, labels=info.num_labels,
                         embed_trains=any(l.part == "embed" for l in info.leaves if l.name in plan.saved_copies),
                         lm_head_trains=info.output_head in plan.saved_copies,
                         head_trains=plan.train_head or (not plan.lora_r and any(
                             l.trainable for l in info.leaves if in_module(l.name, info.classifier))),
                         p_head=info.head_dropout, own=own_bytes(info.own_head), **shapes,
                         **{k: v for k, v in (("ckpt_every", plan.offload.get("ckpt_every_n_layers", 1)),
                                              ("ckpt_offload", plan.offload.get("checkpoint_offload", False)),
                                              ("trl_offload", plan.offload.get("activation_offloading", False))) if v},
                         **frozen_parts(info, plan), **vision_fields(info, plan))
    refuse_frozen_prefix(setup)
    return setup


def vision_fields(info: Info, plan: Plan) -> dict:
    """A vision-language model's :attr:`Setup.vision` (its family's ``images.shape``): the tower's rows in the batch,
    their side, its LoRA targets and which of its weights train, read from its leaves (a tower trained in part is
    refused, naming what was found); {} for a language model."""
    if not plan.images:
        return {}
    tower = [l for l in info.leaves if l.part == "vision" and l.kind == "linear" and l.short != l.name]
    other = [l for l in info.leaves if l.part == "vision" and l not in tower]
    connector = [l for l in other if l.kind == "linear"]
    trains = {l.trainable for l in tower + other if l not in connector}
    if len(trains) > 1:
        raise InputError("model", f"{sum(not t for t in trains)} of the vision tower's modules are frozen and others "
                         "train, and the kit replays the vision tower trained or frozen whole: freeze or train it "
                         "whole, or measure the run with kit.watch(trainer).", code="partly-frozen-vision")
    lora = {l.short: plan.lora_r for l in tower if l.name in plan.lora_modules}
    lora |= {l.name: plan.lora_r for l in connector if l.name in plan.lora_modules}
    rows, side = plan.images
    return {"vision": replay.family(info.family).images.shape(
        info.vision, plan.batch_size * rows, side, lora=lora, trains=not plan.lora_r and trains == {True},
        connector_trains=not plan.lora_r and all(l.trainable for l in connector))}


def own_bytes(head) -> tuple:
    """The replay's figures of a head of the user's own (:class:`kit.estimate.own_head.OwnHead`): saved bytes per
    token, per row and once, and the logits' bytes per row; () for a transformers head."""
    return (head.per_token, head.per_row, head.fixed, head.logits_row) if head else ()


def own_head_cache(info: Info, setup: replay.Setup, rows: int, dtype_bytes: int) -> int:
    """The KV cache a decoder base under a head of the user's own builds in evaluation (bytes): Trainer sets
    ``model.config.use_cache = args.use_cache`` (False) only on a model with a ``config``, so a plain module's base
    keeps its own (``use_cache=True`` in most configs), and its eval-mode forward fills a cache of every layer's
    k and v, (rows, kvh, S, hd) each, alive till the module's forward returns."""
    if not info.own_head or replay.family(info.family).encoder or not getattr(info.config, "use_cache", False):
        return 0
    return 2 * setup.L * rows * setup.kvh * setup.S * setup.hd * dtype_bytes


def encoder_notes(info: Info, plan: Plan) -> list:
    """What the replay of an encoder does not yet follow, said where it applies: LoRA dropout on the attention's
    inputs, whose backward autograd runs while the attention's other grads wait (on tiny BERT twins, measured from
    -2.7% with dropout on ``query`` to +4.3% on ``value``; exact without dropout)."""
    if not (replay.family(info.family).encoder and plan.lora_r and plan.lora_dropout):
        return []
    return [Note(f"LoRA dropout on an encoder ({info.family}): the backward's order around its attention is not "
                 "replayed op for op, so the peak may be a few percent off (exact with lora_dropout=0)",
                 field="lora_dropout", code="encoder-lora-dropout")]


def batch_row_bytes(task: str, seq_len: int, target_len: int = 0) -> int:
    """One row of the batch on the device: input_ids and attention_mask, [S] int64 each, and the labels: [S]
    int64 per token (causal LM, token classification), one int64 per sequence (sequence classification); an
    encoder-decoder's labels and decoder_input_ids, [target_len] int64 each."""
    if target_len:
        return 2 * seq_len * 8 + 2 * target_len * 8
    return 2 * seq_len * 8 + (8 if task == "seq-cls" else seq_len * 8)


def images_bytes(info: Info, plan: Plan) -> int:
    """A vision-language batch's images as its collator holds them (its family's ``images.row_bytes``); on a CPU,
    twice the whole batch: accelerate's data loader fetches the next batch before it yields this one (on a GPU that
    one waits in host memory)."""
    if not plan.images:
        return 0
    images = plan.batch_size * replay.family(info.family).images.row_bytes(info.vision, *plan.images, plan.seq_len)
    return images if plan.device != "cpu" else 2 * images + plan.batch_size * batch_row_bytes(plan.task, plan.seq_len)


def evaluation(info: Info, plan: Plan, setup: replay.Setup, rp, *, held: int, copies: int):
    """``Trainer.evaluate()``'s peak (:func:`kit.estimate.evaluation.eval_peak`) at its own batches' length: from the
    training replay ``rp`` where that is the training length, else from a replay of ``setup`` at it."""
    ev = plan.evaluation
    S, rows = ev["seq_len"], ev["batch_size"]
    if S != setup.S:
        setup = replace(setup, S=S)
        rp = replay.replay(setup)
    return eval_peak(rp, batch=setup.B, eval_batch=rows, seq_len=S, vocab=setup.labels or setup.V, held=held,
                     copies=copies, inputs_per_row=batch_row_bytes(plan.task, S, plan.target_len), gather=ev["gather"],
                     samples=ev["samples"], accumulation=ev["accumulation"], device=plan.device,
                     mixed=bool(plan.half), pooled=plan.task == "seq-cls", blocks=block_forward_bytes(setup, rows),
                     head=info.own_head.eval_bytes(rows, S) if info.own_head else 0,
                     kv_cache=own_head_cache(info, setup, rows, plan.half or plan.load_bytes))


def phases(info: Info, plan: Plan, counts: Counts, setup: replay.Setup, notes: list, loop: dict | None = None,
           expandable: bool = False) -> Estimate:
    """Stage 3: the forward/backward phase, the optimizer step and evaluation; the larger of the first two
    is the peak.

    ``loop``: what a plain PyTorch loop holds beyond Trainer (:class:`~kit.training_setup.TrainingSetup`'s
    ``outputs_kept`` and ``grads_kept``; ``optimizer_before_move`` changes nothing on one device)."""
    loop = loop or {}
    rp = replay.replay(setup)
    g, L = counts.grads, setup.L
    # the model's outputs, held from the forward into the next step's (`outputs = model(**batch)` rebound only when
    # the next forward returns): the logits Trainer lets go at the loss, and the KV cache (config.use_cache), whose
    # k/v sdpa does not save itself where GQA repeats them (one storage otherwise)
    cache = 2 * L * plan.batch_size * plan.seq_len * setup.kvh * setup.hd * (plan.half or plan.load_bytes) \
        if getattr(info.config, "use_cache", False) and setup.kvh != setup.nh else 0
    held_out = rp.last_logits + cache if loop.get("outputs_kept") else 0

    towers = [replay.replay(replace(setup, B=setup.B * rows, S=tokens)) for rows, tokens in plan.towers]   # one each

    def peak(later: bool, **kwargs):   # step 1's forward has no earlier outputs beside it
        found = replay.tower_moments([(r, replay.moments(r, **kwargs), replay.moments(r, **alive)) for r in towers]) \
            if towers else replay.step_moments(rp, replay.moments(rp, **kwargs), later)
        return max((replace(x, logits=x.logits + held_out) if later or x.where.startswith("backward") else x
                    for x in found), key=lambda moment: moment.total)

    fresh = dict(grads_embed=g["embed"], grads_block=g["block"] // rp.L, grads_head=g["head"],
                 wtemp_block=counts.wtemp["block"], wtemp_head=counts.wtemp["head"], head_half=counts.wtemp["head"],
                 tied=counts.moved)
    # every grad alive from the forward on, each new one added in place: gradient accumulation's later
    # micro-batches, and every step after the first where zero_grad(set_to_none=False) keeps the grads
    alive = dict(grads_embed=counts.wnew["embed"], grads_block=0, grads_head=0,
                 wtemp_block=max(counts.wtemp["block"], counts.wnew["block"]), wtemp_head=counts.wnew["head"],
                 grads_before=counts.gradients, head_half=counts.wtemp["head"], tied=counts.moved)
    first, m = peak(False, **fresh), peak(True, **fresh)   # step 1 (no grads before its backward), the later steps
    if plan.grad_accum > 1 and counts.gradients:
        first, m = (max(x, peak(later, **alive), key=lambda moment: moment.total)
                    for x, later in ((first, False), (m, True)))
    if loop.get("grads_kept") and counts.gradients:
        m = max(m, peak(True, **alive), key=lambda moment: moment.total)
    weights = counts.weights + info.buffers_bytes
    inputs = sum(rows * plan.batch_size * batch_row_bytes(plan.task, tokens, plan.target_len)
                 for rows, tokens in plan.towers or ((1, plan.seq_len),)) + images_bytes(info, plan)
    fwdbwd = weights + counts.optimizer + m.total + inputs
    # its step's own, at their highest
    step_temp = optimizers.step_temporaries(plan.optimizer, counts.trained, plan.device)
    # the batch is still alive at the step (Trainer's loop holds it): its images are counted, which on a
    # vision-language model can outweigh the step's other figures' rounding (its token ids, a few KiB, are not)
    step = weights + counts.gradients + counts.optimizer + step_temp + held_out + images_bytes(info, plan)
    ev = evaluation(info, plan, setup, rp, held=weights + counts.optimizer, copies=counts.halves)
    if fwdbwd >= step:
        phase, moment = "forward/backward", m.where
        parts = {"weights": weights, "gradients": m.gradients, "optimizer state": counts.optimizer,
                 "activations": m.activations, "logits & loss": m.logits, "autocast weight copies": m.copies,
                 "temporaries": m.temporaries + inputs}
    else:
        phase = moment = "optimizer step"
        parts = {"weights": weights, "gradients": counts.gradients, "optimizer state": counts.optimizer,
                 "temporaries": step_temp, **({"model outputs held": held_out} if held_out else {})}
    notes = notes + kit_quantization.notes(rp)
    host = replay.host_peak(replay.moments(rp, **fresh)) if rp.layers else 0   # pinned RAM for saved activations
    notes += offload_notes(rp, plan.offload, host, plan.device) if rp.layers else []
    if ev.moment == "forward (a block)":
        notes.append(Note("the evaluation peak is set by the blocks, where the kit counts at most what one block "
                          "saves in training: an upper bound (it is exact where the logits set it)",
                          field="eval_batch_size", code="eval-upper-bound"))
    peak = max(fwdbwd, step)

    def reserve(peak_bytes):   # on first use only: the allocator's model runs over the step laid out as tensors
        if plan.device != "cuda":
            return reserved.Reserved(peak_bytes, 0, expandable, peak_bytes)
        return reserved.reserved(counts.tensors, rp, peak_bytes, inputs=inputs, step_temp=step_temp,
                                 accum=plan.grad_accum, expandable=expandable)

    return Estimate(
        params=counts.params, trainable_params=counts.trainable, weights_bytes=weights,
        gradients_bytes=counts.gradients, optimizer_bytes=counts.optimizer + counts.paged,
        activations_bytes=sum(r.activation_bytes() for r in towers or [rp]),
        logits_bytes=sum(r.logits_bytes() for r in towers or [rp]),
        peak_bytes=peak, first_step_peak_bytes=max(weights + first.total + inputs, step),
        eval_peak_bytes=ev.peak_bytes, eval_moment=ev.moment,
        cpu_build_bytes=counts.build + counts.streamed + info.buffers_bytes, peak_phase=phase, peak_moment=moment,
        loaded_weights_bytes=counts.loaded + info.buffers_bytes, paged_optimizer_bytes=counts.paged,
        autocast_copies_bytes=rp.copies_saved + rp.cache, saved_bytes=sum(r.saved_bytes() for r in towers or [rp]),
        quantized_params=counts.quantized, unquantized_params=counts.unquantized, offloaded_bytes=host,
        offenders=list(counts.top_offenders),
        notes=notes, setup=dict(model=plan.model, batch_size=plan.batch_size, seq_len=plan.seq_len,
                                precision=plan.precision, quantization=plan.quantization, lora_r=plan.lora_r,
                                optimizer=plan.optimizer,
                                optim=optimizers.trainer_optim(plan.optimizer),
                                gradient_checkpointing=plan.gradient_checkpointing, grad_accum=plan.grad_accum,
                                load_dtype=plan.load_dtype, attn_implementation=plan.attn_implementation,
                                kbit_recipe=plan.kbit_recipe, device=plan.device,
                                **plan.bnb.setup(plan.quantization, plan.gradient_checkpointing,
                                                 plan.checkpoint_reentrant),
                                eval_batch_size=plan.evaluation["batch_size"], eval_gather=plan.evaluation["gather"],
                                eval_samples=plan.evaluation["samples"],
                                eval_accumulation_steps=plan.evaluation["accumulation"],
                                **({"eval_seq_len": plan.evaluation["seq_len"]}
                                   if plan.evaluation["seq_len"] != plan.seq_len else {}),
                                expandable_segments=expandable,
                                **({"fused_lm_head": True} if plan.fused_lm_head else {}),
                                **({"liger_kernel": True} if plan.liger_kernels else {}),
                                **plan.offload,   # (only the options that differ from their defaults)
                                **({"adapter_dtype": "bf16"} if plan.adapter_dtype == replay.BF16 else {}),
                                **({"task": plan.task, "num_labels": info.num_labels} if info.classifier else {}),
                                **({"train_head": True} if plan.train_head else {}),
                                **({"use_dora": True} if plan.dora else {}),
                                **({"towers": plan.towers} if plan.towers else {}),
                                **({"images": plan.images} if plan.images else {}),
                                **({"modules_to_save": tuple(sorted(plan.saved_copies))} if plan.saved_copies
                                   else {})),
        _parts=parts,
        context=Context(rp=rp, grads=counts.grads, wtemp=counts.wtemp, moved=counts.moved, inputs=inputs,
                        step_temp=step_temp,
                        L=L, weights=counts.part_weights, opt=counts.part_optimizer, trainable=counts.part_trainable,
                        buffers=info.buffers_bytes, H=setup.H, fwdbwd=fwdbwd, step=step, reserve=reserve,
                        tensors=counts.tensors, wnew=counts.wnew),
        expandable_segments=expandable, options=dict(plan.setup))
