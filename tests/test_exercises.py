"""The notebooks' exercises: each check tells a working answer from a wrong one (the solutions shown in the
notebooks' collapsed cells are the working answers here)."""
import gc

import pytest
import torch

from kit.scenarios.cross_validation.exercises import check_free, check_reset
from kit.scenarios.custom_head import notebook as s1nb

SMALL = dict(batch_size=2, seq_len=16, max_samples=8)


def solution_reset(model, init):
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = name.replace(".default", "")  # peft's saved names drop the adapter's name
            if key in init:
                param.copy_(init[key])


def solution_free(trainer):
    trainer.accelerator.free_memory()  # the accelerator's own lists of models, optimizers, data loaders
    trainer.callback_handler.model = None
    trainer.model = trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = None
    gc.collect()
    torch.cuda.empty_cache()


def test_the_reset_check_tells_a_working_reset_from_the_advice():
    from kit.scenarios.cross_validation.lora_reset import advice_reset

    assert check_reset(solution_reset, "tiny-llama", **SMALL).startswith("your reset works")
    assert "NOT reset" in check_reset(lambda model, init: advice_reset(model), "tiny-llama", **SMALL)


def test_the_free_check_tells_a_working_cleanup_from_the_users():
    from kit.scenarios.cross_validation.user_loop import free_gpu_cache

    assert check_free(solution_free, "tiny-llama", **SMALL).startswith("your cleanup works")
    assert "left 1 model" in check_free(lambda trainer: free_gpu_cache(), "tiny-llama", **SMALL)


def test_the_largest_rank_fits_and_the_next_does_not():
    best = s1nb.largest_rank("colab-t4")
    assert s1nb.rank_check(best).endswith("the largest")
    assert "DOES NOT FIT" in s1nb.rank_check(best + 1)
    assert s1nb.twin_rank(best, "real") == best and s1nb.twin_rank(best, "smoke") < 4097
    with pytest.raises(ValueError, match="below the vocabulary"):
        s1nb.rank_check(60000)
