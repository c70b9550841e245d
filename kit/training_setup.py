"""One declared description of a training setup: every option the estimator takes, in one place.

Each field of :class:`TrainingSetup` carries its name, type, default and help, and, in its metadata, its
command-line flag and whether the fit advisor may change it (``suggest``) or the panel shows it (``panel``).
``estimate()``'s keywords, the ``estimate``/``fit`` flags, the advisor's options and the names in its
``changes``, the panel's setup and the scenarios' settings are all read from here, so a new option is one
field below, plus the code that models it.

>>> TrainingSetup(batch_size=2, seq_len=64).changed()
{'batch_size': 2, 'seq_len': 64}
>>> flag_of("attn_implementation"), "lora_dropout" in KEYWORDS
('--attn', True)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from kit import inputs
from kit.inputs import InputError
from kit import optimizers
from kit.presets import DTYPES, GPU_PRESETS, OPTIMIZERS, QUANTIZATIONS

STRATEGIES = ("single", "ddp", "fsdp", "fsdp-grad-op", "zero1", "zero2", "zero3")
GATHER = ("loss", "logits", "preprocessed")  # what Trainer.evaluate() keeps (kit.estimate.evaluation)
TASKS = ("causal-lm", "seq-cls", "token-cls")  # the head: AutoModelForCausalLM, ...SequenceClassification, ...Token...
_UNSET = dataclasses.MISSING


def option(default, help: str, *, flag: str | None = None, kind=None, choices=None, required: bool = False,
           cli_default=_UNSET, negative: str | None = None, suggest: int = 0, panel: bool = False,
           metavar: str | None = None, minimum: int = 1, read=None):
    """A field of :class:`TrainingSetup`. ``flag``: its command-line option (None: no flag); ``kind``: its type
    (int, float: a fraction, str; ``bool`` is a flag, and a switch on the command line); ``negative``: a flag that
    sets it False; ``cli_default``: the flag's default where it differs (None: filled in later, e.g. from an
    accelerate config); ``suggest``: the fit advisor may change it, and where it comes in a suggestion's
    ``changes`` (1 first); ``panel``: the widget panel holds it; ``minimum``: a whole number's least value;
    ``read``: ``(name, value) -> value``, where the kind and choices do not say how a value is read
    (:func:`read_value`)."""
    return field(default=default, metadata=dict(help=help, flag=flag, kind=kind, choices=choices,
                                                required=required, cli_default=cli_default, negative=negative,
                                                suggest=suggest, panel=panel, metavar=metavar, minimum=minimum,
                                                read=read))


_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _dtype(name: str, value) -> str:
    """A dtype as the kit names it: fp32, fp16, bf16, or torch's name for one (``torch.bfloat16``, ``"float16"``)."""
    return inputs.choice(name, str(value).replace("torch.", ""), DTYPES, _DTYPE_ALIASES)


def _optimizer(name: str, value) -> str:
    """An optimizer as the kit names it, or TrainingArguments.optim's name for one (``adamw_torch``)."""
    return inputs.choice(name, value, optimizers.ROOM, optimizers.BY_OPTIM)


def read_towers(name: str, towers) -> tuple:
    """The ``towers`` option: ``(rows, tokens)`` pairs of whole numbers, refused in one sentence otherwise.

    >>> read_towers("towers", [(1, 16), (2, 64)])
    ((1, 16), (2, 64))
    """
    pairs = tuple(towers or ())
    if not all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        raise InputError(name, f"towers is a tuple of (rows, tokens) pairs, one per forward (rows as a "
                         f"multiple of batch_size), not {towers!r}: e.g. ((1, 16), (2, 64)).", code="towers-pairs")
    return tuple((inputs.whole_number(name, rows), inputs.whole_number(name, tokens)) for rows, tokens in pairs)


