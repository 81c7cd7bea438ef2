"""The entries of ptrun's caches (`ptrun.cache_entries`): written atomically beside a checksum, verified on read,
and rebuilt, said in one line, when damaged (bytes flipped, truncated, another entry's file copied over it,
half-written by a run that was killed); two processes rebuilding one entry at once leave one good entry. Each
cache's own tests (tests/test_hf_data.py, tests/test_microtune.py, tests/test_compile_price.py) damage its
entries with `damage` and check it trains or tunes as with a clean cache."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ptrun import cache_entries

DAMAGES = ("flipped", "truncated", "foreign")
"""How `damage` spoils an entry: bytes flipped in its middle, cut to half its size, replaced by another
entry's file."""


def damage(path: Path, how: str, other: Path | None = None) -> None:
    """Spoil the cache entry at `path` as a bad disk, a run killed mid-write or a wrong copy would. `other`: the
    entry whose file replaces it (`foreign`)."""
    if how == "flipped":
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
        path.write_bytes(bytes(data))
    elif how == "truncated":
        os.truncate(path, path.stat().st_size // 2)
    elif how == "foreign":
        assert other is not None and other.read_bytes() != path.read_bytes()
        shutil.copyfile(other, path)
    else:
        raise ValueError(how)


def said(caplog, path: Path) -> list[str]:
    """The lines the cache code said about unusable entries, checked to name `path`."""
    lines = [r.getMessage() for r in caplog.records if r.name == cache_entries.__name__]
    assert all(str(path) in line and "\n" not in line for line in lines), lines
    return lines


def entry(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    cache_entries.write_bytes(path, data)
    return path


# ---- checking ---------------------------------------------------------------------------------------------------


def test_a_written_entry_is_whole_and_the_folder_holds_it_and_its_checksum_only(tmp_path):
    path = entry(tmp_path, "a.json", b'{"x": 1}')
    assert cache_entries.fault(path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "a.json.sum"]
    assert cache_entries.fault(tmp_path / "missing.json") == ""


@pytest.mark.parametrize("how", DAMAGES)
def test_each_damage_is_found_with_its_reason(tmp_path, how):
    path = entry(tmp_path, "a.bin", bytes(range(256)) * 64)
    other = entry(tmp_path, "b.bin", bytes(range(255, -1, -1)) * 64)  # of the same size
    damage(path, how, other)
    why = cache_entries.fault(path)
    assert (
        why
        == {
            "flipped": "its bytes differ from its checksum (damaged, or another entry's file)",
            "truncated": "it is 8192 bytes where its checksum says 16384 (truncated or replaced)",
            "foreign": "its bytes differ from its checksum (damaged, or another entry's file)",
        }[how]
    )


def test_an_entry_without_its_checksum_or_with_another_ones_is_not_used(tmp_path):
    path = entry(tmp_path, "a.bin", b"a" * 100)
    other = entry(tmp_path, "b.bin", b"b" * 100)
    shutil.copyfile(cache_entries.sum_path(other), cache_entries.sum_path(path))
    shutil.copyfile(other, path)  # the other entry's file and its checksum: whole, but not this entry
    assert cache_entries.fault(path) == "its checksum is another entry's (b.bin)"
    cache_entries.sum_path(path).unlink()
    assert cache_entries.fault(path).startswith("it has no checksum (a.bin.sum: a run ended while writing it")
    cache_entries.sum_path(path).write_text("{not json")
    assert cache_entries.fault(path) == "its checksum a.bin.sum is unreadable"


@pytest.mark.parametrize("how", DAMAGES)
def test_ensure_rebuilds_a_damaged_entry_once_saying_so_in_one_line(tmp_path, caplog, how):
    path, other = tmp_path / "a.bin", entry(tmp_path, "b.bin", b"b" * 4096)
    made = []

    def fill(tmp: Path) -> None:
        made.append(1)
        tmp.write_bytes(b"a" * 4096)

    assert cache_entries.ensure(path, fill, "test cache entry", "making it again")
    assert said(caplog, path) == []  # a first build is no news
    damage(path, how, other)
    caplog.clear()
    assert cache_entries.ensure(path, fill, "test cache entry", "making it again")
    (line,) = said(caplog, path)
    assert line.startswith(f"test cache entry {path} is unusable: ") and line.endswith("; making it again")
    assert path.read_bytes() == b"a" * 4096 and cache_entries.fault(path) is None and len(made) == 2
    caplog.clear()
    assert not cache_entries.ensure(path, fill, "test cache entry", "making it again")  # whole now: read
    assert said(caplog, path) == [] and len(made) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "a.bin.sum", "b.bin", "b.bin.sum"]


def test_a_write_killed_midway_leaves_no_usable_entry_and_its_litter_is_swept(tmp_path, caplog):
    """A run killed while writing leaves its temporary file (and maybe the entry without its checksum: killed
    between the two renames). The next build rebuilds the entry and removes the dead process's file, not a live
    one's."""
    path = tmp_path / "a.bin"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host = socket.gethostname()
    stale = tmp_path / f".a.bin.{host}.{int(dead.stdout)}.tmp"
    live = tmp_path / f".a.bin.{host}.{os.getppid()}.tmp"  # pytest's parent: alive
    stale.write_bytes(b"half")
    live.write_bytes(b"half")
    path.write_bytes(b"half an entry")  # no checksum
    assert cache_entries.ensure(path, lambda tmp: tmp.write_bytes(b"whole"), "test cache entry", "making it again")
    (line,) = said(caplog, path)
    assert "it has no checksum" in line
    assert path.read_bytes() == b"whole" and not stale.exists() and live.exists()
    live.unlink()


def test_read_bytes_returns_a_whole_entry_and_reports_a_damaged_one(tmp_path, caplog):
    path = entry(tmp_path, "a.json", b"[1, 2, 3]")
    assert cache_entries.read_bytes(path, "test cache", "measuring again") == b"[1, 2, 3]"
    assert cache_entries.read_bytes(tmp_path / "none.json", "test cache", "measuring again") is None
    assert said(caplog, path) == []
    damage(path, "truncated")
    assert cache_entries.read_bytes(path, "test cache", "measuring again") is None
    (line,) = said(caplog, path)
    assert line == (
        f"test cache {path} is unusable: it is 4 bytes where its checksum says 9 (truncated or replaced); "
        f"measuring again"
    )


# ---- two processes at once ------------------------------------------------------------------------------------

BUILDER = textwrap.dedent(
    """
    import logging, sys, time
    from pathlib import Path
    from ptrun import cache_entries

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    path, start = Path(sys.argv[1]), float(sys.argv[2])
    def fill(tmp):
        with open(tmp, "wb") as f:
            for i in range(50):  # a slow build: the other process arrives while this one writes
                f.write(bytes([i]) * 100_000)
                time.sleep(0.01)
    time.sleep(max(0.0, start - time.time()))
    wrote = cache_entries.ensure(path, fill, "test cache entry", "making it again")
    print("wrote" if wrote else "read", path.read_bytes() == b"".join(bytes([i]) * 100_000 for i in range(50)))
    """
)


@pytest.mark.slow  # two Python processes
@pytest.mark.parametrize("before", ["missing", "flipped"])
def test_two_processes_building_one_entry_at_once_leave_one_good_entry(tmp_path, before):
    path = tmp_path / "cache" / "a.bin"
    path.parent.mkdir()
    if before == "flipped":
        cache_entries.write_bytes(path, b"\1" * 5_000_000)
        damage(path, "flipped")

    start = time.time() + 1.5  # both past their imports, then at once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILDER, str(path), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(out.split() for out, _ in outs) == [["read", "True"], ["wrote", "True"]], outs
    lines = [line for _, err in outs for line in err.splitlines()]
    assert len(lines) == (1 if before == "flipped" else 0) and all(str(path) in line for line in lines), lines
    assert cache_entries.fault(path) is None
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.bin", "a.bin.sum"]


@pytest.mark.slow  # a Python process, killed
def test_a_build_killed_midway_leaves_nothing_that_is_read_and_the_next_build_cleans_up(tmp_path, caplog):
    """A process killed with SIGKILL while it writes an entry (a run killed while tokenizing) leaves its
    temporary file and the lock file; the next build writes the entry whole, says nothing (there was no
    entry), and leaves the entry and its checksum alone in the folder."""
    path = tmp_path / "cache" / "a.bin"
    path.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(path), "0"], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(path.parent.glob(".a.bin.*.tmp")) and time.time() < deadline:
        time.sleep(0.02)
    proc.kill()
    proc.communicate()
    left = sorted(p.name for p in path.parent.iterdir())
    assert left[0].startswith(".a.bin.") and left[1:] == ["a.bin.lock"], left  # half an entry, never renamed
    assert cache_entries.fault(path) == ""
    whole = b"".join(bytes([i]) * 100_000 for i in range(50))
    assert cache_entries.ensure(path, lambda tmp: tmp.write_bytes(whole), "test cache entry", "making it again")
    assert said(caplog, path) == [] and path.read_bytes() == whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.bin", "a.bin.sum"]


