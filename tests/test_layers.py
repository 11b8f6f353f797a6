"""The package is built in layers: a module imports only modules of lower layers, or of its own layer
without a circle, and nothing outside the standard library and the package's dependencies.

Every import counts, wherever it is written: at the top, inside a function, under ``if TYPE_CHECKING``.
The Hub-portable files (``configuration_*``, ``modeling_*``, ``*_vanilla_transformer.py``), which travel
with every saved model, import only torch, transformers, huggingface_hub, safetensors, the standard
library, and each other by relative imports. The table below is the one in ``vanilla_transformer/__init__.py``.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import vanilla_transformer

PACKAGE = "vanilla_transformer"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE

#: (name, modules), lowest first. A new ``*_vanilla_transformer.py`` file belongs to the modeling layer.
LAYERS = [
    ("configuration", {"configuration_vanilla_transformer"}),
    (
        "modeling",
        {
            "modeling_vanilla_transformer",
            "generation_vanilla_transformer",
            "kernels_vanilla_transformer",
            "pipeline_vanilla_transformer",
            "__init__",
        },
    ),
    (
        "foundations",
        {
            "tokenization",
            "data",
            "schedule",
            "checkpoints",
            "distributed",
            "loading",
            "training_config",
            "deployment",
            "prepared",
        },
    ),
    ("evaluation", {"evaluation"}),
    ("reporting", {"visualization", "cards", "explorer"}),
    ("training", {"training", "finetuning"}),
    ("command line", {"cli", "__main__"}),
]
#: What the package may import besides the standard library and itself (examples/, benchmarks/ and scripts/ sit
#: above it).
DEPENDENCIES = {
    "accelerate",
    "ctranslate2",
    "datasets",
    "evaluate",
    "gradio",
    "huggingface_hub",
    "matplotlib",
    "numpy",
    "PIL",
    "sacrebleu",
    "safetensors",
    "tokenizers",
    "torch",
    "tqdm",
    "transformers",
    "yaml",
}
#: What a Hub-portable file may import besides the standard library and the other Hub-portable files.
HUB_PORTABLE_DEPENDENCIES = {"huggingface_hub", "safetensors", "torch", "transformers"}


@dataclass(frozen=True)
class Import:
    """One imported name: a module of the package (``internal``), or the top-level name of anything else."""

    module: str  # the importing module
    line: int
    target: str
    internal: bool
    relative: bool


def is_hub_portable(module: str) -> bool:
    return module.endswith("_vanilla_transformer")


def layer_of(module: str, layers: list[tuple[str, set[str]]]) -> int | None:
    for index, (_, modules) in enumerate(layers):
        if module in modules:
            return index
    return 1 if is_hub_portable(module) else None


def imports_of(path: Path, modules: set[str]) -> list[Import]:
    """Every import in the file ``path`` of the package whose modules are ``modules``."""
    module, found = path.stem, []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name.split(".")
                internal = name[0] == PACKAGE
                target = (name[1] if len(name) > 1 else "__init__") if internal else name[0]
                found.append(Import(module, node.lineno, target, internal, relative=False))
        elif isinstance(node, ast.ImportFrom):
            relative = node.level > 0
            name = (node.module or "").split(".") if node.module else []
            if not relative and name[0] != PACKAGE:
                found.append(Import(module, node.lineno, name[0], internal=False, relative=False))
                continue
            if relative and node.level > 1:
                found.append(Import(module, node.lineno, "." * node.level + ".".join(name), True, relative))
                continue
            inside = name if relative else name[1:]
            if inside:
                found.append(Import(module, node.lineno, inside[0], True, relative))
            else:  # from . import x / from vanilla_transformer import x: submodules, or names of __init__
                for alias in node.names:
                    target = alias.name if alias.name in modules else "__init__"
                    found.append(Import(module, node.lineno, target, True, relative))
    return found


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The circles of a graph (module -> imported module -> line), each as a path [a, b, ..., a], found once."""
    cycles, seen = [], set()

    def visit(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], {})):
            if nxt == path[0]:
                key = frozenset(path)
                if key not in seen:
                    seen.add(key)
                    cycles.append([*path, nxt])
            elif nxt not in path and nxt > path[0]:  # each circle is found from its smallest module
                visit([*path, nxt])

    for start in sorted(edges):
        visit([start])
    return cycles