@dataclass(frozen=True)
class TrainingSetup:
    """Everything but the model that decides a Trainer step's memory. Values are the kit's names
    (``"fp16"``, ``"4bit"``, ``"adamw-8bit"``); ``estimate(model, **setup.changed())`` predicts it."""

    batch_size: int = option(None, "per-device train batch size", flag="--batch-size", kind=int, required=True,
                             suggest=1, panel=True)
    seq_len: int = option(None, "tokens per sequence", flag="--seq-len", kind=int, required=True, suggest=2,
                          panel=True)
    target_len: int = option(None, "an encoder-decoder's target tokens per sequence (the labels' and "
                             "decoder_input_ids' length; seq_len is the source's); None: seq_len's, said in a note",
                             flag="--target-len", kind=int)
    images_per_row: int = option(None, "a vision-language model's images in each row (None: 1, said in a note); "
                                 "seq_len counts their image tokens among the row's", flag="--images-per-row",
                                 kind=int)
    image_size: int = option(None, "a vision-language model's images' side in pixels after its processor's resize "
                             "(the image processor's size['longest_edge']; square images); None: 4 crops a side, as "
                             "SmolVLM's processors resize, said in a note (Qwen2.5-VL: the side before its resize "
                             "to multiples of 28 px; None: 448)", flag="--image-size", kind=int)
    image_splitting: bool = option(True, "a vision-language model's processor splits each image larger than the "
                                   "vision tower's crop into crops plus a global view (do_image_splitting)",
                                   negative="--no-image-splitting")
    task: str = option(None, "the model's head: causal-lm (AutoModelForCausalLM: vocabulary logits), seq-cls "
                       "(AutoModelForSequenceClassification: batch x labels logits), token-cls "
                       "(AutoModelForTokenClassification: batch x seq x labels); a built model's class says it "
                       "(None: that, else causal-lm)", flag="--task", choices=TASKS, panel=True)
    num_labels: int = option(None, "classes of a seq-cls or token-cls head (config.num_labels; a built model's head "
                             "says it; None: that, else 2); refused with a causal-lm head", flag="--num-labels",
                             kind=int)
    train_head: object = option(None, "with LoRA on a seq-cls or token-cls model: the classifier head trains, as "
                                "peft's modules_to_save copy beside the frozen original (None: as peft's SEQ_CLS and "
                                "TOKEN_CLS task types do it, yes)", kind=bool)
    modules_to_save: tuple = option((), "with LoRA on a causal LM: the input embeddings and the output head (by module "
                                    "name, e.g. ('lm_head', 'embed_tokens')) that train as peft's modules_to_save "
                                    "copies beside their frozen originals; empty: none")
    towers: tuple = option((), "forwards of the model a step whose saved activations add up before one backward, in "
                           "the order they run, each (rows as a multiple of batch_size, tokens): "
                           "sentence-transformers' ((1, 16), (2, 256)) is the anchor column alone at its length, then "
                           "the positive and negative columns merged into one at theirs; empty: one forward",
                           read=read_towers)
    use_dora: bool = option(False, "with LoRA: peft's DoRA (LoraConfig(use_dora=True)): a trained magnitude vector "
                            "per adapted layer and the weight norm its forward computes")
    precision: str = option("fp32", "fp16/bf16 = Trainer mixed precision (weights stay in --load-dtype); default "
                            "fp32, or the --accelerate-config file's mixed_precision", flag="--precision",
                            choices=tuple(DTYPES), cli_default=None, suggest=4, panel=True)
    quantization: str = option("none", "bitsandbytes; 4bit = NF4 + double quant, bf16 compute (see the three "
                               "4-bit options below)", flag="--quantization", choices=tuple(QUANTIZATIONS),
                               suggest=5, panel=True)
    lora_r: int = option(0, "LoRA rank (0: no LoRA)", flag="--lora-r", kind=int, suggest=7, panel=True, minimum=0)
    lora_targets: object = option(None, "comma-separated module names, e.g. q_proj,v_proj (default: peft's for "
                                  "the architecture)", flag="--lora-targets", kind=str, suggest=8,
                                  read=lambda name, value: inputs.targets(value, name))
    optimizer: str = option("adamw-fused", optimizers.choices_help(),
                            flag="--optimizer", kind="optimizer", choices=tuple(OPTIMIZERS), suggest=10,
                            panel=True, read=_optimizer)
    gradient_checkpointing: object = option(None, "checkpoint the blocks (default: the model's own default)",
                                            flag="--gradient-checkpointing", kind=bool,
                                            negative="--no-gradient-checkpointing", suggest=11, panel=True)
    grad_accum: int = option(1, "gradient accumulation steps", flag="--grad-accum", kind=int, suggest=3)
    load_dtype: object = option(None, "dtype the weights load in (default fp32; bf16 for the unquantized parts "
                                "with quantization)", flag="--load-dtype", choices=tuple(DTYPES), suggest=9,
                                read=_dtype)
    attn_implementation: str = option("sdpa", "attention implementation", flag="--attn", choices=("sdpa", "eager"),
                                      suggest=12)
    kbit_recipe: str = option("standard", "standard: peft's prepare_model_for_kbit_training (fp32 upcast); lean: "
                              "no upcast", flag="--kbit-recipe", choices=("standard", "lean"), suggest=6)
    lora_dropout: float = option(0.0, "LoraConfig.lora_dropout (its masks are saved for backward)",
                                 flag="--lora-dropout", kind=float)
    padded: bool = option(True, "batches have no padding (no attention mask is built)", negative="--no-padding")
    device: str = option("cuda", "whose kernels are predicted: cuda, or cpu", choices=("cuda", "cpu"))
    gpu: object = option(None, "the GPU preset the run is judged on (colab-t4, l4, a100-40, a100-80, h100): its "
                         "architecture picks SDPA's attention kernel as torch 2.13 does (read from PyTorch's source, "
                         "not yet measured on a GPU). None: flash / memory-efficient attention assumed",
                         choices=GPU_PRESETS)
    eval_batch_size: int = option(8, "per_device_eval_batch_size, for the evaluation phase (default 8, as "
                                  "TrainingArguments)", flag="--eval-batch-size", kind=int, suggest=13)
    eval_gather: str = option("loss", "what evaluate() keeps: loss (no compute_metrics), logits (compute_metrics), "
                              "preprocessed (preprocess_logits_for_metrics returning one id per token)",
                              flag="--eval-gather", choices=GATHER)
    eval_samples: object = option(None, "len(eval_dataset): gathered logits grow with it", flag="--eval-samples",
                                  kind=int)
    eval_seq_len: object = option(None, "tokens in the longest eval batch's rows, as the collator pads them (None: "
                                  "seq_len)", flag="--eval-seq-len", kind=int)
    eval_accumulation_steps: object = option(None, "move gathered predictions off the GPU every N eval steps",
                                             flag="--eval-accumulation-steps", kind=int, suggest=14)
    quant_type: str = option("nf4", "4-bit: bnb_4bit_quant_type (the same bytes; BitsAndBytesConfig's own default "
                             "is fp4)", flag="--quant-type", choices=("nf4", "fp4"))
    double_quant: bool = option(True, "4-bit: bnb_4bit_use_double_quant=False (each block's scale in 4 bytes, not "
                                "1)", negative="--no-double-quant")
    compute_dtype: str = option("bf16", "4-bit: bnb_4bit_compute_dtype (BitsAndBytesConfig's own default is fp32)",
                                flag="--compute-dtype", choices=tuple(DTYPES), read=_dtype)
    checkpoint_reentrant: object = option(None, "whether checkpointing is reentrant (None: only the k-bit "
                                          "recipe's own, and that before peft 0.22 only)", kind=bool)
    strategy: str = option("single", "single (default), ddp, fsdp (FULL_SHARD / reshard_after_forward), "
                           "fsdp-grad-op (SHARD_GRAD_OP), zero1, zero2, zero3 (DeepSpeed)", flag="--strategy",
                           choices=STRATEGIES, cli_default=None)
    num_gpus: int = option(1, "GPUs the run is spread over (default 1)", flag="--num-gpus", kind=int,
                           cli_default=None)
    fused_lm_head: bool = option(False, "TRL's SFT trainer: the LM head computes the labels' log-probs in tiles "
                                 "(add_fused_lm_head), never the (batch, seq, vocab) logits")
    liger_kernel: bool = option(False, "TrainingArguments.use_liger_kernel: Liger-Kernel's RMSNorm, SwiGLU, RoPE and "
                                "fused linear cross-entropy (no (batch, seq, vocab) logits; TRL's SFT trainer keeps "
                                "its own fused head), counted from Liger 0.8.2's source, not yet measured on a GPU",
                                flag="--liger-kernel", kind=bool,
                                suggest=17)
    liger_kernel_config: object = option(None, "TrainingArguments.liger_kernel_config: which Liger kernels run, e.g. "
                                         "{'rope': False} (None: Liger's defaults for the model type)")
    padding_free: bool = option(False, "the micro-batch is ONE flattened row of sequences (TRL's padding_free / "
                                "bfd packing): batch_size 1, seq_len its tokens; position ids restart per sequence, "
                                "so seq_len may pass the model's positions", flag="--padding-free", kind=bool,
                                suggest=15)
    loss_type: object = option(None, "TRL's SFT trainer's loss_type (TRL 1.16): nll or dft, both from its "
                               "fused LM head (log-probs in tiles, no (batch, seq, vocab) logits); chunked_nll is "
                               "TRL's deprecated alias of nll (the same bytes). Unset: Trainer's loss on the full "
                               "logits", flag="--loss-type", choices=("nll", "dft", "chunked_nll"))
    adapter_dtype: str = option("fp32", "the LoRA adapters' dtype: fp32 (peft's autocast_adapter_dtype), bf16 (TRL's "
                                "SFT trainer casts them on a quantized model)", choices=("fp32", "bf16"))
    input_require_grads: object = option(None, "enable_input_require_grads ran (its hook makes the embeddings' "
                                         "output require grad, so block 1 saves for it): None as the libraries "
                                         "do it, with checkpointing (the k-bit recipe's too); estimate_trainer reads "
                                         "the hook off the model")
    outputs_kept: bool = option(False, "a plain loop's `outputs = model(**batch)` held through loss.backward(): its "
                                "logits (and, with config.use_cache, its KV cache) stay alive through the backward, "
                                "where Trainer lets them go at the loss", flag="--outputs-kept", kind=bool)
    grads_kept: bool = option(False, "optimizer.zero_grad(set_to_none=False): the gradients stay allocated (zeros) "
                              "through the next step's forward, and its backward adds into them (step 1 has none "
                              "yet, so only the later steps change)", flag="--grads-kept", kind=bool)
    optimizer_before_move: bool = option(False, "the optimizer was built before model.to(device): on one device this "
                                         "changes nothing (.to() moves each Parameter in place, so the optimizer "
                                         "holds the moved ones, and makes its state at its first step, on their "
                                         "device): the estimate is the default's", flag="--optimizer-before-move",
                                         kind=bool)
    expandable_segments: object = option(None, "the CUDA caching allocator's expandable_segments (set by "
                                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts): it "
                                         "changes the reserved estimate, not the allocated peak. Unset: read from "
                                         "the environment", flag="--expandable-segments", kind=bool, suggest=16)
    cpu_offload: bool = option(False, "fsdp: offload parameters (CPUOffloadPolicy); zero: offload the optimizer "
                               "(zero3: and params)", flag="--cpu-offload", kind=bool, cli_default=None)
    ckpt_every_n_layers: int = option(1, "with gradient checkpointing, checkpoint only blocks 1, n+1, 2n+1, ... "
                                      "(activation_checkpointing_kwargs every_n_layers); the others keep all they "
                                      "save", flag="--ckpt-every-n-layers", kind=int, suggest=18)
    checkpoint_offload: bool = option(False, "with gradient checkpointing, hold each checkpointed block's input in "
                                      "pinned host memory (activation_checkpointing_kwargs offload=True: "
                                      "save_on_cpu); offloaded_bytes counts it", flag="--checkpoint-offload",
                                      kind=bool, suggest=19)
    activation_offloading: bool = option(False, "TRL's SFT config's activation_offloading over checkpointed blocks: "
                                         "block inputs and the head's saved tensors go to pinned host memory "
                                         "(offloaded_bytes), tensors under 1 KiB and the last five stay",
                                         flag="--activation-offloading", kind=bool, suggest=20)

    def changed(self) -> dict:
        """The options that differ from their defaults, as ``estimate()`` keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def panel_values(self) -> dict:
        """The options the widget panel holds (:data:`PANEL`), with this setup's values."""
        return {k: getattr(self, k) for k in PANEL}


