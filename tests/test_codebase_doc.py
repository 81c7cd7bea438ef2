"""docs/codebase.md names only what is in the tree: every path it mentions exists, and every `ptrun.…` name is a
module, or a name a module defines at its top level.

The rule the document follows, read block by block (a paragraph, a list item, a table row, a code block):
- A path is written in backticks: a mention with a `/` (`ptrun/train/step.py`, `layout/`, `tests/*_dist.py`) or
  ending in `.py` or `.sh` (`plan.py`, `cli*.py`). It names a file or folder of the tree (a glob: at least one),
  relative to the repository's root, to `ptrun/`, or to the folder of a path mentioned before it in the same
  block (`plan.py` in the `layout/` row). A bare name with another suffix (`report.md`, `config.json`) is a file a
  run writes or reads, not one of the tree's, and a mention with a placeholder (`RUN_DIR/config.yaml`,
  `org/name`) or an absolute path names no file of the tree either.
- Outside backticks, nothing looks like a path of the tree: no word ending in a source suffix and no word that
  starts with one of the repository's top-level folders (`ptrun/…`, `tests/…`). Code blocks of Python are the
  source quoted (tests/test_layers.py compares them); other code blocks (a diagram) are read as plain words.
- A test's node id (`tests/test_layers.py::test_no_import_cycles`) names a test its file defines, and a
  command in backticks (`bash scripts/test.sh`) runs the tree's scripts.
- A dotted name from `ptrun.` (`ptrun.layout.fill.resolve(cfg, world, devices)`) is a module, or a module and a
  name its source defines at the top level (a function, a class, an assignment, an import).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "codebase.md"
SOURCE_SUFFIXES = (".py", ".sh")
PLAIN_SUFFIXES = (".py", ".sh", ".md", ".toml", ".cfg", ".yaml", ".yml")
"""A plain word ending in one of these is a path written without its backticks."""
TOP_FOLDERS = tuple(sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")))


def blocks(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each block: "code" (a code block that is not Python), "python", "row" (a table row),
    "item" (a list item, its continuation lines with it) or "prose" (a paragraph)."""
    out: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        fence = line.strip()
        if fence.startswith("```"):
            body = []
            for inner in lines:
                if inner.strip().startswith("```"):
                    break
                body.append(inner)
            out.append(("python" if fence[3:].strip() == "python" else "code", body))
        elif not line.strip():
            out.append(("blank", []))
        elif line.startswith("|"):
            out.append(("row", [line]))
        elif re.match(r"(- |\d+\. )", line):
            out.append(("item", [line]))
        elif out and out[-1][0] in ("item", "prose") and out[-1][1]:
            out[-1][1].append(line)
        else:
            out.append(("prose", [line]))
    return [(kind, "\n".join(body)) for kind, body in out if kind != "blank"]


def is_path(mention: str) -> bool:
    """A backticked mention that names a path of the tree (see the module's docstring)."""
    if re.search(r"\s|[=()$~:<>]", mention) or mention.startswith(("/", ".")):
        return False
    if "/" in mention:
        return not re.search(r"[A-Z]{2,}", mention) and mention.split("/")[0] not in ("org",)
    return mention.endswith(SOURCE_SUFFIXES)


def exists(mention: str, folders: list[Path]) -> Path | None:
    """Where `mention` is, relative to the root, `ptrun/` or `folders` (nearest first); None when nowhere."""
    for base in [ROOT, ROOT / "ptrun", *folders]:
        if any(c in mention for c in "*?["):
            found = sorted(base.glob(mention.rstrip("/")))
            if found:
                return found[0]
        elif (base / mention).exists() and (not mention.endswith("/") or (base / mention).is_dir()):
            return base / mention
    return None


