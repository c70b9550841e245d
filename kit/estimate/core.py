"""Predict the memory of one training setup before anything is loaded, and name who eats it.

The model is built once on the meta device (no memory, cached), so parameter counts are
exact, tied weights count once, and the arithmetic below follows the libraries' code:
bitsandbytes for 4-bit/8-bit weights and 8-bit optimizer states, peft for LoRA and
``prepare_model_for_kbit_training``, torch for AdamW, and :mod:`kit.estimate.replay` for what
the forward saves. ``peak_bytes`` predicts ``torch.cuda.max_memory_allocated()`` over a
Trainer step: the larger of the forward/backward phase and the optimizer step, in the steady
state (from the second step, the optimizer state is alive during backward).
``first_step_peak_bytes`` is the first step's: its backward runs before the optimizer has
made its state, which is why step 1 can run and step 2 die. ``eval_peak_bytes`` is
``Trainer.evaluate()``'s during training (:mod:`kit.estimate.evaluation`).

>>> est = estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128, precision="fp16")
>>> est.offenders[0][0], est.peak_moment
('custom_layer', 'backward (head)')
"""
from __future__ import annotations

import dataclasses
import os

from kit import optimizers
from kit.estimate import assembly
from kit.estimate import quantization as kit_quantization
from kit.estimate import replay
from kit.estimate import trl
from kit.estimate.counts import count_parameters
from kit.estimate.inventory import default_targets, info_of
from kit.estimate.offload_options import read as read_offload
from kit.estimate.replay import liger as kit_liger
from kit.estimate.replay import linear_attention, moe
from kit.estimate.result import Estimate
from kit.estimate.strategies import per_gpu
from kit import runtime
from kit.inputs import InputError, Note
from kit.presets import PRESETS
from kit.training_setup import read
from kit.units import fmt_bytes

# A note's code where bitsandbytes' 8-bit optimizer would kill the process (a tensor of 2^31 elements or more)
INT32_OPTIMIZER = "int32-optimizer"

def refuse_other_head(model, info, task, num_labels) -> None:
    """Refuse a ``task`` or ``num_labels`` that contradicts the model's head (a built model's class and its
    classifier say theirs), or ``num_labels`` without a classifier head: never dropped without a word."""
    built = hasattr(model, "named_modules")
    what = f"this {type(model).__name__}" if built else "the model"
    if task is not None and task != info.task:
        raise InputError("task", f"task={task!r} contradicts {what}, a {info.task} model (its class says so): "
                         "build the model with the head you mean (AutoModelForSequenceClassification, "
                         "...ForTokenClassification), or leave task out.", code="task-contradicts-model")
    if num_labels is not None and info.task == "causal-lm":
        raise InputError("num_labels", f"num_labels={num_labels} is for a classifier head, and {what} is a causal "
                         "LM (vocabulary logits): pass task='seq-cls' or 'token-cls' (--task) with it, or leave "
                         "num_labels out.", code="num-labels-without-classifier")
    if num_labels is not None and built and num_labels != info.num_labels:
        raise InputError("num_labels", f"num_labels={num_labels} contradicts {what}, whose classifier gives "
                         f"{info.num_labels} labels: leave num_labels out (the model's head says it).",
                         code="num-labels-contradicts-model")


