# Two entry points, each from a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install attnlab with torch pinned to 2.13.0 (constraints.txt), the CPU
# build that pip finds on this machine's disk.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install test-fast lint properties bench docs clean system

# Debian packages, installed once if missing: espeak-ng speaks the `speech` task's words;
# chromium renders the arena's report.html and the attention viewer in tests
system:
	@for pkg in espeak-ng chromium; do command -v $$pkg >/dev/null || apt-get install -y -q $$pkg >/dev/null || \
		(apt-get update -q >/dev/null && apt-get install -y -q $$pkg >/dev/null) || \
		(echo "install $$pkg (Debian/Ubuntu: apt install $$pkg)" >&2; exit 1); done

$(BIN)/attnlab: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,cluster,dev,docs,pretrained,transformers]'
	touch $@

# everything demo and test install (.venv, attnlab with every extra, the Debian packages), and nothing run
install: system $(BIN)/attnlab

demo: system $(BIN)/attnlab
	$(BIN)/attnlab arena --out arena

# two worker processes of one torch thread each (tests/conftest.py): on 2 cores about 4 minutes instead of 6.5 in one
# process of two threads, whose tiny matrix products spend their time synchronising the threads
test: system $(BIN)/attnlab
	$(BIN)/python -m pytest -n 2

# the edit-test loop: the suite without the tests marked slow (trainings, child processes, benchmarks end to end)
test-fast: system $(BIN)/attnlab
	$(BIN)/python -m pytest -n 2 -m "not slow"

# ruff (the rules in pyproject.toml) on the code, mypy on the typed floors ([tool.mypy] files)
lint: $(BIN)/attnlab
	$(BIN)/ruff check src tests benchmarks docs
	$(BIN)/mypy

# the property tests' long profile: 10,000 examples per property (about 7 minutes on 2 cores)
properties: $(BIN)/attnlab
	$(BIN)/python -m pytest tests/properties --hypothesis-profile=long --hypothesis-show-statistics

bench: $(BIN)/attnlab
	$(BIN)/python benchmarks/attention.py

# the documentation site: guides, API reference from the docstrings, benchmark pages; open docs/_build/html/index.html
docs: $(BIN)/attnlab
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) src/*.egg-info .pytest_cache .hypothesis
