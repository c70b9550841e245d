"""Models: shipped configs give the real parameter counts, twins train, loading goes through from_pretrained."""
import sys
import warnings

import pytest
import torch

from kit import data, models

REAL_COUNTS = {
    "distilgpt2": 81_912_576,
    "gpt2": 124_439_808,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
}
HEAD_PARAMS = 50258 * 50258 + 50258  # 2,525,916,822


@pytest.fixture(autouse=True)
def _twin_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "twins"))


@pytest.mark.parametrize("name,count", REAL_COUNTS.items())
def test_real_sizes_on_meta_have_exact_param_counts(name, count):
    model = models.build_model(name, device="meta")
    assert model.num_parameters() == count
    assert next(model.parameters()).is_meta


def test_llama_configs_match_the_published_ones():
    big, small = models.get_config("meta-llama/Meta-Llama-3-8B"), models.get_config("meta-llama/Llama-3.2-1B")
    assert (big.hidden_size, big.num_hidden_layers, big.num_key_value_heads, big.intermediate_size) \
        == (4096, 32, 8, 14336)
    assert big.tie_word_embeddings is False and big.max_position_embeddings == 8192
    assert small.tie_word_embeddings is True and small.max_position_embeddings == 131072
    assert (small.rope_parameters["rope_type"], small.rope_parameters["factor"]) == ("llama3", 32.0)


def test_vocab_head_model_on_meta_is_scenario_one():
    model = models.build_model("distilgpt2+vocab-head", device="meta")
    assert isinstance(model, models.VocabHeadModel)
    assert model.gpt2.config.vocab_size == 50258  # the pad token was added
    assert sum(p.numel() for p in model.custom_layer.parameters()) == HEAD_PARAMS == 2_525_916_822
    assert all(p.requires_grad for p in model.custom_layer.parameters())
    assert not any(p.requires_grad for p in model.gpt2.parameters())
    assert model.gpt2.is_activation_checkpointing
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == HEAD_PARAMS
    assert models.get_config("distilgpt2+vocab-head").vocab_size == 50258


