"""The package's layers, read from its source: `report`, `models`, `data`, `costs`, `layout`, `numerics`,
`compiling`, `parallel`, `freezing`, `auto`, `train`, `launcher` and `sim` from the bottom up (every package but
the base's `config`), each importing only from layers below it (or from the base modules every layer may use), and
no import cycle anywhere in `ptrun`. Imports inside functions count; imports only for type checkers do not (they
never run)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from importlib.util import resolve_name
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ptrun"
LAYERS = (
    "report",
    "models",
    "data",
    "costs",
    "layout",
    "numerics",
    "compiling",
    "parallel",
    "freezing",
    "auto",
    "train",
    "launcher",
    "sim",
)
"""Bottom first: a module in one of these packages imports from its own layer or lower ones only."""
BASE = ("ptrun.compat", "ptrun.errors", "ptrun.installed", "ptrun.config")
"""Below every layer: each (a module, or a package with its modules) imports only from itself and the ones
before it in this list."""


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _runtime_nodes(tree: ast.AST):
    """Every node, except the bodies of `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ptrun modules `name` imports (the deepest module an import names: `from ptrun.data import x`
    imports `ptrun.data.x` when that is a module, else `ptrun.data`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve_name("." * node.level + (node.module or ""), package)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def base(name: str) -> int | None:
    return next((i for i, b in enumerate(BASE) if name == b or name.startswith(b + ".")), None)


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_layer_imports_from_one_above_it():
    upward = [
        f"{name} -> {dep}"
        for name, deps in graph().items()
        for dep in sorted(deps)
        if layer(name) is not None and layer(dep) is not None and layer(dep) > layer(name)
    ]
    upward += [
        f"{name} -> {dep}"
        for name, deps in graph().items()
        if base(name) is not None
        for dep in sorted(deps)
        if base(dep) is None or base(dep) > base(name)
    ]
    assert not upward, f"imports against the layers ({' < '.join(LAYERS)}, base below all):\n" + "\n".join(upward)


def test_every_package_has_a_layer():
    """A new package takes its place in LAYERS (or the base's), so the check above covers it."""
    packages = {path.parent.name for path in PACKAGE.glob("*/*.py")}
    assert packages - set(LAYERS) == {"config"}, sorted(packages - set(LAYERS))


def test_no_import_cycles():
    edges = graph()
    cycles, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(" -> ".join(path[path.index(node) :] + [node]))
            return
        if node in done:
            return
        for dep in sorted(edges.get(node, ())):
            visit(dep, path + [node])
        done.add(node)

    for name in sorted(edges):
        visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(sorted(set(cycles)))


LAUNCHER = (
    "ptrun.cli_train",
    "ptrun.compose",
    "ptrun.launcher.start",
    "ptrun.launcher.launch",
    "ptrun.launcher.worker",
    "ptrun.launcher.elastic_agent",
)
"""`ptrun train`'s side: the command, the config's steps, the agent and the workers."""


def test_the_launcher_never_imports_the_simulator():
    """Filling a config and running it need no simulation (`ptrun plan` is the simulator's command): no module
    `ptrun train` can import, inside functions included, is one of `ptrun.sim`'s."""
    edges = graph()
    seen, todo = set(LAUNCHER), list(LAUNCHER)
    while todo:
        for dep in edges.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    assert sorted(n for n in seen if n == "ptrun.sim" or n.startswith("ptrun.sim.")) == []


def test_the_checks_see_an_import_inside_a_function(tmp_path):
    """The reader itself: a function-level import counts, a type-checking-only one does not."""
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ptrun.train.trainer\n"
        "def f():\n    from ptrun.auto import controller\n"
    )
    modules = module_names()
    assert imports("ptrun.models.m", source, modules) == {"ptrun.auto.controller"}


MAX_MODULE_LINES = 450
ROOT = PACKAGE.parent


def test_no_module_is_over_450_lines():
    """Small modules with one job each: a module that grows past this is split along its jobs."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in sorted((ROOT / "ptrun").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_the_walkthrough_quotes_the_step_as_it_is():
    """docs/codebase.md quotes `train_step` and the segment's loop whole: a change to either shows here until
    the document follows."""
    import inspect
    import textwrap

    from ptrun.train import step, trainer

    doc = (ROOT / "docs" / "codebase.md").read_text()
    # The quote sits in a list item, indented with it (ruff formats the document's code blocks too).
    assert textwrap.indent(inspect.getsource(step.train_step), "  ") in doc
    loop = inspect.getsource(trainer.Trainer._train_segment)
    quoted = [line.strip() for line in loop.splitlines() if line.strip() and not line.strip().startswith('"""')]
    assert all(line in doc for line in quoted), quoted


def test_the_trainer_keeps_the_loop_and_the_wiring():
    """The Trainer composes a few parts: at most 15 attributes, an `__init__` whose body is at most 40 lines (its
    signature, formatted one parameter a line, not counted), and no part (no call at all) is handed the trainer
    itself."""
    import ast
    import inspect

    from ptrun.train import trainer

    tree = ast.parse(inspect.getsource(trainer))
    attributes = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    assert len(attributes) <= 15, sorted(attributes)
    init = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    assert init.end_lineno - init.body[0].lineno + 1 <= 40
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    handed = [
        call.lineno
        for call in calls
        if any(isinstance(a, ast.Name) and a.id == "self" for a in [*call.args, *(k.value for k in call.keywords)])
    ]
    assert handed == [], f"trainer.py hands `self` to a call at lines {handed}"


INNER_IMPORT_REASONS = ("start-up", "optional library", "spawned process")
"""Why an import may sit inside a function, the keys docs/codebase.md states: `start-up` (a module on the
commands' path keeps `ptrun --help` and a refused config quick), `optional library` (a heavy or optional library,
or a heavy part of one, imported only where a run uses it), `spawned process` (what only the process started
from the function needs)."""
MAX_INNER_PTRUN_IMPORTS = 60
"""Imports of ptrun modules inside functions, at most."""
REASON = re.compile(r"#\s*inner import:\s*(.*)")


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def inner_import_runs(tree: ast.AST) -> list[list[ast.Import | ast.ImportFrom]]:
    """The imports inside functions (not under `if TYPE_CHECKING:`), in runs: the imports that follow each
    other in one block, with no other statement between them."""
    runs: list[list] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            run: list = []
            for child in block:
                if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                    run.append(child)
                    continue
                if run:
                    runs.append(run)
                run = []
                if _is_type_checking(child):  # only its `else:` runs
                    visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                elif isinstance(child, ast.AST):
                    visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))
            if run:
                runs.append(run)

    visit(tree, False)
    return runs


def imports_ptrun(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").split(".")[0] == "ptrun"
    return any(alias.name.split(".")[0] == "ptrun" for alias in node.names)


def unexplained_inner_imports(source: str) -> list[tuple[int, str]]:
    """(line, why) of each import inside a function without a reason: a comment `# inner import: KEY`, KEY one
    of INNER_IMPORT_REASONS, at the end of one of the import's lines, or on the line directly above it or above
    an import before it in its run (the comment covers the rest of the run)."""
    comments = {
        token.start[0]: token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }

    def key(line: int) -> str | None:
        found = REASON.search(comments.get(line, ""))
        return found.group(1).strip() if found else None

    def known(text: str) -> bool:
        return any(
            text == k or (text.startswith(k) and not re.match(r"[\w-]", text[len(k)])) for k in INNER_IMPORT_REASONS
        )

    lines = source.splitlines()
    problems = []
    for run in inner_import_runs(ast.parse(source)):
        covering = None
        for node in run:
            own = next((k for line in range(node.lineno, node.end_lineno + 1) if (k := key(line)) is not None), None)
            above = key(node.lineno - 1) if lines[node.lineno - 2].lstrip().startswith("#") else None
            if above is not None:
                covering = above
            reason = own if own is not None else covering
            if reason is None:
                problems.append((node.lineno, "no `# inner import: KEY` comment"))
            elif not known(reason):
                problems.append((node.lineno, f"unknown reason {reason!r}"))
    return problems


def test_every_import_inside_a_function_says_why():
    """Imports sit at the top of a module; one inside a function names its reason, one of the keys
    docs/codebase.md lists, in a comment `# inner import: KEY` on its line or above its run of imports."""
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {why}: {lines[line - 1].strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for lines, source in [(path.read_text().splitlines(), path.read_text())]
        for line, why in unexplained_inner_imports(source)
    ]
    assert not problems, (
        f"{len(problems)} imports inside functions without a reason (keys: {', '.join(INNER_IMPORT_REASONS)};"
        f" a light or already loaded module goes to the top):\n" + "\n".join(problems)
    )


def test_at_most_60_imports_of_ptrun_modules_inside_functions():
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for run in inner_import_runs(ast.parse(path.read_text()))
        for node in run
        if imports_ptrun(node)
    ]
    assert len(found) <= MAX_INNER_PTRUN_IMPORTS, f"{len(found)} imports of ptrun modules inside functions:\n" + (
        "\n".join(found)
    )


def test_the_document_states_the_same_reasons():
    """docs/codebase.md lists the keys, one bullet each, right after the paragraph that names the comment."""
    lines = (ROOT / "docs" / "codebase.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "`# inner import: KEY`" in line)
    bullets = []
    for line in lines[start + 1 :]:
        if line.startswith("- "):
            bullets.append(re.match(r"- `([^`]+)`", line).group(1))
        elif not line.startswith("  ") and bullets:
            break
    assert tuple(bullets) == INNER_IMPORT_REASONS


def test_the_reason_reader_sees_each_form():
    """The reader itself: a reason at the end of the line, above a run (blank lines and the second import
    covered), none, an unknown key; module-level and type-checking imports need none."""
    source = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "def f():\n"
        "    if TYPE_CHECKING:\n"
        "        import ptrun.train\n"
        "    import json  # inner import: start-up\n"
        "    x = 1\n"
        "    # inner import: optional library (timm)\n"
        "    import timm\n"
        "\n"
        "    from ptrun.models import vit\n"
        "    y = 2\n"
        "    import re\n"
        "    from ptrun import (  # inner import: sometime\n"
        "        errors,\n"
        "    )\n"
        "    class C:\n"
        "        def g(self):\n"
        "            from ptrun import compat  # inner import: spawned process\n"
    )
    assert unexplained_inner_imports(source) == [
        (13, "no `# inner import: KEY` comment"),
        (14, "unknown reason 'sometime'"),
    ]
    assert [imports_ptrun(n) for run in inner_import_runs(ast.parse(source)) for n in run] == [
        False,
        False,
        True,
        False,
        True,
        True,
    ]
