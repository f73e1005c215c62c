"""The crate's shape (`src/`): files small enough to read, no import circles, and storage
backends that do not lean on each other. The import graph is
`tests/module_graph.py`'s: every `crate::`/`super::` path, and every path through a
name a file imports, resolved to the file that defines the item."""

from __future__ import annotations

from pathlib import Path

import module_graph

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# `src/source/` files that each reach one kind of storage (see `source::backend`).
BACKENDS = {"local.rs", "s3.rs", "gcs.rs", "azure.rs", "http.rs", "hf.rs"}


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_file_in_src_is_over_1500_lines() -> None:
    long = {str(p.relative_to(ROOT)): lines(p) for p in SRC.rglob("*.rs") if lines(p) > 1500}
    assert long == {}


def test_pipeline_mod_is_a_table_of_contents() -> None:
    assert lines(SRC / "pipeline" / "mod.rs") < 300


def test_no_import_circles_among_src_files() -> None:
    graph = module_graph.Crate().edges()
    circles = [[str(p.relative_to(ROOT)) for p in c] for c in module_graph.cycles(graph)]
    assert circles == []


def test_the_graph_sees_imports_of_every_kind(tmp_path: Path) -> None:
    """The checker itself: a circle made by a `use` line, by a path through an imported
    module, and by a re-export, each found; a `mod tests` importing `super::*` not."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod b;\n")
    (src / "a" / "mod.rs").write_text("mod x;\nmod y;\npub use x::Thing;\n")
    (src / "a" / "x.rs").write_text(
        "pub struct Thing;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"
    )
    (src / "a" / "y.rs").write_text("use super::Thing;\npub fn f() {}\n")
    (src / "b.rs").write_text("use crate::a;\npub fn g() { a::y::f(); }\n")
    graph = module_graph.Crate(src).edges()
    assert module_graph.cycles(graph) == []
    # y.rs -> x.rs through the re-export in a/mod.rs, not -> a/mod.rs
    assert graph[src / "a" / "y.rs"] == {src / "a" / "x.rs"}
    assert graph[src / "b.rs"] == {src / "a" / "y.rs"}
    (src / "a" / "x.rs").write_text("use crate::b::g;\npub struct Thing;\n")
    found = module_graph.cycles(module_graph.Crate(src).edges())
    assert [sorted(p.name for p in c) for c in found] == [["b.rs", "x.rs", "y.rs"]]
    # A grouped import of items is an edge to where they are defined, and a name that
    # holds "as" (`task`) is not an alias.
    (src / "a" / "x.rs").write_text("pub struct Thing;\npub fn task() {}\n")
    (src / "b.rs").write_text("use crate::a::x::{Thing, task};\nuse crate::a::y::{f as g};\n")
    assert module_graph.expand_use("a::{task, b::{c as d}}") == [(["a", "task"], None), (["a", "b", "c"], "d")]
    assert module_graph.Crate(src).edges()[src / "b.rs"] == {src / "a" / "x.rs", src / "a" / "y.rs"}


def test_no_backend_imports_another_backend() -> None:
    graph = module_graph.Crate().edges()
    source = SRC / "source"
    present = {name for name in BACKENDS if (source / name).exists()}
    assert present == BACKENDS
    leaning = {
        name: sorted(t.name for t in graph[source / name] if t.parent == source and t.name in BACKENDS)
        for name in sorted(present)
    }
    assert leaning == {name: [] for name in sorted(present)}


def test_data_flows_top_to_bottom() -> None:
    """source -> format -> pipeline -> write -> python: no file imports from a folder
    later in that list (CONTRIBUTING.md, "Layout of the code")."""
    order = ["source", "format", "pipeline", "write", "python"]
    graph = module_graph.Crate().edges()

    def folder(path: Path) -> str:
        parts = path.relative_to(SRC).parts
        return parts[0] if len(parts) > 1 else path.stem

    upward = sorted(
        f"{source.relative_to(ROOT)} -> {target.relative_to(ROOT)}"
        for source, targets in graph.items()
        for target in targets
        if folder(source) in order
        and folder(target) in order
        and order.index(folder(target)) > order.index(folder(source))
    )
    assert upward == []


def test_only_the_binding_uses_pyo3() -> None:
    users = sorted(
        str(p.relative_to(ROOT))
        for p in SRC.rglob("*.rs")
        if "python" not in p.relative_to(SRC).parts[:1]
        and any(word in module_graph.strip(p.read_text()) for word in ("pyo3", "numpy::"))
    )
    assert users == []
