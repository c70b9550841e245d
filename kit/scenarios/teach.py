"""Workshop helpers: a learner's guess set beside the answer, and the words before the numbers.

- :func:`guess_text`: "you guessed X GiB, the estimate says Y": the reveal of a prediction cell;
  :func:`answer_text` the same for an exact answer (a count, True or False, a name).
- :func:`glossary_markdown` / :func:`glossary`: every bar of a breakdown, the counters, GB against
  GiB, and the bytes each parameter costs, computed by the kit's own arithmetic
  (:mod:`kit.presets`), never typed in.

>>> print(guess_text(4, 52 * 2**30, "the ESTIMATED peak"))
Your guess: 4.00 GiB. The ESTIMATED peak: 52.00 GiB, 13.0x your guess: far off: read on.
"""
from __future__ import annotations

import math

from kit.presets import int8_bytes, nf4_bytes, optimizer_state_bytes
from kit.units import GiB, fmt_bytes, wrapped


@wrapped
def guess_text(my_guess_gib, actual_bytes: int, what: str = "the answer") -> str:
    """The learner's guess (in GiB, as written in a prediction cell) beside the answer, in one line.

    ``my_guess_gib`` left at None says so: a reading of the answer with no guess to learn from.

    >>> print(guess_text(None, 2**30, "the ESTIMATED peak"))
    No guess written yet. The ESTIMATED peak: 1.00 GiB. Next time, write a number first.
    >>> print(guess_text(1.1, 2**30, "the ESTIMATED peak"))
    Your guess: 1.10 GiB. The ESTIMATED peak: 1.00 GiB, 0.91x your guess: close.
    """
    answer = f"{what[:1].upper()}{what[1:]}: {fmt_bytes(actual_bytes)}"
    if my_guess_gib is None:
        return f"No guess written yet. {answer}. Next time, write a number first."
    if isinstance(my_guess_gib, bool) or not isinstance(my_guess_gib, (int, float)) or \
            not math.isfinite(my_guess_gib) or my_guess_gib <= 0:
        raise ValueError(f"my_guess_gib must be a number of GiB above 0, such as 4 or 0.5, not {my_guess_gib!r}.")
    ratio = actual_bytes / (my_guess_gib * GiB)
    close = 0.8 <= ratio <= 1.25
    verdict = "close" if close else ("far off: read on" if ratio > 1
                                     else "far off: less than you thought")
    return (f"Your guess: {fmt_bytes(my_guess_gib * GiB)}. {answer}, {ratio:.{2 if close else 1}f}x your guess: "
            f"{verdict}.")


@wrapped
def answer_text(my_answer, actual, what: str = "the answer") -> str:
    """A learner's exact answer (a count, True/False, a name) beside the one the kit computed or measured.

    >>> print(answer_text(1, 2, "the MEASURED count of models"))
    Your answer: 1. The MEASURED count of models: 2. Not this time: see below why.
    >>> print(answer_text(None, True, "the guard's result"))
    No answer written yet. The guard's result: True.
    """
    said = f"{what[:1].upper()}{what[1:]}: {actual}"
    if my_answer is None:
        return f"No answer written yet. {said}."
    return f"Your answer: {my_answer}. {said}. " + ("Right." if my_answer == actual else "Not this time: see below why.")


def bytes_per_parameter() -> list[tuple[str, float, str]]:
    """``(what, bytes per parameter, where it comes from)``, computed by the kit (a 4096 x 4096 layer
    for the quantized formats, where the per-block scales show).

    >>> dict((w, b) for w, b, _ in bytes_per_parameter())["fp16 / bf16 weight"]
    2.0
    """
    n = 4096 * 4096
    adam, _ = optimizer_state_bytes("adamw", n, 4)
    adam8, _ = optimizer_state_bytes("adamw-8bit", n, 4)
    return [("fp32 weight", 4.0, "torch.float32"),
            ("fp16 / bf16 weight", 2.0, "half precision"),
            ("int8 weight (bitsandbytes 8-bit)", int8_bytes(4096, 4096) / n, "1 byte + a scale per row"),
            ("NF4 weight (4-bit, double quant)", nf4_bytes(n) / n, "half a byte + its block scales"),
            ("gradient of an fp32 trainable weight", 4.0, "same size as the weight"),
            ("AdamW state of an fp32 weight", adam / n, "two moments, fp32 each"),
            ("8-bit AdamW state", adam8 / n, "two moments, 1 byte each + scales")]


GLOSSARY = """\
**Words before numbers.** The kit's breakdowns use these words; each bar of a breakdown is one of them.

| word | what it means |
|---|---|
| **weights** | the model's parameters, as they sit in memory (their dtype decides the bytes) |
| **gradients** | one tensor per *trainable* weight, filled by the backward pass; frozen weights have none |
| **optimizer state** | what the optimizer keeps per trainable weight: AdamW two moments, SGD with momentum one |
| **activations** | what the forward pass saves for the backward: grows with batch x sequence length |
| **logits** | the output scores, batch x sequence x vocabulary, with the loss's fp32 copies: large for big vocabularies |
| **temporaries** | tensors that live only inside one operation (an upcast copy, a matmul's workspace) |
| **autocast weight copies** | under mixed precision, a 16-bit copy of each fp32 weight made for the forward pass |
| **allocated** | bytes held by live tensors (`torch.cuda.memory_allocated`): what runs out first |
| **reserved** | allocated + the caching allocator's spare blocks (`memory_reserved`); `empty_cache()` returns only the spare |
| **NVML** | the driver's count (what `nvidia-smi` shows): reserved + the CUDA context and the libraries' kernels |
| **RSS** | the process's CPU RAM in use (resident set size): what Colab's RAM bar shows |
| **live-tensor bytes** | on a CPU, the kit counts the bytes of every live tensor: its stand-in for *allocated* |
| **GB and GiB** | 1 GB = 10^9 bytes; 1 GiB = 2^30 bytes = {gib_in_gb:.3f} GB. The kit says GiB; "about 4 GB" is {four_gb:.2f} GiB |
| **NF4, double quant** | 4-bit weights on a normal-distribution grid (NF4), with their block scales quantized too |
| **LoRA** | small trainable matrices A and B beside a frozen layer; B starts at zero, so training starts from the base |
| **gradient checkpointing** | keep only each block's input, recompute the rest in the backward: less memory, one more forward's time |
| **mixed precision** | compute in fp16/bf16 with fp32 weights kept: less activation memory, faster on a GPU |
"""


def glossary_markdown() -> str:
    """The glossary and the bytes-per-parameter cheat sheet, as Markdown (the numbers computed here).

    >>> "| NF4 weight (4-bit, double quant) | 0.516 |" in glossary_markdown()
    True
    """
    rows = "\n".join(f"| {what} | {b:.3g} | {why} |" for what, b, why in bytes_per_parameter())
    return (GLOSSARY.format(gib_in_gb=GiB / 1e9, four_gb=4e9 / GiB) + "\n**Bytes per parameter** (computed by the kit, `kit.scenarios.teach.bytes_per_parameter`). Training "
            "an fp32 weight with AdamW costs 4 + 4 + 8 = 16 bytes; a frozen one only its weight.\n\n"
            "| what | bytes per parameter | why |\n|---|---|---|\n" + rows + "\n")


def glossary():
    """Show the glossary in a notebook (an ``IPython.display.Markdown``).

    >>> glossary()                              # doctest: +SKIP
    """
    from IPython.display import Markdown

    return Markdown(glossary_markdown())
