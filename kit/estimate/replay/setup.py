"""What one replay needs: the shapes, dtypes and flags of a training forward, and the mark a family's
block carries for what its model does outside the blocks (:func:`around`).

A dtype is a :class:`Dt`: its bytes per element as an ``int`` (so every byte count stays plain arithmetic),
and its name, which equality compares, so bf16 and fp16 (both 2 bytes) are different dtypes, as torch has
them: a bf16 weight under fp16 autocast gets an fp16 copy, and bf16 + fp16 promotes to fp32
(:func:`promote`).

>>> BF16 == FP16, BF16 == 2, BF16 * 3, promote(BF16, FP16), promote(FP16, FP16), promote(BOOL, BF16)
(False, True, 6, fp32, fp16, bf16)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit.estimate.replay.kernels import sdpa_kernel


class Dt(int):
    """A dtype: ``int(dt)`` is its bytes per element; two :class:`Dt` are equal when their names are.

    Arithmetic gives plain ints (bytes). Against a plain int it compares as its width (a byte count);
    its hash is the int's, so a ``Dt`` and the int it equals hash alike.
    """

    name: str

    def __new__(cls, name: str, nbytes: int):
        d = super().__new__(cls, nbytes)
        d.name = name
        return d

    def __eq__(self, other):
        if self is other:   # (the common case, and the estimate's hot loops compare dtypes often)
            return True
        if isinstance(other, Dt):
            return self.name == other.name
        return int(self) == other

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = int.__hash__

    def __repr__(self):
        return self.name

    def __reduce__(self):
        return Dt, (self.name, int(self))


FP32, BF16, FP16, BOOL, I64 = Dt("fp32", 4), Dt("bf16", 2), Dt("fp16", 2), Dt("bool", 1), Dt("int64", 8)
F32 = FP32                 # (the name the op rules use)
FLOATS = (FP32, BF16, FP16)
DTYPE_OF = {d.name: d for d in (FP32, BF16, FP16, BOOL, I64)}


def dtype(name) -> Dt:
    """The :class:`Dt` of a kit dtype name ("fp32", "bf16", "fp16"), or of a Dt (itself)."""
    return name if isinstance(name, Dt) else DTYPE_OF[name]


def promote(a: Dt, b: Dt) -> Dt:
    """The dtype torch gives an op of two tensors (``torch.promote_types``, for these dtypes): the wider float;
    bf16 with fp16 makes fp32 (neither holds the other); a bool or integer tensor takes the float's dtype."""
    if a == b:
        return a
    fa, fb = (isinstance(t, Dt) and t in FLOATS for t in (a, b))
    if fa != fb:  # one float, one not
        return a if fa else b
    if int(a) == int(b):  # bf16 and fp16
        return FP32
    return a if int(a) > int(b) else b


