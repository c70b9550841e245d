"""The Hub code path, run without a network: the real ids load from a pre-filled Hugging Face cache.

Colab has the Hub, so there the kit takes its "Hub reachable" branch: ``from_pretrained("distilgpt2")``,
``load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1")``, ``meta-llama/Llama-3.2-1B`` in 4-bit.
Offline tests never run that branch. Here a temporary ``HF_HOME`` is filled, in the caches' own
layouts, with what a first Colab run leaves there:

- ``hub/models--<id>/{refs/main, blobs/<sha256>, snapshots/<commit>/<file> -> blob}`` for a
  DistilGPT2-shaped and a Llama-shaped tiny twin, each with its tokenizer files (huggingface_hub's
  cache; checked with ``huggingface_hub.try_to_load_from_cache``);
- ``hub/datasets--Salesforce--wikitext/...``: the parquet repo (README with its ``configs``, one
  parquet file per split), and ``datasets/Salesforce___wikitext/wikitext-2-raw-v1/0.0.0/<commit>/``:
  the Arrow tables ``datasets`` prepares from it. Offline, ``load_dataset`` reads only the latter
  (``datasets.load.CachedDatasetModuleFactory``), so it is prepared by the same parquet builder the
  online path runs, from the snapshot's own README configs.

Then a subprocess with ``HF_HOME`` there and ``HF_HUB_OFFLINE=1`` (huggingface_hub and datasets read
these at import) forces ``kit.runtime.hub_reachable`` to True, as it is on Colab, and runs the kit's
real-mode code in notebook 01's order (tokenizer, dataset, model, a Trainer run through
``s1_runs.run_fix``), then scenario 2's (a 4-bit load, and the fixed fold loop). The assertions tell
the cached objects from the kit's offline fallbacks: the twins' small widths, the rows written here,
``kit_source == "real"``, and no fallback twin saved.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPT2_ID, LLAMA_ID, WIKI_ID, WIKI_CONFIG = "distilgpt2", "meta-llama/Llama-3.2-1B", "Salesforce/wikitext", \
    "wikitext-2-raw-v1"
GPT2_WIDTH, LLAMA_WIDTH = 48, 64          # the real ones are 768 and 2048: a fallback twin would have those
COMMITS = {GPT2_ID: "1" * 40, LLAMA_ID: "2" * 40, WIKI_ID: "3" * 40}
TRAIN_ROWS = [""] + [f" cached wikitext row {i} : the quick brown fox jumps over the lazy dog . " for i in range(60)]
TEST_ROWS = ["", " cached test row . "]
README = f"""---
configs:
- config_name: {WIKI_CONFIG}
  data_files:
  - split: test
    path: {WIKI_CONFIG}/test-*
  - split: train
    path: {WIKI_CONFIG}/train-*
  - split: validation
    path: {WIKI_CONFIG}/validation-*
---
# A wikitext-shaped twin for tests
"""


def _repo_folder(repo_type: str, repo_id: str) -> str:
    return f"{repo_type}s--" + repo_id.replace("/", "--")   # huggingface_hub's repo_folder_name


def _put(hub: Path, repo_type: str, repo_id: str, files: dict[str, bytes]) -> Path:
    """Write files into the Hub cache layout: blobs by content hash, snapshot links, refs/main."""
    repo, commit = hub / _repo_folder(repo_type, repo_id), COMMITS[repo_id]
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for rel, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return repo / "snapshots" / commit


def _saved(obj, tmp: Path) -> dict[str, bytes]:
    obj.save_pretrained(tmp)
    return {p.name: p.read_bytes() for p in tmp.iterdir() if p.is_file()}


def _tokenizer():
    """The kit's shipped BPE, saved like a Hub tokenizer with no pad token (as distilgpt2 and Llama ship)."""
    from transformers import PreTrainedTokenizerFast

    from kit.assets import TOKENIZER_FILE
    from kit.data import EOS_TOKEN

    return PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_FILE), bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
                                   unk_token=EOS_TOKEN, model_max_length=1024)


