"""kit.advise.table.levers: each lever alone, its figures those of the estimate of the setup with that change, the
free ones first, and the ones that do not apply named, not shown as zero."""
from kit.advise import limit_for
from kit.advise.search import MOVES
from kit.advise.table import NAMES, TIERS, levers
from kit.cli.fit import setup_of
from kit.cli.parser import build_parser
from kit.estimate import estimate

QWEN = dict(model="Qwen/Qwen2.5-0.5B", batch_size=16, seq_len=512)


def test_each_row_is_the_estimate_of_that_one_change():
    t = levers(QWEN, "colab-t4")
    lim, base = limit_for("colab-t4"), estimate(**QWEN)
    assert (t.setup_peak_bytes, t.setup_reserved_bytes) == (base.peak_bytes, base.reserved_bytes)
    shown = [r for r in t.rows if r.peak_bytes is not None]
    assert len(t.rows) == len(MOVES) and {r.name for r in t.rows} == set(NAMES.values())
    for r in shown:   # the row's change, pasted back through the fit command's own parser, estimates the same
        opts = setup_of(build_parser().parse_args(["fit", "--model", QWEN["model"], "--batch-size", "16",
                                                   "--seq-len", "512", *r.cli.split()]))
        e = estimate(**opts)
        assert (e.peak_bytes, lim.judged(e), lim.judged(e) <= lim.usable_bytes) == (r.peak_bytes, r.reserved_bytes,
                                                                                   r.fits), r.name
    order = [list(TIERS.values()).index(r.cost) for r in t.rows]
    assert order == sorted(order) and t.rows[0].name == "allocator: expandable segments"
    idle = {r.name for r in t.rows if r.peak_bytes is None}
    assert {"fused AdamW", "sdpa attention"} <= idle   # the setup has them already
    text = str(t)
    assert "not for this setup (already so, or it does not apply): fused AdamW" in " ".join(text.split())
    assert all(len(line) <= 120 for line in text.splitlines())


def test_a_mixture_of_experts_gets_its_levers_named():
    """Issue 46's MoE levers, where the table has them: LoRA on the attention only with the experts frozen (peft's
    targets, or all-linear, reach no fused expert parameter), and fewer routed tokens per step (the smaller
    micro-batch, the shorter sequences): each row the estimate of that change, and the table says what they are."""
    setup = dict(model="tiny-qwen3-moe", batch_size=8, seq_len=256)
    t = levers(setup, "colab-t4")
    rows = {r.name: r for r in t.rows}
    attention = estimate(**setup, lora_r=16, lora_targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    opts = setup_of(build_parser().parse_args(["fit", "--model", setup["model"], "--batch-size", "8", "--seq-len",
                                               "256", *rows["LoRA on every linear layer"].cli.split()]))
    assert estimate(**opts).trainable_params == attention.trainable_params   # the experts and the router frozen
    for fewer in ("smaller micro-batch, accumulate", "shorter sequences"):
        assert rows[fewer].peak_bytes < t.setup_peak_bytes
    text = " ".join(str(t).split())
    assert "mixture of experts: the LoRA rows adapt the attention only" in text and "tokens x top-k" in text
    assert "mixture of experts" not in str(levers(QWEN, "colab-t4"))
