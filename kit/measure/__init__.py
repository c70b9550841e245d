"""The measuring side: what each stage really took, on the GPU or the CPU, and whether it came back.

Its rooms: ``device`` (the readings: with :mod:`kit.machine`, the only code touching ``torch.cuda``, NVML and
psutil), ``controls`` (the allocator's controls and the memory cap), ``tensor_peak`` (exact tensor bytes,
op by op), ``cells`` (``%load_ext kit``), ``track``, ``records``, ``callback`` and ``files`` (stages and the
tracker), ``cleanup``, ``leaks`` and ``oom``. Importing it applies ``KIT_GPU_CAP_BYTES`` (``ENV_CAP`` says what).
"""
from kit.measure.controls import ENV_CAP

__all__ = ["ENV_CAP"]
