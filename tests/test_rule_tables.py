"""Every rule in one table: a key's values (precision, optimizer, learning-rate schedule, logger, cache dtype,
pipeline schedule, model family, adapter) are the keys of a table whose fields the code reads, so no module compares a
config value with one of those names. Names that also mean something else are left out of the search:
`pipedream` (a partition method too), `bert` (a Hugging Face model type and ptrun's presets), `transformers`
(the model group's option), `none` (a freeze policy, a recompute setting and more)."""

from __future__ import annotations

import ast
from pathlib import Path

from ptrun.config.adapter import ADAPTER_SPECS
from ptrun.config.freezing import CACHE_DTYPE_BYTES
from ptrun.config.model import FAMILY_SPECS
from ptrun.config.pipe import SCHEDULE_SPECS
from ptrun.config.training import LR_SCHEDULE_SPECS, OPTIMIZER_SPECS, PRECISION_SPECS
from ptrun.installed import LOGGER_SPECS

PACKAGE = Path(__file__).resolve().parents[1] / "ptrun"
AMBIGUOUS = {"pipedream", "bert", "transformers", "none"}
RULE_NAMES = {
    *PRECISION_SPECS,
    *OPTIMIZER_SPECS,
    *LR_SCHEDULE_SPECS,
    *LOGGER_SPECS,
    *CACHE_DTYPE_BYTES,
    *SCHEDULE_SPECS,
    *FAMILY_SPECS,
    *ADAPTER_SPECS,
} - AMBIGUOUS


def strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {s for element in node.elts for s in strings(element)}
    return set()


def rule_compares(source: str) -> list[str]:
    """Each `==`, `!=`, `in` or `not in` of `source` with a rule's name on either side."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            if {s for side in (node.left, *node.comparators) for s in strings(side)} & RULE_NAMES:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_search_finds_a_compare_with_a_rule_name():
    """The search itself can fail: a precision, a schedule and a family compared by name are each found."""
    source = 'a = p == "fp16"\nb = s in ("GPipe", "1F1B")\nc = f != "vit"\nd = x == "other"\n'
    assert [line.split(":")[0] for line in rule_compares(source)] == ["1", "2", "3"]


def test_no_module_compares_a_config_value_with_a_rule_name():
    found = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := rule_compares(path.read_text()))
    }
    assert found == {}
