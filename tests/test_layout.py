"""The house's rules, read from the source (ast): the import graph of ``kit/`` has no circle, layers point
down only, prediction never reaches the measuring side, no module imports another's private names, and every
package's ``__init__`` is its public list and a docstring."""
from __future__ import annotations

import ast
import pathlib
import re
from collections import defaultdict

import pytest

KIT = pathlib.Path(__file__).resolve().parent.parent / "kit"

# Each package's layer: an import may point to a lower layer or within its own package, never up or sideways.
LAYERS = {
    "kit.units": 0, "kit.inputs": 0, "kit.machine": 0, "kit.presets": 0, "kit.dtypes": 0, "kit.runtime": 0,
    "kit.model_configs": 0, "kit.models": 0, "kit.vocab_head": 0, "kit.data": 0, "kit.assets": 0,
    "kit.training_setup": 0, "kit.optimizers": 0, "kit.trainer_kinds": 0,
    "kit.estimate": 1, "kit.measure": 1, "kit.plot": 1,
    "kit.advise": 2,
    "kit.watching": 3, "kit.widgets": 3,
    "kit.scenarios": 4,
    "kit.cli": 5, "kit.__main__": 6, "kit": 6,
}
PREDICTION = ("kit.estimate", "kit.advise")
NOT_FOR_PREDICTION = ("kit.measure", "kit.widgets", "kit.plot", "kit.watching", "kit.scenarios", "kit.cli")