def violations(package_dir: Path, layers: list[tuple[str, set[str]]] = LAYERS) -> list[str]:
    """Every broken rule, as ``path:line: what (the rule)``."""
    files = sorted(package_dir.glob("*.py"))
    modules = {path.stem for path in files}
    problems, same_layer = [], {}
    for path in files:
        here = path.stem
        where = f"{package_dir.name}/{path.name}"
        layer = layer_of(here, layers)
        if layer is None:
            problems.append(f"{where}:1: {here} is in no layer (rule: every module has a place in the layer table)")
            continue
        for imp in imports_of(path, modules):
            at = f"{where}:{imp.line}"
            if is_hub_portable(here):
                if imp.internal and not (imp.relative and is_hub_portable(imp.target)):
                    problems.append(
                        f"{at}: imports {imp.target} (rule: a Hub-portable file imports only the other "
                        f"Hub-portable files, relatively)"
                    )
                elif not imp.internal and imp.target not in HUB_PORTABLE_DEPENDENCIES | sys.stdlib_module_names:
                    problems.append(
                        f"{at}: imports {imp.target} (rule: a Hub-portable file imports only torch, "
                        f"transformers, huggingface_hub, safetensors and the standard library)"
                    )
            if not imp.internal:
                if imp.target not in DEPENDENCIES | sys.stdlib_module_names:
                    problems.append(
                        f"{at}: imports {imp.target} (rule: the package imports only the standard library, "
                        f"itself and its dependencies; examples/, benchmarks/ and scripts/ sit above it)"
                    )
                continue
            target_layer = layer_of(imp.target, layers) if imp.target in modules else None
            if target_layer is None:
                problems.append(f"{at}: imports {imp.target}, which is not a module of the package")
            elif target_layer > layer:
                problems.append(
                    f"{at}: imports {imp.target} of layer {layers[target_layer][0]!r} from layer "
                    f"{layers[layer][0]!r} (rule: a module imports only its own layer and lower ones)"
                )
            elif target_layer == layer and imp.target != here:
                same_layer.setdefault(here, {}).setdefault(imp.target, imp.line)
    for cycle in _cycles(same_layer):
        steps = ", ".join(
            f"{a} imports {b} ({package_dir.name}/{a}.py:{same_layer[a][b]})" for a, b in zip(cycle, cycle[1:])
        )
        problems.append(
            f"{package_dir.name}/{cycle[0]}.py:{same_layer[cycle[0]][cycle[1]]}: a circle: {steps} "
            f"(rule: modules of one layer import each other without circles)"
        )
    return problems


# ------------------------------------------------------------------ the package
def test_the_package_keeps_its_layers():
    problems = violations(PACKAGE_DIR)
    assert not problems, "\n" + "\n".join(problems)


def documented_layers() -> list[tuple[str, str]]:
    """(name, text) of each numbered line of the layer list in the package docstring, with its continuation lines."""
    layers, in_list = [], False
    for line in vanilla_transformer.__doc__.splitlines():
        numbered = re.match(r"(\d+)\. ([^:]+): (.*)", line)
        if numbered:
            layers.append((numbered[2], numbered[3]))
        elif layers and in_list and line.startswith("   "):
            layers[-1] = (layers[-1][0], f"{layers[-1][1]} {line.strip()}")
        in_list = bool(numbered) or (in_list and line.startswith("   "))
    return layers


