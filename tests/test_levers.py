"""Two levers practitioners pull first, as TRL 1.16 runs them, measured on real SFTTrainer steps on a CPU twin
(TensorPeak on top of the weights and optimizer state held when each step begins, as tests/test_trl.py):

- ``loss_type="chunked_nll"``: ``SFTConfig.__post_init__`` rewrites it to ``"nll"``, whose loss already comes
  from the fused LM head: the estimate matches its steps (vocabularies 4096 and 131072, packing on) and the
  measured peaks are the ``"nll"`` run's, byte for byte;
- padding-free (bfd packing) at equal tokens against padded rows: the estimate holds both, and the advisor
  says so rather than claim a saving the data may not give.

Rows of 40 and 24 tokens alternate, so bfd packing at max_length 64 fills every bin (4 x 64 tokens in one row).
"""
import json
import os
import sys
import warnings

import pytest
import torch

trl = pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import estimate_vs_measured as bench  # noqa: E402

from kit import data, models  # noqa: E402
from kit.cli import main  # noqa: E402
from kit.estimate import estimate, estimate_trainer  # noqa: E402
from kit.model_configs import get_config  # noqa: E402

warnings.filterwarnings("ignore")


def _rows(lengths=(24, 40), n=32):
    return Dataset.from_dict({"input_ids": [[5 + (i * 7 + j) % 4000 for j in range(lengths[i % 2])]
                                            for i in range(n)]})


def _trainer(tmp_path, vocab=4096, rows=None, **kw):
    torch.manual_seed(0)
    cfg = get_config("tiny-llama")
    cfg.vocab_size = vocab
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_steps=3,
                     per_device_train_batch_size=4, save_strategy="no", logging_strategy="no", disable_tqdm=True,
                     learning_rate=1e-4, gradient_checkpointing=False, **kw)
    return SFTTrainer(model=models.build_model(cfg), args=args, train_dataset=rows or _rows(),
                      processing_class=data.shipped_tokenizer())


def _measure(tr):
    return bench.step_peaks(tr)   # each step's exact CPU peak over what it holds


def _ratios(est, got):
    return est.first_step_peak_bytes / got[0], est.peak_bytes / max(got[1:])


@pytest.mark.parametrize("vocab", [4096, 131072])
def test_chunked_nll_is_nll_and_the_estimate_matches_its_steps(tmp_path, vocab):
    with pytest.warns(FutureWarning, match="chunked_nll"):
        tr = _trainer(tmp_path, vocab, loss_type="chunked_nll", packing=True, max_length=64)
    assert tr.args.loss_type == "nll"            # SFTConfig.__post_init__ rewrote it
    est = estimate_trainer(tr, device="cpu")
    assert est.setup["loss_type"] == "nll" and est.setup["fused_lm_head"] is True and est.setup["seq_len"] == 256
    direct = estimate(model=tr.model, batch_size=1, seq_len=256, padding_free=True, loss_type="chunked_nll",
                      device="cpu")
    assert direct.peak_bytes == est.peak_bytes and any(getattr(n, "code", "") == "trl-chunked-nll"
                                                       for n in direct.notes)
    got = _measure(tr)
    first, steady = _ratios(est, got)
    print(f"V {vocab}, chunked_nll, packed: estimate/measured step 1 {first:.4f}, steady {steady:.4f}")
    assert 0.98 <= first <= 1.02 and 0.98 <= steady <= 1.02, (est.peak_moment, est.peak_bytes, got)
    if vocab == 4096:   # the "nll" run, measured: the same bytes at every step
        assert _measure(_trainer(tmp_path / "nll", vocab, loss_type="nll", packing=True, max_length=64)) == got