def test_tiny_twins_match_the_shipped_tokenizer():
    tok = data.shipped_tokenizer()
    for name in ("tiny-gpt2", "tiny-llama"):
        cfg = models.get_config(name)
        assert cfg.vocab_size == len(tok) == 4096
        assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) \
            == (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
        assert cfg.num_hidden_layers == 2
    llama = models.get_config("tiny-llama")
    assert llama.num_key_value_heads < llama.num_attention_heads  # GQA, like Llama-3


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_tiny_twin_forward_backward_on_cpu(name):
    torch.manual_seed(0)
    model = models.build_model(name)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_tiny_vocab_head_trains_only_the_head():
    torch.manual_seed(0)
    model = models.build_model("tiny-gpt2+vocab-head")
    v = model.gpt2.config.vocab_size
    assert v == 4097 and model.custom_layer.weight.shape == (v, v)
    ids = torch.randint(0, 4096, (2, 12))
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    assert set(out) == {"loss", "logits"} and out["logits"].shape == (2, 12, v)
    out["loss"].backward()
    assert model.custom_layer.weight.grad is not None
    assert all(p.grad is None for p in model.gpt2.parameters())


def test_vocab_head_trains_and_saves_under_trainer_with_gradient_checkpointing(tmp_path):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    tok = data.shipped_tokenizer()
    model = models.build_model("tiny-gpt2+vocab-head")
    base_before = model.gpt2.transformer.h[0].mlp.c_fc.weight.clone()
    head_before = model.custom_layer.weight.clone()
    rows = [{"input_ids": list(range(2, 2 + n))} for n in (5, 9, 7, 3)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, gradient_checkpointing=True, learning_rate=1e-2,
                             use_cpu=True, save_strategy="steps", save_steps=2, logging_steps=1, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=data.collator(tok))
    result = trainer.train()
    assert result.global_step == 2 and result.training_loss > 0
    assert not torch.equal(model.custom_layer.weight, head_before)
    assert torch.equal(model.gpt2.transformer.h[0].mlp.c_fc.weight, base_before)
    # The checkpoint saves despite GPT-2's tied embeddings (safetensors refuses shared tensors).
    assert (tmp_path / "checkpoint-2" / "model.safetensors").is_file()


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        models.get_config("distilgtp2")
    message = str(err.value)
    assert "distilgpt2" in message and "meta-llama/Meta-Llama-3-8B" in message and "config.json" in message
    with pytest.raises(ValueError, match="vocab head"):
        models.get_config("tiny-llama+vocab-head")
    with pytest.raises(ValueError, match="cpu"):
        models.build_model("tiny-gpt2", device="cuda")


def test_config_from_a_path(tmp_path):
    models.build_model("tiny-llama").config.save_pretrained(tmp_path)
    for path in (tmp_path, tmp_path / "config.json"):
        assert models.get_config(str(path)).num_key_value_heads == 2
    assert models.build_model(str(tmp_path), device="meta").num_parameters() \
        == models.build_model("tiny-llama").num_parameters()


def test_smoke_twin_and_known_models():
    assert models.smoke_twin("distilgpt2") == "tiny-gpt2"
    assert models.smoke_twin("meta-llama/Meta-Llama-3-8B") == "tiny-llama"
    assert models.smoke_twin("distilgpt2+vocab-head") == "tiny-gpt2+vocab-head"
    assert models.smoke_twin("tiny-llama") == "tiny-llama"
    for name in models.known_models():
        models.get_config(name)  # every listed name resolves


def test_load_model_offline_is_a_loud_twin_loaded_with_from_pretrained(capsys):
    model = models.load_model("distilgpt2")
    out = capsys.readouterr().out
    assert "MODEL: architecture TWIN of distilgpt2" in out and "Hub is not reachable" in out
    assert model.kit_source == "twin"
    folder = models.twin_dir("distilgpt2", torch.float32)
    assert (folder / "config.json").is_file() and model.name_or_path == str(folder)
    assert model.num_parameters() == REAL_COUNTS["distilgpt2"]
    assert next(model.parameters()).dtype == torch.float32


def test_load_vocab_head_takes_the_tokenizer_length(capsys):
    tok = data.shipped_tokenizer()
    model = models.load_model("tiny-gpt2+vocab-head", tokenizer=tok)
    assert "tiny TWIN tiny-gpt2" in capsys.readouterr().out
    assert isinstance(model, models.VocabHeadModel) and model.kit_source == "twin"
    assert model.custom_layer.in_features == len(tok) == 4096


def test_bnb_config_recipes():
    four = models.bnb_config("4bit")
    assert four.load_in_4bit and four.bnb_4bit_quant_type == "nf4" and four.bnb_4bit_use_double_quant
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    assert models.bnb_config("8bit").load_in_8bit
    assert models.bnb_config("none") is None
    with pytest.raises(ValueError, match="4bit"):
        models.bnb_config("3bit")


@pytest.mark.parametrize("quantization,layer", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")])
def test_quantized_tiny_llama_on_cpu(quantization, layer, capsys):
    pytest.importorskip("bitsandbytes")
    model = models.load_model("tiny-llama", quantization=quantization)
    assert f"tiny-llama {quantization}" in capsys.readouterr().out
    assert sum(type(m).__name__ == layer for m in model.modules()) == 2 * 7  # q,k,v,o,gate,up,down per layer
    assert model.config.quantization_config.to_dict()[f"load_in_{quantization}"]
    ids = torch.randint(0, 4096, (1, 8))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_quantization_without_bitsandbytes_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import now fails, as on Colab
    with pytest.raises(RuntimeError, match="pip install bitsandbytes"):
        models.load_model("tiny-llama", quantization="4bit")


# ---- configs that cannot be read or built: one sentence each --------------------------------
def test_unreadable_config_files_are_one_sentence(tmp_path):
    import json

    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(models.get_config("tiny-llama").to_dict())[:80])
    with pytest.raises(ValueError, match=r"cut.json is not a readable config.json .*download or copy it again"):
        models.get_config(cut)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"is not a transformers config.json \(it has no \"model_type\"\)"):
        models.get_config(listed)
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps({"model_type": "my-own-llm", "hidden_size": 8}))
    with pytest.raises(ValueError, match="model_type 'my-own-llm'.*remote code, which the kit never runs"):
        models.get_config(custom)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no config.json"):
        models.get_config(tmp_path / "empty")


