"""The menu of choices and what each costs: devices (with the fits / does-not-fit verdict),
dtypes, bitsandbytes weight formats and optimizers (named as in ``TrainingArguments.optim``).

>>> from kit.estimate import estimate
>>> v = verdict(estimate("tiny-gpt2", batch_size=2, seq_len=64), "colab-t4")
>>> v.fits
True
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from kit import machine, optimizers
from kit.inputs import InputError
from kit.units import GiB, fmt_bytes, wrapped

# "fits" keeps this share of the limit free while the figure judged is modelled, not measured on a GPU: the allocated
# estimate and the caching allocator's model (the reserved figure) are checked against CPU steps and a fake-CUDA
# meter, which sat 78-88 MiB under H200 readings (the cuBLAS workspaces, kernel scratch it cannot see), and a real
# run adds what no model here holds (CUDA's context outside torch's count, other processes, fragmentation after
# many steps). Less margin than this is "tight", never "fits". The fit advisor, `python -m kit fit` and the panel
# apply it (docs/cli-and-api.md says it).
MODELLED_MARGIN = 0.05
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
QUANTIZATIONS = ("none", "8bit", "4bit")
# kit name -> TrainingArguments.optim, and every TrainingArguments.optim name -> kit name: kit.optimizers has them
OPTIMIZERS = optimizers.TRAINER_OPTIM
ALIASES = optimizers.BY_OPTIM


def nf4_bytes(elements: int, double_quant: bool = True, blocksize: int = 64) -> int:
    """Bytes of one NF4 weight of ``elements`` elements, as bitsandbytes' ``quantize_4bit`` stores it.

    Packed 4-bit values: n/2 bytes. One absmax per block of 64 (``blocksize=64``):
    without double quant an fp32 each, 4/64 = 0.0625 B/param. With double quant
    (``compress_statistics=True``) ``quantize_blockwise(absmax - offset, blocksize=256)``
    stores each absmax in 1 byte, plus one fp32 absmax per 256 of them:
    1/64 + 4/(64*256) = 0.015625 + 0.000244 = 0.015869 B/param, so 0.5 + 0.015869
    = 0.515869 B/param in all. Per tensor: the 256-entry fp32 code copy (1024 B), the
    16-entry NF4 code (64 B) and the fp32 offset (4 B).

    >>> nf4_bytes(4096 * 4096) / (4096 * 4096)    # doctest: +ELLIPSIS
    0.5159...
    """
    blocks = -(-elements // blocksize)
    if not double_quant:
        return -(-elements // 2) + 4 * blocks + 64
    return -(-elements // 2) + blocks + 4 * -(-blocks // 256) + 1024 + 64 + 4


def int8_bytes(fin: int, fout: int) -> int:
    """Bytes of a bitsandbytes 8-bit weight: int8 values (``CB``) + one fp32 scale per row (``SCB``)."""
    return fin * fout + 4 * fout


def optimizer_state_bytes(optimizer: str, elements: int, dtype_bytes: int, embedding: bool = False) -> tuple[int, int]:
    """(bytes the allocator holds, bytes paged outside it) of the state of ``elements`` elements in one flat tensor
    (:func:`kit.optimizers.state_bytes` reads a tensor's shape).

    >>> optimizer_state_bytes("adamw-8bit", 1024 * 1024, 4)
    (2129920, 0)
    """
    return optimizers.state_bytes(optimizer, (elements,), dtype_bytes, embedding)


# What the runtime itself holds in RAM before the model is built (Python, torch, transformers, CUDA's libraries, and
# on Colab the VM's own processes): the RAM verdict adds it to the CPU build. Where a session runs on the machine
# judged, the face measures it (kit.measure.device.runtime_ram_bytes, the process's RSS once those are loaded) and
# passes a Preset carrying it; a preset carries these figures:
COLAB_VM_RAM_BYTES = 900_000_000   # the VM's own use of a fresh free Colab session, "around 0.9 to 1.4 GB", the
# low end (linux-blog.anracom.com, 2023/05/04, "Google Colab, RAM, VRAM and GPU usage limits - I")
TORCH_CUDA_RAM_BYTES = 2_056_600 * 1024   # the max RSS of `import torch` and one CUDA tensor (CUDA's libraries
# and context loaded; torch 2.2, CUDA 11.8: https://github.com/pytorch/pytorch/issues/113326)
TORCH_CPU_RAM_BYTES = 233_316_352   # the RSS of `import torch` (2.13, CPU build), measured on this machine
TRANSFORMERS_RAM_BYTES = 312_524_800   # the RSS that importing transformers' Trainer and datasets adds beside torch,
# measured on this machine (transformers 5.25): an assumption for Colab. `python benchmarks/runtime_ram.py` measures
# the last two figures again.
GPU_RUNTIME_RAM_BYTES = TORCH_CUDA_RAM_BYTES + TRANSFORMERS_RAM_BYTES
COLAB_RUNTIME_RAM_BYTES = COLAB_VM_RAM_BYTES + GPU_RUNTIME_RAM_BYTES
CPU_RUNTIME_RAM_BYTES = TORCH_CPU_RAM_BYTES + TRANSFORMERS_RAM_BYTES
RUNTIME_SAID = {"colab": "the Colab VM's own 0.9 GB, torch with CUDA's libraries and transformers: public figures",
                "gpu": "torch with CUDA's libraries and transformers: public figures",
                "cpu": "torch and transformers, as measured on the kit's own CPU machine"}


@dataclass(frozen=True)
class Preset:
    """A machine: GPU memory (None for a CPU-only one) and CPU RAM, in bytes, and its GPU's CUDA compute
    capability (None for a CPU), which says whether bf16 is native (8.0 and up). ``runtime_ram_bytes``: what the
    runtime holds in RAM before the model is built, and ``runtime_said`` where that figure comes from."""

    name: str
    label: str
    gpu_bytes: int | None
    ram_bytes: int
    capability: tuple[int, int] | None = None
    runtime_ram_bytes: int = GPU_RUNTIME_RAM_BYTES
    runtime_said: str = RUNTIME_SAID["gpu"]

    @property
    def ram_for_model_bytes(self) -> int:
        """The RAM left for the model (and, on a CPU, its training) once the runtime holds its own."""
        return self.ram_bytes - self.runtime_ram_bytes


def _this_machine_ram() -> int:
    # os.sysconf, not psutil: the estimate must not read the machine, so prediction runs anywhere.
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # A T4 has 15 GB, but torch can allocate only about 14.56 GiB of it in Colab (the CUDA context
        # and the driver keep the rest): the verdicts use what torch can have.
        Preset("colab-t4", "Colab T4 (14.56 GiB for torch, 12.7 GiB RAM)", int(14.56 * GiB), int(12.7 * GiB), (7, 5),
               COLAB_RUNTIME_RAM_BYTES, RUNTIME_SAID["colab"]),
        Preset("l4", "L4 (24 GB GPU)", 24 * 10**9, 64 * GiB, (8, 9)),
        Preset("a100-40", "A100 40 GB", 40 * 10**9, 85 * 10**9, (8, 0)),
        Preset("a100-80", "A100 80 GB", 80 * 10**9, 170 * 10**9, (8, 0)),
        Preset("h100", "H100 80 GB", 80 * 10**9, 200 * 10**9, (9, 0)),
        Preset("cpu", "this machine's CPU and RAM", None, _this_machine_ram(), None, CPU_RUNTIME_RAM_BYTES,
               RUNTIME_SAID["cpu"]),
    )
}


GPU_PRESETS = tuple(name for name, p in PRESETS.items() if p.capability)   # the presets with a GPU architecture


# A device given as a number of bytes is read between these (a bare "16" is 16 bytes, not 16 GB: refused)
SMALLEST_GPU_BYTES, LARGEST_GPU_BYTES = 2**20, 2**50


def parse_bytes(value) -> int | None:
    """A positive number of bytes from ``16e9``, ``"16GiB"``, ``"24 GB"`` or ``"512MiB"``; None when it is not one.

    >>> parse_bytes("16GiB"), parse_bytes(24e9), parse_bytes("l4")
    (17179869184, 24000000000, None)
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*(gib|gb|mib|mb|b)?\s*", str(value).lower())
    n = int(float(m[1]) * {"gib": 2**30, "gb": 10**9, "mib": 2**20, "mb": 10**6}.get(m[2], 1)) if m else 0
    return n if n > 0 else None


def resolve_device(device=None, *, cpu_ok: bool = False) -> tuple[Preset, str | None]:
    """The one reading of a device argument, for the advisor, ``kit.check``, the panel and ``kit.train``:
    ``(Preset, a line to print or None)``. The Preset's compute capability decides the 16-bit dtype
    (:func:`kit.dtypes.run_dtype`), never its name.

    - a :class:`Preset`, or a preset's name (``"colab-t4"``, ``"l4"``, ...): that one;
    - ``"this"``: this GPU now, what torch can have of it (the rest is the CUDA context's and other
      processes'); with no GPU, the CPU and its RAM where ``cpu_ok``, else a refusal;
    - ``None``: this GPU, or with none here the ``colab-t4`` preset, and a line that says so;
    - a number of bytes (``16e9``, ``"16GiB"``): a GPU of that size.

    >>> resolve_device("colab-t4")[0].capability, resolve_device("16GiB")[0].gpu_bytes
    ((7, 5), 17179869184)
    """

    if isinstance(device, Preset):
        return device, None
    key = device.strip().lower() if isinstance(device, str) else device
    if key in PRESETS:
        return PRESETS[key], None
    if key is None or key in ("this", "this gpu"):
        hw = machine.hardware()
        if not hw["gpu_total_bytes"]:
            if key is None:
                return PRESETS["colab-t4"], "no GPU was found here, so this was judged against the colab-t4 preset"
            if cpu_ok:
                return Preset("this", "this machine (CPU and RAM)", None, hw["ram_total_bytes"], None,
                              CPU_RUNTIME_RAM_BYTES, RUNTIME_SAID["cpu"]), None
            raise InputError("device", "device 'this' reads this machine's GPU, and no CUDA GPU was found here: "
                                       f"name a preset ({', '.join(PRESETS)}) or a number of bytes (e.g. 16GiB).")
        total, usable = hw["gpu_total_bytes"], machine.gpu_bytes_for_torch()
        label = (f"this GPU ({hw['gpu_name']}: {fmt_bytes(usable)} for torch of {fmt_bytes(total)}"
                 f"{', the rest used outside this torch' if usable < total else ''})")
        return Preset("this", label, usable, hw["ram_total_bytes"], machine.compute_capability()), None
    n = parse_bytes(device)
    if n is not None and not SMALLEST_GPU_BYTES <= n <= LARGEST_GPU_BYTES:
        raise InputError("device", f"device {device!r} reads as {n:.4g} bytes, "
                                   + ("smaller than any GPU: give a unit (16GiB, 16GB) or the bytes in full (16e9)."
                                      if n < SMALLEST_GPU_BYTES else "more than any GPU holds (over 1 PiB): give its "
                                      "memory, as 80GB or 80e9."), code="device-size")
    if n is not None:
        return Preset("bytes", f"a GPU with {fmt_bytes(n)}", n, PRESETS["cpu"].ram_bytes), None
    raise InputError("device", f"device must be a preset ({', '.join(PRESETS)}), 'this' (this GPU, now) "
                               f"or a number of bytes (e.g. 16000000000 or 16GiB), not {device!r}.")


@dataclass(frozen=True)
class Verdict:
    """Does an estimate fit a preset? Margins are bytes left over (negative: missing)."""

    preset: Preset
    fits: bool
    gpu_margin_bytes: int | None   # GPU memory - reserved_bytes (the peak where none was modelled; None on "cpu")
    ram_margin_bytes: int          # RAM - the runtime's own - cpu_build_bytes (or - peak_bytes on "cpu")
    text: str
    judged_bytes: int | None = None   # the figure judged (shown in ``text``): reserved, else the peak
    judged_name: str = ""             # its name, as ``text`` says it: "reserved (modelled)", "peak (allocated)"
    limit_bytes: int | None = None    # what it was judged against (GPU memory for torch; RAM on "cpu")
    tight: bool = False               # within the limit, with less than the MODELLED_MARGIN of it to spare (fits False)

    @property
    def word(self) -> str:
        """"fits", "TIGHT" (under the :data:`MODELLED_MARGIN`) or "DOES NOT FIT"."""
        return "TIGHT" if self.tight else "fits" if self.fits else "DOES NOT FIT"

    @wrapped
    def __str__(self) -> str:
        return self.text


def verdict(est, preset: str | Preset = "colab-t4") -> Verdict:
    """Compare an :class:`~kit.estimate.Estimate` with a device preset; the text names the one figure judged.

    Within the limit but with less than :data:`MODELLED_MARGIN` of it to spare, the verdict is "TIGHT" (``tight``
    True, ``fits`` False): the figures are modelled, not measured on this GPU.

    On a GPU preset what the caching allocator holds (the estimate's modelled ``reserved_bytes``; the allocated
    peak where none was modelled) must fit in GPU memory, and building the model on the CPU must fit in RAM
    (said only where it does not: the table says the build's figure). On ``"cpu"`` the training peak must fit in RAM.

    >>> from kit.estimate import estimate
    >>> print(verdict(estimate("distilgpt2+vocab-head", batch_size=1, seq_len=128), "colab-t4"))  # doctest: +ELLIPSIS
    DOES NOT FIT Colab T4: ... GiB reserved (modelled) of 14.56 GiB (... GiB short)...
    """
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"Unknown device preset {preset!r}. Known: {', '.join(PRESETS)}.")
        preset = PRESETS[preset]
    if preset.gpu_bytes is None:
        gpu_margin, ram_margin = None, preset.ram_for_model_bytes - est.peak_bytes
        fits, judged, name, limit = ram_margin >= 0, est.peak_bytes, "training peak", preset.ram_bytes
        what = (f"training peak {fmt_bytes(est.peak_bytes)} + {runtime_said(preset)} of {fmt_bytes(preset.ram_bytes)} "
                f"RAM ({_margin(ram_margin)})")
    else:
        reserved = getattr(est, "reserved_bytes", 0)
        judged = reserved or est.peak_bytes   # what the allocator holds, modelled
        name, limit = "reserved (modelled)" if reserved else "peak (allocated)", preset.gpu_bytes
        with_vllm = beside_vllm(est, judged, preset.gpu_bytes)
        if with_vllm != judged:   # GRPO with vLLM colocate: its share of the device is judged too
            name += f" with vLLM's share of {fmt_bytes(vllm_share_bytes(est, preset.gpu_bytes))}"
            judged = with_vllm
        gpu_margin = preset.gpu_bytes - judged
        if est.peak_bytes <= preset.gpu_bytes < judged:   # the allocated peak fits: the allocator's model alone says no
            _add_note(est, allocator_model_note(est))
        ram_margin = preset.ram_for_model_bytes - est.cpu_build_bytes
        fits = gpu_margin >= 0 and ram_margin >= 0
        ram = "" if ram_margin >= margin_kept(preset.ram_bytes) else \
            "; " + ram_said(est.cpu_build_bytes, preset.ram_bytes, preset.runtime_ram_bytes) + (
                "" if ram_margin < 0 else f", a near miss ({_margin(ram_margin)})")
        gpus = getattr(est, "num_gpus", 1)   # a multi-GPU estimate's bytes are one GPU's: the verdict says so
        each = f" per GPU ({est.strategy} over {gpus} GPUs)" if gpus > 1 else ""
        what = f"{fmt_bytes(judged)} {name}{each} of {fmt_bytes(preset.gpu_bytes)} ({_margin(gpu_margin)}){ram}"
    limit_tight = fits and (gpu_margin if gpu_margin is not None else ram_margin) < margin_kept(limit)
    tight = limit_tight or fits and ram_margin < margin_kept(preset.ram_bytes)   # a near miss in RAM: said above
    if limit_tight:
        what += f", under the {MODELLED_MARGIN:.0%} margin ({fmt_bytes(margin_kept(limit))}) kept while it is modelled"
    head = "TIGHT" if tight else "fits" if fits else "DOES NOT FIT"
    text = f"{head} {short_label(preset)}: {what}{kernel_said(est)}"
    return Verdict(preset=preset, fits=fits and not tight, gpu_margin_bytes=gpu_margin, ram_margin_bytes=ram_margin,
                   text=text, judged_bytes=judged, judged_name=name, limit_bytes=limit, tight=tight)