def estimate(model, **setup) -> Estimate:
    """Predict the memory of training ``model`` with Trainer in this setup. See the module doc.

    ``setup`` holds the options :class:`kit.training_setup.TrainingSetup` declares (``batch_size`` and ``seq_len``
    are needed; the others have its defaults); an unknown name is refused.

    ``precision`` fp16/bf16 is Trainer mixed precision (autocast, weights stay in
    ``load_dtype``). ``load_dtype`` defaults to fp32, or bf16 with quantization.
    ``gradient_checkpointing=None`` keeps the model's default (on for scenario 1 and for
    the k-bit recipe). ``kbit_recipe="standard"`` is ``prepare_model_for_kbit_training``
    (non-quantized weights upcast to fp32); ``"lean"`` skips the upcast. ``padded``: the
    batches have padding, so an attention mask is built. ``device="cpu"`` predicts CPU kernels.

    ``eval_*`` describe ``Trainer.evaluate()`` (see :mod:`kit.estimate.evaluation`): ``eval_batch_size`` is
    ``per_device_eval_batch_size`` (TrainingArguments' default, 8); ``eval_gather`` is "loss" (no
    ``compute_metrics``), "logits" (``compute_metrics``: the logits are gathered) or "preprocessed"
    (``preprocess_logits_for_metrics`` returning one id per token, as ``argmax`` does);
    ``eval_samples`` is ``len(eval_dataset)``; ``eval_seq_len`` the longest eval batch's length (default
    ``seq_len``); ``eval_accumulation_steps`` as in TrainingArguments.

    ``quant_type`` ("nf4"|"fp4"), ``double_quant`` and ``compute_dtype`` are BitsAndBytesConfig's 4-bit
    options (the defaults are the kit's 4bit; BitsAndBytesConfig's own are fp4, no double quant, fp32).
    ``checkpoint_reentrant``: whether the checkpointing is reentrant; None: the k-bit recipe's own
    (``gradient_checkpointing=None``) runs as the installed peft runs it (reentrant before peft 0.22:
    :func:`kit.estimate.quantization.recipe_reentrant`), an explicit one is Trainer's, non-reentrant. It
    matters with 8-bit weights, whose inputs non-reentrant checkpointing cannot free.

    ``strategy`` ("single", "ddp", "fsdp", "fsdp-grad-op", "zero1", "zero2", "zero3"), ``num_gpus`` and
    ``cpu_offload``: the bytes are per GPU, as :mod:`kit.estimate.strategies` models each engine.

    >>> estimate("meta-llama/Meta-Llama-3-8B", batch_size=1, seq_len=512, quantization="4bit",
    ...          lora_r=16).trainable_params
    6815744
    """
    return finished(planned(model, **setup))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Planned:
    """A setup read and counted, not yet replayed (:func:`planned`): what :func:`finished` makes an Estimate of."""

    info: object
    plan: assembly.Plan       # the options as read are its setup
    counts: object
    fused_loss: tuple         # (loss_type, its note) as trl.sft_loss reads them
    read_notes: tuple = ()    # notes made in reading the options (an encoder-decoder's target length assumed)

    @property
    def multi(self) -> tuple:
        """The launch: (strategy, num_gpus, cpu_offload)."""
        return tuple(self.plan.setup[k] for k in ("strategy", "num_gpus", "cpu_offload"))

    @property
    def floor_bytes(self) -> int:
        """A floor under the estimate's peak, known before the replay: the weights and the optimizer state, alive
        through every step after the first (0 across several GPUs, whose shares the strategy decides)."""
        if self.multi[0] != "single":
            return 0
        return self.counts.weights + self.info.buffers_bytes + self.counts.optimizer