def test_a_config_that_is_no_causal_lm_is_refused_before_building():
    from transformers import ViTConfig

    with pytest.raises(ValueError, match=r"^vit \(ViTConfig\) is not a causal language model .*decoder-only") as exc:
        models.build_model(ViTConfig(), device="meta")
    assert "GPT2Config, " not in str(exc.value)  # not transformers' list of every causal LM config


def test_a_config_with_a_size_of_zero_is_one_sentence_naming_the_field():
    cfg = models.get_config("tiny-llama")
    cfg.num_attention_heads = 0
    with pytest.raises(ValueError, match=r"^this llama config: num_attention_heads is 0, and a model needs it a whole "
                                         r"number >= 1: fix that field\.$"):
        models.build_model(cfg, device="meta")


def test_a_pad_id_beyond_the_vocabulary_is_one_sentence_not_an_assertion(tmp_path):
    from transformers import Phi3Config

    from kit.models import build_model

    Phi3Config(vocab_size=4096, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2).to_json_file(tmp_path / "config.json")   # pad id 32000 by default
    with pytest.raises(ValueError, match=r"could not build a phi3 model.*Padding_idx must be within num_embeddings"):
        build_model(tmp_path / "config.json", device="meta")


# ---- issue 26 ------------------------------------------------------------------------------------------------

def test_item1_build_model_takes_cuda_and_says_so_where_there_is_no_gpu(monkeypatch):
    from kit import machine

    monkeypatch.setattr(machine, "has_cuda", lambda: False)
    with pytest.raises(ValueError, match=r"build_model\(device='cuda'\) needs a CUDA GPU"):
        models.build_model("tiny-gpt2", device="cuda")
    with pytest.raises(ValueError, match="builds on 'cpu', 'meta' or 'cuda'"):
        models.build_model("tiny-gpt2", device="tpu")


@pytest.mark.gpu
def test_item1_gpu_build_model_builds_on_the_gpu():
    m = models.build_model("tiny-gpt2", device="cuda")
    assert {p.device.type for p in m.parameters()} == {"cuda"}


def test_item3_a_trainable_fp16_head_trains_without_fp16_autocast_and_its_scaler_unscales():
    """Scenario 1's head in fp16 (a quantized load on a T4). With fp16=True Trainer's GradScaler raises
    'Attempting to unscale FP16 gradients'; with the panel's flags the step goes through."""
    from kit.widgets.runs import amp_flags

    model = models.build_model("tiny-gpt2+vocab-head")
    model.custom_layer.half()
    flags = amp_flags(model, "fp16", cuda=True)
    assert flags == {"fp16": False, "bf16": False}
    for p in model.custom_layer.parameters():
        p.grad = torch.zeros_like(p)              # fp16 gradients, as backward leaves them
    opt = torch.optim.SGD(model.custom_layer.parameters(), lr=1e-3)

    def unscale(enabled: bool) -> None:           # what Trainer's fp16=True does before clipping and stepping
        scaler = torch.amp.GradScaler("cpu", enabled=enabled)
        scaler.scale(torch.ones(()))
        scaler.unscale_(opt)

    unscale(flags["fp16"])                        # the panel's flags: no scaler, no error
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        unscale(True)                             # fp16=True, what the panel set before
    assert amp_flags(models.build_model("tiny-gpt2+vocab-head"), "fp16", cuda=True)["fp16"] is True


def _shards(monkeypatch, shard_bytes):
    import safetensors.torch

    sizes = []
    real = safetensors.torch.save_file
    monkeypatch.setattr(models, "SHARD_BYTES", shard_bytes)
    monkeypatch.setattr(safetensors.torch, "save_file", lambda t, *a, **k: sizes.append(
        sum(x.numel() * x.element_size() for x in t.values())) or real(t, *a, **k))
    return sizes


