"""Real transformers Trainer steps on a fake cuda:0, metered: the peak of live CUDA storages, as the caching
allocator rounds them, per step.

    python benchmarks/fake_cuda/trainer_steps.py --config gpt2 --precision fp32 --batch 8 --seq 512 --gpu H200

prints one JSON object (peaks in bytes). It runs in a process of its own: the shim must load before torch, and the
patches it makes to torch.cuda last for the process. The model is built from a config file shipped in kit/configs
(read as JSON; nothing of kit/ is imported), with random weights on the fake device: memory depends on shapes and
dtypes, not on weights.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import shim  # noqa: E402  (no torch imported yet)

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "kit" / "configs"
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch")


def _batches(count: int, seq: int, vocab: int, padded: bool) -> list:
    """Rows of token ids (labels = ids). Unpadded rows carry no attention mask at all: given an all-ones mask,
    transformers treats fake tensors as tracing and builds a 4-D mask a GPU run skips. Padded rows (every other row
    a quarter padding, as the kit's benchmarks pad) carry their mask and -100 labels."""
    import torch

    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(count):
        ids = torch.randint(2, vocab, (seq,), generator=generator)
        row = {"input_ids": ids, "labels": ids.clone()}
        if padded:
            mask = torch.ones(seq, dtype=torch.long)
            if index % 2 == 0:
                mask[-max(1, seq // 4):] = 0
            row = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        rows.append(row)
    return rows


def _patch_rng():
    """torch.cuda's RNG state (read by activation checkpointing to replay dropout) lives in generators a CPU build
    lacks; a fake tensor's dropout draws nothing, so a placeholder state serves."""
    import torch

    torch.cuda.get_rng_state = lambda device="cuda": torch.zeros(16, dtype=torch.uint8)
    torch.cuda.set_rng_state = lambda state, device="cuda": None


def _masks_as_on_a_gpu():
    """transformers' masking code counts a fake tensor as tracing (``is_tracing(tensor)``), and while tracing it
    never skips the causal mask: every SDPA call would get a 4-D boolean mask a GPU run does not build (and which
    turns flash attention away). Here every tensor is fake and nothing traces: only the process-wide checks
    (dynamo, jit, stream capture) remain. Values are still unreadable: an all-ones mask reads as "not all ones",
    hence unpadded rows carry no mask, and the check for packed rows (which reads whether position ids restart) is
    answered "not packed": the rows built here never are."""
    from transformers import masking_utils
    from transformers.utils import import_utils

    masking_utils.is_tracing = lambda tensor=None: import_utils.is_tracing(None)
    masking_utils.find_packed_sequence_indices = lambda position_ids: None


def _stay_on_device(model):
    """The model is built on the fake cuda:0, where Trainer and accelerate move it again. Module.to swaps every
    FakeTensor parameter for a new one, which fails on parameters FakeTensorMode holds weak references to; a move
    to the device they are on is a no-op on a GPU, and is made one here (a move with a dtype still runs)."""
    import torch

    move = model.to

    def to(*args, **kwargs):
        targets = [*args, kwargs.get("device", "cuda")]
        if set(kwargs) <= {"device", "non_blocking"} and all(
                isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda" for target in targets):
            return model
        return move(*args, **kwargs)

    model.to = to
    return model


def _attention_taken(model_config, attn: str) -> str:
    """The attention the model runs: SDPA asked of a model class without an SDPA path (Gemma-2's soft-capped
    scores) is refused by transformers at build time, so such a model is built eager, as it runs whatever is asked
    of it."""
    from transformers import AutoModelForCausalLM

    model_class = AutoModelForCausalLM._model_mapping[type(model_config)]
    return "eager" if attn == "sdpa" and not model_class._supports_sdpa else attn


def run(config: str, precision: str, batch: int, seq: int, steps: int = 3, checkpointing: bool = False,
        padded: bool = False, gpu: str = "H200", optim: str = "adamw_torch_fused", attn: str = "sdpa",
        overrides: dict | None = None, probes: tuple = ()) -> dict:
    shim.load()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    import sdpa_choice
    from meter import CudaStorageMeter, ScalarReadsAsZero

    device = sdpa_choice.GPUS[gpu]
    shim.patch_cuda_queries(device)
    _patch_rng()
    _masks_as_on_a_gpu()
    shim.register_placeholder_cuda_kernels()
    routed = sdpa_choice.route_sdpa(device, {name: sdpa_choice.GPUS[name] for name in probes})

    spec = json.loads((CONFIGS / f"{config}.json").read_text())
    spec.update(overrides or {})
    model_config = AutoConfig.for_model(**spec)
    model_config.use_cache = False
    attn = _attention_taken(model_config, attn)
    step_peaks = []

    class StepPeaks(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            meter.reset_peak()

        def on_step_end(self, args, state, control, **kwargs):
            step_peaks.append(meter.peak)

    fake_mode = shim.fake_cuda_mode()
    meter = CudaStorageMeter()
    with fake_mode, ScalarReadsAsZero(), meter:
        with torch.device("cuda"):
            # fp32 weights whatever the config's torch_dtype (Llama-3.2-1B's says bf16), as the kit's estimates load
            model = _stay_on_device(AutoModelForCausalLM.from_config(model_config, attn_implementation=attn,
                                                                     dtype=torch.float32))
        weights = meter.live
        args = TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="fake-cuda-"), per_device_train_batch_size=batch, max_steps=steps,
            report_to=[], save_strategy="no", logging_strategy="no", optim=optim, learning_rate=1e-4,
            dataloader_num_workers=0, dataloader_pin_memory=False, disable_tqdm=True,
            fp16=precision == "fp16", bf16=precision == "bf16", activation_checkpointing=checkpointing)
        trainer = Trainer(model=model, args=args, callbacks=[StepPeaks()],
                          train_dataset=_batches(steps * batch, seq, model_config.vocab_size, padded))
        trainer.train()
    return {"config": config, "precision": precision, "batch": batch, "seq": seq, "checkpointing": checkpointing,
            "padded": padded, "gpu": gpu, "optim": optim, "attn": attn, "weights_bytes": weights,
            "step_peaks": step_peaks, "peak_bytes": max(step_peaks), "sdpa_backends": routed.counts,
            "sdpa_choices": routed.choices}


def run_sharing(gpus: list, **setup) -> list:
    """run() on each of ``gpus``, once per distinct SDPA choice: the first GPU left runs, probing the others, and
    every GPU left whose choice at each SDPA call equals the one taken shares its result (``metered_on`` names the
    GPU that ran). For a dense model the emulated GPU enters a run only through SDPA's choice (torch.cuda's queries
    answer its name, capability and memory, which neither Trainer nor such a model reads for its tensors), so a
    shared figure is the one its own run would give. Not for a mixture of experts: transformers picks its experts'
    grouped_mm by compute capability (``_can_use_grouped_mm``); run() it per GPU."""
    results, left = [], list(gpus)
    while left:
        result = run(**setup, gpu=left[0], probes=tuple(left))
        choices = result.pop("sdpa_choices")
        same = [name for name in left if choices[name] == choices[left[0]]]
        results += [{**result, "gpu": name, "metered_on": left[0]} for name in same]
        left = [name for name in left if name not in same]
    return sorted(results, key=lambda result: gpus.index(result["gpu"]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a config name in kit/configs (gpt2, tiny-llama, ...)")
    parser.add_argument("--precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--padded", action="store_true")
    parser.add_argument("--gpu", choices=("T4", "L4", "A100", "H100", "H200"), default="H200")
    parser.add_argument("--optim", choices=OPTIMIZERS, default="adamw_torch_fused")
    parser.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    parser.add_argument("--override", default="{}", help="JSON object of config fields to change")
    parser.add_argument("--setups", help="a JSON list of run()'s keyword arguments (or run_sharing()'s, with a list "
                                         "\"gpus\" in place of \"gpu\"): every setup in this one process (one JSON "
                                         "line each per GPU), in place of the options above")
    options = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if options.setups:
        for setup in json.loads(options.setups):
            for result in run_sharing(**setup) if "gpus" in setup else [run(**setup)]:
                print(json.dumps(result), flush=True)
        return
    if not (options.config and options.batch and options.seq):
        parser.error("--config, --batch and --seq are needed (or --setups)")
    result = run(options.config, options.precision, options.batch, options.seq, options.steps, options.checkpointing,
                 options.padded, options.gpu, options.optim, options.attn, json.loads(options.override))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
