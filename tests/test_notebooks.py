"""The notebooks run: each ``notebooks/*.ipynb`` executes top to bottom in a fresh kernel.

Every notebook must finish without an error and draw at least one figure (an
``image/png`` output). The kernel is this interpreter (a ``python3`` kernelspec
written for ``sys.executable``, found first through ``JUPYTER_PATH``), started in
the repository root with the repository on ``PYTHONPATH``, so the notebooks import
the working tree's ``solver`` and ``sweep`` whether or not the package is installed.

Needs nbclient, nbformat and ipykernel (the ``test`` extra) and matplotlib; when
one is missing the tests fail and say so, rather than skip.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: Seconds one cell may run.
CELL_TIMEOUT = 120
_NEEDED = ("nbclient", "nbformat", "ipykernel", "matplotlib")


def _require_tools():
    missing = []
    for name in _NEEDED:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        pytest.fail(f"the notebook tests need {', '.join(_NEEDED)} (the `test` extra: "
                    f"pip install -e '.[test]'), but {', '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not installed", pytrace=False)


@pytest.fixture(scope="module")
def kernel_path(tmp_path_factory):
    """A directory holding a ``python3`` kernelspec that runs this interpreter."""
    _require_tools()
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (layout-sweep tests)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return root


def test_there_are_notebooks():
    assert NOTEBOOKS, f"expected notebooks in {ROOT / 'notebooks'}, but found none"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path):
    _require_tools()
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    with_outputs = [i for i, cell in enumerate(notebook.cells)
                    if cell.cell_type == "code" and (cell.outputs or cell.execution_count)]
    assert not with_outputs, (f"{path.name}: expected cleared outputs (the tests run it), but "
                              f"code cells {with_outputs} have outputs or execution counts")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        [str(kernel_path)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep)
                              if p]))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # quiets debugpy's frozen-modules note

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    started = time.perf_counter()
    client.execute(env=env, cwd=str(ROOT))  # raises CellExecutionError on a failing cell
    elapsed = time.perf_counter() - started

    images = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
              for output in cell.outputs if "image/png" in output.get("data", {})]
    assert images, f"{path.name}: expected at least one figure (image/png output), but got none"
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name}: a cell raised {errors[0].ename}: {errors[0].evalue}"
    print(f"{path.name}: {elapsed:.1f} s, {len(images)} figures")
