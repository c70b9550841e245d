"""GRPO rows of ``benchmarks/real_clients.py``: TRL's quick-start GRPOTrainer on a tiny Qwen2 twin.

TRL's quick start (``GRPOTrainer(model=..., reward_funcs=reward_num_unique_chars, train_dataset=...)``), offline:
the twin saved with ``save_pretrained`` and given by its path (so that ``beta > 0`` builds the reference the way TRL
does, ``create_model_from_path`` of the policy's id), prompts of one length in tokens, every completion exactly
``max_completion_length`` tokens (``generation_kwargs={"min_new_tokens": ...}``: the end-of-sequence token is held
back until then), ``use_vllm=False``, fp32 on the CPU (``bf16=False``).

Each step is metered as ``real_clients.meter_trainer`` meters a Trainer, with the rollouts that ``_prepare_inputs``
buffered at the previous generation (``trainer._buffered_inputs``) counted as held at the step's start. The
generation phase (``_generate_and_score_completions``: ``generate``, the no-grad old/reference log-prob passes and
the rewards) is a ``record_function`` range of its own, and its peak is read from the same profile: the bytes held
at the step's start + the highest running sum of the memory events from the step's start to the end of that range.
"""
from __future__ import annotations

import bisect
import os

import torch
from torch.profiler import record_function

GEN_MARK = "clients_grpo::generation"


def reward_num_unique_chars(completions, **kwargs):
    """TRL's quick-start reward: the number of distinct characters in each completion."""
    return [float(len(set(c))) for c in completions]


def _prompts(tok, n_tokens: int, n_rows: int):
    from datasets import Dataset
    from kit.data import equal_token_rows

    return Dataset.from_dict({"prompt": equal_token_rows(tok, n_tokens, n_rows)})


class GenerationMeter:
    """A real_clients meter that also counts the buffered rollouts as held and reads the generation's own peak."""

    def __init__(self, meter, trainer):
        self.meter, self.trainer, self.generation = meter, trainer, []

    @property
    def peaks(self):
        return self.meter.peaks

    def start(self):
        self.meter.start()

    def begin(self, held: int):
        from real_clients import storage_bytes, tensors_in

        buffered = storage_bytes(tensors_in(self.trainer._buffered_inputs))
        self.meter.begin(held + buffered)

    def end(self):
        self.meter.end()

    def stop(self):
        prof = getattr(self.meter, "prof", None)
        peaks = self.meter.stop()
        if prof is not None:
            self.generation = generation_peaks(prof, self.meter.held)
        return peaks


def generation_peaks(prof, held) -> list:
    """For each step that generated: held at the step's start + the highest running sum of the memory events from
    the step's start to the end of its generation range (None for a step that reused the buffered rollouts)."""
    from real_clients import MARK

    events = prof.profiler.kineto_results.events()
    mem = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]")
    times = [m[0] for m in mem]
    steps = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name().startswith(MARK)}
    gens = sorted((e.start_ns(), e.end_ns()) for e in events if e.name() == GEN_MARK)
    out = []
    for k, h in enumerate(held, 1):
        start, end = steps[f"{MARK}{k}"]
        inside = [g for g in gens if start <= g[0] <= end]
        if not inside:
            out.append(None)
            continue
        run = top = 0
        lo = bisect.bisect_left(times, start)
        for t, _, n in mem[lo:bisect.bisect_right(times, inside[0][1])]:
            run += n
            if t >= inside[0][0]:
                top = max(top, run)
        out.append(h + top)
    return out


def mark_generation(trainer) -> None:
    """Wrap ``trainer._generate_and_score_completions`` in a ``record_function`` range (the generation phase)."""
    inner = trainer._generate_and_score_completions

    def generate_and_score(*args, **kwargs):
        with record_function(GEN_MARK):
            return inner(*args, **kwargs)

    trainer._generate_and_score_completions = generate_and_score