@dataclass
class Setup:
    """What the replay needs: shapes, dtypes (:class:`Dt`: bytes per element, and which dtype) and flags."""

    family: str                  # a model type a family declares (kit.estimate.replay.families): its registry key
    B: int
    S: int
    H: int
    F: int                       # MLP width
    nh: int
    kvh: int
    hd: int
    V: int
    L: int
    w: Dt = FP32                 # float block weights
    w_other: Dt = FP32           # embeddings, norms, lm_head
    ac: Dt | None = None         # autocast dtype (FP16 or BF16) under Trainer fp16/bf16, else None
    base_trainable: bool = True  # full fine-tuning; False: frozen base (LoRA, scenario 1)
    embed_frozen: bool = False   # full fine-tuning with the input embeddings frozen: they save nothing
    frozen_below: int = 0        # ... and blocks 0..k-1 frozen too, with no input grad: they run as under no_grad
    #                              (save nothing, their outputs are transient); the replay covers blocks k..L-1
    lm_head_frozen: bool = False  # full fine-tuning with the LM head frozen (tied to frozen embeddings): its input
    #                               is not saved for a weight grad
    final_norm_frozen: bool = False  # ... the norm before the head frozen
    block_norms_frozen: bool = False  # ... every replayed block's norms frozen, its other weights trained: a norm
    #                                   keeps no normalized input for its weight's grad (:attr:`norms_train`)
    quant: str = "none"          # block linears: "none", "8bit", "4bit"
    compute: Dt = BF16           # 4-bit layers' compute dtype (BitsAndBytesConfig.bnb_4bit_compute_dtype)
    dequant: int = 2             # bytes per weight element a 4-bit layer's backward dequantizes into
    #                              (kit.estimate.quantization)
    reentrant: bool = False      # the checkpointing is reentrant (the k-bit recipe's before peft 0.22, or asked):
    #                              kit.estimate.quantization
    lora: dict = field(default_factory=dict)  # block linear name ("self_attn.q_proj") -> rank
    lora_dropout: float = 0.0
    input_grad: bool = False     # the embeddings' output requires grad (enable_input_require_grads)
    attn: str = "sdpa"           # "sdpa" or "eager"
    padded: bool = True          # the batch has padding, so an attention mask is built
    ckpt: bool = False           # gradient checkpointing of the blocks
    device: str = "cuda"         # whose kernels: "cuda" (the prediction) or "cpu" (tests)
    sm: tuple | None = None      # the GPU's compute capability: SDPA's kernel as torch 2.13 picks it there
    #                              (.kernels); None: not known, flash / memory-efficient assumed
    kernels: set = field(default_factory=set, compare=False, repr=False)  # the SDPA kernels the blocks took
    #                              (:meth:`sdpa_kernel`, recorded by the tape's attention)
    p_attn: float = 0.0
    p_resid: float = 0.0
    p_embd: float = 0.0
    head: tuple = ()             # scenario 1: linears on the logits, ((name, out_features), ...) in order:
                                 # (("custom_layer", V),) for the user's Linear(V, V); two for a V->r->V head
    head_w: Dt = FP32
    head_trainable: bool = True
    rotary: int = 0              # rotary dims of a head (partial rotary: GPT-NeoX, Phi-3.5); 0: all hd
    rope_sets: int = 1           # rotary cos/sin pairs made per forward (Gemma-3: one per layer type)
    window: int = 0              # sliding-window attention: the window (0: none) ...
    sliding: int = 0             # ... and how many of the L layers use it
    first_sliding: bool = False  # ... and whether the first layer is one of them (its layer_types[0])
    attn_cap: bool = False       # attention logits soft-capped (Gemma-2): sdpa cannot, so eager runs
    logit_cap: bool = False      # final logits soft-capped (Gemma-2): tanh keeps a (B, S, V) output
    parallel: bool = False       # GPT-NeoX's parallel residual: attention and MLP read the same input
    adapter: Dt = FP32           # LoRA adapters' dtype (TRL casts them to bf16 on a quantized model)
    dora: bool = False           # ... as peft's DoRA (a magnitude vector per layer: Tape.dora)
    fused_head: bool = False     # TRL's fused LM head (kit.estimate.replay.fused_head): no (B, S, V) logits
    liger: tuple = ()            # Liger's kernels that run: "rope", "rms_norm", "swiglu", "flce" (.liger)
    ckpt_every: int = 1          # with ckpt: only blocks whose index % ckpt_every == 0 are checkpointed
    ckpt_offload: bool = False   # with ckpt: save_on_cpu around each checkpointed block (kit.estimate.replay.offload)
    trl_offload: bool = False    # TRL's OffloadActivations around the step (kit.estimate.replay.trl_offload)
    sliding_at: tuple = ()       # indices of the sliding-window layers where only some are (config.layer_types)
    task: str = "causal-lm"      # the head: "causal-lm" (lm_head, V logits), "seq-cls", "token-cls" (.task_heads)
    labels: int = 0              # a classifier head's classes (its Linear's out_features)
    head_trains: bool = False    # ... its Linear trains (full fine-tuning, or peft's modules_to_save copy)
    embed_trains: bool = False   # with LoRA: peft's modules_to_save copy of the input embeddings trains
    lm_head_trains: bool = False  # ... and of the LM head (its input is saved for the weight's grad)
    p_head: float = 0.0          # ... the dropout before it (token classification)
    pooling: str = "cls"         # ... a sequence's pooling before it: "cls" or "mean" (ModernBERT's config)
    rel_span: int = 0            # DeBERTa's relative attention: its span (position_buckets), 2 x span table rows
    rel_att: tuple = ()          # ... its disentangled terms ("c2p", "p2c")
    rel_share: bool = True       # ... the table through the content projections (share_att_key), else its own
    experts: int = 0             # mixture-of-experts blocks (kit.estimate.replay.moe): experts per layer (0: dense)
    top_k: int = 0               # ... experts each token is routed to
    moe_F: int = 0               # ... one expert's MLP width
    norm_topk: bool = False      # ... the top-k routing weights renormalized to sum to 1 (norm_topk_prob)
    shared_F: int = 0            # ... a shared expert's MLP width beside the routed ones (Qwen3.5-MoE; 0: none)
    weights_fp32: bool = False   # ... the routing weights stay fp32 (Mixtral's), not cast to the router logits' dtype
    linear_at: tuple = ()        # indices of the Gated DeltaNet (linear-attention) layers (Qwen3.5's layer_types)
    linear_heads: tuple = ()     # ... their (key heads, value heads) (kit.estimate.replay.linear_attention)
    linear_dims: tuple = ()      # ... their (key head dim, value head dim)
    conv_kernel: int = 0         # ... their short causal convolution's kernel
    vision: tuple = ()           # a vision-language model: its vision tower's shapes and the batch's images, as its
    #                              family declares them (Family.images); S counts the image tokens among the text's
    S_dec: int = 0               # an encoder-decoder (T5): the target length (S is the source's) ...
    L_dec: int = 0               # ... the decoder's blocks (L: the encoder's)
    gated: bool = False          # ... its feed-forward is gated (wi_0, wi_1)
    act: str = "gelu_new"        # ... its feed-forward's activation
    buckets: int = 0             # ... its relative position buckets (the bias: buckets x heads per stack)
    own: tuple = ()              # a head of the user's own (kit.estimate.own_head): its saved bytes per token, per
                                 # row and once, and its logits' bytes per row; () for a transformers head

    @property
    def T(self) -> int:
        return self.B * self.S

    @property
    def norms_train(self) -> bool:
        """A block's norms train: full fine-tuning, unless :attr:`block_norms_frozen` (a family whose declaration
        says ``frozen_norms`` reads this for its blocks' norms)."""
        return self.base_trainable and not self.block_norms_frozen

    @property
    def eager(self) -> bool:
        """The eager attention code runs (asked for, or soft-capped attention, which sdpa cannot do)."""
        return self.attn == "eager" or self.attn_cap

    @property
    def math_attn(self) -> bool:
        """Eager attention, or sdpa's math path (a CPU with attention dropout)."""
        return self.eager or (self.device == "cpu" and self.p_attn > 0)

    def sdpa_kernel(self, masked: bool, dt: Dt) -> str | None:
        """The kernel CUDA's SDPA runs for a block's attention (:mod:`.kernels`), its inputs ``dt`` before autocast
        and a mask passed or not; None: eager, a CPU, or no GPU architecture known. transformers passes
        ``enable_gqa`` (fewer key/value heads) only without a mask; with one it has copied k and v (``repeat_kv``)."""
        if self.eager or self.device != "cuda":
            return None
        gqa = not masked and self.kvh != self.nh and self.hd <= 256
        return sdpa_kernel(self.sm, (self.ac or dt).name, masked, gqa, self.hd, self.p_attn)

    def math_path(self, masked: bool, dt: Dt) -> bool:
        """Attention saves the probabilities: :attr:`math_attn`, or SDPA's math path on this GPU."""
        return self.math_attn or self.sdpa_kernel(masked, dt) == "math"

    @property
    def fla(self) -> bool:
        """The linear-attention layers run flash-linear-attention's kernels (CUDA), not transformers' reference
        PyTorch path (a CPU)."""
        return self.device == "cuda"

    def layer_kinds(self) -> dict:
        """{a mask is built: layers}: the blocks differ only in whether their attention gets a mask.

        A mask is built for padded batches; a sliding-window layer (``Setup.sliding``) also
        builds one once S reaches the window (transformers' ``_ignore_causal_mask_sdpa``).
        """
        kinds = {}
        full, sliding = self.L - self.sliding, self.sliding
        # a frozen prefix is not replayed; its blocks are of the one kind all blocks are (others are refused:
        # kit.estimate.assembly.frozen_prefix)
        full, sliding = (full - self.frozen_below, sliding) if full else (full, sliding - self.frozen_below)
        for n, masked in ((full, self.padded), (sliding, self.padded or 0 < self.window <= self.S)):
            if n:
                kinds[masked] = kinds.get(masked, 0) + n
        return kinds

    def first_masked(self) -> bool:
        """Whether the first block's attention gets a mask (the rule of :meth:`layer_kinds`, for its layer type)."""
        sliding = self.sliding and (self.first_sliding or self.sliding == self.L)
        return self.padded or bool(sliding and 0 < self.window <= self.S)

    def kept_masks(self, dt: int) -> int:
        """Bytes of the masks that checkpointing keeps for the recompute (one per layer type used).

        Eager builds a float mask in the embeddings' dtype ``dt``; sdpa a bool one, when it
        builds one at all.
        """
        full, slid = self.L - self.sliding, self.sliding
        one = self.B * self.S * self.S
        if self.eager:
            return one * dt * ((full > 0) + (slid > 0))
        return one * BOOL * ((full > 0 and self.padded) + (slid > 0 and (self.padded or 0 < self.window <= self.S)))


