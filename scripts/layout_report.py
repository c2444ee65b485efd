"""Counts of the package layout, as Python sees the modules: ``python scripts/layout_report.py [--root DIR]``.

Reads the source as text (nothing is imported), mapping ``tasks/``, ``simulators/`` and ``configs/`` to
``mmrl.tasks``, ``mmrl.simulators`` and ``mmrl.configs`` as setup.py installs them, and prints:

- files and lines per modality adapter (``mmrl/adapters/<name>/`` plus ``tasks/<name>/``);
- the trainer's lines;
- import cycles between modules, counted twice: top-level imports only (the cycles Python meets at import time) and
  any import (also inside functions: lazy imports are coupling too), and cycles between folders (any import);
- upward imports: the core (``mmrl`` outside ``adapters/``) importing an adapter or a task module other than the
  Task contract (``mmrl.tasks.base``, ``mmrl.tasks.task_config``, the registry ``mmrl.tasks``), and an adapter
  importing a task;
- probes of the policy or task outside the contract (``getattr``/``hasattr`` on them) in the modules that consume
  both (trainer, SFT, evaluation, rollout collection, CLI);
- probes of a config, policy or task anywhere in ``mmrl/`` and ``tasks/`` (:func:`contract_probes`; ``--verbose``
  lists them): each is a field or capability the contracts (``RunConfig``'s typed ``task`` / ``model``, ``Policy``,
  ``Task``) do not declare.

Run it on an older checkout (``git archive <commit> | tar -x -C /tmp/old``) for a before/after.

``--check BASELINE.json`` (tests/contracts/test_layout.py runs it in CI) compares the cycles and upward imports with
a committed baseline (``--write-baseline`` writes one) and exits 1, naming them, when one is new: a cycle is known
when all its members lie in one cycle of the baseline (a cycle that shrinks passes), an upward import when the
baseline lists it. Counts may go down; the baseline is then rewritten to hold the gain.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

MAPPED = {"tasks": "mmrl.tasks", "simulators": "mmrl.simulators", "configs": "mmrl.configs"}
CONSUMERS = ("mmrl/trainer.py", "mmrl/sft.py", "mmrl/evaluation.py", "mmrl/collector.py", "mmrl/cli.py")
FORMER_PATHS = {"mmrl/collector.py": "mmrl/rollouts.py"}
"""A consumer's path before a rename, read when the current one is absent, so ``--root`` on an older checkout counts
the same modules."""
CONTRACT = {"mmrl.tasks", "mmrl.tasks.base", "mmrl.tasks.task_config"}
PROBE = re.compile(r"(getattr|hasattr)\((self\.)?(policy|task)\b")
PROBED_NAMES = {"policy", "task", "cfg", "run_cfg", "task_cfg", "model_cfg"}
"""The names mmrl gives a policy, a task, the run config and the task's / model's config (``self.<name>`` too)."""
RUN_CONFIG_SECTIONS = {"model", "task", "trainer", "algo", "reward", "agent"}
"""Attributes of a run config that are configs themselves (``cfg.model``, ``run_cfg.trainer``)."""
HELD_CONFIGS = {"cfg", "run_cfg"}
"""Attributes of a policy or task that are configs (``policy.cfg``, ``task.run_cfg``; not ``policy.model``)."""


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the installed package."""
    out = {}
    for top, dotted in [("mmrl", "mmrl"), *MAPPED.items()]:
        for f in sorted((root / top).rglob("*.py")):
            rel = f.relative_to(root / top).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([dotted, *parts])] = f
    return out


def imports(path: Path, module: str, is_pkg: bool) -> list[tuple[str, bool]]:
    """``(imported module, at top level?)`` for every import of ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts if is_pkg else parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            found.append((base, id(node) in top_level))
            found += [(f"{base}.{a.name}", id(node) in top_level) for a in node.names]
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def graph(root: Path) -> tuple[dict[str, Path], dict[str, set[str]], dict[str, set[str]]]:
    """Modules, their top-level import edges and all their import edges (within the package)."""
    modules = module_files(root)
    top, every = defaultdict(set), defaultdict(set)
    for mod, path in modules.items():
        for name, at_top in imports(path, mod, path.name == "__init__.py"):
            target = resolve(name, modules)
            if target and target != mod and target.startswith("mmrl"):
                every[mod].add(target)
                if at_top:
                    top[mod].add(target)
    return modules, top, every


def cycles(edges: dict[str, set[str]], nodes) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def folder(mod: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to (a package's ``__init__`` belongs to the package itself); the modules directly
    in ``mmrl/`` (trainer, config, cli, ...) count one each."""
    if modules[mod].name == "__init__.py":
        return mod
    parent = mod.rpartition(".")[0]
    return mod if parent == "mmrl" else parent


