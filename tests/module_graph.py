"""Which files of `src/` import which: every `crate::`, `super::` and `self::` path
(in `use` lines and in code), resolved to the file that defines the item it names,
through the re-exports (`pub use`) and imports of the modules on the way.

`python tests/module_graph.py` prints the import circles (groups of files that import
each other, directly or round a loop) and exits 1 if there is one; `--edges` prints
every edge. tests/test_layout.py holds the crate to it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"

ITEM = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:async\s+)?"
    r"(?:struct|enum|fn|trait|type|const|static|union|mod|macro_rules!)\s+(\w+)"
)
USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]*);", re.S)
PATH = re.compile(r"\b(crate|super|self)((?:::\w+)+)")
NAMED_PATH = re.compile(r"(?<![:\w])(\w+)((?:::\w+)+)")


def module_of(path: Path, src: Path = SRC) -> tuple[str, ...]:
    rel = path.relative_to(src).with_suffix("")
    parts = rel.parts
    if parts == ("lib",):
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def strip(text: str) -> str:
    """The code without comments, strings and character literals (kept as blanks, so
    line numbers and braces of the code stay where they were)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not text[i - 1].isalnum()):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x..'", text[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def expand_use(tree: str) -> list[tuple[list[str], str | None]]:
    """`a::{b, c::{d as e}}` -> [(['a','b'], None), (['a','c','d'], 'e')]."""
    # Spaces go but around `as`, which is all that tells `d as e` from a name holding
    # "as" (`task`).
    tree = re.sub(r"\s+as\s+", " as ", re.sub(r"\s+", " ", tree))
    tree = re.sub(r"\s*([{},:])\s*", r"\1", tree).strip()

    def parse(s: str, prefix: list[str]) -> list[tuple[list[str], str | None]]:
        out = []
        depth, start, items = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                items.append(s[start:i])
                start = i + 1
        items.append(s[start:])
        for item in filter(None, items):
            if "{" in item:
                head, rest = item.split("{", 1)
                head_parts = [p for p in head.split("::") if p]
                out += parse(rest[:-1], prefix + head_parts)
            else:
                alias = None
                if " as " in item:
                    item, alias = item.split(" as ", 1)
                out.append((prefix + [p for p in item.split("::") if p], alias))
        return out

    return parse(tree, [])