def _parquet(rows: list[str]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": rows}), buf)
    return buf.getvalue()


def _prepare_arrow(snapshot: Path, datasets_cache: Path) -> Path:
    """What ``load_dataset`` writes after downloading: the parquet builder, configured from the README."""
    from datasets.load import configure_builder_class, create_builder_configs_from_metadata_configs, import_main_class
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard

    name = WIKI_ID.split("/")[1]
    configs = MetadataConfigs.from_dataset_card_data(DatasetCard.load(snapshot / "README.md").data)
    module = _PACKAGED_DATASETS_MODULES["parquet"][0]
    builder_configs, default = create_builder_configs_from_metadata_configs(module, configs,
                                                                           base_path=str(snapshot))
    cls = configure_builder_class(import_main_class(module), builder_configs, default, dataset_name=name)
    # repo_id is left out: the builder accepts only hf:// data files with it. It names the folder
    # "<namespace>___<name>"; the folder is renamed to that below.
    builder = cls(cache_dir=str(datasets_cache), dataset_name=name, config_name=WIKI_CONFIG,
                  hash=COMMITS[WIKI_ID], base_path=str(snapshot))
    builder.download_and_prepare()
    target = datasets_cache / WIKI_ID.replace("/", "___")
    (datasets_cache / name).rename(target)
    return target / WIKI_CONFIG / "0.0.0" / COMMITS[WIKI_ID]


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    import torch
    from huggingface_hub import try_to_load_from_cache
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    home = tmp_path_factory.mktemp("hf-home")
    hub, work = home / "hub", tmp_path_factory.mktemp("saved")
    tok = _tokenizer()
    ids = dict(bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=GPT2_WIDTH, n_layer=2,
                                      n_head=2, **ids))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=LLAMA_WIDTH, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, **ids)).to(torch.bfloat16)
    for repo_id, model in ((GPT2_ID, gpt2), (LLAMA_ID, llama)):
        folder = work / repo_id.replace("/", "--")
        _put(hub, "model", repo_id, {**_saved(model, folder / "model"), **_saved(tok, folder / "tok")})
    snap = _put(hub, "dataset", WIKI_ID, {
        "README.md": README.encode(),
        f"{WIKI_CONFIG}/train-00000-of-00001.parquet": _parquet(TRAIN_ROWS),
        f"{WIKI_CONFIG}/test-00000-of-00001.parquet": _parquet(TEST_ROWS),
        f"{WIKI_CONFIG}/validation-00000-of-00001.parquet": _parquet(TEST_ROWS)})
    arrow = _prepare_arrow(snap, home / "datasets")
    # The layout is the Hub's: its own lookup finds each file through refs/main.
    for repo_id in (GPT2_ID, LLAMA_ID):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            found = try_to_load_from_cache(repo_id, f, cache_dir=hub)
            assert isinstance(found, str) and COMMITS[repo_id] in found, (repo_id, f, found)
    assert COMMITS[WIKI_ID] in try_to_load_from_cache(WIKI_ID, "README.md", cache_dir=hub, repo_type="dataset")
    assert (arrow / "wikitext-train.arrow").is_file() and (arrow / "dataset_info.json").is_file()
    return home