# ---- inductor's cache ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_compiled_graph_entry_is_removed_in_one_line_and_the_others_kept(tmp_path, caplog, how):
    """torch names its graph entries by the hash of their bytes: one that no longer hashes to its name is
    removed before a run compiles (torch would log a traceback for it on every run, and keep it)."""
    from torch._inductor.codecache import sha256_hash

    from ptrun.compiling import inductor_cache

    def put(folder: Path, content: bytes) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / sha256_hash(content)
        path.write_bytes(content)
        return path

    graph = put(tmp_path / "fxgraph" / "ab" / "fabkey", b"a compiled graph" * 100)
    other = put(tmp_path / "fxgraph" / "cd" / "fcdkey", b"another graph" * 100)
    autograd = put(tmp_path / "aotautograd" / "akey", b"an autograd entry" * 100)
    (tmp_path / "fxgraph" / "ab" / "fabkey" / ".tmp_being_written").write_bytes(b"half")  # torch's own: skipped
    damage(graph, how, other)
    assert inductor_cache.check_entries(tmp_path) == [graph]
    (line,) = [r.getMessage() for r in caplog.records if r.name == inductor_cache.__name__]
    assert line == (
        f"inductor's cache {tmp_path}: removed 1 damaged compiled-graph entries (fxgraph/ab/fabkey/{graph.name}): "
        f"their bytes no longer hash to their names; the graphs are compiled again"
    )
    assert not graph.exists() and other.exists() and autograd.exists()
    caplog.clear()
    assert inductor_cache.check_entries(tmp_path) == [] and caplog.records == []