FIELDS = {f.name: f for f in fields(TrainingSetup)}
KEYWORDS = tuple(FIELDS)                                                     # estimate()'s keywords, model aside
DEFAULTS = {k: f.default for k, f in FIELDS.items()}
SUGGESTED = tuple(sorted((k for k, f in FIELDS.items() if f.metadata["suggest"]),  # what the fit advisor may change,
                         key=lambda name: FIELDS[name].metadata["suggest"]))  # in the order its changes list them
PANEL = tuple(k for k, f in FIELDS.items() if f.metadata["panel"])           # what the widget panel holds


def declared(**given) -> dict:
    """``given``, checked against the declaration: a scenario's own settings, refused by name if one is not an
    option.

    >>> declared(batch_size=1, seq_len=128)
    {'batch_size': 1, 'seq_len': 128}
    """
    options(given)
    return given


def flag_of(name: str) -> str | None:
    """The command-line option that sets ``name`` (its switch-off flag where it has only that)."""
    f = FIELDS.get(name)
    return None if f is None else f.metadata["flag"] or f.metadata["negative"]


def options(given: dict, *, required: bool = False) -> dict:
    """``given`` with every other option at its default; an unknown name is refused, naming the known ones.

    >>> options({"batch_size": 1, "seq_len": 8})["optimizer"]
    'adamw-fused'
    """

    unknown = sorted(set(given) - set(FIELDS))
    if unknown:
        raise InputError(unknown[0], f"unknown setup option{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(unknown)}: the options are {', '.join(KEYWORDS)}.")
    missing = [k for k, f in FIELDS.items() if required and f.metadata["required"] and given.get(k) is None]
    if missing:
        raise InputError(missing[0], f"{', '.join(missing)} must be given.")
    return {**DEFAULTS, **given}


