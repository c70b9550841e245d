"""The shipped configs of the models people fine-tune in Colab (issue 13 item 1), by their exact Hub ids.

Each config is the model's own config.json (non-architectural fields such as transformers_version,
_name_or_path and auto_map dropped). Each is pinned here by the exact parameter count of its twin
built on the meta device, against a published figure named beside it:
- "HF API" is the Hub's safetensors.total for that id (or for a twin with the same architecture,
  named), as recorded in public code; a tied head stored twice on the Hub is noted.
- "keras-hub" is the `params` of the named preset in keras-team/keras-hub's *_presets.py.
- The Pythia and Gemma 2 papers give non-embedding counts; the embedding part is vocab x hidden.
"""
import json

import pytest
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from kit.model_configs import CONFIG_DIR, REGISTRY, get_config, known_models
from kit.models import build_model

PUBLISHED = {
    # keras-hub llama3.1_8b 8030261248; HF API meta-llama/Llama-3.1-8B safetensors.total 8030261248.
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    # HF API meta-llama/Llama-3.2-3B-Instruct (same architecture) 3212749824; keras-hub llama3.2_3b
    # 3606752256 counts the tied head again: 3212749824 + 128256 x 3072.
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    # keras-hub mistral_0.3_7b_en ("Mistral 7B base version 0.3") 7248023552; HF API 7248023552.
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    # keras-hub qwen2.5_0.5b_en 494032768; HF API Qwen/Qwen2.5-0.5B-Instruct 494032768.
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    # HF API Qwen/Qwen2.5-1.5B-Instruct 1543714304; keras-hub qwen2.5_math_1.5b_en (same shape) 1543714304.
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    # HF API Qwen/Qwen2.5-7B-Instruct 7615616512; keras-hub qwen2.5_math_7b_en (same shape) 7615616512.
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    # keras-hub qwen3_0.6b_en 596049920 (the Hub's safetensors.total, 751632384, stores the tied
    # head again: + 151936 x 1024).
    "Qwen/Qwen3-0.6B": 596_049_920,
    # keras-hub qwen3_8b_en 8190735360; HF API Qwen/Qwen3-8B 8190735360.
    "Qwen/Qwen3-8B": 8_190_735_360,
    # keras-hub gemma2_2b_en 2614341888; Gemma 2 paper Table 2: 2,024,517,888 non-embedding + 256000 x 2304.
    "google/gemma-2-2b": 2_614_341_888,
    # keras-hub gemma2_9b_en 9241705984; Gemma 2 paper Table 2: 8,324,201,984 non-embedding + 256000 x 3584.
    "google/gemma-2-9b": 9_241_705_984,
    # keras-hub gemma3_instruct_1b 999885952; HF API google/gemma-3-1b-it 999885952.
    "google/gemma-3-1b-it": 999_885_952,
    # HF API microsoft/Phi-3.5-mini-instruct 3821079552; keras-hub phi3_mini_4k_instruct_en (same shape) 3821079552.
    "microsoft/Phi-3.5-mini-instruct": 3_821_079_552,
    # HF API HuggingFaceTB/SmolLM2-135M-Instruct (same architecture) 134515008.
    "HuggingFaceTB/SmolLM2-135M": 134_515_008,
    # HF API HuggingFaceTB/SmolLM2-360M-Instruct 361821120.
    "HuggingFaceTB/SmolLM2-360M-Instruct": 361_821_120,
    # HF API HuggingFaceTB/SmolLM2-1.7B-Instruct 1711376384.
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": 1_711_376_384,
    # The Hub's safetensors metadata for this id: {"F32": 1100048384}.
    "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T": 1_100_048_384,
    # Pythia paper Table 1: 805,736,448 non-embedding + 2 x 50304 x 2048 (untied in and out embeddings).
    "EleutherAI/pythia-1b": 1_011_781_632,
    # HF API allenai/OLMo-2-1124-7B safetensors.total 7298617344.
    "allenai/OLMo-2-1124-7B": 7_298_617_344,
    # The model card's "Model Architecture" table (huggingface.co/stabilityai/stablelm-3b-4e1t, as copied in
    # https://toolify.ai/ai-model/stabilityai-stablelm-3b-4e1t): 2,795,443,200 parameters, hidden 2560, 32 layers,
    # 32 heads, sequence length 4096. Its config.json, copied field for field from the public copy in mlc-ai/mlc-llm
    # (https://github.com/mlc-ai/mlc-llm/blob/01ced331a9e155c5ba4e7625b027a51bee611450/python/mlc_llm/model/
    # model_preset.py, its "stablelm" entry: StableLmForCausalLM, 2560 hidden, 32 layers, 50304 vocabulary;
    # transformers_version dropped); the fields that copy leaves out take StableLmConfig's defaults (no parallel
    # residual, no q/k LayerNorm, no dropout).
    "stabilityai/stablelm-3b-4e1t": 2_795_443_200,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_shipped_model_builds_to_its_published_parameter_count(name):
    assert name in known_models()
    assert build_model(name, device="meta").num_parameters() == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_shipped_config_is_plain_config_json_that_autoconfig_reads(name):
    path = CONFIG_DIR / REGISTRY[name]
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["model_type"] in CONFIG_MAPPING                  # no remote code needed
    assert not {"auto_map", "transformers_version", "_name_or_path"} & set(data)
    assert type(AutoConfig.from_pretrained(path)) is type(get_config(name))
    assert get_config(name).kit_name == name


# Qwen/Qwen3-30B-A3B's config.json, copied field for field from the public copy in citsjtu2020/LLM-Prof
# (https://github.com/citsjtu2020/LLM-Prof/blob/8434c8d19c396b2f95d92a67845a7c0a0e0dd512/sglang/Model_Config.md,
# its "Qwen3-30B-A3B" entry; transformers_version dropped). That file's "Qwen3-8B" entry is the shipped Qwen3-8B.json,
# field for field. The published figures are the model card's (Qwen/Qwen3-30B-A3B, and its 2507 update of the same
# architecture, as copied in peterhan91/mimic_skills,
# https://github.com/peterhan91/mimic_skills/blob/c001b2faedc2d0676be35dc6af677c8f9ff756ff/docs/qwen3-a3b.md):
# "30.5B in total", "Number of Paramaters (Non-Embedding): 29.9B", 48 layers, 128 experts, 8 activated, 32 query
# heads and 4 kv heads.
def test_qwen3_30b_a3b_builds_to_its_model_cards_figures():
    cfg = get_config("Qwen/Qwen3-30B-A3B")
    model = build_model("Qwen/Qwen3-30B-A3B", device="meta")
    total = model.num_parameters()
    embeddings = 2 * cfg.vocab_size * cfg.hidden_size      # untied input and output embeddings
    assert round(total / 1e9, 1) == 30.5 and round((total - embeddings) / 1e9, 1) == 29.9
    assert (cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok) == (48, 128, 8)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (32, 4)
    test_a_shipped_config_is_plain_config_json_that_autoconfig_reads("Qwen/Qwen3-30B-A3B")


# mistralai/Mixtral-8x7B-v0.1's config.json, copied field for field from the public copy in NVIDIA/TensorRT-LLM,
# tests/unittest/_torch/modeling/test_modeling_mixtral.py (MIXTRAL_8X7B_CONFIG, commit 1aa6e3d4; transformers_version
# dropped), the same fields as the copy that quotes huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json.
# The published figures are the Mixtral paper's (Jiang et al. 2024): 46.7B parameters in total, 12.9B active per token
# (two of the eight experts).
def test_mixtral_8x7b_builds_to_its_papers_figures():
    cfg = get_config("mistralai/Mixtral-8x7B-v0.1")
    total = build_model("mistralai/Mixtral-8x7B-v0.1", device="meta").num_parameters()
    experts = cfg.num_hidden_layers * cfg.num_local_experts * 3 * cfg.hidden_size * cfg.intermediate_size
    idle = experts * (cfg.num_local_experts - cfg.num_experts_per_tok) // cfg.num_local_experts
    assert round(total / 1e9, 1) == 46.7 and round((total - idle) / 1e9, 1) == 12.9
    test_a_shipped_config_is_plain_config_json_that_autoconfig_reads("mistralai/Mixtral-8x7B-v0.1")


# openai/gpt-oss-20b's config.json, copied field for field from the public copy in tinygrad/tinygrad,
# test/external/external_test_gpt_oss.py (TORCH_PARAMS["20B"], commit 6a9011bf, which quotes
# https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json; transformers_version dropped), its MXFP4
# quantization_config kept. The published figures are the model card's (openai/gpt-oss-20b: 21B parameters, 3.6B
# active; arXiv 2508.10925: 20.9B in total): the active ones are four of the 32 experts and no input embeddings.
def test_gpt_oss_20b_builds_to_its_model_cards_figures():
    cfg = get_config("openai/gpt-oss-20b")
    model = build_model("openai/gpt-oss-20b", device="meta")
    total = model.num_parameters()
    experts = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    idle = experts * (cfg.num_local_experts - cfg.num_experts_per_tok) // cfg.num_local_experts
    embeddings = cfg.vocab_size * cfg.hidden_size
    assert round(total / 1e9, 1) == 20.9 and round((total - idle - embeddings) / 1e9, 1) == 3.6
    assert cfg.quantization_config["quant_method"] == "mxfp4" and cfg.layer_types[:2] == ["sliding_attention",
                                                                                         "full_attention"]
    test_a_shipped_config_is_plain_config_json_that_autoconfig_reads("openai/gpt-oss-20b")