def planned(model, **setup) -> Planned:
    """:func:`estimate`'s first stages: the options checked, the model read, the plan made and its parameters
    counted. The fit advisor asks it for :attr:`Planned.floor_bytes` before it replays a candidate."""
    o = read(setup, required=True)
    seq_len, quantization, device = o["seq_len"], o["quantization"], o["device"]
    ev = dict(batch_size=o["eval_batch_size"], gather=o["eval_gather"], samples=o["eval_samples"],
              seq_len=o["eval_seq_len"] or seq_len, accumulation=o["eval_accumulation_steps"])
    if ev["gather"] != "loss" and ev["samples"] is None and ev["accumulation"] is None:
        raise InputError("eval_samples", f"eval_gather={ev['gather']!r} keeps every eval batch's predictions on "
                         "the device until the loop ends: give eval_samples (len(eval_dataset)) or "
                         "eval_accumulation_steps.")
    gpu = read_gpu(o["gpu"], device)
    load_dtype = o["load_dtype"] or ("bf16" if quantization != "none" else "fp32")
    bnb = kit_quantization.options(o)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    task, num_labels = o["task"], o["num_labels"]
    try:
        info = info_of(model, task or "causal-lm", num_labels or 2)
    except ValueError as exc:  # what is wrong is the model: say so, so the CLI can name --model
        exc.name = getattr(exc, "name", None) or "model"
        raise
    refuse_other_head(model, info, task, num_labels)
    target_len, target_notes = read_target_len(info, o["target_len"], seq_len)
    images, image_notes = read_images(info, o, seq_len)
    fused, loss_type, loss_note = trl.sft_loss(o["loss_type"], o["fused_lm_head"])
    refuse_lm_only(info, loss_type=loss_type, padding_free=o["padding_free"])
    if info.max_positions and seq_len > info.max_positions and not o["padding_free"]:
        raise InputError("seq_len", f"seq_len {seq_len} is beyond the model's {info.max_positions} "
                                f"positions: use seq_len <= {info.max_positions}.")
    if info.max_positions and ev["seq_len"] > info.max_positions:
        raise InputError("eval_seq_len", f"eval_seq_len {ev['seq_len']} is beyond the model's "
                                             f"{info.max_positions} positions: use eval_seq_len <= "
                                             f"{info.max_positions}.")
    liger = kit_liger.kernels(info.config, o["liger_kernel_config"], fused_head=fused, device=device,
                              vocab_head=bool(info.vocab_head)) \
        if o["liger_kernel"] else ()
    if not optimizers.ROOM[o["optimizer"]].flat and o["strategy"] != "single":
        raise InputError("optimizer", f"{o['optimizer']} keeps state by each tensor's shape, which a sharded or "
                                          "replicated launch changes, and the kit models it on one GPU: estimate "
                                          "it with strategy='single'.", code="optimizer-one-gpu")
    if (offload := read_offload(o)) and o["strategy"] != "single":
        raise InputError(next(iter(offload)), f"{next(iter(offload))} is modeled on one GPU: estimate it with "
                                                  "strategy='single'.", code="offload-one-gpu")
    plan = assembly.plan(info, o, model=model if isinstance(model, str) else type(model).__name__,
                         load_dtype=load_dtype, evaluation=ev, bnb=bnb, fused_lm_head=fused, liger_kernels=liger,
                         offload=offload, sm=PRESETS[gpu].capability if gpu else None, target_len=target_len,
                         images=images)
    return Planned(info=info, plan=plan, counts=count_parameters(info, plan), fused_loss=(loss_type, loss_note),
                   read_notes=tuple(target_notes + image_notes))


def finished(planned_setup: Planned) -> Estimate:
    """:func:`estimate`'s last stages: the notes, the replay of the family's blocks and the phases."""
    info, plan, counts = planned_setup.info, planned_setup.plan, planned_setup.counts
    o, liger, gpu = plan.setup, plan.liger_kernels, plan.setup["gpu"]
    (loss_type, loss_note), multi = planned_setup.fused_loss, planned_setup.multi
    notes = _notes(plan.optimizer, info.leaves, counts.paged, info, plan.lora_r, plan.quantization) \
        + [loss_note] * bool(loss_note) + kit_liger.notes(liger, plan.evaluation["gather"]) \
        + assembly.encoder_notes(info, plan) + list(planned_setup.read_notes)
    loop = {k: o[k] for k in ("outputs_kept", "grads_kept", "optimizer_before_move")}
    expandable = o["expandable_segments"]
    conf = runtime.allocator_conf() if expandable is None else None   # read as torch reads it; refused as torch would
    expandable = conf.expandable if conf is not None else expandable
    notes += _alloc_conf_notes(conf) if plan.device == "cuda" else []
    notes += moe.notes(info, plan.quantization, plan.kbit_prepared, plan.batch_size, plan.seq_len)
    notes += linear_attention.notes(info, plan.device)
    declared = replay.family(info.family)
    notes += declared.weights_notes(info, plan.load_dtype) if declared.weights_notes else []
    replay_setup = assembly.replay_setup(info, plan)
    if (replay_setup.frozen_below or replay_setup.block_norms_frozen) and multi[0] != "single":
        what = f"blocks 0-{replay_setup.frozen_below - 1} are frozen" if replay_setup.frozen_below else \
            "the blocks' norms are frozen"
        raise InputError("strategy", f"{what}, and the kit replays a frozen bottom or frozen norms on one GPU: "
                         "estimate it with strategy='single'.", code="frozen-blocks-one-gpu")
    est = assembly.phases(info, plan, counts, replay_setup, notes, loop, expandable)
    est = dataclasses.replace(est, setup={
        **est.setup, **attention_assumed(replay_setup, gpu),
        **({"weights_assumed": declared.weights_assumed(plan.load_dtype)} if declared.weights_assumed else {}),
        **({"loss_type": loss_type} if loss_type else {}),   # a TRL config's loss_type (trl.sft_loss)
        **({"liger_kernel_config": dict(o["liger_kernel_config"])} if liger and o["liger_kernel_config"] else {})})
    return per_gpu(est, *multi)  # the same object for one GPU (strategy "single")


