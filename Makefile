# Two entry points, each from a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Both create .venv and install attnlab with torch pinned to 2.13.0 (constraints.txt), the CPU
# build that pip finds on this machine's disk.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean system

# espeak-ng (Debian's package) speaks the `speech` task's words; installed once if missing
system:
	@command -v espeak-ng >/dev/null || apt-get install -y -q espeak-ng >/dev/null || \
		(apt-get update -q >/dev/null && apt-get install -y -q espeak-ng >/dev/null) || \
		(echo "install espeak-ng (Debian/Ubuntu: apt install espeak-ng) for the speech task" >&2; exit 1)

$(BIN)/attnlab: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

demo: system $(BIN)/attnlab
	$(BIN)/attnlab explain "I saw a saw"
	$(BIN)/attnlab bench attention -o bench-results/attention.json --plot bench-results/attention.png

test: system $(BIN)/attnlab
	$(BIN)/python -m pytest

bench: $(BIN)/attnlab
	$(BIN)/python benchmarks/attention.py

clean:
	rm -rf $(VENV) src/*.egg-info .pytest_cache .hypothesis