def test_the_file_a_failed_compile_names_is_removed(tmp_path, monkeypatch):
    from ptrun.compiling import inductor_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    module = tmp_path / "wm" / "cwmabc.py"
    module.parent.mkdir()
    module.write_text("x = (")
    try:
        try:
            raise UnicodeDecodeError("utf-8", b"\x8b", 0, 1, "invalid start byte")
        except UnicodeDecodeError as inner:
            raise RuntimeError(f"Failed to import {module}") from inner
    except RuntimeError as exc:
        assert inductor_cache.remove_named_file(exc) == (module, True)
        assert not module.exists()
        assert inductor_cache.remove_named_file(exc) == (module, False)  # another worker's, gone already
    assert inductor_cache.remove_named_file(RuntimeError("no file named")) is None


COMPILE_A_UNIT = textwrap.dedent(
    """
    import logging
    logging.basicConfig(level=logging.WARNING, format="LINE %(name)s: %(message)s")
    import torch
    from ptrun.compiling.compiler import CompiledUnit, UnitCompiler
    torch.manual_seed(0)
    unit = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    compiler = UnitCompiler("default", None)
    out = CompiledUnit(unit, "u.0", compiler)(torch.arange(8.0).reshape(2, 4))
    print("OUT", out.tolist(), sorted(compiler.eager_kinds))
    """
)


@pytest.mark.slow  # two compiles in fresh processes: about 2.5 minutes cold on 2 CPU cores
def test_a_compile_on_a_damaged_inductor_cache_heals_it_in_one_line_per_file(tmp_path):
    """A unit compiled into a cache of its own, then its graph entry and its generated module damaged (bytes
    flipped): the next process removes the graph entry before compiling, removes the module its compile
    fails to import and compiles again, one line each; it computes what the first did, compiled, not eager."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}

    def compile_once() -> tuple[str, list[str]]:
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_A_UNIT], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("LINE ptrun.")]
        return done.stdout.strip().splitlines()[-1], lines

    clean, lines = compile_once()
    assert clean.startswith("OUT [[") and clean.endswith(" []") and lines == []
    graphs = sorted((tmp_path / "inductor").glob("fxgraph/*/*/*"))
    modules = sorted((tmp_path / "inductor").glob("*/c*.py"))
    assert graphs and modules
    for path in graphs + modules:
        damage(path, "flipped")
    healed, lines = compile_once()
    assert healed == clean
    assert len(lines) == 1 + len(modules), lines
    assert lines[0].startswith(
        f"LINE ptrun.compiling.inductor_cache: inductor's cache {tmp_path / 'inductor'}: removed "
    )
    assert all(f"inductor's cache entry {m} is unusable: it failed to load" in "".join(lines) for m in modules)
