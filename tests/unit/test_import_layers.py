"""The package's layers: a module imports only its own layer or earlier ones.

ids/errors/config (and the other pure leaves) -> storage -> protocol -> state -> adapters
-> engine/sinks -> ops -> cli/plugins. Imports are read with ``ast`` from the source,
function-level and ``TYPE_CHECKING`` ones included, so a lazy import inside a function
breaks the order as much as one at the top. There are no allowed exceptions; if one is
ever needed, list it in ``EXCEPTIONS`` with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In order; a module's layer is the first entry whose name is it or a package holding it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ids/errors/config",
        (
            "microcheckpoint.ids",
            "microcheckpoint.errors",
            "microcheckpoint.config",
            "microcheckpoint.formatting",  # pure formatting of bytes and times
            "microcheckpoint.run_conf",  # a run's conf against declared names: pure
            "microcheckpoint.faults",  # fault points read from the environment: no imports
        ),
    ),
    ("storage", ("microcheckpoint.storage",)),
    ("protocol", ("microcheckpoint.protocol",)),
    ("state", ("microcheckpoint.state",)),
    ("adapters", ("microcheckpoint.adapters",)),
    ("engine/sinks", ("microcheckpoint.engine", "microcheckpoint.sinks")),
    ("ops", ("microcheckpoint.ops",)),
    (
        "cli/plugins",
        ("microcheckpoint.cli", "microcheckpoint.run_epoch", "microcheckpoint_airflow"),
    ),
]
# (importing module, imported module) -> why it may break the order. None today.
EXCEPTIONS: dict[tuple[str, str], str] = {}
SOURCES = (ROOT / "microcheckpoint", ROOT / "microcheckpoint_airflow")


def layer_of(module: str) -> int | None:
    """The index of ``module``'s layer; None for a module of no layer (or not ours)."""
    if module == "microcheckpoint":
        return 0  # the root package itself: empty, it imports nothing
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(path: Path, module: str) -> list[tuple[str, int]]:
    """Every module ``path`` imports (absolute, relative resolved), with its line."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from package import submodule` imports the submodule.
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
    return found


def our_modules() -> list[tuple[Path, str]]:
    files = sorted(
        p for root in SOURCES for p in root.rglob("*.py") if "__pycache__" not in p.parts
    )
    return [(p, module_name(p)) for p in files]


def violations() -> list[str]:
    out = []
    for path, module in our_modules():
        mine = layer_of(module)
        for name, line in imported(path, module):
            theirs = layer_of(name)
            if mine is None or theirs is None or theirs <= mine:
                continue
            if (module, name) in EXCEPTIONS:
                continue
            out.append(
                f"{path.relative_to(ROOT)}:{line}: {module} ({LAYERS[mine][0]}) imports "
                f"{name} ({LAYERS[theirs][0]}), a later layer; move the code down a layer "
                "or the import up"
            )
    return out


def test_every_module_is_in_a_layer() -> None:
    unplaced = [f"{p.relative_to(ROOT)}" for p, m in our_modules() if m and layer_of(m) is None]
    assert unplaced == [], f"modules in no layer (add them to LAYERS): {unplaced}"


def test_no_module_imports_a_later_layer() -> None:
    assert violations() == []


def test_every_listed_exception_still_occurs() -> None:
    imports = {
        (module, name) for path, module in our_modules() for name, _ in imported(path, module)
    }
    assert [pair for pair in EXCEPTIONS if pair not in imports] == []


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import microcheckpoint.cli\n", "microcheckpoint.protocol.x", "microcheckpoint.cli"),
        (
            "def f():\n    from microcheckpoint.adapters import s3\n",
            "microcheckpoint.storage",
            "microcheckpoint.adapters.s3",
        ),
        ("from ..state import handles\n", "microcheckpoint.protocol.x", "microcheckpoint.state"),
    ],
)
def test_the_reader_sees_every_kind_of_import(tmp_path, source, module, expected) -> None:
    path = tmp_path / ("__init__.py" if module == "microcheckpoint.storage" else "x.py")
    path.write_text(source)
    names = [name for name, _ in imported(path, module)]
    assert any(n == expected or n.startswith(expected + ".") for n in names), names
    assert layer_of(names[0]) is not None
