"""The meter against PyTorch's own MemTracker (torch.distributed._tools.mem_tracker) on one small setup: a tiny
Llama (kit/configs/tiny-llama.json), batch 4 x 64, on the fake cuda:0: forward, loss, backward, fused AdamW step,
twice. Both run at once, as the innermost dispatch modes under FakeTensorMode. Prints one JSON object.

    python benchmarks/fake_cuda/memtracker_check.py
"""
from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import shim  # noqa: E402  (no torch imported yet)

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "kit" / "configs" / "tiny-llama.json"


def main(batch: int = 4, seq: int = 64, steps: int = 2) -> dict:
    shim.load()
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoConfig, AutoModelForCausalLM

    import sdpa_choice
    from meter import CudaStorageMeter

    shim.patch_cuda_queries(sdpa_choice.GPUS["H100"])
    shim.register_placeholder_cuda_kernels()
    sdpa_choice.route_sdpa(sdpa_choice.GPUS["H100"])
    config = AutoConfig.for_model(**json.loads(CONFIG.read_text()))
    config.use_cache = False
    meter = CudaStorageMeter()
    tracker = MemTracker()
    with shim.fake_cuda_mode(), meter:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        tracker.track_external(model, optimizer)
        with tracker:
            for _ in range(steps):
                tracker.reset_mod_stats()  # MemTracker refuses a second forward of the same modules otherwise
                ids = torch.randint(2, config.vocab_size, (batch, seq), device="cuda")
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del loss, ids
    tracker_peak = tracker.get_tracker_snapshot("peak")[torch.device("cuda", 0)]["Total"]
    return {"meter_peak_bytes": meter.peak, "memtracker_peak_bytes": tracker_peak}


if __name__ == "__main__":
    print(json.dumps(main()))
