"""The distribution holds every file the package reads at run time.

Builds the wheel and the sdist from this checkout (``python -m build``, as a
user or a lock file would) and lists their contents: every module of
``solver`` and ``sweep``, every catalog and example-spec TOML of ``configs/``
(installed as the data package ``layout_sweep_configs``), and the console
script. CI also installs the wheel into a fresh venv and runs the main job from
an empty folder (``.ci/run``).
"""

from __future__ import annotations

import importlib.resources
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import solver
import sweep
from sweep import spec as spec_mod

ROOT = Path(__file__).resolve().parent.parent


def _source_files(pattern: str) -> set:
    return {p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern)}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return wheels[0], sdists[0]


def test_wheel_holds_every_runtime_file(dist):
    wheel, _ = dist
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = _source_files("solver/**/*.py") | _source_files("sweep/**/*.py")
    assert modules and modules <= names, sorted(modules - names)
    configs = _source_files("configs/**/*.toml")
    assert len(configs) >= 9  # five catalog files and the example specs
    installed = {"layout_sweep_configs/" + c.removeprefix("configs/") for c in configs}
    assert installed <= names, sorted(installed - names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "layout-sweep = sweep.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: optuna>=5" in metadata


def test_sdist_holds_the_sources_and_configs(dist):
    _, sdist = dist
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = (_source_files("solver/**/*.py") | _source_files("sweep/**/*.py")
              | _source_files("configs/**/*.toml") | {"pyproject.toml", "README.md"})
    assert wanted <= names, sorted(wanted - names)


def test_catalog_and_specs_read_through_importlib_resources(monkeypatch):
    monkeypatch.delenv("SOLVER_CATALOG_DIR", raising=False)
    catalog_files = importlib.resources.files(solver.catalog.RESOURCE_PACKAGE)
    assert catalog_files.joinpath("fleets.toml").is_file()
    assert str(solver.catalog.catalog_dir()) == str(catalog_files)
    specs = importlib.resources.files(spec_mod.SPECS_PACKAGE)
    assert specs.joinpath("default.toml").is_file()
    assert {"default", "search_llama70b", "calculon_gpt3", "cluster_size"} <= set(
        sweep.spec.builtin_specs())


def test_builtin_spec_names_work_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    for name in ("default", "default.toml", "configs/sweeps/default.toml"):
        assert sweep.load_spec(name).name == "default"
    with pytest.raises(sweep.SpecError, match="no such spec file"):
        sweep.load_spec("configs/sweeps/nope.toml")
    with pytest.raises(sweep.SpecError, match="did you mean 'default'"):
        sweep.spec.builtin_spec("defualt")


def test_a_local_file_wins_over_the_builtin_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default.toml").write_text('name = "mine"\nworkload = "Llama3_8B"\n'
                                           'fleet = "Research_256"\n')
    assert sweep.load_spec("default.toml").name == "mine"


def test_version_comes_from_the_installed_metadata(capsys):
    from importlib.metadata import version

    from sweep import cli

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"layout-sweep {version('layout-sweep')}"
