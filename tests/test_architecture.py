"""The package's layering: every import points down the stack, never up.

tables -> positions -> layers (position layers, attention, encoder) -> models -> export -> app
(`backend`, `validation` and `special_ids` sit below everything). The application package
(`keras_posenc.app`: trainer, data, ablation, diagnostics, CLI) is never imported by the library.
The benchmarks use the package's public names only, as a user would.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "keras_posenc"
LEVELS = {
    "keras_posenc._startup": 0, "keras_posenc.validation": 0, "keras_posenc.backend": 0,
    "keras_posenc.special_ids": 0, "keras_posenc.files": 0,
    "keras_posenc.tables": 1,
    "keras_posenc.positions": 2,
    "keras_posenc.layers": 3,
    "keras_posenc.schedules": 4, "keras_posenc.generation": 4, "keras_posenc.beam_search": 4,
    "keras_posenc.models": 5, "keras_posenc.seq2seq": 5,
    "keras_posenc.export": 6,
    "keras_posenc.app": 7,
}


def _level(module):
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in LEVELS:
            return LEVELS[name]
    raise AssertionError(f"no level for {module}: add it to LEVELS")


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            continue  # package entry points re-export from below
        yield ".".join(parts), path


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" if node.module == "keras_posenc" else node.module
                     for alias in node.names]
        else:
            continue
        yield from (name for name in names if name.startswith("keras_posenc"))


@pytest.mark.parametrize("module,path", list(_modules()), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_imports_point_down_the_stack(module, path):
    own = _level(module)
    upward = sorted({name for name in _imports(path) if _level(name) > own})
    assert upward == [], f"{module} (level {own}) imports from above: {upward}"


def test_every_module_has_a_level():
    for module, _ in _modules():
        _level(module)


MHA_INTERNALS = {"_query_dense", "_key_dense", "_value_dense", "_output_dense", "_num_heads", "_key_dim",
                 "_value_dim", "_dropout_layer", "_softmax", "_attention_axes", "_dot_product_equation",
                 "_combine_equation", "_compute_attention", "_masked_softmax", "_use_bias"}
ATTENTION_MODULE = "keras_posenc.layers.positional_attention"


@pytest.mark.parametrize("module,path", list(_modules()), ids=lambda v: str(v).rsplit("/", 1)[-1])
def test_only_the_attention_layer_reads_multi_head_attention_internals(module, path):
    if module == ATTENTION_MODULE:
        return
    read = sorted({node.attr for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Attribute) and node.attr in MHA_INTERNALS
                   and ast.unparse(node.value) != "self"})
    assert read == [], f"{module} reads MultiHeadAttention internals {read}: use {ATTENTION_MODULE}"


# A module of the application or the export wing over this many lines has more than one job: split
# it by job.
MAX_APP_MODULE_LINES = 500
# The long modules not split yet, each with its reason; a module leaves this list once it is split.
LONG_APP_MODULES = {
    "app/ablation.py": "not split yet (issue #51 names train.py and cli.py)",
    "app/translation_ablation.py": "not split yet (issue #51 names train.py and cli.py)",
    "app/dataset.py": "not split yet (issue #51 names train.py and cli.py)",
}


@pytest.mark.parametrize("folder", ["app", "export"])
def test_application_and_export_modules_stay_within_500_lines(folder):
    lines = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
             for path in sorted((PACKAGE / folder).rglob("*.py"))}
    too_long = {name: count for name, count in lines.items()
                if count > MAX_APP_MODULE_LINES and name not in LONG_APP_MODULES}
    assert too_long == {}, f"split these by job (at most {MAX_APP_MODULE_LINES} lines each): {too_long}"
    listed = [name for name in LONG_APP_MODULES if name.startswith(folder + "/")]
    short_now = sorted(name for name in listed if lines.get(name, 0) <= MAX_APP_MODULE_LINES)
    assert short_now == [], f"no longer long (or gone): remove them from LONG_APP_MODULES: {short_now}"


BENCHMARKS = PACKAGE.parent / "benchmarks"


def _private_names_used(path):
    """`(line, name)` of each private name of `keras_posenc` that the script at `path` imports or reads."""
    tree = ast.parse(path.read_text())
    package_names, used = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keras_posenc"):
            for alias in node.names:
                package_names.add(alias.asname or alias.name)
                name = f"{node.module}.{alias.name}"
                if any(part.startswith("_") for part in name.split(".")):
                    used.append((node.lineno, name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("keras_posenc"):
                    package_names.add(alias.asname or alias.name.split(".")[0])
                    if any(part.startswith("_") for part in alias.name.split(".")):
                        used.append((node.lineno, alias.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in package_names:
                used.append((node.lineno, ast.unparse(node)))
    return sorted(used)


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_benchmarks_use_only_public_names_of_the_package(path):
    # A benchmark measures what users call: a private name it needs is made public where it lives.
    assert _private_names_used(path) == [], f"{path.name} uses private names of keras_posenc"