def test_the_package_docstring_lists_the_layers_of_this_table():
    documented = documented_layers()
    assert [name for name, _ in documented] == [name for name, _ in LAYERS]
    for (name, text), (_, modules) in zip(documented, LAYERS):
        for module in sorted(modules):
            if (PACKAGE_DIR / f"{module}.py").is_file():
                assert f"``{module}``" in text, f"{module} is not listed in the layer {name!r} of the package docstring"


# ------------------------------------------------------------------ the checker finds what it should
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / PACKAGE
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from .training import train\n", "data.py:1: imports training of layer 'training' from layer 'foundations'"),
        ("def f():\n    from vanilla_transformer.cli import main\n", "data.py:2: imports cli of layer 'command line'"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import vanilla_transformer.evaluation\n",
            "data.py:3: imports evaluation of layer 'evaluation'",
        ),
        ("from vanilla_transformer import cards\n", "data.py:1: imports cards of layer 'reporting'"),
        ("import toy\n", "data.py:1: imports toy (rule: the package imports only the standard library"),
    ],
)
def test_an_import_of_a_higher_layer_is_reported_with_module_line_and_rule(tmp_path, source, expected):
    folder = _package(tmp_path, {"data": source, "training": "", "cli": "", "evaluation": "", "cards": ""})
    assert any(expected in problem for problem in violations(folder)), violations(folder)


def test_imports_of_lower_layers_and_of_the_own_layer_without_a_circle_pass(tmp_path):
    folder = _package(
        tmp_path,
        {
            "data": "import json\nimport torch\nfrom .loading import PRESETS\n",
            "loading": "",
            "evaluation": "from . import data\nfrom vanilla_transformer import VanillaTransformerConfig\n",
            "__init__": "from .configuration_vanilla_transformer import C\n",
            "configuration_vanilla_transformer": "",
        },
    )
    assert violations(folder) == []


def test_a_circle_within_a_layer_is_reported_with_every_step(tmp_path):
    folder = _package(
        tmp_path,
        {
            "data": "from . import loading\n",
            "loading": "\n\nfrom .schedule import x\n",
            "schedule": "def f():\n    from .data import y\n",
        },
    )
    (problem,) = violations(folder)
    assert "a circle: data imports loading (vanilla_transformer/data.py:1), loading imports schedule" in problem
    assert "(vanilla_transformer/loading.py:3), schedule imports data (vanilla_transformer/schedule.py:2)" in problem
    assert "rule: modules of one layer import each other without circles" in problem


def test_hub_portable_files_import_only_torch_transformers_and_each_other(tmp_path):
    folder = _package(
        tmp_path,
        {
            "modeling_vanilla_transformer": "import math\nimport torch\n"
            "from .configuration_vanilla_transformer import C\n"
            "from .kernels_vanilla_transformer import k\n",
            "kernels_vanilla_transformer": "import numpy\n",
            "generation_vanilla_transformer": "from vanilla_transformer.modeling_vanilla_transformer import M\n",
            "pipeline_vanilla_transformer": "from .tokenization import t\n",
            "configuration_vanilla_transformer": "from transformers import PreTrainedConfig\n",
            "tokenization": "",
        },
    )
    problems = violations(folder)
    assert not [p for p in problems if p.startswith(("vanilla_transformer/modeling_", "vanilla_transformer/config"))]
    assert any(
        "kernels_vanilla_transformer.py:1: imports numpy (rule: a Hub-portable file imports only torch" in p
        for p in problems
    )
    assert any(
        "generation_vanilla_transformer.py:1: imports modeling_vanilla_transformer (rule: a Hub-portable file "
        "imports only the other Hub-portable files, relatively)" in p
        for p in problems
    )
    assert any("pipeline_vanilla_transformer.py:1: imports tokenization" in p for p in problems)


def test_a_module_without_a_layer_is_reported(tmp_path):
    (problem,) = violations(_package(tmp_path, {"helpers": ""}))
    assert "helpers is in no layer" in problem