def runtime_said(preset: Preset) -> str:
    """The runtime's own RAM as a verdict says it, beside the model's: "3.09 GiB runtime"."""
    return f"{fmt_bytes(preset.runtime_ram_bytes)} runtime"


def ram_said(build_bytes: int, ram_bytes: int, runtime_ram_bytes: int, unit: str | None = None) -> str:
    """The CPU build against the RAM, in few words (it ends a verdict's line): the runtime's own RAM is named where
    the build alone would fit, and so the runtime turns it.

    >>> colab = PRESETS["colab-t4"]
    >>> [ram_said(n * GiB, colab.ram_bytes, colab.runtime_ram_bytes) for n in (10, 20)]
    ['CPU build 10.00 GiB + 3.09 GiB runtime > 12.70 GiB RAM', 'CPU build 20.00 GiB > 12.70 GiB RAM']
    """
    runtime = f" + {fmt_bytes(runtime_ram_bytes, unit)} runtime" if build_bytes <= ram_bytes else ""
    over = "> " if build_bytes + runtime_ram_bytes > ram_bytes else "of "
    return f"CPU build {fmt_bytes(build_bytes, unit)}{runtime} {over}{fmt_bytes(ram_bytes, unit)} RAM"


def margin_kept(limit_bytes: int) -> int:
    """The bytes of ``limit_bytes`` that "fits" keeps free while the figure judged is modelled
    (:data:`MODELLED_MARGIN`).

    >>> round(margin_kept(PRESETS["colab-t4"].gpu_bytes) / 2**30, 2)
    0.73
    """
    return int(limit_bytes * MODELLED_MARGIN)