RUN = textwrap.dedent("""
    import json, sys
    from kit import runtime
    runtime.hub_reachable = lambda *a, **k: True   # the branch Colab takes; HF_HUB_OFFLINE=1 keeps it on the cache
    from kit import data as kdata, models as kmodels
    from kit.scenarios.custom_head import runs as s1_runs
    from kit.scenarios.cross_validation import fixed_loop as s2

    out = {}
    # Notebook 01's order: tokenizer, dataset, model, then a Trainer run (fix (a), the base LM fine-tuned).
    tok = kdata.load_tokenizer("distilgpt2+vocab-head")
    ds = kdata.load_text_dataset()
    model = kmodels.load_model("distilgpt2")
    out["s1"] = dict(tok_len=len(tok), pad=tok.pad_token, train=list(ds["train"]["text"]),
                     test=list(ds["test"]["text"]), width=model.config.n_embd, source=model.kit_source)
    del model
    record, _ = s1_runs.run_fix("a", "real", steps=1, grad_accum=1)
    out["s1_fix_a"] = {k: record.get(k) for k in ("measured_peak_bytes", "oom", "error")}
    # the estimate of the model the run really trained (the cache holds a narrow stand-in for distilgpt2, so
    # the shipped config's estimate in the record is not its estimate), in the run's own settings
    from kit.scenarios.custom_head import scenario as s1
    s = s1.fix_setup("a", "real")
    loaded = kmodels.load_model("distilgpt2")
    out["s1_fix_a"]["params"] = sum(p.numel() for p in loaded.parameters())
    out["s1_fix_a"]["estimate_peak_bytes"] = s1.estimate_user(
        loaded, precision=s1.run_precision(s["precision"]), optimizer=s["optimizer"],
        load_dtype=s["load_dtype"], device="cpu", grad_accum=1).peak_bytes
    # Scenario 2: the 4-bit load its loops make, then the fixed loop (tokenizer, dataset, model, Trainer).
    model = kmodels.load_model("meta-llama/Llama-3.2-1B", quantization="4bit")
    q = model.config.quantization_config
    q = q if isinstance(q, dict) else q.to_dict()
    out["s2_load"] = dict(width=model.config.hidden_size, source=model.kit_source,
                          linear4bit=sum(type(m).__name__ == "Linear4bit" for m in model.modules()),
                          quant_type=q.get("bnb_4bit_quant_type"), double=q.get("bnb_4bit_use_double_quant"))
    del model
    fixed = s2.run_fixed_loop("meta-llama/Llama-3.2-1B", folds=2, steps_per_fold=1, batch_size=2, seq_len=32,
                              max_samples=16, output_dir=sys.argv[1], resume=False)
    out["s2_fixed"] = dict(folds=len(fixed["folds"]), reset=[f["adapter_reset_ok"] for f in fixed["folds"]],
                           oom=fixed["oom_at_fold"])
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def ran(hf_home, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KIT_CACHE"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", RUN, str(tmp_path_factory.mktemp("cv"))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):]), proc.stdout


def test_notebook_01_real_branch_loads_from_the_cache(ran):
    out, printed = ran
    s1 = out["s1"]
    assert "TOKENIZER: REAL distilgpt2 from the Hub" in printed
    assert "DATA: REAL wikitext-2-raw-v1 from the Hub" in printed
    assert "MODEL: REAL distilgpt2" in printed and "TWIN" not in printed
    assert s1["source"] == "real" and s1["width"] == GPT2_WIDTH        # the cached twin, not the 768-wide fallback
    assert s1["tok_len"] == 4096 and s1["pad"] == "[PAD]"              # the kit added the user's pad token
    assert s1["train"] == TRAIN_ROWS and s1["test"] == TEST_ROWS       # the rows written into the cache


def test_notebook_01_trainer_run_on_the_cached_model(ran):
    out, _ = ran
    fix = out["s1_fix_a"]
    assert fix["oom"] is False and fix["error"] is None
    # The cached model trained: its peak holds at least its model states (fp32 weights, grads and AdamW's two
    # moments, 16 bytes a parameter), and at most the estimate of that model at the user's full 128-token rows
    # (the run's rows are the user's shorter ones, so the estimate at 128 tokens bounds it from above)
    assert 16 * fix["params"] <= fix["measured_peak_bytes"] <= 1.02 * fix["estimate_peak_bytes"]


def test_scenario2_4bit_load_of_the_cached_llama(ran):
    out, printed = ran
    s2 = out["s2_load"]
    assert "MODEL: REAL meta-llama/Llama-3.2-1B 4bit" in printed
    assert s2["source"] == "real" and s2["width"] == LLAMA_WIDTH
    assert s2["linear4bit"] == 2 * 7                                   # q, k, v, o, gate, up, down per layer
    assert (s2["quant_type"], s2["double"]) == ("nf4", True)


def test_scenario2_fixed_loop_trains_on_the_cached_llama(ran):
    out, printed = ran
    assert "TOKENIZER: REAL meta-llama/Llama-3.2-1B from the Hub" in printed
    assert out["s2_fixed"] == {"folds": 2, "reset": [True, True], "oom": None}


def test_no_fallback_twin_was_saved(ran, hf_home):
    assert not (hf_home / "kit-twins").exists(), "the kit built an offline twin: the cache was not used"
