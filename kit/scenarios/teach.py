"""Workshop helpers: a learner's guess set beside the answer, and the words before the numbers.

- :func:`guess_text`: "you guessed X GiB, the estimate says Y": the reveal of a prediction cell;
  :func:`answer_text` the same for an exact answer (a count, True or False, a name).
- :func:`glossary_markdown` / :func:`glossary`: every bar of a breakdown, the counters, GB against
  GiB, and the bytes each parameter costs, computed by the kit's own arithmetic
  (:mod:`kit.presets`), never typed in.
- :func:`solution`: a learner copy's exercise solution, revealed by running a cell (printed, then run).
- :func:`cheatsheet_markdown`: the one-page cheat sheet (``docs/cheatsheet.md``): the glossary in one line a
  term, and the five fixes that matter with their bytes per parameter, computed here.

>>> print(guess_text(4, 52 * 2**30, "the ESTIMATED peak"))
Your guess: 4.00 GiB. The ESTIMATED peak: 52.00 GiB, 13.0x your guess: far off: read on.
"""
from __future__ import annotations

import json
import math
import sys

from kit.assets import ASSETS_DIR
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
    verdict = "Right." if my_answer == actual else "Not this time: see below why."
    return f"Your answer: {my_answer}. {said}. " + verdict


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


# (term, what it means): the glossary's rows, and the cheat sheet's lines. "{gib_in_gb}" and "{four_gb}" are
# filled in by the kit's own arithmetic (kit.units.GiB).
TERMS = [
    ("weights", "the model's parameters, as they sit in memory (their dtype decides the bytes)"),
    ("gradients", "one tensor per *trainable* weight, filled by the backward pass; frozen weights have none"),
    ("optimizer state", "what the optimizer keeps per trainable weight: AdamW two moments, SGD with momentum one"),
    ("activations", "what the forward pass saves for the backward: grows with batch x sequence length"),
    ("logits", ("the output scores, batch x sequence x vocabulary, with the loss's fp32 copies: large for big "
                "vocabularies")),
    ("temporaries", "tensors that live only inside one operation (an upcast copy, a matmul's workspace)"),
    ("autocast weight copies", "under mixed precision, a 16-bit copy of each fp32 weight made for the forward pass"),
    ("allocated", "bytes held by live tensors (`torch.cuda.memory_allocated`): what runs out first"),
    ("caching allocator", ("PyTorch's manager of GPU memory: it keeps the blocks that tensors free, to hand them "
                           "out again, instead of giving them back to the GPU")),
    ("reserved", ("allocated + the caching allocator's spare blocks (`memory_reserved`); `empty_cache()` returns "
                  "only the spare")),
    ("NVML", "the driver's count (what `nvidia-smi` shows): reserved + the CUDA context and the libraries' kernels"),
    ("RSS", "the process's CPU RAM in use (resident set size): what Colab's RAM bar shows"),
    ("live-tensor bytes", "on a CPU, the kit counts the bytes of every live tensor: its stand-in for *allocated*"),
    ("GB and GiB", ("1 GB = 10^9 bytes; 1 GiB = 2^30 bytes = {gib_in_gb:.3f} GB. The kit says GiB; \"about 4 GB\" "
                    "is {four_gb:.2f} GiB")),
    ("NF4, double quant", "4-bit weights on a normal-distribution grid (NF4), with their block scales quantized too"),
    ("upcast", "turning a tensor into a wider dtype, such as 16-bit into fp32: twice the bytes"),
    ("meta device", ("PyTorch's make-believe device: tensors with shapes and dtypes but no data, so a model built "
                     "there takes no memory; the kit counts models there")),
    ("memory cap", ("a limit the kit sets on the memory a run may take, as if the GPU were that small: past it, "
                    "the run gets the same out-of-memory error")),
    ("LoRA", ("small trainable matrices A and B beside a frozen layer; B starts at zero, so training starts from "
              "the base")),
    ("gradient checkpointing", ("keep only each block's input, recompute the rest in the backward: less memory, "
                                "one more forward's time")),
    ("gradient accumulation", ("N micro-batches of B/N, their gradients summed, then one optimizer step: "
                               "activations scale with the micro-batch, so they take 1/N of a batch of B's, while "
                               "the weights, gradients and optimizer state stay as they are. Its cost: N "
                               "micro-steps' wall time per update, run one after another")),
    ("mixed precision", "compute in fp16/bf16 with fp32 weights kept: less activation memory, faster on a GPU"),
]


