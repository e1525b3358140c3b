# Two entry points, each from a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install attnlab with torch pinned to 2.13.0 (constraints.txt), the CPU
# build that pip finds on this machine's disk.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean

$(BIN)/attnlab: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

demo: $(BIN)/attnlab
	$(BIN)/attnlab explain "I saw a saw"
	$(BIN)/attnlab bench attention -o bench-results/attention.json --plot bench-results/attention.png

test: $(BIN)/attnlab
	$(BIN)/python -m pytest

bench: $(BIN)/attnlab
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) src/*.egg-info .pytest_cache .hypothesis
