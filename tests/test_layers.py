"""The package's layers, read from its source: `report`, `models`, `data`, `costs`, `layout`, `numerics`,
`compiling`, `parallel`, `freezing`, `auto`, `train`, `launcher` and `sim` from the bottom up (every package but
the base's `config`), each importing only from layers below it (or from the base modules every layer may use), and
no import cycle anywhere in `ptrun`. Imports inside functions count; imports only for type checkers do not (they
never run)."""

from __future__ import annotations

import ast
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
