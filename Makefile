# The two commands of the README. Each sets itself up first (scripts/setup.sh).
#   make book   build the course into _build/html (warnings are errors)
#   make test   unit, property, kernel, notebook (nbval) and browser tests
PY := .venv/bin/python
PYTEST_FLAGS ?= -n 2 --dist loadfile

.PHONY: book test setup clean

setup:
	scripts/setup.sh

book: setup
	.venv/bin/jupyter-book build . -W -n --keep-going

test:
	scripts/setup.sh --browser
	.venv/bin/jupyter-book build . -W -n --keep-going -q
	$(PY) -m pytest $(PYTEST_FLAGS) --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg tests book exercises

clean:
	rm -rf _build .pytest_cache .hypothesis