def is_adapter(mod: str) -> bool:
    return mod.startswith("mmrl.adapters.") or mod.startswith("mmrl.policies.diffusion")


def is_core(mod: str) -> bool:
    return not (is_adapter(mod) or mod.startswith(("mmrl.tasks", "mmrl.simulators", "mmrl.configs", "mmrl.adapters")))


def upward(every: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in sorted(every.items()):
        for dst in sorted(targets):
            task = dst.startswith("mmrl.tasks.") and dst not in CONTRACT
            if (is_core(src) and (is_adapter(dst) or task)) or (is_adapter(src) and task):
                out.append(f"{src} -> {dst}")
    return out


def adapter_files(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for name in ("grounding", "video", "diffusion", "vla"):
        files = [*(root / "mmrl" / "adapters" / name).rglob("*.py"), *(root / "tasks" / name).rglob("*.py")]
        if files:
            out[name] = (len(files), sum(len(f.read_text().splitlines()) for f in files))
    return out


def layering(root: Path) -> dict[str, list]:
    """The layering's faults: ``module_cycles_import_time`` / ``module_cycles_any_import`` / ``folder_cycles`` (each a
    list of sorted member lists) and ``upward_imports`` (``"src -> dst"`` lines, lazy imports included)."""
    modules, top, every = graph(root)
    fold_edges = defaultdict(set)
    for src, targets in every.items():
        for dst in targets:
            a, b = folder(src, modules), folder(dst, modules)
            if a != b:
                fold_edges[a].add(b)
    return {
        "module_cycles_import_time": cycles(top, modules),
        "module_cycles_any_import": cycles(every, modules),
        "folder_cycles": cycles(fold_edges, {folder(m, modules) for m in modules}),
        "upward_imports": upward(every),
    }


FAULT_NAMES = {
    "module_cycles_import_time": "import-time module cycle",
    "module_cycles_any_import": "module cycle (any import)",
    "folder_cycles": "folder cycle",
}


def new_faults(current: dict[str, list], baseline: dict[str, list]) -> list[str]:
    """What ``current`` has that ``baseline`` does not: a cycle whose members are not all in one baseline cycle of
    the same kind, an upward import the baseline does not list (one line each)."""
    out = []
    for kind, found in current.items():
        known = baseline.get(kind, [])
        for item in found:
            if kind == "upward_imports":
                if item not in known:
                    out.append(f"new upward import: {item}")
            elif not any(set(item) <= set(k) for k in known):
                out.append(f"new {FAULT_NAMES[kind]}: {' <-> '.join(item)}")
    return out


def consumer_probes(root: Path) -> list[str]:
    """``"<file>: <line>"`` for each getattr / hasattr on the policy or task in the consumers (a consumer absent
    under ``root`` is read under its former path, else skipped)."""
    probes = []
    for rel in CONSUMERS:
        if not (root / rel).exists() and rel in FORMER_PATHS:
            rel = FORMER_PATHS[rel]
        f = root / rel
        if f.exists():
            probes += [f"{rel}: {ln.strip()}" for ln in f.read_text().splitlines() if PROBE.search(ln)]
    return probes


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``, reading ``getattr(a, "b", ...)`` as ``a.b``; None for anything else."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and [*head, node.attr]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        head = _dotted(node.args[0])
        return head and [*head, node.args[1].value]
    return None


def _is_probed(parts: list[str] | None, aliases: dict[str, bool]) -> bool:
    """Whether a dotted expression is a policy, a task or a config: a name of :data:`PROBED_NAMES` (or ``self.`` one)
    unless the function assigns it something else, a local alias of such an expression, or a config section of one
    (``cfg.model``, ``policy.cfg``; also ``<x>.config.model`` / ``.task``, a run config held by another object)."""
    if not parts:
        return False
    if len(parts) == 1:
        return aliases.get(parts[0], parts[0] in PROBED_NAMES)
    if parts[0] == "self" and len(parts) == 2:
        return parts[1] in PROBED_NAMES
    head, last = parts[:-1], parts[-1]
    if last in HELD_CONFIGS:
        return _is_probed(head, aliases)
    if last not in RUN_CONFIG_SECTIONS:
        return False
    holder = head[-1] in ("policy", "task") and (len(head) == 1 or head == ["self", head[-1]])
    return (_is_probed(head, aliases) and not holder) or (head[-1] == "config" and last in ("model", "task"))


def _assignments(scope: ast.AST) -> list[tuple[str, ast.expr]]:
    """``(name, value)`` of the assignments in ``scope``: ``a = x`` and ``a, b = x, y`` element by element."""
    out = []
    for n in ast.walk(scope):
        if not isinstance(n, ast.Assign) or len(n.targets) != 1:
            continue
        target, value = n.targets[0], n.value
        if isinstance(target, ast.Name):
            out.append((target.id, value))
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            out += [(t.id, v) for t, v in zip(target.elts, value.elts) if isinstance(t, ast.Name)]
    return out


def _aliases(scope: ast.AST, outer: dict[str, bool]) -> dict[str, bool]:
    """``outer`` updated with the names ``scope`` assigns: True for an alias of a probed expression (``m =
    cfg.model``, to a fixed point), False for a name of :data:`PROBED_NAMES` that it assigns another object's attribute
    (``cfg = lm.config``: a transformers config, not mmrl's)."""
    assigns = _assignments(scope)
    found = dict(outer)
    for name, value in assigns:
        parts = _dotted(value)
        if name in PROBED_NAMES and parts and len(parts) > 1 and not _is_probed(parts, {}):
            found[name] = False
    while True:
        more = {name for name, value in assigns if not found.get(name) and _is_probed(_dotted(value), found)}
        if not more:
            return found
        found.update(dict.fromkeys(more, True))


def probes_in(source: str) -> list[int]:
    """Line numbers of the probes in ``source``: ``hasattr(obj, name)`` or ``getattr(obj, name, default)`` (an
    attribute that may be missing; a two-argument ``getattr`` raises like ``obj.name``) whose ``obj`` is a policy, a
    task or a config (:func:`_is_probed`, with the aliases of the enclosing function)."""
    tree = ast.parse(source)
    lines = []

    def visit(node: ast.AST, aliases: dict[str, bool]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            aliases = _aliases(node, aliases)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            n = len(node.args)
            probe = (node.func.id == "hasattr" and n == 2) or (node.func.id == "getattr" and n == 3)
            if probe and _is_probed(_dotted(node.args[0]), aliases):
                lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, aliases)

    visit(tree, {})
    return sorted(lines)


def contract_probes(root: Path) -> list[str]:
    """``"<file>:<line>: <source line>"`` for each probe (:func:`probes_in`) in ``mmrl/`` and ``tasks/``."""
    out = []
    for top in ("mmrl", "tasks"):
        for f in sorted((root / top).rglob("*.py")):
            text = f.read_text()
            src = text.splitlines()
            rel = f.relative_to(root).as_posix()
            out += [f"{rel}:{ln}: {src[ln - 1].strip()}" for ln in probes_in(text)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--check", type=Path, metavar="BASELINE", help="exit 1 on a cycle or upward import not in it")
    ap.add_argument("--write-baseline", type=Path, metavar="BASELINE", help="write the current faults to it")
    ap.add_argument("--verbose", action="store_true", help="list every probe of a config, policy or task")
    args = ap.parse_args()
    root = args.root
    faults = layering(root)
    if args.write_baseline:
        args.write_baseline.write_text(json.dumps(faults, indent=1) + "\n")
    if args.check:
        new = new_faults(faults, json.loads(args.check.read_text()))
        for line in new:
            print(line)
        counts = ", ".join(f"{k} {len(v)}" for k, v in faults.items())
        print(f"layout: {counts}; {len(new)} new against {args.check}")
        sys.exit(1 if new else 0)
    modules, _, _ = graph(root)
    print(f"modules: {len(modules)}")
    trainer = root / "mmrl" / "trainer.py"
    print(f"mmrl/trainer.py lines: {len(trainer.read_text().splitlines())}")
    for name, (n, lines) in adapter_files(root).items():
        print(f"adapter {name}: {n} files, {lines} lines (mmrl/adapters/{name}/ + tasks/{name}/)")
    titles = {
        "module_cycles_import_time": "import-time cycles between modules",
        "module_cycles_any_import": "cycles between modules (any import, lazy ones included)",
        "folder_cycles": "cycles between folders (any import)",
    }
    for kind, title in titles.items():
        print(f"{title}: {len(faults[kind])} ({sum(len(c) for c in faults[kind])} modules / folders)")
        for c in faults[kind]:
            print("   ", " <-> ".join(c))
    up = faults["upward_imports"]
    print(f"upward imports (core -> adapter/task, adapter -> task; lazy ones included): {len(up)}")
    for line in up:
        print("   ", line)
    probes = consumer_probes(root)
    print(f"probes of policy/task outside the contract in {', '.join(CONSUMERS)}: {len(probes)}")
    for line in probes:
        print("   ", line)
    probes = contract_probes(root)
    print(f"getattr/hasattr probes of a config, policy or task in mmrl/ and tasks/: {len(probes)}")
    for line in probes if args.verbose else ():
        print("   ", line)


if __name__ == "__main__":
    main()
