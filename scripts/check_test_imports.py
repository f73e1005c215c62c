"""Imports, in this interpreter, every third-party module the test suite imports, so a
test dependency missing from the `test` extra fails here, by name, before the suite runs.

The modules are read from the tests' own source (every `import x.y` and `from x.y
import`, `pytest.importorskip("x")` included), plus the few that the suite reaches only
through a library call (EXTRA below). Each top-level package is imported in a process of
its own: torch and tensorflow abort when loaded into one process.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Reached through a library, not written in a test: ray.data's iter_torch_batches
# imports ray.train, which needs pydantic (the `train` extra of ray). tests/test_docs.py
# runs `mkdocs build`, whose theme and API reference are Material and mkdocstrings.
EXTRA = ["ray.train", "torchdata.stateful_dataloader", "mkdocs", "material", "mkdocstrings_handlers.python"]


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "importorskip"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(node.args[0].value)
    return found


def main() -> int:
    tests = ROOT / "tests"
    files = sorted(tests.rglob("*.py"))
    # The tests' own modules and packages (tests/model/ is imported as `model`).
    local = {p.stem for p in files} | {p.parent.name for p in files if p.name == "__init__.py"} | {"shardflow"}
    modules = set(EXTRA)
    for path in files:
        modules |= imported_modules(path)
    by_package: dict[str, list[str]] = defaultdict(list)
    for module in sorted(modules):
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in local or top == "__future__":
            continue
        by_package[top].append(module)
    failed = []
    for package, names in sorted(by_package.items()):
        code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
        out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["(no message)"])[-1]
            failed.append(f"{', '.join(names)}: {last}")
    print(f"imported {sum(map(len, by_package.values()))} modules of {len(by_package)} packages")
    for line in failed:
        print(f"cannot import {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
