"""Colab, simulated: a fresh environment that already has torch, triton, numpy, matplotlib (and the
rest of what a Colab image brings, here the test venv's own packages), the notebooks' install
command run against a local clone of this repository, then chapter 2, exercise 1 and the real-model
chapter (7) top to bottom. (SmolLM2's weights, which chapter 7's second install line adds on Colab, are
among the linked packages here.)

* The fresh venv sees this venv's packages through a ``.pth`` line (a folder of links to them,
  minikv left out), so nothing big is downloaded; installing minikv needs only the package index
  (setuptools for the isolated build).
* The install command is taken from each notebook's first cell, with the GitHub address swapped for
  ``git+file://`` of a clone of the working tree (committed on branch ``main``).
* ``pip freeze`` before and after must differ by exactly one line: minikv. Anything else means the
  install cell would replace Colab's torch or triton (a multi-GB download, and a broken runtime).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import set_repository  # noqa: E402

CHAPTER = "book/02_two_layers.ipynb"
EXERCISE = "exercises/ex1_capacity.ipynb"
REAL_MODEL = "book/07_real_model.ipynb"
IN_CI = bool(os.environ.get("CI"))
INSTALL = re.compile(r"^\s*%pip install (?P<args>.+)$", re.M)


def install_commands() -> dict[str, str]:
    """``{notebook: the arguments of its %pip install}`` for every notebook of the book."""
    found = {}
    for _title, path in set_repository.notebook_pages(REPO):
        first = json.loads((REPO / path).read_text())["cells"][0]
        match = INSTALL.search("".join(first["source"]))
        assert match, f"{path}: the first cell has no %pip install"
        found[path] = match["args"].strip()
    return found


def clean_env() -> dict[str, str]:
    """No PYTHONPATH (it would put a checkout's minikv first) and no virtualenv of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def colab_like_venv(where: Path) -> Path:
    """A fresh venv whose only packages are links to this interpreter's, minikv excluded."""
    base = where / "colab-image"
    base.mkdir()
    seen = set()
    for key in ("purelib", "platlib"):
        site = Path(sysconfig.get_paths()[key])
        if site in seen or not site.is_dir():
            continue
        seen.add(site)
        for entry in site.iterdir():
            name = entry.name.lower()
            if "minikv" in name or entry.suffix == ".pth" or (base / entry.name).exists():
                continue
            (base / entry.name).symlink_to(entry)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where / "venv")
    python = where / "venv" / "bin" / "python"
    own_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env=clean_env(),
    ).stdout.strip()  # fmt: skip
    (Path(own_site) / "colab_image.pth").write_text(f"{base}\n")
    return python


def clone_of_the_working_tree(dest: Path) -> Path:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, out.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git = ["git", "-c", "user.name=colab-sim", "-c", "user.email=colab-sim@localhost", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "working tree"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


def freeze(python: Path) -> list[str]:
    result = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True, env=clean_env()
    )
    return sorted(line for line in result.stdout.splitlines() if line.strip())


@pytest.fixture(scope="module")
def colab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        urllib.request.urlopen("https://pypi.org/simple/setuptools/", timeout=15).read(1)
    except OSError as error:
        if IN_CI:
            pytest.fail(f"the package index is unreachable ({error})")
        pytest.skip(f"the package index is unreachable ({error}); building minikv needs setuptools from it")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    where = tmp_path_factory.mktemp("colab")
    python = colab_like_venv(where)
    clone = clone_of_the_working_tree(where / "clone")
    before = freeze(python)
    assert not [line for line in before if line.lower().startswith("minikv")], "minikv is already there"
    assert [line for line in before if line.startswith("torch==")], "the Colab-like venv has no torch"
    url = set_repository.read_repository(REPO)
    commands = set(install_commands().values())
    for args in commands:
        local = args.replace(f"git+{url}@", f"git+file://{clone}@")
        assert local != args, f"the install command does not name {url}: {args}"
        result = subprocess.run(
            [str(python), "-m", "pip", "install", *shlex.split(local)],
            capture_output=True, text=True, timeout=600, env=clean_env(), cwd=where,
        )  # fmt: skip
        assert result.returncode == 0, f"pip install {local} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    after = freeze(python)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    assert removed == [], f"the install cell replaced {removed} with {added}"
    assert len(added) == 1 and added[0].startswith("minikv @ git+file://"), added
    return python


def test_every_notebook_installs_minikv_the_same_way() -> None:
    commands = install_commands()
    assert len(commands) >= 10
    # The notebooks that load the real model ask for the extra with its readers: minikv[models].
    assert len({args.replace('"minikv[models] @', '"minikv @') for args in commands.values()}) == 1, commands
    assert any("minikv[models]" in args for args in commands.values())


def test_install_cell_adds_only_minikv_and_it_imports_from_the_venv(colab: Path) -> None:
    result = subprocess.run(
        [str(colab), "-c", "import minikv, torch; print(minikv.__file__); print(minikv.__version__)"],
        capture_output=True, text=True, check=True, env=clean_env(), cwd=colab.parent,
    )  # fmt: skip
    where, version = result.stdout.split()
    assert where.startswith(str(colab.parent.parent)), f"minikv was imported from {where}"
    assert version == re.search(r'__version__ = "([^"]+)"', (REPO / "minikv" / "__init__.py").read_text())[1]


@pytest.mark.parametrize("notebook", [CHAPTER, EXERCISE, REAL_MODEL])
def test_a_notebook_runs_top_to_bottom_there(colab: Path, notebook: str, tmp_path: Path) -> None:
    copy = tmp_path / Path(notebook).name
    shutil.copy2(REPO / notebook, copy)
    runner = (
        "import sys, nbformat\n"
        "from nbclient import NotebookClient\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=600, kernel_name='python3',"
        " resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
        "print('ran', len(nb.cells), 'cells')\n"
    )
    result = subprocess.run(
        [str(colab), "-c", runner, str(copy), str(tmp_path)],
        capture_output=True, text=True, timeout=900, env=clean_env(), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, f"{notebook} failed in the Colab-like venv:\n{result.stderr[-5000:]}"
    assert "ran" in result.stdout
