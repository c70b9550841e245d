"""A 70B config for the latency benchmarks: Llama-3.1-70B's shapes (its published config.json: hidden 8192,
80 layers, 64 heads, 8 KV heads, intermediate 28672, vocabulary 128256), written beside the shipped 8B's.

The kit ships no 70B config; the benchmarks pass this file's path as the model, as a user would.

>>> import json, pathlib, tempfile
>>> json.loads(pathlib.Path(write(tempfile.mkdtemp())).read_text())["num_hidden_layers"]
80
"""
from __future__ import annotations

import json
import pathlib

SHIPPED_8B = pathlib.Path(__file__).resolve().parents[1] / "kit" / "configs" / "Llama-3.1-8B.json"
SHAPES_70B = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "intermediate_size": 28672}


def write(folder) -> str:
    """Write ``<folder>/Llama-3.1-70B/config.json`` and return its path."""
    path = pathlib.Path(folder) / "Llama-3.1-70B" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**json.loads(SHIPPED_8B.read_text()), **SHAPES_70B}, indent=1))
    return str(path)