def test_padding_free_at_equal_tokens_against_padded_rows(tmp_path):
    """Four rows of 64 tokens, padded (a [4, 64] batch), against the same 256 tokens packed into one row: the
    estimate matches both, and their ratio is the measured one."""
    padded = _trainer(tmp_path / "padded", rows=_rows((64, 64)))
    packed = _trainer(tmp_path / "packed", packing=True, max_length=64)
    ep, ef = estimate_trainer(padded, device="cpu"), estimate_trainer(packed, device="cpu")
    assert (ep.setup["batch_size"], ep.setup["seq_len"], ef.setup["batch_size"], ef.setup["seq_len"]) == (4, 64, 1, 256)
    gp, gf = _measure(padded), _measure(packed)
    for e, g in ((ep, gp), (ef, gf)):
        first, steady = _ratios(e, g)
        assert 0.98 <= first <= 1.02 and 0.98 <= steady <= 1.02, (e.setup, e.peak_moment, e.peak_bytes, g)
    est_ratio, got_ratio = ef.peak_bytes / ep.peak_bytes, max(gf[1:]) / max(gp[1:])
    print(f"packed / padded at 256 tokens: estimate {est_ratio:.4f}, measured {got_ratio:.4f}")
    assert 0.98 <= est_ratio / got_ratio <= 1.02


SFT = ["--model", "tiny-llama", "--batch-size", "4", "--seq-len", "64", "--device", "60000000", "--safety", "0"]


def _fit(capsys, *argv):
    assert main(["fit", *SFT, *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_fit_says_what_chunked_nll_and_padding_free_give(capsys):
    got = _fit(capsys, "--loss-type", "chunked_nll")
    nll = _fit(capsys, "--loss-type", "nll")
    base = estimate(model="tiny-llama", batch_size=4, seq_len=64, loss_type="nll")
    assert not got["fits"] and got["peak_bytes"] == nll["peak_bytes"] == base.peak_bytes
    assert got["suggestions"] == nll["suggestions"]
    assert not any("loss-type" in s["changes"] for s in got["suggestions"])
    flat = estimate(model="tiny-llama", batch_size=1, seq_len=256, padding_free=True, loss_type="nll")
    assert flat.peak_bytes >= base.peak_bytes   # at equal tokens, one row is no saving here: not offered ...
    assert not any("padding-free" in s["changes"] for s in got["suggestions"])
    notes = " ".join(got["notes"])              # ... and the notes say so, with the direct estimate's figure
    assert "chunked_nll' is no lever" in notes and "padding_free=True at equal tokens" in notes
    from kit.units import fmt_bytes
    assert f"peaks at {fmt_bytes(flat.peak_bytes)}, not less than {fmt_bytes(base.peak_bytes)}" in notes
    # a plain Trainer (no --loss-type) takes neither lever: neither offered nor noted
    plain = _fit(capsys)
    assert not any("padding-free" in s["changes"] for s in plain["suggestions"])
    assert not any("chunked_nll" in n or "padding_free" in n for n in plain["notes"])


def test_the_padding_free_move_is_the_direct_estimate_and_only_where_trl_runs():
    """The move (kit.advise.levers.padding_free): one row of the same tokens, estimated as a direct estimate of
    that setup; never for a plain Trainer, an unpadded batch or one row."""
    from kit.advise.core import limit_for
    from kit.advise.search import Search

    setup = dict(model="tiny-llama", batch_size=4, seq_len=64, loss_type="nll", device="cpu")
    s = Search(setup, limit_for(10**9, 0))
    o = s.apply({"padding-free"})
    flat = estimate(model="tiny-llama", batch_size=1, seq_len=256, padding_free=True, loss_type="nll", device="cpu")
    assert (o["batch_size"], o["seq_len"], o["padding_free"]) == (1, 256, True)
    assert s.estimate(o).peak_bytes == flat.peak_bytes
    assert s.apply({"padding-free", "split"}) is None and s.apply({"padding-free", "seq"}) is None
    for other in (dict(setup, loss_type=None), dict(setup, padded=False), dict(setup, batch_size=1)):
        assert Search(other, limit_for(10**9, 0)).apply({"padding-free"}) is None
