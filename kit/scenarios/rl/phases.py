"""The three suspects of an RL run's memory, read off a GRPO estimate (:mod:`kit.estimate.grpo`): what the
generation phase adds above what is held (``generate``'s KV cache and the no-grad log-prob passes), the reference
model's weights (held all along where ``beta > 0`` and there is no LoRA), and the logits (with their loss, at the
training step's peak: TRL's fused head scores them in tiles). The training step's saved activations are shown
beside them: often bigger than all three.

>>> SUSPECTS
('generation', 'reference', 'logits')
"""
from __future__ import annotations

from kit.units import fmt_bytes, wrapped

SUSPECTS = ("generation", "reference", "logits")
_KIND = {"none": "beta=0.0: none", "model": "a second copy of the model",
         "adapter-disabled": "the policy with its adapter disabled: no copy"}


def suspects(est) -> dict:
    """``{suspect: bytes}`` of a GRPO estimate, and ``"activations"``: the training step's saved activations."""
    s = est.setup
    held = est.weights_bytes + est.optimizer_bytes - est.paged_optimizer_bytes + s["buffered_rollouts_bytes"]
    parts = est.components() if est.peak_phase != "generation" else {}
    return {"generation": max(s["generation_peak_bytes"] - held, 0), "reference": s["reference_weights_bytes"],
            "logits": parts.get("logits & loss", 0), "activations": parts.get("activations", 0)}


def largest(est) -> str:
    """The suspect that takes the most (of :data:`SUSPECTS`)."""
    found = suspects(est)
    return max(SUSPECTS, key=lambda k: found[k])


@wrapped
def read_aloud(est) -> str:
    """Each phase of the estimate in a line (ESTIMATED), then the three suspects, the largest named."""
    s, found = est.setup, suspects(est)
    where = "the generation phase" if est.peak_phase == "generation" else "the training step"
    lines = [f"ESTIMATED peak {fmt_bytes(est.peak_bytes)} in {where} ({est.peak_moment}); step 1 "
             f"{fmt_bytes(est.first_step_peak_bytes)}",
             f"  generation ({s['generation_rows']} rows x {s['prompt_len']} + {s['completion_len']} tokens): step 1 "
             f"{fmt_bytes(s['first_generation_peak_bytes'])}, later {fmt_bytes(s['generation_peak_bytes'])}, at "
             f"{s['generation_moment']}",
             "the suspects (ESTIMATED):",
             f"  generation adds {fmt_bytes(found['generation'])} above the weights and optimizer state it runs beside",
             f"  the reference model holds {fmt_bytes(found['reference'])} ({_KIND[s['reference']]})",
             f"  the logits and loss take {fmt_bytes(found['logits'])} at the training step's peak (fused head: tiles)",
             f"largest of the three: {largest(est)}; beside them, the training step's saved activations: "
             f"{fmt_bytes(found['activations'])}"]
    return "\n".join(lines)