def read_images(info, o: dict, seq_len: int) -> tuple:
    """((the vision tower's rows for a batch row, their side), notes) of a vision-language model, from the image
    options (its family's ``images.rows``); ((), []) for a language model, which is given none. ``seq_len`` must
    hold the image tokens."""
    per_row, size, splitting = o["images_per_row"], o["image_size"], o["image_splitting"]
    if info.vision is None:
        given = next((k for k, v in (("images_per_row", per_row), ("image_size", size)) if v is not None), None)
        given = given or (None if splitting else "image_splitting")
        if given:
            raise InputError(given, f"{given} describes a vision-language model's images, and "
                             f"{info.config.model_type} has no vision tower: leave it out.", code="no-images")
        return (), []
    notes = [] if per_row is not None else [Note("1 image a row assumed: pass images_per_row (--images-per-row)",
                                                 field="images_per_row", code="images-assumed")]
    per_row = 1 if per_row is None else per_row
    rows, side, taken, tokens = replay.family(info.family).images.rows(info.vision, per_row, size, splitting)
    if tokens > seq_len:
        raise InputError("seq_len", f"seq_len {seq_len} cannot hold the row's {tokens} image tokens ({per_row} "
                         f"image(s) of {taken} px, {rows} vision tower rows): use a seq_len above {tokens}, or fewer "
                         "or smaller images.", code="images-beyond-seq-len")
    if size is None and replay.family(info.family).images.fixed_size is None:
        notes.append(Note(f"images of {taken} px a side assumed (the processor's resize): pass image_size "
                          "(--image-size)", field="image_size", code="images-assumed"))
    return (rows, side), notes


def read_target_len(info, target_len, seq_len) -> tuple:
    """(the target length, notes): an encoder-decoder's (its config's ``is_encoder_decoder``) as given, else seq_len's
    with a note that says so; refused on any other model, which has no target apart from its sequence."""
    if not getattr(info.config, "is_encoder_decoder", False):
        if target_len is not None:
            raise InputError("target_len", f"target_len is an encoder-decoder's target length, and "
                             f"{info.config.model_type} has one sequence: leave target_len out.",
                             code="target-len-no-decoder")
        return 0, []
    if target_len is not None:
        return target_len, []
    return seq_len, [Note(f"the target length was not given: the decoder's is taken as the source's {seq_len} tokens "
                          "(--target-len, target_len=...)", field="target_len", code="target-len-assumed")]


def read_gpu(gpu, device: str) -> str | None:
    """The GPU preset whose architecture picks SDPA's kernel (None: none given), refused on a CPU's kernels."""
    if gpu is None:
        return None
    if device != "cuda":
        raise InputError("gpu", f"gpu {gpu!r} picks a GPU's attention kernel, and device={device!r} predicts a "
                         "CPU's kernels: leave gpu out, or use device='cuda'.", code="gpu-on-cpu")
    return gpu