def modules(root: pathlib.Path = KIT) -> dict[str, pathlib.Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def imports(mods: dict[str, pathlib.Path]) -> dict[str, set[tuple[str, str | None, int]]]:
    """module -> {(imported module, name imported from it or None, line)}, function-level imports included."""
    out = defaultdict(set)
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        out[mod].add((f"{base}.{a.name}", None, node.lineno))
                    elif base in mods:
                        out[mod].add((base, a.name, node.lineno))
            elif isinstance(node, ast.Import):
                out[mod] |= {(a.name, None, node.lineno) for a in node.names if a.name in mods}
    return out


def package_of(mod: str) -> str:
    best = max((p for p in LAYERS if mod == p or (p != "kit" and mod.startswith(p + "."))), key=len, default=None)
    assert best is not None, f"{mod} is in no layer: add its package to LAYERS"
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each a circle of imports."""
    index, low, stack, on, found, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def module_edges(mods) -> dict[str, set[str]]:
    # A package's __init__ imports its own rooms to re-export them; a room importing the package's face
    # imports a sibling. Both are package-internal, so an edge to a package is an edge to what its face names.
    edges = defaultdict(set)
    for mod, targets in imports(mods).items():
        for target, _name, _line in targets:
            if target != mod and not (mod.startswith(target + ".") and mods[target].name == "__init__.py"):
                edges[mod].add(target)
    return edges


def problems(root: pathlib.Path = KIT) -> list[str]:
    mods = modules(root)
    found = []
    edges = module_edges(mods)
    found += [f"import circle: {' <-> '.join(c)}" for c in cycles(edges)]
    for mod, targets in sorted(imports(mods).items()):
        for target, name, line in sorted(targets, key=str):
            if name and name.startswith("_") and not name.startswith("__") and target != mod:
                found.append(f"{mod}:{line} imports the private {target}.{name}")
            src, dst = package_of(mod), package_of(target)
            if src != dst and (LAYERS[dst] > LAYERS[src] or LAYERS[dst] == LAYERS[src] != 0) \
                    and not mod.startswith(target + "."):
                found.append(f"{mod}:{line} imports {target}: layer {LAYERS[dst]} from layer {LAYERS[src]}, "
                             "not below")
    for mod in mods:  # prediction never reaches the measuring side, however far the imports go
        if package_of(mod) in PREDICTION:
            seen, todo = set(), [mod]
            while todo:
                m = todo.pop()
                for t in edges.get(m, ()):
                    if t not in seen:
                        seen.add(t)
                        todo.append(t)
            bad = sorted(t for t in seen if package_of(t) in NOT_FOR_PREDICTION)
            if bad:
                found.append(f"prediction module {mod} reaches {', '.join(bad)}")
    for mod, path in mods.items():
        if path.name == "__init__.py" and mod != "kit":
            for node in ast.parse(path.read_text()).body:
                ok = isinstance(node, (ast.ImportFrom, ast.Import)) or (
                    isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) or (
                    isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in ast.dump(node))
                if not ok:
                    found.append(f"{mod}'s __init__ holds more than a docstring and its public list "
                                 f"(line {node.lineno})")
    return found


def test_the_house_keeps_its_rules():
    assert problems() == []


def test_every_package_names_its_public_face():
    for mod, path in modules().items():
        if path.name == "__init__.py" and mod not in ("kit", "kit.assets"):
            assert "__all__" in path.read_text(), f"{mod} has no __all__"


def test_cycles_finds_a_planted_circle_in_a_module_graph():
    """The circle finder alone, on a made-up graph: a -> b -> c -> a is one circle, d -> a hangs off it, and e <-> f
    is a second; a graph without them has none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []


@pytest.mark.parametrize("plant, expected", [
    ({"kit/units.py": "from kit.estimate import estimate\n"}, "import circle"),
    ({"kit/estimate/core.py": "from kit.measure import device\n"}, "prediction module kit.estimate.core reaches"),
    ({"kit/advise/core.py": "from kit.estimate.inventory import _head_on_logits\n"}, "imports the private"),
    ({"kit/estimate/inventory.py": "from kit.advise import advise\n"}, "not below"),
])
def test_the_rules_catch_a_planted_breach(tmp_path, plant, expected):
    """Copy the tree, plant one bad import, and the check names it."""
    import shutil

    shutil.copytree(KIT, tmp_path / "kit", ignore=shutil.ignore_patterns("*.json", "*.txt", "__pycache__"))
    for rel, line in plant.items():
        p = tmp_path / rel
        p.write_text(p.read_text() + "\n" + line)
    assert any(expected in p for p in problems(tmp_path / "kit")), problems(tmp_path / "kit")


MAX_LINE = 120
LINE_CHECKED = ("kit", "benchmarks", "tests")   # the folders whose Python the line rule covers


def long_lines(root: pathlib.Path = KIT) -> list[str]:
    """``file:line (N characters)`` for each line of ``root``'s Python over MAX_LINE characters (characters, not
    bytes: a "·" counts one)."""
    return [f"{p.relative_to(root.parent)}:{i} ({len(line)} characters)"
            for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if len(line) > MAX_LINE]


def tuple_call_statements(root: pathlib.Path = KIT) -> list[str]:
    """``file:line`` for each statement that is a tuple holding a call (``a.update(x), b.update(y)``): one call a
    line instead."""
    found = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Tuple) and any(
                    isinstance(e, ast.Call) for e in node.value.elts):
                found.append(f"{p.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_line_in_kit_benchmarks_or_tests_is_over_120_characters():
    found = [line for folder in LINE_CHECKED for line in long_lines(KIT.parent / folder)]
    assert not found, f"{len(found)} line(s) over {MAX_LINE} characters: " + ", ".join(found)


def test_no_statement_in_kit_is_a_tuple_of_calls():
    found = tuple_call_statements()
    assert not found, f"{len(found)} tuple-of-calls statement(s), write one call a line: " + ", ".join(found)


def test_the_text_checks_name_a_planted_breach(tmp_path):
    """Both checks above, on a made-up package: each names the file and line it plants, and nothing else."""
    (tmp_path / "kit").mkdir()
    (tmp_path / "kit" / "bad.py").write_text("a, b = [], []\n" + "x = '" + "·" * 115 + "'\n"
                                             "a.append(1), b.append(2)\n" + "y = '" + "·" * 114 + "'\n",
                                             encoding="utf-8")
    assert long_lines(tmp_path / "kit") == ["kit/bad.py:2 (121 characters)"]
    assert tuple_call_statements(tmp_path / "kit") == ["kit/bad.py:3"]


# --- A family is named only by its own module -------------------------------------------------------------------
# A family module declares its family with one register_family(...) call; the names it declares (its name, its
# model_types and aliases) may appear in kit/'s code (identifiers and string constants, read with ast; comments
# and docstrings are prose) only in that module, or in a family module that imports it to build on it (Qwen-3's
# on Llama's layer). The exemptions, each with its reason:
FAMILY_NAME_EXEMPT = {
    # scenario 1's model keeps the user's own attribute name (self.gpt2, in the seed's code; its state-dict keys
    # follow it): a field name of that one model, not a family routed on
    ("kit/vocab_head.py", "gpt2"), ("kit/widgets/runs.py", "gpt2"),
    # the tokenizer recipe of scenario 1's user ("[PAD]" added to a GPT-2 tokenizer), matched in the Hub id a
    # notebook passes, in a foundation module below the registry; no family is routed on it
    ("kit/data.py", "gpt2"),
}
# the scenarios; the shipped configs and their name table (Hub ids: the model named "gpt2" is one)
EXEMPT_DIRS = ("kit/scenarios/", "kit/configs/", "kit/model_configs.py")
COPIED_MARK = "# Copied from "   # a table copied from a third party: the comment line above it names its source


def declared_families(root: pathlib.Path = KIT) -> dict[str, set[str]]:
    """family module (path relative to kit/'s parent) -> the names its register_family call declares."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_family" and node.args:
                names = {node.args[0].value}
                for kw in node.keywords:
                    if kw.arg in ("model_types", "aliases"):
                        names |= {e.value for e in kw.value.elts}
                out[str(p.relative_to(root.parent))] = names
    return out


# A trainer kind's class names (its trainer's and its config's) and the modules that are its own, in any layer: its
# reader in estimate/, its levers in advise/, its stage in watching/. No other module of kit/ names them (its
# identifiers and string constants read with ast; comments and docstrings are prose). kit/scenarios/ is exempt.
KIND_NAMES = {
    "sft": (("SFTTrainer", "SFTConfig"), ("kit.estimate.trl", "kit.estimate.replay.trl_offload", "kit.advise.levers")),
    "dpo": (("DPOTrainer", "DPOConfig"), ("kit.estimate.dpo", "kit.advise.dpo_levers")),
    "grpo": (("GRPOTrainer", "GRPOConfig"), ("kit.estimate.grpo", "kit.advise.grpo_levers", "kit.watching.generation")),
    "reward": (("RewardTrainer", "RewardConfig"), ("kit.estimate.reward",)),
    "kto": (("KTOTrainer", "KTOConfig"), ("kit.estimate.kto", "kit.advise.kto_levers")),
    "rloo": (("RLOOTrainer", "RLOOConfig"), ("kit.estimate.rloo", "kit.advise.grpo_levers",
                                             "kit.watching.generation")),
    "distillation": (("DistillationTrainer", "DistillationConfig"), ("kit.estimate.distillation",
                                                                     "kit.advise.distillation_levers",
                                                                     "kit.watching.generation")),
    "sentence": (("SentenceTransformerTrainer", "SentenceTransformerTrainingArguments"),
                 ("kit.estimate.sentence_trainer", "kit.advise.sentence_levers")),
    "seq2seq": (("Seq2SeqTrainer", "Seq2SeqTrainingArguments"), ("kit.estimate.seq2seq",)),
}


def _docstrings(tree) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def _copied(tree, lines) -> set[int]:
    """The constants inside a statement whose line above is a ``# Copied from <source>`` comment."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno > 1 and any(
                lines[i].lstrip().startswith(COPIED_MARK) for i in range(max(0, node.lineno - 4), node.lineno - 1)):
            out |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    return out


