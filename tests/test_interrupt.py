"""Ctrl-C inside kit.train is cleaned up as an out-of-memory error is (memory back, said so), then re-raised;
kit.train's cap_bytes reads numpy integers and refuses infinity in one sentence; `%kit_cells live` works on
first use."""
import pytest

import kit
from kit import machine, models
from kit.measure import leaks
from test_watch import Inject, _trainer, ds, tok  # noqa: F401 (the fixtures)

pytestmark = pytest.mark.skipif(machine.has_cuda(), reason="CPU readings (live tensors); the GPU path is in gpu-check")


def test_ctrl_c_inside_train_gives_the_memory_back_says_so_and_re_raises(ds, tok, tmp_path, capsys):  # noqa: F811
    model = models.build_model("tiny-llama")
    base = leaks.take_baseline()                   # the weights, alone
    tr = _trainer(model, ds, tok, tmp_path, [Inject("on_step_begin", 2, KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        kit.train(tr)
    said = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("kit.train: interrupted")]
    assert len(said) == 1 and said[0].startswith("kit.train: interrupted at step 2 (forward_backward). Released")
    assert "the Trainer trains again from step 1" in said[0]
    # the interrupted frames, the gradients and AdamW's moments are gone, though `tr` is still held here
    assert leaks.check_returned(base).ok
    assert tr.optimizer is None and tr.lr_scheduler is None
    tr.remove_callback(Inject)                     # no second Ctrl-C
    again = kit.train(tr)                          # a fresh optimizer: AdamW's state starts empty at step 1
    assert not again.oom and again.step == 3


def test_cap_bytes_reads_numpy_integers_and_refuses_infinity_in_one_sentence(ds, tok, tmp_path):  # noqa: F811
    import numpy as np

    from kit.estimate import estimate_trainer

    tr = _trainer(models.build_model("tiny-llama"), ds, tok, tmp_path)
    for bad in (float("inf"), float("nan"), np.float64("inf")):
        with pytest.raises(ValueError, match=r"^cap_bytes must be a positive whole number of bytes \(or None: no "
                                             r"cap\), not (np\.float64\()?(inf|nan)\)?\.$") as e:
            kit.train(tr, cap_bytes=bad)
        assert e.value.name == "cap_bytes"
    cap = np.int64(int(1.1 * estimate_trainer(tr, device="cpu").peak_bytes))
    r = kit.train(tr, cap_bytes=cap)
    assert not r.oom and r.cap_bytes == int(cap) and type(r.cap_bytes) is int


def test_kit_cells_live_works_on_the_cell_that_turns_it_on(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    from kit.measure import cells

    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "kit")
        capsys.readouterr()
        result = ip.run_cell("%kit_cells live")          # the documented command, as its own cell
        out = capsys.readouterr()
        assert result.success and "Traceback" not in out.out + out.err and "TypeError" not in out.out + out.err
        assert cells.current(ip).last.live_end_bytes is None    # live readings start with the next cell
        ip.run_cell("import torch; x = torch.ones(2**20, dtype=torch.uint8)")
        assert cells.current(ip).last.live_delta_bytes == 2**20
        ip.run_cell("del x")
        ip.run_cell("%kit_cells cheap")                  # and back, in the same way
        assert "Traceback" not in capsys.readouterr().out
    finally:
        ip.run_line_magic("unload_ext", "kit")
        InteractiveShell.clear_instance()
