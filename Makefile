# The two commands of the README. Each sets itself up first (scripts/setup.sh).
#   make book   build the course into _build/html and its Chinese edition into _build/html/zh
#               (warnings are errors; scripts/i18n.py has the translation commands)
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
	$(PY) scripts/i18n.py build

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

test: $(TEST_FIRST)
	scripts/setup.sh --browser
	.venv/bin/jupyter-book build . -W -n --keep-going -q
	$(PY) scripts/i18n.py build
	$(PY) -m pytest $(PYTEST_FLAGS) --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg tests book exercises

clean:
	rm -rf _build .pytest_cache .hypothesis dist build