def _words(node, docstrings, copied) -> list[tuple[str, bool]]:
    """(text, is_identifier) for a node that names something: an identifier, or a string constant's text."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | copied:
        return [(node.value, False)]
    if isinstance(node, ast.Name):
        return [(node.id, True)]
    if isinstance(node, ast.Attribute):
        return [(node.attr, True)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, True)]
    if isinstance(node, ast.arg):
        return [(node.arg, True)]
    if isinstance(node, ast.keyword) and node.arg:
        return [(node.arg, True)]
    if isinstance(node, ast.alias):
        return [(node.asname or node.name, True)]
    return []


def names_in(text: str, names, identifier: bool) -> set[str]:
    """The names that appear in ``text`` as words: in an identifier between underscores (``_LLAMA_LOOP``); in a
    string as a word of its own, not part of a model name, a path or a file name (``"tiny-llama"``,
    ``"meta-llama/Llama-3.2-1B"``, ``"org/gpt2"``, ``"gpt2.json"``); the longest name first (``qwen3_moe`` is not
    ``qwen3``)."""
    before, after = (r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])") if identifier else (r"(?<![\w\-/.])", r"(?![\w\-/]|\.\w)")
    found, text = set(), text.lower() if identifier else text
    for name in sorted(names, key=len, reverse=True):
        pattern = before + re.escape(name) + after
        if re.search(pattern, text):
            found.add(name)
            text = re.sub(pattern, " ", text)
    return found


def family_name_breaches(root: pathlib.Path = KIT) -> list[str]:
    declared = declared_families(root)
    owner = {name: path for path, names in declared.items() for name in names}
    found = []
    for p in sorted(root.rglob("*.py")):
        rel = str(p.relative_to(root.parent))
        if rel.startswith(EXEMPT_DIRS):
            continue
        source = p.read_text(encoding="utf-8")
        tree = ast.parse(source, str(p))
        allowed = set(declared.get(rel, ()))
        if rel in declared:   # a family module may name the families whose modules it imports (it builds on them)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    mods = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
                    allowed |= {n for m in mods for path, names in declared.items()
                                if m.replace(".", "/") + ".py" == path for n in names}
        docstrings, copied = _docstrings(tree), _copied(tree, source.splitlines())
        for node in ast.walk(tree):
            for text, identifier in _words(node, docstrings, copied):
                # (every name is matched, the longest first, so that an allowed one hides none inside it:
                # qwen2_5_vl is not qwen2; then the allowed ones are dropped)
                for name in names_in(text, owner.keys(), identifier) - allowed:
                    if (rel, name) not in FAMILY_NAME_EXEMPT:
                        found.append(f"{rel}:{node.lineno} names {name} ({owner[name]}'s family): {text[:60]!r}")
    return found


def test_a_family_is_named_only_by_its_own_module():
    found = family_name_breaches()
    assert not found, f"{len(found)} place(s) name a family outside its module:\n" + "\n".join(found)


def test_every_family_module_declares_its_family_once():
    """One register_family call per family module, and no name declared twice: what the check above reads."""
    declared = declared_families()
    assert len(declared) >= 16, declared
    names = [n for names in declared.values() for n in names]
    assert len(names) == len(set(names))
    assert declared["kit/estimate/replay/llama.py"] == {"llama", "mistral", "qwen2"}


def test_the_family_rule_catches_a_planted_name(tmp_path):
    """Copy the tree, name a family outside its module (as a string, in an identifier, in another family's
    module), and the check names each; prose (a docstring, a comment) or a model name ("tiny-llama") is no breach."""
    import shutil

    shutil.copytree(KIT, tmp_path / "kit", ignore=shutil.ignore_patterns("*.json", "*.txt", "__pycache__"))
    plants = {"kit/estimate/evaluation.py": ('LOOPS = ("llama", "mistral")\n', "evaluation.py:"),
              "kit/estimate/core.py": ("def _gemma2_note():\n    return 0\n", "core.py:"),
              "kit/estimate/replay/phi3.py": ('X = "gpt_neox"\n', "phi3.py:")}
    for rel, (line, _) in plants.items():
        p = tmp_path / rel
        p.write_text(p.read_text() + "\n" + line)
    (tmp_path / "kit" / "prose.py").write_text('"""llama, mistral"""\nNAME = "tiny-llama"\n# gemma2\n')
    found = family_name_breaches(tmp_path / "kit")
    assert {where for _, (_, where) in plants.items() if any(where in f for f in found)} == \
        {where for _, where in plants.values()}, found
    assert len(found) == 4 and not [f for f in found if "prose.py" in f], found   # llama and mistral: two
def _kind_word(node) -> str | None:
    """The text of a node that names something: an identifier, an attribute, an import, a string constant."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return node.name
    return node.name if isinstance(node, ast.alias) else None