@dataclass(frozen=True)
class Covers:
    """The transformers classes a family's replay follows op for op, by class name (``__qualname__``, defined in
    ``transformers.models``): its decoder (or encoder) layer, the attention and MLP modules inside it and the
    norms it holds (and their parts: BERT's ``BertSelfAttention``, ``BertIntermediate``, ...); and the
    ``config.layer_types`` it replays. A model is estimated by a family only when every block is one of
    ``blocks`` and every class of transformers' modeling code inside it is one of these
    (:func:`kit.estimate.inventory.check_blocks`); torch's, peft's, bitsandbytes' layers and transformers'
    activations are the tape's op rules, taken as they are."""

    blocks: tuple
    attention: tuple
    mlp: tuple
    norms: tuple = ()
    layer_types: tuple = ("full_attention", "sliding_attention")

    @property
    def classes(self) -> frozenset:
        return frozenset(self.blocks + self.attention + self.mlp + self.norms)


def around(*, covers: Covers, final_norm: str | None, positions: bool = False, embd_dropout: bool = False,
           embed_scale: bool = False, embed_norm: bool = False, id_rows: int = 0,
           first_layer: bool = False, embed_mask: bool = False):
    """Mark a family's block function with the classes it covers (:class:`Covers`) and with what its model does
    outside the blocks.

    ``final_norm``: the :class:`Tape` rule of the norm before the head ("layer_norm",
    "rms_norm", "rms_norm_fp32", "rms_norm_offset"); ``positions``: a learned position
    embedding (it keeps the position ids); ``embd_dropout``: dropout (``Setup.p_embd``) on
    the embeddings' output; ``embed_scale``: the embeddings are multiplied by a scalar
    (Gemma's sqrt(hidden)), a new tensor that keeps nothing but the 0-d scale; ``embed_norm``: a LayerNorm on the
    embeddings' sum, before their dropout (BERT's); ``final_norm=None``: none before the head (post-norm blocks);
    ``id_rows``: (B, S) int64 tensors the embeddings make and keep besides the input ids (RoBERTa's position ids
    and token types); ``first_layer``: block 1 differs from the others (ModernBERT's layer 0 has no attention norm):
    it is replayed alone, with ``Tape.first`` set; ``embed_mask``: the normed embeddings are multiplied by the
    attention mask made float, a (B, S, 1) tensor the mul keeps (DeBERTa's).
    """
    def mark(block):
        block.final_norm, block.positions, block.embd_dropout = final_norm, positions, embd_dropout
        block.embed_scale, block.embed_norm, block.id_rows = embed_scale, embed_norm, id_rows
        block.first_layer, block.embed_mask, block.covers = first_layer, embed_mask, covers
        return block
    return mark