def missing_paths(text: str) -> list[str]:
    problems = []
    for kind, block in blocks(text):
        if kind == "python":
            continue
        folders: list[Path] = []
        mentions = re.findall(r"`([^`]+)`", block) if kind != "code" else []
        for mention in mentions:
            if re.fullmatch(r"[\w/.]+\.py::\w+(\[[^\]]*\])?", mention):  # a test's node id
                file, _, test = mention.partition("::")
                if not (ROOT / file).is_file() or test.split("[")[0] not in top_level_names(ROOT / file):
                    problems.append(f"`{mention}`: no such test")
                continue
            if not is_path(mention):
                # a command: the scripts it runs are the tree's (`bash scripts/test.sh`)
                problems += [
                    f"`{word}`: no such path (in the command `{' '.join(mention.split())}`)"
                    for word in mention.split()
                    if word.split("/")[0] in TOP_FOLDERS and "/" in word and exists(word, []) is None
                ]
                continue
            found = exists(mention, folders)
            if found is None:
                problems.append(f"`{mention}`: no such path (in: {block.splitlines()[0][:80]}...)")
                continue
            folder = found if found.is_dir() else found.parent
            folders.insert(0, folder)
        plain = re.sub(r"`[^`]+`", " ", block) if kind != "code" else block
        for word in re.findall(r"[\w./*-]+", plain):
            word = word.rstrip(".")
            if word.endswith(PLAIN_SUFFIXES) or (
                "/" in word and word.split("/")[0] in TOP_FOLDERS and word.split("/")[1:] != [""]
            ):
                if kind == "code":
                    if exists(word, []) is None:
                        problems.append(f"{word}: no such path (in a code block)")
                else:
                    problems.append(f"{word}: a path outside backticks (in: {block.splitlines()[0][:80]}...)")
    return problems


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_names(text: str) -> list[str]:
    problems = []
    for kind, block in blocks(text):
        if kind in ("python", "code"):
            continue
        for mention in re.findall(r"`(ptrun(?:\.\w+)+)", block):
            parts = mention.split(".")
            depth = max((i for i in range(1, len(parts) + 1) if module_file(".".join(parts[:i]))), default=0)
            if depth == 0:
                problems.append(f"`{mention}`: no such module")
            elif depth < len(parts) and parts[depth] not in top_level_names(module_file(".".join(parts[:depth]))):
                problems.append(f"`{mention}`: {'.'.join(parts[:depth])} defines no {parts[depth]}")
    return problems


def test_every_path_the_document_names_is_in_the_tree():
    problems = missing_paths(DOC.read_text())
    assert not problems, "docs/codebase.md names what is not in the tree:\n" + "\n".join(problems)


def test_every_ptrun_name_the_document_names_is_defined():
    problems = missing_names(DOC.read_text())
    assert not problems, "docs/codebase.md names what ptrun does not define:\n" + "\n".join(problems)


def test_the_reader_finds_a_moved_file_and_a_bare_path():
    """The checks themselves: a row's bare name resolves in the row's folder and fails once moved; a path
    without backticks, a diagram's missing file, a command's missing script, a missing test and a missing
    module name are each found."""
    row = "| `layout/` | `plan.py` (a plan), `owners.py` |"
    assert missing_paths(row) == []
    assert missing_paths(row.replace("plan.py", "plans.py")) == [
        "`plans.py`: no such path (in: | `layout/` | `plans.py` (a plan), `owners.py` |...)"
    ]
    assert missing_paths("See ptrun/layout/plan.py.") == [
        "ptrun/layout/plan.py: a path outside backticks (in: See ptrun/layout/plan.py....)"
    ]
    assert missing_paths("```\n|-- in_use  ptrun/train/nowhere.py\n```") == [
        "ptrun/train/nowhere.py: no such path (in a code block)"
    ]
    assert missing_paths("A run writes `report.md` and `RUN_DIR/config.yaml`.") == []
    assert missing_paths("`bash scripts/nothing.sh -x` and `tests/test_layers.py::test_nothing[a]`") == [
        "`scripts/nothing.sh`: no such path (in the command `bash scripts/nothing.sh -x`)",
        "`tests/test_layers.py::test_nothing[a]`: no such test",
    ]
    assert missing_names("`ptrun.layout.fill.resolve(cfg)` and `ptrun.layout.fill.nothing_here`") == [
        "`ptrun.layout.fill.nothing_here`: ptrun.layout.fill defines no nothing_here"
    ]