def attention_assumed(st, gpu: str | None) -> dict:
    """Where the GPU's architecture changes the figure (torch picks SDPA's math path there, which the kit assumes
    nowhere without one): that GPU and kernel, ``{"gpu": ..., "attention_kernel": "math"}``; else {}."""
    return {"gpu": gpu, "attention_kernel": "math"} if "math" in st.kernels else {}


def _alloc_conf_notes(conf) -> list:
    """A note naming the allocator settings in the environment that the reserved figure's model ignores."""
    if conf is None or not conf.ignored:
        return []
    return [Note(f"{conf.var} sets {', '.join(conf.ignored)}, which the reserved figure's allocator model ignores "
                 f"(it reads {', '.join(runtime.MODELLED_KEYS)} alone): the reserved figure is the allocator's "
                 f"without {'those settings' if len(conf.ignored) > 1 else 'that setting'}",
                 field="expandable_segments", code="alloc-conf-ignored")]


def refuse_lm_only(info, *, loss_type, padding_free: bool) -> None:
    """TRL SFTTrainer's settings for a causal LM, refused on a classifier in one sentence that names the option as
    both faces spell it: ``loss_type`` (its loss through the fused LM head, over the vocabulary) and
    ``padding_free`` (a batch flattened into one row, where a classifier labels each row)."""
    if info.task == "causal-lm":
        return
    if loss_type is not None:
        raise InputError("loss_type", f"loss_type {loss_type!r} is {trl.SftReader.trainer_name}'s loss through "
                         f"its fused LM head, over a causal LM's vocabulary, and this {info.task} model has a "
                         f"classifier head ({info.classifier}) instead: estimate it without loss_type "
                         "(--loss-type).",
                         code="fused-head-classifier")
    if padding_free:
        raise InputError("padding_free", "padding_free flattens a batch into one row of sequences (TRL's "
                         f"{trl.SftReader.trainer_name}, for causal LMs), and this {info.task} model labels each "
                         "row: estimate it without padding_free (--padding-free).", code="padding-free-classifier")


def _notes(optimizer, leaves, paged, info, lora_r, quant) -> list:
    notes = []
    if paged:
        notes.append(Note(f"{fmt_bytes(paged)} of optimizer state is paged (CUDA managed memory): "
                          "outside max_memory_allocated, evicted to RAM under pressure", field="optimizer",
                          code="paged-optimizer"))
    if optimizers.ROOM[optimizer].int32_limit and any(
            l.trainable and not lora_r and optimizers.over_int32(l.weight) for l in leaves):
        notes.append(Note("a trainable tensor has >= 2^31 elements: bitsandbytes 8-bit AdamW kills the process "
                          "on it (ops.cu 'invalid argument'); do not run this", field="optimizer",
                          code=INT32_OPTIMIZER))
    if optimizers.ROOM[optimizer].note:
        notes.append(optimizers.ROOM[optimizer].note)
    said = replay.family(info.family).notes   # what the family's declaration says of its estimates
    notes.extend(said(info.config) if said else [])
    if lora_r:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_targets

        # peft looks up the whole model's type: a vision-language model's, not its language model's
        mt = (info.vision or info.config).model_type
        if mt not in peft_targets:
            notes.append(Note(f"{mt}: peft has no default LoRA targets for it, so LoraConfig needs target_modules "
                              f"(with no lora_targets this estimate takes {', '.join(default_targets(info))})",
                              field="lora_targets", code="no-peft-default-targets"))
    if quant != "none" and info.vocab_head:
        notes.append(f"quantization applies to the {info.config.model_type} base; {', '.join(info.head_layers)} "
                     f"{'stays a' if len(info.head_layers) == 1 else 'stay'} float nn.Linear")
    return notes

