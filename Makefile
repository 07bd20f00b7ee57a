# The two commands of the README. Each sets itself up first (scripts/setup.sh).
#   make book   build the course into _build/html (warnings are errors)
#   make test   unit, property, kernel, notebook (nbval), packaging, workflow and browser tests
#   make lint   ruff (lint + format) and mypy, with the versions pinned in requirements.txt
PY := .venv/bin/python
PYTEST_FLAGS ?= -n 2 --dist loadfile
# `make test` runs these first, so the README's test command (and CI) also checks lint and types.
TEST_FIRST ?= lint

.PHONY: book test lint setup clean

setup:
	scripts/setup.sh

book: setup
	.venv/bin/jupyter-book build . -W -n --keep-going

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: $(TEST_FIRST)
	scripts/setup.sh --browser
	.venv/bin/jupyter-book build . -W -n --keep-going -q
	$(PY) -m pytest $(PYTEST_FLAGS) --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg tests book exercises

clean:
	rm -rf _build .pytest_cache .hypothesis dist build