def _terms() -> list[tuple[str, str]]:
    return [(t, m.format(gib_in_gb=GiB / 1e9, four_gb=4e9 / GiB)) for t, m in TERMS]


# the glossary's terms shown collapsed, one click away (the counters' fine print); the rest are shown open
MORE_TERMS = ("NVML", "RSS", "live-tensor bytes", "GB and GiB")


def _details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>\n"


def glossary_markdown() -> str:
    """The glossary and the bytes-per-parameter cheat sheet, as Markdown (the numbers computed here): the words of
    the breakdowns in a table, the counters' fine print (:data:`MORE_TERMS`) and the bytes per parameter collapsed
    beneath it, one click away, so that the cell shows at most 25 lines.

    >>> "| NF4 weight (4-bit, double quant) | 0.516 |" in glossary_markdown()
    True
    """
    rows = "\n".join(f"| {what} | {b:.3g} | {why} |" for what, b, why in bytes_per_parameter())
    table = "| word | what it means |\n|---|---|\n"
    shown = "\n".join(f"| **{term}** | {meaning} |" for term, meaning in _terms() if term not in MORE_TERMS)
    more = "\n".join(f"| **{term}** | {meaning} |" for term, meaning in _terms() if term in MORE_TERMS)
    return ("**Words before numbers.** The kit's breakdowns use these words; each bar of a breakdown is one of "
            "them.\n\n" + table + shown + "\n\n"
            + _details("More words: the counters, GB and GiB", table + more)
            + _details("Bytes per parameter (computed by the kit)",
                       "Training an fp32 weight with AdamW costs 4 + 4 + 8 = 16 bytes; a frozen one only its weight "
                       "(`kit.scenarios.teach.bytes_per_parameter`).\n\n| what | bytes per parameter | why |\n"
                       "|---|---|---|\n" + rows))


def glossary():
    """Show the glossary in a notebook (an ``IPython.display.Markdown``).

    >>> glossary()                              # doctest: +SKIP
    """
    from IPython.display import Markdown

    return Markdown(glossary_markdown())


# -- learner copies: the solutions, revealed by running a cell -----------------------------------------------------
SOLUTIONS_FILE = ASSETS_DIR / "solutions.json"  # written by kit.scenarios.learner (make learner-notebooks)


def load_solutions(path=SOLUTIONS_FILE) -> dict[str, dict]:
    """The shipped solutions, ``key -> {"notebook", "title", "code"}``, as :mod:`kit.scenarios.learner` extracted
    them from the instructor copies.

    >>> all({"notebook", "title", "code"} <= set(entry) for entry in load_solutions().values())
    True
    """
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def solution(key: str, namespace: dict | None = None, *, solutions: dict | None = None) -> None:
    """Reveal an exercise's solution, as a learner copy's solution cell does: print its code, then run it in the
    caller's namespace (a notebook's: its variables are there for the cells below, as in the instructor copy).

    ``namespace`` overrides where it runs; ``solutions`` (``key -> {"title", "code"}``) overrides the shipped file.

    >>> fake = {"demo": {"title": "Solution: twice 21", "code": "answer = 2 * 21\\nprint(answer)"}}
    >>> ns = {}
    >>> solution("demo", ns, solutions=fake)
    Solution: twice 21
    ----- its code -----
    answer = 2 * 21
    print(answer)
    ----- its run -----
    42
    >>> ns["answer"]
    42
    """
    solutions = load_solutions() if solutions is None else solutions
    if key not in solutions:
        raise KeyError(f"no solution {key!r}; the solutions are {', '.join(sorted(solutions))}. Regenerate the "
                       "learner copies (make learner-notebooks) if a notebook's solution was renamed.")
    entry = solutions[key]
    code = entry["code"]
    if namespace is None:
        namespace = sys._getframe(1).f_globals  # the calling cell's globals: the notebook's namespace
    print(entry.get("title", key))
    print("----- its code -----")
    print(code)
    print("----- its run -----")
    if any(line.lstrip().startswith(("%", "!")) for line in code.splitlines()):  # IPython's magics, as a cell runs
        from IPython.core.inputtransformer2 import TransformerManager

        code = TransformerManager().transform_cell(code)
    exec(compile(code, f"<solution {key}>", "exec"), namespace)  # noqa: S102 - the point: run it as the cell would