def kernel_said(est) -> str:
    """The attention kernel the figure assumes, where the GPU's architecture changed it (SDPA's math path), and how
    sure that is, and the weights it assumes where a family says so (gpt-oss's MXFP4 experts dequantized); ""
    elsewhere.

    >>> from types import SimpleNamespace as Est
    >>> kernel_said(Est(setup={"gpu": "colab-t4", "attention_kernel": "math"}))
    "; SDPA math path on sm75 (torch 2.13's rule, unmeasured)"
    """
    setup = getattr(est, "setup", {})
    weights = f"; {setup['weights_assumed']}" if setup.get("weights_assumed") else ""   # gpt-oss: MXFP4 dequantized
    if setup.get("attention_kernel") != "math":
        return weights
    major, minor = PRESETS[setup["gpu"]].capability
    # short: it ends the verdict's line, and the answer keeps to five lines (the docs say where the rule is read)
    return f"; SDPA math path on sm{major}{minor} (torch 2.13's rule, unmeasured){weights}"


def vllm_share_bytes(est, device_bytes: int) -> int:
    """What vLLM colocate keeps of a device of ``device_bytes`` beside training (TRL's GRPOTrainer with
    ``use_vllm=True, vllm_mode="colocate"``): ``vllm_gpu_memory_utilization`` of it, modelled, not measured; 0
    without vLLM colocate."""
    return int((est.setup.get("vllm_reserved_fraction") or 0) * device_bytes)


