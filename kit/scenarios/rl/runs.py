"""A measured GRPO run (``kit.train``) with the generation phase metered apart, set beside the estimate of the
same setup (``estimate_trainer`` of the very Trainer, on this device's kernels).

The generation phase is ``GRPOTrainer._generate_and_score_completions`` (called from ``_prepare_inputs`` at the start
of each step that generates): on CUDA its peak is max allocated, reset as it starts (:func:`kit.measure.device.
reset_peak`, which ``kit.train``'s tracker counts) and read as it returns. The reset restarts ``kit.train``'s own
counter too, so its part's peak then counts from the last generation's start: exact for the notebook's two steps
(each part is one step, whose generation runs first), the last step's alone with more. On a CPU, an exact count of
live tensor bytes (:class:`kit.measure.tensor_peak.TensorPeak`, which counts the weights, optimizer state and
buffered rollouts alive at its start), which leaves ``kit.train``'s count alone. The steps' peaks are
``kit.train``'s own (step 1 apart from the later steps). The CUDA path has not run on a GPU yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kit import machine
from kit.estimate import estimate_trainer
from kit.measure import cleanup, device
from kit.measure.tensor_peak import TensorPeak
from kit.units import fmt_bytes, wrap
from kit.watching.trainer import train


class GenerationMeter:
    """Wraps a GRPOTrainer's generation phase while it runs (``with GenerationMeter(trainer) as m``): ``m.peaks``
    holds one peak a generation, in bytes, in order."""

    def __init__(self, trainer):
        self.trainer, self.peaks = trainer, []

    def _metered(self, inner):
        def generate_and_score(*args, **kwargs):
            if machine.has_cuda():
                device.reset_peak()
                out = inner(*args, **kwargs)
                self.peaks.append(device.peak_allocated_bytes())
                return out
            with TensorPeak() as peak:
                out = inner(*args, **kwargs)
            self.peaks.append(peak.peak_bytes)
            return out
        return generate_and_score

    def __enter__(self):
        self.trainer._generate_and_score_completions = self._metered(self.trainer._generate_and_score_completions)
        return self

    def __exit__(self, *exc):
        self.trainer.__dict__.pop("_generate_and_score_completions", None)   # the class's method again
        return False


@dataclass
class Measured:
    """One run: its name, the estimate, ``kit.train``'s report and the generation phase's peaks."""
    name: str
    est: object
    report: object
    generation: list = field(default_factory=list)

    def rows(self) -> list:
        """(phase, estimated, measured or None) for step 1, the later steps and the two generations."""
        s, r = self.est.setup, self.report
        gen = self.generation + [None] * (2 - len(self.generation))
        return [("step 1 (training)", self.est.first_step_peak_bytes, r.first_step_peak_bytes),
                ("later steps", self.est.peak_bytes, r.later_steps_peak_bytes),
                ("generation, step 1", s["first_generation_peak_bytes"], gen[0]),
                ("generation, step 2", s["generation_peak_bytes"], gen[1])]


def measure(name: str, trainer, cap_bytes: int | None = None) -> Measured:
    """Run ``trainer`` with ``kit.train`` (exact tensor counts on a CPU), the generation metered apart."""
    est = estimate_trainer(trainer, device="cuda" if machine.has_cuda() else "cpu")
    with GenerationMeter(trainer) as meter:
        report = train(trainer, estimate=est, tensor_peak=True, cap_bytes=cap_bytes, plot=False)
    return Measured(name, est, report, meter.peaks)


def _cell(n) -> str:
    return "not taken" if n is None else fmt_bytes(n)


def table(runs: list) -> str:
    """The runs' phases, ESTIMATED beside MEASURED, with their ratio ("not taken" where no reading saw it)."""
    reading = runs[0].report.reading if runs else ""
    lines = [f"({reading}; ESTIMATED by estimate_trainer, MEASURED by kit.train)",
             f"{'run':<16}{'phase':<20}{'estimated':>11}{'measured':>11}{'meas/est':>9}"]
    for run in runs:
        if run.report.oom:
            lines.append(f"{run.name:<16}out of memory at step {run.report.step} ({run.report.phase_text})")
            continue
        for phase, est, got in run.rows():
            ratio = f"{got / est:.3f}" if got is not None and est else "-"
            lines.append(f"{run.name:<16}{phase:<20}{fmt_bytes(est):>11}{_cell(got):>11}{ratio:>9}")
    return "\n".join(lines)


def release(trainer) -> None:
    """Free a finished run's Trainer and model, so that the next run starts from the baseline."""
    cleanup.release(trainer, free_model=True)


def _outcome(run) -> str:
    r = run.report
    if r.oom:
        return f"ran out of memory at step {r.step} ({r.phase_text})"
    if r.measured_peak_bytes is None:
        return "completed (its peak not taken)"
    return f"completed, MEASURED peak {fmt_bytes(r.measured_peak_bytes)} (ESTIMATED {fmt_bytes(run.est.peak_bytes)})"


def verdict(before, after, change: str) -> str:
    """The fix's answer first: each run's outcome and peak, MEASURED beside ESTIMATED (``change``: the lever)."""
    return wrap(f"as written: {_outcome(before)}; with {change}: {_outcome(after)}")
