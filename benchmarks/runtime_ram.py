"""What the runtime itself holds in RAM before a model is built: the RSS of `import torch`, and what importing
transformers' Trainer and datasets adds beside it. kit.presets cites these figures (TORCH_CPU_RAM_BYTES,
TRANSFORMERS_RAM_BYTES) for the presets of a CPU, and as the transformers share of a GPU runtime.

    HF_HUB_OFFLINE=1 PYTHONPATH=$PWD python benchmarks/runtime_ram.py
"""
import os

import psutil


def rss_bytes() -> int:
    return psutil.Process(os.getpid()).memory_info().rss


def main() -> None:
    import torch

    torch_bytes = rss_bytes()
    import datasets  # noqa: F401
    from transformers import Trainer  # noqa: F401

    print(f"torch {torch.__version__}: RSS {torch_bytes:,} B after `import torch`")
    print(f"transformers' Trainer and datasets add {rss_bytes() - torch_bytes:,} B")


if __name__ == "__main__":
    main()
