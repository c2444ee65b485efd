"""The ``mmrl.config`` package keeps the layering its docstring states: each module imports only the modules listed
before it (imports inside functions included), never the package itself, so no import cycle can form inside it; and
the package re-exports its public names."""

from __future__ import annotations

import ast
from pathlib import Path

import mmrl.config

PACKAGE = Path(mmrl.config.__file__).parent
ORDER = ("schema", "docstrings", "overrides", "deprecated", "coercion", "validate", "compose", "io")
"""The package's modules, each allowed to import only those before it (the order of the package docstring)."""


def config_imports(source: str) -> set[str]:
    """The ``mmrl.config`` modules ``source`` imports (``"mmrl.config"`` for the package itself), anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n == "mmrl.config" or n.startswith("mmrl.config.")}
    return found


def test_every_module_of_the_package_is_in_the_stated_order():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(ORDER)


def test_each_module_imports_only_the_modules_before_it():
    for i, name in enumerate(ORDER):
        imported = config_imports((PACKAGE / f"{name}.py").read_text())
        allowed = {f"mmrl.config.{before}" for before in ORDER[:i]}
        assert imported <= allowed, f"mmrl/config/{name}.py imports {sorted(imported - allowed)}"


def test_config_imports_reads_top_level_and_lazy_imports():
    source = (
        "from mmrl.config.schema import RunConfig\ndef f():\n    import mmrl.config.io\n    from mmrl.config import x\n"
    )
    assert config_imports(source) == {"mmrl.config.schema", "mmrl.config.io", "mmrl.config"}


def test_every_name_the_repository_imports_from_the_package_is_re_exported():
    """``from mmrl.config import X`` in the code base, tests, scripts, examples and benchmarks: X is in ``__all__``."""
    root = PACKAGE.parents[1]
    wanted = set()
    for top in ("mmrl", "tests", "scripts", "examples", "benchmarks", "tasks"):
        for path in (root / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "mmrl.config" and not node.level:
                    wanted |= {a.name for a in node.names}
    assert {"load_config", "RunConfig", "ConfigError", "load_run_config"} <= wanted  # the scan found the imports
    assert not wanted - set(mmrl.config.__all__), f"not re-exported: {sorted(wanted - set(mmrl.config.__all__))}"
    assert all(hasattr(mmrl.config, name) for name in mmrl.config.__all__)
    assert mmrl.config.load_config.__module__ == "mmrl.config.compose"
    assert mmrl.config.RunConfig.__module__ == "mmrl.config.schema"