def beside_vllm(est, judged_bytes: int, device_bytes: int) -> int:
    """The figure ``judged_bytes`` (training's) with vLLM colocate's share beside it: all along, or with
    ``vllm_enable_sleep_mode`` beside the generation phase only (the share is released during the training step),
    the generation's peak carrying the same allocator gap as training's.

    >>> from types import SimpleNamespace as Est
    >>> est = Est(peak_bytes=80, setup={"vllm_reserved_fraction": 0.3, "generation_peak_bytes": 50})
    >>> beside_vllm(est, 100, 1000), beside_vllm(Est(peak_bytes=80, setup={}), 100, 1000)
    (400, 100)
    >>> est.setup["vllm_sleep_mode"] = True; beside_vllm(est, 100, 1000)
    370
    """
    share = vllm_share_bytes(est, device_bytes)
    if not share:
        return judged_bytes
    if est.setup.get("vllm_sleep_mode"):
        return max(judged_bytes, est.setup["generation_peak_bytes"] + judged_bytes - est.peak_bytes + share)
    return judged_bytes + share


def short_label(preset: Preset | str) -> str:
    """A preset's label (or a label) without its parentheses: the verdict says the limit itself.

    >>> short_label(PRESETS["colab-t4"]), short_label("Colab T4 (14.56 GiB for torch, 12.7 GiB RAM) less 2 GiB")
    ('Colab T4', 'Colab T4 less 2 GiB')
    """
    return re.sub(r" \([^()]*\)", "", preset if isinstance(preset, str) else preset.label)


