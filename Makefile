# Trainyard: `make run` starts everything on this machine; `make test` runs every test CI runs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
CHROMIUM := /usr/bin/chromium

.PHONY: run test bench lint format chromium clean

# The stamp is rebuilt when the dependency lists change; constraints.txt pins torch to the
# CPU wheel so that no CUDA packages are pulled in.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

run: $(VENV)/.installed
	$(PY) -m stack.run --port $(PORT)

test: $(VENV)/.installed chromium
	$(PY) -m pytest

# Figures as ratios against a baseline measured in the same run; no thresholds, no asserts.
bench: $(VENV)/.installed
	$(PY) -m bench

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .

format: $(VENV)/.installed
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The browser tests drive Debian's Chromium; Playwright never downloads a browser of its own.
chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "Chromium is missing: run 'sudo apt-get install chromium' (the browser tests need it)"; exit 1; \
		fi; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
