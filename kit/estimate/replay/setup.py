"""What one replay needs: the shapes, dtypes (bytes per element) and flags of a training forward, and
the mark a family's block carries for what its model does outside the blocks (:func:`around`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

F32, HALF, BOOL, I64 = 4, 2, 1, 8


@dataclass
class Setup:
    """What the replay needs: shapes, dtypes (bytes per element) and flags."""

    family: str                  # a key of kit.estimate.replay.FAMILIES: "gpt2", "llama", "phi3", ...
    B: int
    S: int
    H: int
    F: int                       # MLP width
    nh: int
    kvh: int
    hd: int
    V: int
    L: int
    w: int = F32                 # float block weights
    w_other: int = F32           # embeddings, norms, lm_head
    ac: int | None = None        # autocast dtype (HALF) under Trainer fp16/bf16, else None
    base_trainable: bool = True  # full fine-tuning; False: frozen base (LoRA, scenario 1)
    quant: str = "none"          # block linears: "none", "8bit", "4bit"
    compute: int = HALF          # 4-bit layers' compute dtype (BitsAndBytesConfig.bnb_4bit_compute_dtype)
    dequant: int = HALF          # bytes per weight element a 4-bit layer's backward dequantizes into (kit.estimate.quantization)
    reentrant: bool = False      # the checkpointing is reentrant (prepare_model_for_kbit_training's): kit.estimate.quantization
    lora: dict = field(default_factory=dict)  # block linear name ("self_attn.q_proj") -> rank
    lora_dropout: float = 0.0
    input_grad: bool = False     # the embeddings' output requires grad (enable_input_require_grads)
    attn: str = "sdpa"           # "sdpa" or "eager"
    padded: bool = True          # the batch has padding, so an attention mask is built
    ckpt: bool = False           # gradient checkpointing of the blocks
    device: str = "cuda"         # whose kernels: "cuda" (the prediction) or "cpu" (tests)
    p_attn: float = 0.0
    p_resid: float = 0.0
    p_embd: float = 0.0
    head: tuple = ()             # scenario 1: linears on the logits, ((name, out_features), ...) in order:
                                 # (("custom_layer", V),) for the user's Linear(V, V); two for a V->r->V head
    head_w: int = F32
    head_trainable: bool = True
    rotary: int = 0              # rotary dims of a head (partial rotary: GPT-NeoX, Phi-3.5); 0: all hd
    rope_sets: int = 1           # rotary cos/sin pairs made per forward (Gemma-3: one per layer type)
    window: int = 0              # sliding-window attention: the window (0: none) ...
    sliding: int = 0             # ... and how many of the L layers use it
    attn_cap: bool = False       # attention logits soft-capped (Gemma-2): sdpa cannot, so eager runs
    logit_cap: bool = False      # final logits soft-capped (Gemma-2): tanh keeps a (B, S, V) output
    parallel: bool = False       # GPT-NeoX's parallel residual: attention and MLP read the same input
    adapter: int = F32           # LoRA adapters' dtype (TRL casts them to bf16 on a quantized model)
    fused_head: bool = False     # TRL's fused LM head (kit.estimate.replay.fused_head): no (B, S, V) logits

    @property
    def T(self) -> int:
        return self.B * self.S

    @property
    def eager(self) -> bool:
        """The eager attention code runs (asked for, or soft-capped attention, which sdpa cannot do)."""
        return self.attn == "eager" or self.attn_cap

    @property
    def math_attn(self) -> bool:
        """Eager attention, or sdpa's math path (a CPU with attention dropout)."""
        return self.eager or (self.device == "cpu" and self.p_attn > 0)

    def layer_kinds(self) -> dict:
        """{a mask is built: layers}: the blocks differ only in whether their attention gets a mask.

        A mask is built for padded batches; a sliding-window layer (``Setup.sliding``) also
        builds one once S reaches the window (transformers' ``_ignore_causal_mask_sdpa``).
        """
        kinds = {}
        for n, masked in ((self.L - self.sliding, self.padded),
                          (self.sliding, self.padded or 0 < self.window <= self.S)):
            if n:
                kinds[masked] = kinds.get(masked, 0) + n
        return kinds

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


def around(*, final_norm: str, positions: bool = False, embd_dropout: bool = False, embed_scale: bool = False):
    """Mark a family's block function with what its model does outside the blocks.

    ``final_norm``: the :class:`Tape` rule of the norm before the head ("layer_norm",
    "rms_norm", "rms_norm_fp32", "rms_norm_offset"); ``positions``: a learned position
    embedding (it keeps the position ids); ``embd_dropout``: dropout (``Setup.p_embd``) on
    the embeddings' output; ``embed_scale``: the embeddings are multiplied by a scalar
    (Gemma's sqrt(hidden)), a new tensor that keeps nothing but the 0-d scale.
    """
    def mark(block):
        block.final_norm, block.positions, block.embd_dropout = final_norm, positions, embd_dropout
        block.embed_scale = embed_scale
        return block
    return mark