def figures_line(est) -> str | None:
    """One line saying what the peak and the reserved figure each are, where an estimate has both (None: not).

    >>> from kit.estimate import estimate
    >>> print(figures_line(estimate("tiny-gpt2", batch_size=1, seq_len=32)))  # doctest: +ELLIPSIS
    (peak ... MiB: live tensors at their most, max allocated; reserved adds torch's cached blocks and must fit)
    """
    if not getattr(est, "reserved_bytes", 0) or est.setup.get("device") == "cpu":
        return None
    return figures_said(est.peak_bytes)


def figures_said(peak_bytes: int, unit: str | None = None) -> str:
    """What the peak (its figure given) and the reserved figure each are, in one line."""
    return (f"(peak {fmt_bytes(peak_bytes, unit)}: live tensors at their most, max allocated; reserved adds "
            "torch's cached blocks and must fit)")


# The allocator model's known error, from benchmarks/results/reserved_layout-2026-12-01-cpu.md (its gap columns: the
# laid-out step's gap against the gap of real allocation sequences of the same setups, through the same model)
LAYOUT_GAP_CHECK = "the laid-out gap up to 2.8x the real sequences' (499 vs 225 MiB, 763 vs 269 MiB)"
LAYOUT_GAP_FILE = "benchmarks/results/reserved_layout-2026-12-01-cpu.md"


