"""sentence-transformers' SentenceTransformerTrainer (issue 48, part 3): the own-head probe calls a SentenceTransformer
as its losses do (one dict of features), a read leaves the model as it was, the trainer's columns become the
forwards a step runs (the anchor alone, the others merged), and the estimate is within 2% of the independent meter
(``benchmarks/real_clients.py``'s ProfilerMeter) at step 1 and at the steady step on a tiny BERT twin.

sentence-transformers is an optional extra of the kit (``requirements-dev.txt`` installs it): without it, this file
is skipped with the reason printed."""
import warnings

import pytest
import torch

pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed (an optional extra of "
                    "the kit; pip install -r requirements-dev.txt)")

from kind_checks import assert_within_2_percent, step_ratios  # noqa: E402

import clients_embeddings as ce  # noqa: E402
import real_clients as rc  # noqa: E402

from kit import inputs as kin  # noqa: E402
from kit.estimate import estimate_trainer  # noqa: E402
from kit.estimate.own_head import OwnHeadError, calling, read_own_head  # noqa: E402

warnings.filterwarnings("ignore")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sentence"))


def _model(work, pooling="mean"):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules

    transformer = modules.Transformer(ce.st_twin(work), max_seq_length=128)
    return SentenceTransformer(modules=[transformer, modules.Pooling(transformer.get_embedding_dimension(), pooling)])


def test_the_probe_calls_a_sentence_transformer_with_one_dict_of_features(work):
    """It was called model(input_ids=..., attention_mask=...): "BaseModel.forward() missing 1 required positional
    argument: 'input'", a refusal of the most common embedding model there is."""
    model = _model(work)
    assert calling(model) == "features"
    head = read_own_head(model)
    assert head.base == "0.model" and head.labels == 128   # its pooled embedding: (rows, hidden)
    assert head.per_token == 4   # the mean pooling's mask made float, (rows, tokens, 1): 4 bytes a token


def test_the_probe_reads_cls_pooling_keeping_the_hidden_state(work):
    head = read_own_head(_model(work, "cls"))
    assert head.per_token == 128 * 4   # hidden[:, 0] is a view: its backward keeps the whole (rows, tokens, H) state


def test_a_read_leaves_the_sentence_transformer_as_it_was(work):
    model = _model(work)
    model.eval()
    model[1].train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    attributes = [dict(vars(m)) for m in model.modules()]
    read_own_head(model)
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [set(vars(m)) for m in model.modules()] == [set(a) for a in attributes]
    assert all(vars(m)[k] is v for m, a in zip(model.modules(), attributes) for k, v in a.items())
    assert "forward" not in vars(model[0].model)   # the stand-in forward is gone


def test_a_forward_taking_neither_keywords_nor_one_dict_is_refused_by_name():
    class TwoInputs(torch.nn.Module):
        def forward(self, left, right):
            return left

    with pytest.raises(OwnHeadError, match="requires left, right"):
        calling(TwoInputs(), "TwoInputs")


def test_columns_are_the_forwards_a_step_runs(work):
    trainer = ce.sentence_trainer(work, towers=3, B=4, S=32, rows=8)
    est = estimate_trainer(trainer, device="cpu")
    # the anchor alone, then positive and negative merged: (rows as a multiple of B, tokens) each
    assert est.sources["towers"][0] == ((1, 32), (2, 32))
    assert est.sources["seq_len"][0] == 32 and est.setup["towers"] == ((1, 32), (2, 32))
    assert not any(n.code == "own-head-loss" for n in est.notes if isinstance(n, kin.Note))
    two = estimate_trainer(ce.sentence_trainer(work, towers=2, B=4, S=32, rows=8), device="cpu")
    assert est.activations_bytes > 1.4 * two.activations_bytes   # three columns' saved tensors against two


def test_each_forward_runs_at_its_own_columns_length(work):
    """A short anchor (a query) beside long documents: the anchor's forward at its length, the merged one at theirs,
    and the estimate below the one that takes every column at the longest."""
    trainer = ce.sentence_trainer(work, towers=3, B=4, S=64, rows=8, anchor_tokens=16)
    est = estimate_trainer(trainer, device="cpu")
    assert est.setup["towers"] == ((1, 16), (2, 64)) and est.sources["seq_len"][0] == 64
    assert est.activations_bytes < estimate_trainer(trainer, device="cpu", seq_len=64).activations_bytes


def test_a_loss_the_kit_does_not_model_is_refused_by_name(work):
    from sentence_transformers.sentence_transformer import losses

    trainer = ce.sentence_trainer(work, B=4, S=32, rows=8)
    trainer.loss = losses.CachedMultipleNegativesRankingLoss(trainer.model)
    with pytest.raises(kin.InputError, match="CachedMultipleNegativesRankingLoss") as raised:
        estimate_trainer(trainer, device="cpu")
    assert raised.value.code == "st-loss"


@pytest.mark.parametrize("loss, columns, pooling, B, S", [("MultipleNegativesRankingLoss", 3, "mean", 16, 64),
                                                           ("CoSENTLoss", 2, "cls", 4, 32),
                                                           ("OnlineContrastiveLoss", 2, "mean", 16, 64)])
def test_the_estimate_is_within_2_percent_of_the_meter(work, loss, columns, pooling, B, S):
    """B16 x 64: the backward is step 1's peak as well as the later steps'; B4 x 32: the optimizer's first step is."""
    _, setup, est, peaks = rc.run_trainer_client(ce.client_sentence(work, loss, columns, pooling, B, S),
                                                 rc.ProfilerMeter)
    assert_within_2_percent(setup, step_ratios(est, peaks), peaks)


def test_kit_check_answers_for_a_sentence_transformer_trainer(work, capsys):
    import kit

    kit.check(ce.sentence_trainer(work, B=4, S=32, rows=8))
    out = capsys.readouterr().out
    answer = [line for line in out.splitlines() if line.strip()]
    assert answer[0].startswith("fits") and "cannot be read" not in out, out


def test_kit_check_on_a_sentence_transformer_trainer_that_does_not_fit_says_what_to_change(work, capsys):
    """The advisor does not search a setup whose forwards it read from the trainer's columns: one sentence instead."""
    import kit

    trainer = ce.sentence_trainer(work, towers=3, B=4, S=32, rows=8)
    est = kit.check(trainer, device=int(estimate_trainer(trainer, device="cpu").peak_bytes * 0.5))
    out = " ".join(capsys.readouterr().out.split())
    assert est.setup["towers"] == ((1, 32), (2, 32))
    assert "DOES NOT FIT" in out and "the fit advisor does not search SentenceTransformerTrainer setups" in out, out


def test_kit_train_runs_a_sentence_transformer_trainer_beside_its_estimate(work):
    import kit

    trainer = ce.sentence_trainer(work, towers=3, B=4, S=32, rows=8)
    expected = estimate_trainer(trainer, device="cpu").peak_bytes   # no GPU here: the watch judges the CPU
    report = kit.train(trainer, plot=False)
    assert not report.oom and report.step == 3   # max_steps=3
    assert report.estimate_peak_bytes == expected
