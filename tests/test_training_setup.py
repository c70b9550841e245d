"""One declared description of a training setup feeds estimate(), the CLI, the advisor and the panel; and the
public face the README and docs/cli-and-api.md document is where it was."""
import inspect
import json

import pytest

import kit
from kit import training_setup as ts
from kit.advise import search
from kit.cli import build_parser
from kit.cli.fit import setup_of
from kit.estimate import estimate
from kit.inputs import InputError


def test_every_declared_option_is_an_estimate_keyword_and_nothing_else_is():
    base = estimate("tiny-gpt2", batch_size=1, seq_len=16)
    for name, default in ts.DEFAULTS.items():
        if default is not None and name not in ("batch_size", "seq_len"):
            estimate("tiny-gpt2", batch_size=1, seq_len=16, **{name: default})   # each is taken as declared
    with pytest.raises(InputError, match="unknown setup option lora_alpha") as exc:
        estimate("tiny-gpt2", batch_size=1, seq_len=16, lora_alpha=32)
    assert exc.value.name == "lora_alpha"
    with pytest.raises(InputError, match="seq_len must be given"):
        estimate("tiny-gpt2", batch_size=1)
    assert base.setup["optimizer"] == ts.DEFAULTS["optimizer"]


def test_the_cli_flags_the_advisor_and_the_panel_are_read_from_the_declaration():
    parser = build_parser()
    for command in ("estimate", "fit"):
        flags = {}
        for a in parser._subparsers._group_actions[0].choices[command]._actions:
            flags.setdefault(a.dest, []).extend(a.option_strings)
        for name, f in ts.FIELDS.items():
            for flag in (f.metadata["flag"], f.metadata["negative"]):
                assert flag is None or flag in flags[name], (command, name, flag)
    assert search.KW == ("model",) + ts.KEYWORDS
    assert list(search.CLI) == list(ts.SUGGESTED) and search.CLI["attn_implementation"] == "attn"
    from kit.widgets.build import DEFAULTS
    from kit.widgets.runs import SETUP_KEYS

    assert SETUP_KEYS == ("model",) + ts.PANEL
    assert all(set(ts.PANEL) <= set(d) for d in DEFAULTS.values())


def test_an_option_declared_once_reaches_the_cli_and_the_estimate(capsys):
    """lora_dropout was an estimate() keyword only; declaring its flag in one field put it on both commands."""
    argv = ["--model", "tiny-llama", "--batch-size", "2", "--seq-len", "32", "--lora-r", "4"]
    args = build_parser().parse_args(["fit", *argv, "--lora-dropout", "0.1"])
    assert setup_of(args)["lora_dropout"] == 0.1
    assert kit.cli.main(["estimate", *argv, "--lora-dropout", "0.1", "--json"]) == 0
    with_dropout = json.loads(capsys.readouterr().out)
    direct = estimate("tiny-llama", batch_size=2, seq_len=32, lora_r=4, lora_dropout=0.1)
    assert with_dropout["peak_bytes"] == direct.peak_bytes
    assert direct.saved_bytes > estimate("tiny-llama", batch_size=2, seq_len=32, lora_r=4).saved_bytes  # its masks


def test_a_scenarios_settings_are_checked_against_the_declaration():
    assert ts.declared(batch_size=1, grad_accum=16) == {"batch_size": 1, "grad_accum": 16}
    with pytest.raises(InputError, match="unknown setup option grad_acum"):
        ts.declared(grad_acum=16)


def test_the_public_face_is_where_the_readme_says():
    from kit.advise import advise, max_batch_size
    from kit.estimate import estimate_from, estimate_trainer

    assert all(callable(f) for f in (kit.panel, kit.check, kit.watch, kit.train, advise, max_batch_size,
                                     estimate_from, estimate_trainer, kit.load_ipython_extension,
                                     kit.unload_ipython_extension))
    assert kit.check.__wrapped__ is kit.advise.check and kit.watch is kit.watching.watch
    assert "trainer" in inspect.signature(kit.train).parameters
    assert kit.panel.__module__ == "kit.widgets.build"
