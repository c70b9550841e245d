"""Each rule once (issue 45, item 4): the 8-bit optimizers' 2^31 limit in one place, and no dtype compared as an int
(a Dt is its width as an int, so `dt == 2` is true for bf16 and fp16 alike)."""
import ast
from pathlib import Path

from kit import optimizers

KIT = Path(__file__).resolve().parents[1] / "kit"


def _dtype_named(node) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "dtype" in name or name in ("dt", "adapter")


def test_no_dtype_is_compared_with_an_int():
    found = []
    for path in KIT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and _dtype_named(node.left) and any(
                    isinstance(c, ast.Constant) and type(c.value) is int for c in node.comparators):
                found.append(f"{path.relative_to(KIT.parent)}:{node.lineno}")
    assert not found, f"a dtype compared as its width: {found}"


def _powers_of_31(tree) -> list:
    """Each ``2**31`` in the code (strings, user-facing text and doctests, aside)."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow)
            and isinstance(n.left, ast.Constant) and n.left.value == 2
            and isinstance(n.right, ast.Constant) and n.right.value == 31]


def test_the_int32_limit_is_written_once():
    assert optimizers.over_int32(2**31) and not optimizers.over_int32(2**31 - 1)
    written = [str(path.relative_to(KIT.parent)) for path in sorted(KIT.rglob("*.py"))
               if _powers_of_31(ast.parse(path.read_text()))]
    assert written == ["kit/optimizers.py"], written


def test_the_int32_check_finds_a_second_copy():
    assert _powers_of_31(ast.parse("limit = 2**31 - 1\ntext = '2**31'\n")) == [1]