def allocator_model_note(est) -> str:
    """The note on a verdict that only the reserved figure turns: that figure is the allocator model's, which no GPU
    has measured yet, and its known error."""
    from kit.inputs import Note

    return Note(f"the verdict rests on the reserved {fmt_bytes(est.reserved_bytes)} alone (the allocated peak "
                f"{fmt_bytes(est.peak_bytes)} fits): the allocator's model, not measured on a GPU; its check found "
                f"{LAYOUT_GAP_CHECK}, {LAYOUT_GAP_FILE}", field="expandable_segments", code="allocator-model")


def _add_note(est, note) -> None:
    if note not in est.notes:
        est.notes.append(note)


_EVAL = {"loss": "loss only", "logits": "logits gathered", "preprocessed": "preprocessed logits gathered"}


def _margin(nbytes: int) -> str:
    return f"{fmt_bytes(nbytes)} to spare" if nbytes >= 0 else f"{fmt_bytes(-nbytes)} short"


@wrapped
def render(est, preset: str | Preset = "colab-t4", answer: bool = True) -> str:
    """The readable table of an estimate, answer first: the verdict and what its figures are (left out with
    ``answer=False``, where the answer was just printed), then the components at the peak, the phases a run meets,
    the biggest modules and the notes.

    >>> from kit.estimate import estimate
    >>> print(render(estimate("tiny-gpt2", batch_size=2, seq_len=64)))   # doctest: +SKIP
    """
    s = est.setup
    v = verdict(est, preset)   # (first: a verdict may add its note to est.notes)
    lines = [v.text] + [x for x in [figures_line(est)] if x] if answer else []
    lines += [f"{s.get('model')}: batch {s.get('batch_size')} x seq {s.get('seq_len')}, {s.get('precision')}"
              f", quantization {s.get('quantization')}, lora_r {s.get('lora_r')},",
              f"  optimizer {s.get('optimizer')} (optim={s.get('optim')!r})"
              f", checkpointing {'on' if s.get('gradient_checkpointing') else 'off'}",
              f"params {est.params:,} ({est.trainable_params:,} trainable)",
              f"  {'at the peak: ' + est.peak_moment:<46}{'GiB':>12}"]
    for k, v_bytes in est.components().items():
        lines.append(f"  {k:<46}{fmt_bytes(v_bytes, 'GiB'):>12}")
        if k == "gradients" and v_bytes == 0 and est.trainable_params:
            lines.append("    (none yet: the backward makes them, and zero_grad(set_to_none=True) freed the last)")
    lines.append(f"  {'PEAK (predicted max allocated, ' + est.peak_phase + ')':<46}"
                 f"{fmt_bytes(est.peak_bytes, 'GiB'):>12}")
    if getattr(est, "reserved_bytes", 0) and s.get("device") != "cpu":
        how = "max reserved, expandable segments" if est.expandable_segments else "predicted max reserved"
        lines.append(f"  {'RESERVED (' + how + ')':<46}{fmt_bytes(est.reserved_bytes, 'GiB'):>12}")
    lines.append(f"  {'CPU RAM to build the model':<46}{fmt_bytes(est.cpu_build_bytes, 'GiB'):>12}")
    if getattr(est, "offloaded_bytes", 0):   # checkpoint offload / TRL's activation_offloading
        lines.append(f"  {'pinned CPU RAM for offloaded activations':<46}{fmt_bytes(est.offloaded_bytes, 'GiB'):>12}")
    ev = f"evaluation (batch {s.get('eval_batch_size')}, {_EVAL[s.get('eval_gather', 'loss')]})"
    lines.append(f"phases (max allocated): step 1 {fmt_bytes(est.first_step_peak_bytes, 'GiB')}, step 2 on "
                 f"{fmt_bytes(est.peak_bytes, 'GiB')}, {ev} {fmt_bytes(est.eval_peak_bytes, 'GiB')}")
    if s.get("generation_peak_bytes"):   # GRPOTrainer's generation phase (kit.estimate.grpo), its own peak
        lines.append(f"  generation ({s['generation_rows']} rows, {s['prompt_len']} + {s['completion_len']} tokens, "
                     f"at {s['generation_moment']}): step 1 {fmt_bytes(s['first_generation_peak_bytes'], 'GiB')}, "
                     f"later {fmt_bytes(s['generation_peak_bytes'], 'GiB')}")
    state = est.weights_bytes + est.gradients_bytes + est.optimizer_bytes
    c = getattr(est, "context", None)
    if getattr(est, "num_gpus", 1) > 1 and c is not None:  # a module's bytes are the whole model's, not one GPU's
        state = sum(c.weights.values()) + sum(c.grads.values()) + sum(c.opt.values())
        lines.append("biggest modules by training bytes, the whole model's before sharding (their weights + grads + "
                     "optimizer state, and their share of the whole model's):")
    else:
        lines.append("biggest modules by training bytes (their weights + grads + optimizer state, and their share of "
                     "all):")
    for name, p, b in est.offenders[:3]:
        share = 100 * b / state if state else 0
        lines.append(f"  {name:<40}{p:>15,} params {fmt_bytes(b, 'GiB'):>12} ({share:.0f}%)")
    lines += [f"note: {n}" for n in est.notes]
    if v.preset.gpu_bytes is not None and est.eval_peak_bytes > v.preset.gpu_bytes:
        lines.append(f"note: the evaluation needs {fmt_bytes(est.eval_peak_bytes)}, "
                     f"over the {fmt_bytes(v.preset.gpu_bytes)} "
                     "the device has: with evaluation on, lower per_device_eval_batch_size (or set "
                     "eval_accumulation_steps when compute_metrics gathers the logits)")
    return "\n".join(lines)
