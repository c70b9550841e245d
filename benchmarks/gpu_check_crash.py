"""``make gpu-check``'s crash stage: the user's fold loop at Llama-3-8B size, under the T4 cap.

Notebook 02 predicts that the user's loop runs out of memory on a T4 while fold 2 *loads*: fold 1's
Trainer still holds its model and optimizer state beside the new model (``kit.scenarios.cross_validation.predict.
fold2_prediction``). This stage runs that loop (``run_broken_loop``) on Llama-3-8B in 4 bits (its
architecture twin when the Hub is offline: the real shapes, so the real memory) for 2 folds, and writes
the prediction and the measured fold records to one JSON file, which ``gpu_check_verdicts.crash_verdict``
reads. The cap comes from ``KIT_GPU_CAP_BYTES``, applied when ``kit.measure.device`` is imported.

Run: ``python benchmarks/gpu_check_crash.py OUT.json``.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "meta-llama/Meta-Llama-3-8B"
SETTINGS = dict(batch_size=4, seq_len=256, steps_per_fold=2, max_samples=24, lora_r=8,
                lora_targets=["q_proj", "v_proj"], quantization="4bit")   # notebook 02's, two short folds


def main(out: str) -> int:
    from kit.estimate import estimate
    from kit.measure import device  # noqa: F401 (applies KIT_GPU_CAP_BYTES before anything is allocated)
    from kit.scenarios.cross_validation import fixed_loop as cv
    from kit.scenarios.cross_validation.predict import fold2_prediction

    est = estimate(MODEL, **{k: v for k, v in SETTINGS.items() if k not in ("steps_per_fold", "max_samples")})
    prediction = fold2_prediction(est)
    print(f"ESTIMATED: fold 2's load peaks at {prediction['load_peak_bytes']:,} bytes", flush=True)
    broken = cv.run_broken_loop(MODEL, folds=2, output_dir=tempfile.mkdtemp(prefix="gpu-check-crash-"), **SETTINGS)
    Path(out).write_text(json.dumps({"model": MODEL, "prediction": prediction, "broken": broken}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