def client_grpo(work, kind: str, prompt_len: int = 12, completion_len: int = 16, batch: int = 4, generations: int = 4):
    """TRL's quick-start GRPOTrainer; ``kind``: "beta0" (no reference), "beta" (beta=0.04: a reference copy),
    "lora" (LoRA r8 q,v with beta=0.04: the adapter-disabled policy as reference), "spg2" (steps_per_generation=2:
    one generation of 8 rows for two steps, and the old-log-prob pass), "long" ("beta0" with 128 completion tokens:
    the KV cache and the sampling's logits set the generation's rise)."""
    from peft import LoraConfig
    from real_clients import tokenizer, twin_dir
    from trl import GRPOConfig, GRPOTrainer

    from kit.estimate import estimate_trainer

    tok = tokenizer()
    path = twin_dir("tiny-qwen2", work)
    extra = {"beta": 0.04} if kind in ("beta", "lora") else {}
    if kind == "spg2":
        extra["steps_per_generation"] = 2
    if kind == "long":
        completion_len = 128
    args = GRPOConfig(output_dir=os.path.join(work, "grpo"), use_cpu=True, bf16=False, report_to="none",
                      max_steps=3, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                      per_device_train_batch_size=batch, num_generations=generations,
                      max_completion_length=completion_len,
                      generation_kwargs={"min_new_tokens": completion_len}, **extra)
    peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"]) if kind == "lora" else None
    torch.manual_seed(0)
    trainer = GRPOTrainer(model=path, reward_funcs=reward_num_unique_chars, args=args, processing_class=tok,
                          train_dataset=_prompts(tok, prompt_len, 32), peft_config=peft_config)
    mark_generation(trainer)
    what = {"beta0": "full FT, beta=0 (no reference)", "beta": "full FT, beta=0.04 (a reference copy)",
            "lora": "LoRA r8 q,v, beta=0.04 (reference: the adapter disabled)",
            "spg2": "full FT, beta=0, steps_per_generation=2 (+ the old-log-prob pass)",
            "long": "full FT, beta=0, a long completion"}[kind]
    setup = (f"{what}, ckpt (GRPOConfig default), fp32, B{batch}, num_generations {generations}, prompt {prompt_len} "
             f"+ completion {completion_len} tokens")
    yield "12. TRL GRPOTrainer", setup, trainer, lambda: estimate_trainer(trainer, device="cpu")


def rise_cell(est, meter) -> str:
    """The generation's rise above what its step began with, estimated and measured (the last generating step:
    the held part is the weights, the optimizer state and the previous rollouts, the rise generate()'s and the
    no-grad passes' own bytes), a sharper check than the peak where the held bytes dominate."""
    from real_clients import MiB

    steps = [k for k, g in enumerate(meter.generation) if g is not None]
    if isinstance(est, Exception) or not steps or len(meter.generation) < 2:
        return ""
    k = steps[-1]
    got = meter.generation[k] - meter.meter.held[k]
    s = est.setup
    held = est.weights_bytes + est.optimizer_bytes - est.paged_optimizer_bytes + s["buffered_rollouts_bytes"]
    want = s["generation_peak_bytes"] - held
    return f" (its rise above the step's start: {want / MiB:.3f} MiB est. / {got / MiB:.3f} measured)"


def run_grpo_client(gen, meter_cls):
    """real_clients.run_trainer_client with the generation phase metered apart: the row's ``setup`` gains the
    estimated and measured generation peaks and their ratio (the estimate's ``generation_peak_bytes``)."""
    import gc

    from real_clients import MiB, StepPeaks, meter_trainer

    label, setup, trainer, make_estimate = next(gen)
    try:
        est = make_estimate()
    except ValueError as e:  # InputError is a ValueError: a refusal is a row
        est = e
    meter = meter_trainer(trainer, GenerationMeter(meter_cls(), trainer))
    trainer.train()
    peaks = StepPeaks(meter.peaks)
    measured = [g for g in meter.generation if g is not None]
    gen_est = None if isinstance(est, Exception) else est.setup.get("generation_peak_bytes")
    peaks.generation = max(measured) if measured else None
    if measured:
        got = peaks.generation
        cell = f"{gen_est / MiB:.2f} MiB est. / {got / MiB:.2f} measured, ratio {gen_est / got:.4f}" if gen_est \
            else f"not estimated / {got / MiB:.2f} MiB measured"
        cell += rise_cell(est, meter)
    else:
        cell = "not taken"
    setup += f"; generation phase peak: {cell}"
    gen.close()
    del trainer
    gc.collect()
    return label, setup, est, peaks