def test_item4_and_7_the_twin_is_written_a_shard_at_a_time_without_normal_init(monkeypatch, tmp_path):
    from kit.measure.tensor_peak import TensorPeak

    real_normal, real_init = torch.Tensor.normal_, torch.nn.init.normal_

    def guard(real):
        def normal_(t, *a, **k):                 # on meta it costs nothing; on real memory it is the slow init
            if not t.is_meta:
                raise AssertionError("normal_ ran on real memory: the twin was initialised element by element")
            return real(t, *a, **k)
        return normal_

    monkeypatch.setattr(torch.Tensor, "normal_", guard(real_normal))
    monkeypatch.setattr(torch.nn.init, "normal_", guard(real_init))
    cfg = models.get_config("distilgpt2")
    total = models.twin_bytes(cfg, torch.float32)
    sizes = _shards(monkeypatch, 32 * 2**20)
    with TensorPeak() as peak:
        models.write_twin(cfg, tmp_path / "twin", torch.float32)
    largest = 50257 * 768 * 4                                # wte: one tensor bigger than a shard
    assert sum(sizes) == total and total >= REAL_COUNTS["distilgpt2"] * 4   # every weight, once (wte is tied)
    assert len(sizes) > 3 and max(sizes) <= largest
    assert peak.peak_bytes - peak.start_bytes <= 32 * 2**20 + largest + 4 * 1_000_003, peak.peak_bytes
    from transformers import AutoModelForCausalLM

    monkeypatch.undo()                                       # loading may initialise as it likes
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "twin")
    assert m.num_parameters() == REAL_COUNTS["distilgpt2"]
    x = torch.randint(0, 1000, (1, 16))
    assert torch.isfinite(m(input_ids=x, labels=x).loss)


def test_item4_a_twin_that_does_not_fit_the_disk_is_refused_in_one_sentence(monkeypatch):
    import collections

    monkeypatch.setattr(models.shutil, "disk_usage", lambda p: collections.namedtuple("U", "total used free")(
        10**12, 10**12 - 10**9, 10**9))
    why = models.twin_problem("meta-llama/Meta-Llama-3-8B", "bf16")
    assert why.startswith("the architecture twin of meta-llama/Meta-Llama-3-8B needs 15.0 GiB of disk"), why
    assert "set KIT_CACHE" in why
    with pytest.raises(RuntimeError, match="needs 15.0 GiB of disk"):
        models.saved_twin("meta-llama/Meta-Llama-3-8B", torch.bfloat16)


@pytest.mark.parametrize("capability, dtype", [((7, 5), torch.float16), ((8, 0), torch.bfloat16)])
def test_item11_the_4bit_compute_dtype_follows_the_compute_capability(monkeypatch, capability, dtype):
    from kit import machine

    monkeypatch.setattr(machine, "compute_capability", lambda: capability)
    assert models.bnb_config("4bit").bnb_4bit_compute_dtype == dtype


@pytest.mark.parametrize("name", ["tiny-llama", "distilgpt2+vocab-head"])
def test_checkpointing_is_set_by_the_name_this_transformers_has(name):
    """``set_checkpointing`` turns the layers' checkpointing on and off with no FutureWarning: transformers 5.25
    renamed ``gradient_checkpointing_enable`` to ``activation_checkpointing_enable`` and warns on the old name."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    model = models.build_model(name, device="meta")
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        models.set_checkpointing(model.gpt2 if name.endswith("vocab-head") else model, enabled=False)
        assert layers and not any(layer.gradient_checkpointing for layer in layers)
        models.set_checkpointing(model, kwargs={"use_reentrant": False})
        assert all(layer.gradient_checkpointing for layer in layers)


def test_i50_16_kit_cache_with_a_tilde_is_under_the_home_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KIT_CACHE", "~/kitcache")
    monkeypatch.chdir(tmp_path)
    folder = models.twin_dir("tiny-llama", torch.float32)
    assert folder.parent == tmp_path / "home" / "kitcache"
    models.saved_twin("tiny-llama", torch.float32)
    assert (folder / "config.json").is_file() and not (tmp_path / "~").exists()


@pytest.mark.parametrize("under", ["", "sub"])
def test_i50_6_kit_cache_at_a_file_is_one_sentence_naming_the_variable(monkeypatch, tmp_path, under):
    from kit.inputs import InputError

    (tmp_path / "a-file").write_text("the user's")
    monkeypatch.setenv("KIT_CACHE", str(tmp_path / "a-file" / under))
    with pytest.raises(InputError, match="KIT_CACHE is .*a-file is a file, not a folder: point KIT_CACHE at a "
                                         "folder") as caught:
        models.saved_twin("tiny-llama", torch.float32)
    assert caught.value.name == "KIT_CACHE" and (tmp_path / "a-file").read_text() == "the user's"