# -- the cheat sheet -------------------------------------------------------------------------------------------------
def fixes(rank: int = 8, width: int = 4096) -> list[tuple[str, float, str, str]]:
    """The five fixes that matter after the baseline, as ``(fix, bytes per parameter, what else it changes, its
    cost)``: the bytes of weight + gradient + optimizer state per parameter of a ``d x d`` layer trained with
    AdamW, computed by :mod:`kit.presets` (LoRA: the frozen base plus its rank-``rank`` adapters' fp32 weights,
    gradients and AdamW state, spread over the layer's parameters).

    >>> [f"{b:.3g}" for _, b, _, _ in fixes()]
    ['16', '16', '16', '10', '2.06', '0.578']
    """
    n, lora = width * width, 2 * rank * width  # LoRA: A (rank x d) and B (d x rank)
    full = (4 * n + 4 * n + optimizer_state_bytes("adamw", n, 4)[0]) / n
    adam8 = (4 * n + 4 * n + optimizer_state_bytes("adamw-8bit", n, 4)[0]) / n
    adapters = (4 * lora + 4 * lora + optimizer_state_bytes("adamw", lora, 4)[0]) / n
    return [
        ("none: a full fine-tune, fp32 weights, AdamW", full, "the baseline", "-"),
        ("gradient accumulation (N micro-batches of B/N)", full, "activations and logits: 1/N of batch B's",
         "N micro-steps' wall time per update"),
        ("gradient checkpointing", full, "activations: each block's input only, the rest recomputed",
         "one more forward pass per step"),
        ("8-bit AdamW (bitsandbytes)", adam8, "optimizer state: 1 byte a moment, plus block scales",
         "a GPU and bitsandbytes; small tensors keep 32-bit states"),
        (f"LoRA, rank {rank}, on a frozen 16-bit base", (2 * n) / n + adapters,
         "the base has no gradient and no optimizer state", "only the adapters learn"),
        (f"QLoRA: LoRA rank {rank} on an NF4 base (double quant)", nf4_bytes(n) / n + adapters,
         "the base in 4 bits, as bitsandbytes stores it", "a GPU and bitsandbytes; each matmul dequantizes"),
    ]


def cheatsheet_markdown() -> str:
    """The one-page cheat sheet, as Markdown: the glossary's words in one line each, the bytes per parameter and
    the five fixes, every number computed by the kit (``docs/cheatsheet.md`` is this text; a test checks it).

    >>> "| 8-bit AdamW (bitsandbytes) | 10 |" in cheatsheet_markdown()
    True
    """
    rank, d = 8, 4096
    words = "\n".join(f"- **{term}**: {meaning}" for term, meaning in _terms())
    per_param = "; ".join(f"{what} {b:.3g}" for what, b, _ in bytes_per_parameter())
    rows = "\n".join(f"| {fix} | {b:.3g} | {what} | {cost} |" for fix, b, what, cost in fixes(rank, d))
    return (
        "# Memory cheat sheet\n\n"
        "Written by `kit.scenarios.teach.cheatsheet_markdown()` (`make learner-notebooks` rewrites this file, and "
        "`tests/test_learner_notebooks.py` checks it): every number here is computed by the kit.\n\n"
        "## Words before numbers\n\n" + words + "\n\n"
        "## Bytes per parameter\n\n" + per_param + ".\n\n"
        "## The five fixes that matter\n\n"
        f"Bytes per parameter of a {d} x {d} layer trained with AdamW: weight + gradient + optimizer state "
        f"(LoRA: the frozen base, plus its rank-{rank} adapters' fp32 weights, gradients and AdamW state, spread over "
        "the layer's parameters).\n\n"
        "| fix | bytes per parameter | what else it changes | its cost |\n|---|---|---|---|\n" + rows + "\n\n"
        "## When memory runs out\n\n"
        "- Predict before loading: `python -m kit fit --model <id> --batch-size <b> --seq-len <s> --device colab-t4` "
        "ranks the changes that make it fit.\n"
        "- After an out-of-memory error: `print(kit.free(globals()))`; if memory did not come back, "
        "*Runtime → Restart session*.\n"
        "- Between notebooks: *Runtime → Disconnect and delete runtime*.\n")