class Crate:
    def __init__(self, src: Path = SRC):
        self.files: dict[tuple[str, ...], Path] = {}
        self.code: dict[Path, str] = {}
        for path in sorted(src.rglob("*.rs")):
            if path.name == "main.rs" or "bin" in path.relative_to(src).parts:
                continue
            self.files[module_of(path, src)] = path
            self.code[path] = strip(path.read_text())
        # Per module file: items defined at its top level, and names it imports
        # (name -> absolute path), both read from lines outside inline modules.
        self.defined: dict[tuple[str, ...], set[str]] = {}
        self.imported: dict[tuple[str, ...], dict[str, list[str]]] = {}
        self.globs: dict[tuple[str, ...], list[list[str]]] = {}
        for module, path in self.files.items():
            self.defined[module] = set()
            self.imported[module] = {}
            self.globs[module] = []
            for statement in self.top_level(self.code[path]):
                m = ITEM.match(statement)
                if m:
                    self.defined[module].add(m.group(1))
                u = USE.match(statement)
                if u:
                    for parts, alias in expand_use(u.group(1)):
                        absolute = self.absolute(module, parts)
                        if absolute is None:
                            continue
                        if parts[-1] == "*":
                            self.globs[module].append(absolute[:-1])
                        elif parts[-1] == "self":
                            self.imported[module][alias or absolute[-2]] = absolute[:-1]
                        else:
                            self.imported[module][alias or parts[-1]] = absolute

    @staticmethod
    def top_level(code: str):
        """The file's top-level statements: `use` lines whole, and the first line of
        every item (braces of inline modules and bodies count as nesting)."""
        depth = [0] * (len(code) + 1)
        d = 0
        for i, ch in enumerate(code):
            depth[i] = d
            if ch == "{":
                d += 1
            elif ch == "}":
                d -= 1
        for m in re.finditer(r"^[ \t]*(?:#\[[^\]]*\]\s*)*((?:pub(?:\([^)]*\))?\s+)?use\s+[^;]*;)", code, re.M):
            if depth[m.start(1)] == 0:
                yield m.group(1)
        for m in re.finditer(r"^[ \t]*(?:pub|unsafe|async|struct|enum|fn|trait|type|const|static|union|mod|macro_rules).*$", code, re.M):
            if depth[m.start()] == 0:
                yield m.group(0)

    def absolute(self, module: tuple[str, ...], parts: list[str]) -> list[str] | None:
        """An in-crate path as segments from the crate root; None for other crates."""
        parts = list(parts)
        if not parts:
            return None
        if parts[0] == "crate":
            base: list[str] = []
            parts = parts[1:]
        elif parts[0] in ("super", "self"):
            base = list(module)
            while parts and parts[0] in ("super", "self"):
                if parts[0] == "super":
                    base = base[:-1]
                parts = parts[1:]
        elif tuple(module) + (parts[0],) in self.files:
            base = list(module)  # a child module named without `self::`
        else:
            return None
        return base + parts

    def resolve(self, parts: list[str], seen=None) -> Path | None:
        """The file that defines the item `parts` names (absolute segments)."""
        seen = set() if seen is None else seen
        module: tuple[str, ...] = ()
        for i, segment in enumerate(parts):
            child = module + (segment,)
            if child in self.files:
                module = child
                continue
            rest = parts[i:]
            key = (module, segment)
            if key in seen:
                return self.files[module]
            seen.add(key)
            if segment in self.defined[module]:
                return self.files[module]
            if segment in self.imported[module]:
                target = self.imported[module][segment] + rest[1:]
                found = self.resolve(target, seen)
                return found or self.files[module]
            for glob in self.globs[module]:
                found = self.resolve(glob + rest, seen)
                if found is not None and found != self.files.get(tuple(glob)):
                    return found
            return self.files[module]
        # A module named as a whole (`use crate::format;`): its items count where used.
        return None

    def edges(self) -> dict[Path, set[Path]]:
        graph: dict[Path, set[Path]] = {p: set() for p in self.code}
        for module, path in self.files.items():
            code = self.code[path]
            # Paths inside inline modules (`mod tests`) are relative to those modules.
            spans = self.inline_spans(code)
            for m in PATH.finditer(code):
                inner = [name for start, end, name in spans if start <= m.start() < end]
                here = module + tuple(inner)
                segments = [m.group(1)] + [s for s in m.group(2).split("::") if s]
                absolute = self.absolute(here, segments)
                if absolute is None or not absolute:
                    continue
                # Inline modules of this file are part of it.
                if tuple(absolute[: len(module)]) == module and len(absolute) > len(module) and (
                    absolute[len(module)] in [n for _, _, n in spans]
                ):
                    continue
                target = self.resolve(absolute)
                if target is not None and target != path:
                    graph[path].add(target)
            # Items a top-level `use` names (`use super::plan::{Head, Split}`): the
            # paths above see only the module part before the braces.
            for parts in self.imported[module].values():
                target = self.resolve(parts)
                if target is not None and target != path:
                    graph[path].add(target)
            for parts in self.use_paths(code, spans, module):
                target = self.resolve(parts)
                if target is not None and target != path:
                    graph[path].add(target)
            # Paths that start with a name this file imports (`format::memory::X` after
            # `use crate::format`) or with a child module of its own.
            names = self.imported[module]
            for m in NAMED_PATH.finditer(code):
                first = m.group(1)
                rest = [s for s in m.group(2).split("::") if s]
                if first in names:
                    absolute = names[first] + rest
                elif module + (first,) in self.files:
                    absolute = list(module) + [first] + rest
                else:
                    continue
                target = self.resolve(absolute)
                if target is not None and target != path:
                    graph[path].add(target)
        return graph

    def use_paths(self, code: str, spans, module):
        """`use` statements whose first segment names a child module (no prefix)."""
        for m in re.finditer(r"\buse\s+([^;]*);", code):
            inner = [name for start, end, name in spans if start <= m.start() < end]
            here = module + tuple(inner)
            for parts, _ in expand_use(m.group(1)):
                if parts and parts[0] not in ("crate", "super", "self") and (
                    here + (parts[0],) in self.files
                ):
                    yield list(here) + [p for p in parts if p != "*"]

    @staticmethod
    def inline_spans(code: str):
        spans = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
            depth, j = 1, m.end()
            while j < len(code) and depth:
                if code[j] == "{":
                    depth += 1
                elif code[j] == "}":
                    depth -= 1
                j += 1
            spans.append((m.start(), j, m.group(1)))
        return spans


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on: set[Path] = set()
    out: list[list[Path]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: Path) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def main() -> int:
    graph = Crate().edges()
    if "--edges" in sys.argv:
        for source in sorted(graph):
            for target in sorted(graph[source]):
                print(f"{name(source)} -> {name(target)}")
    found = cycles(graph)
    for component in found:
        members = set(component)
        print("import circle:", ", ".join(name(p) for p in component))
        for source in component:
            inside = sorted(t for t in graph[source] if t in members)
            print(f"    {name(source)} -> {', '.join(name(t) for t in inside)}")
    if not found:
        print("no import circles among", len(graph), "files")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