def read(given: dict, *, required: bool = False) -> dict:
    """``given`` as the estimator reads it: every other option at its default (:func:`options`), each value checked
    and put in the kit's form by its declaration (:func:`read_value`).

    >>> o = read({"batch_size": "8", "seq_len": 64.0, "precision": "BF16", "optimizer": "adamw_torch"})
    >>> o["batch_size"], o["seq_len"], o["precision"], o["optimizer"], o["load_dtype"]
    (8, 64, 'bf16', 'adamw', None)
    """
    return {name: read_value(name, value) for name, value in options(given, required=required).items()}


def read_value(name: str, value):
    """``value`` of option ``name``, checked and in the kit's form, as its field declares: its own ``read``, else one
    of its choices, a whole number (at least its ``minimum``), a fraction (``float``) or a flag (``bool``); None stays
    None where it is the default (the model's own, or a default decided later); other options as given, checked where
    they are modelled.

    >>> read_value("lora_r", "0"), read_value("padded", "no"), read_value("gradient_checkpointing", None)
    (0, False, None)
    """
    f = FIELDS[name]
    meta = f.metadata
    if value is None and f.default is None:
        return None
    if meta["read"]:
        return meta["read"](name, value)
    if meta["choices"]:
        return inputs.choice(name, value, meta["choices"])
    if meta["kind"] is int:
        return inputs.whole_number(name, value, minimum=meta["minimum"])
    if meta["kind"] is float:
        return inputs.fraction(name, value)
    if meta["kind"] is bool or isinstance(f.default, bool):
        return inputs.flag(name, value, allow_none=f.default is None)
    return value


