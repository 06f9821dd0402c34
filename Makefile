# Two commands: `make demo` and `make test`. Each sets up .venv from scratch when missing.
# `make lint` (run by CI before the tests) uses the ruff that the `dev` extra installs into .venv.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: demo test setup data lint bench clean

$(STAMP): pyproject.toml constraints/cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -c constraints/cpu.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP) data

# Real Fashion-MNIST from Debian's package when we can install it (root on Debian); otherwise the
# loader explains the other routes when that dataset is asked for. Debian's Chromium and its driver
# for the test that drives `vitkit serve`'s page in a real browser.
data:
	@if command -v dpkg >/dev/null && ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
		|| echo "note: could not install dataset-fashion-mnist (fashion-mnist tests will skip)"; fi
	@if command -v dpkg >/dev/null && ! dpkg -s chromium-driver >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
		|| echo "note: could not install chromium + chromium-driver (the served page's browser test will skip)"; fi

demo: setup
	$(PY) -m vitkit.demo

# Each test process runs torch on one thread (tests/conftest.py), so the suite runs one worker per core (at
# most 4: each worker holds its own torch); a test file stays on one worker, so its module fixtures are made once.
TEST_WORKERS ?= $(shell python3 -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))' 2>/dev/null || echo 2)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) runs build *.egg-info