def kind_names_outside(root: pathlib.Path = KIT, kinds: dict = KIND_NAMES) -> list[str]:
    """``module:line name`` for each trainer class name in a module that is not its kind's (``kit.scenarios``
    exempt)."""
    found = []
    for mod, path in sorted(modules(root).items()):
        if mod.startswith("kit.scenarios"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            text = None if id(node) in prose else _kind_word(node)
            for names, own in kinds.values() if text else ():
                found += [f"{mod}:{node.lineno} {n}" for n in names
                          if re.search(rf"\b{n}\b", text) and mod not in own]
    return found


def test_a_trainer_kinds_class_names_live_in_its_own_modules():
    found = kind_names_outside()
    assert not found, f"{len(found)} trainer class name(s) outside their kind's modules: " + ", ".join(found)


def test_each_registered_kinds_parts_are_among_its_own_modules():
    """The table above is the registry's: every part a TRL kind registers lives in a module the table names."""
    import kit.advise  # noqa: F401 (registers the kinds' levers)
    import kit.watching  # noqa: F401 (registers the kinds' stages)
    from kit import trainer_kinds

    assert set(KIND_NAMES) == set(trainer_kinds.keys()) - {"trainer"}
    for (key, layer), part in trainer_kinds.PARTS.items():
        if key in KIND_NAMES:
            where = part.attach.__module__ if hasattr(part, "attach") else part.__module__
            assert where in KIND_NAMES[key][1], f"{key}'s {layer} part lives in {where}, not one of its modules"


def test_the_kind_check_names_a_planted_breach(tmp_path):
    (tmp_path / "kit" / "estimate").mkdir(parents=True)
    (tmp_path / "kit" / "scenarios").mkdir()
    (tmp_path / "kit" / "estimate" / "dpo.py").write_text('"""DPOTrainer, in prose."""\nX = "SFTConfig(x=1)"\n'
                                                          'NAME = "DPOTrainer"\n')
    (tmp_path / "kit" / "estimate" / "other.py").write_text('# GRPOTrainer in a comment\nfrom trl import GRPOConfig\n')
    (tmp_path / "kit" / "scenarios" / "s.py").write_text('Y = "RewardTrainer"\n')
    assert kind_names_outside(tmp_path / "kit") == ["kit.estimate.dpo:2 SFTConfig",
                                                                "kit.estimate.other:2 GRPOConfig"]


# Names that read: a module is imported under its own name, or a name anyone reads (numpy's np, torch's nn and F,
# pyplot's plt, pandas' pd, ipywidgets' W), never under an opaque short alias such as ``kin`` for kit.inputs.
CONVENTIONAL_ALIASES = {"np", "nn", "F", "plt", "pd", "W"}
SHORTEST_ALIAS = 4


def opaque_aliases(root: pathlib.Path = KIT) -> list[str]:
    """``file:line name as alias`` for each import under an alias of fewer than SHORTEST_ALIAS characters that is
    not a convention."""
    found = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [f"{p.relative_to(root.parent)}:{node.lineno} {a.name} as {a.asname}" for a in node.names
                          if a.asname and len(a.asname) < SHORTEST_ALIAS and a.asname not in CONVENTIONAL_ALIASES]
    return found


MOST_FIELDS_BY_POSITION = 8


def record_fields(root: pathlib.Path = KIT) -> dict[str, int]:
    """Each dataclass or NamedTuple of kit/ with more than MOST_FIELDS_BY_POSITION fields: its name and fields."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if not isinstance(node, ast.ClassDef):
                continue
            record = any("dataclass" in ast.unparse(d) for d in node.decorator_list) or any(
                ast.unparse(b) in ("NamedTuple", "typing.NamedTuple") for b in node.bases)
            fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                      and "ClassVar" not in ast.unparse(s.annotation)]
            if record and len(fields) > MOST_FIELDS_BY_POSITION:
                out[node.name] = len(fields)
    return out


def records_built_by_position(root: pathlib.Path = KIT) -> list[str]:
    """``file:line Record`` for each call that builds a big record (:func:`record_fields`) with any argument given
    by position: each field by its name."""
    big, found = record_fields(root), []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, ast.Call) and node.args:
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name in big:
                    found.append(f"{p.relative_to(root.parent)}:{node.lineno} {name}")
    return found


def test_no_module_is_imported_under_an_opaque_alias():
    found = opaque_aliases()
    assert not found, "import each under its own name: " + ", ".join(found)


def test_no_record_of_more_than_8_fields_is_built_by_position():
    found = records_built_by_position()
    assert not found, "give each field by name: " + ", ".join(found)


def test_the_name_checks_name_a_planted_breach(tmp_path):
    """Both checks above, on a made-up package: each names what it plants, and passes the conventions."""
    (tmp_path / "kit").mkdir()
    fields = "\n".join(f"    f{i}: int = 0" for i in range(9))
    (tmp_path / "kit" / "bad.py").write_text(
        "import numpy as np\nfrom kit import inputs as kin\nfrom dataclasses import dataclass\n\n\n@dataclass\n"
        f"class Big:\n{fields}\n\n\nok = Big(f0=1)\nbad = Big(1, 2)\n", encoding="utf-8")
    assert opaque_aliases(tmp_path / "kit") == ["kit/bad.py:2 inputs as kin"]
    assert records_built_by_position(tmp_path / "kit") == ["kit/bad.py:20 Big"]