def add_arguments(parser, optimizer_type=None) -> None:
    """Add one flag per declared option (in declaration order) to an argparse parser: what ``estimate`` and
    ``fit`` take. ``optimizer_type`` reads ``--optimizer`` (the TrainingArguments.optim aliases)."""
    for name, f in FIELDS.items():
        m = f.metadata
        default = f.default if m["cli_default"] is _UNSET else m["cli_default"]
        if m["kind"] is bool and m["flag"]:
            parser.add_argument(m["flag"], dest=name, action="store_true", default=default, help=m["help"])
        elif m["flag"]:
            kind = optimizer_type if m["kind"] == "optimizer" else m["kind"]
            extra = {"type": kind} if kind else {}
            extra |= {"choices": list(m["choices"])} if m["choices"] else {}
            extra |= {"required": True} if m["required"] else {"default": default}
            parser.add_argument(m["flag"], dest=name, help=m["help"], metavar=m["metavar"], **extra)
        if m["negative"]:
            what = "turn it off even where the model's default is on" if m["flag"] else m["help"]
            parser.add_argument(m["negative"], dest=name, action="store_false", help=what,
                                **({} if m["flag"] else {"default": default}))


def from_arguments(args) -> dict:
    """estimate()'s keywords from parsed ``estimate``/``fit`` flags: every declared option that has a flag."""
    return {k: getattr(args, k) for k, f in FIELDS.items() if (f.metadata["flag"] or f.metadata["negative"])
            and hasattr(args, k)}
