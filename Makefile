# Trainyard: `make run` starts everything on this machine; `make test` runs every test CI runs.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
CHROMIUM := /usr/bin/chromium

.PHONY: directory run cluster slurm slurm-packages people-python test jstest bench bench-scale bench-fairness bench-preemption lint format chromium sandbox clean mxnet-env containers trainer-image

# The stamp is rebuilt when the dependency lists change; constraints.txt pins torch to the
# CPU wheel so that no CUDA packages are pulled in.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[console,agent,trainer,cli,dev]"
	touch $@

# RUN_ARGS: more of stack.run's options, e.g. RUN_ARGS="--redis-also-on 10.0.0.5" for a Slurm
# pool whose nodes reach this machine there (docs/slurm.md).
RUN_ARGS ?=
run: $(VENV)/.installed sandbox
	$(PY) -m stack.run --port $(PORT) $(RUN_ARGS)

# A real three-node Slurm cluster on this machine (stack/slurm.py), beside `make run`, added to
# its console as the Slurm pool "slurm" (docs/slurm.md); Ctrl-C stops it. Its three slurmd share
# loopback, where `make run`'s Redis listens.
slurm: $(VENV)/.installed slurm-packages
	$(PY) -m stack.slurm --one-host --pool slurm

# The multi-host demo on one machine: every node agent in a network namespace of its own, with
# its own address (needs root; docs/deploy.md).
cluster: $(VENV)/.installed sandbox
	$(PY) -m stack.run --cluster --port $(PORT)

# Two pytest processes, each taking whole test files (pytest-xdist): most of an integration test
# is waiting for processes, timers and other hosts, so two share the 2 cores well. Each process
# starts the stacks it needs. TEST_PROCESSES=0 runs everything in one process. The browser tests
# and the tests that change the host's network are handed out as one file (tests/file_groups.py):
# Chromium fails a page's loads when an interface comes or goes.
TEST_PROCESSES ?= 2
test: jstest $(VENV)/.installed chromium sandbox slurm-packages people-python trainer-image directory
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile

# The page scripts' pure parts (tests/js), by Node's own test runner: no npm package, a few
# seconds, and a failure stops `make test` before the long Python suite starts.
jstest:
	node --test tests/js/

# Apache MXNet 1.9.1 for the kvstore images that name it (stack/runtimes.py); prints its python.
mxnet-env: $(VENV)/.installed
	$(PY) -m stack.runtimes mxnet

# Figures as ratios against a baseline measured in the same run; no thresholds, no asserts.
bench: $(VENV)/.installed
	$(PY) -m bench

# Figures at a thousand nodes and ten thousand jobs (bench/scale.py): a simulated fleet of fake
# agents (bench/fleet.py) against the real console, each figure beside its 10-node baseline and
# its target. It loads the machine for several minutes; QUICK=1 for smaller sizes.
bench-scale: $(VENV)/.installed
	$(PY) -m bench.scale $(if $(QUICK),--quick)

# Fair share and borrowing on the simulated fleet against the real console (bench/fairfleet.py,
# time compressed 5 times): two groups' shares over 10 simulated minutes and the time for a
# lender to get its share back; then the same from the policy modules alone (bench/fairness.py).
bench-fairness: $(VENV)/.installed
	$(PY) -m bench.fairfleet shares lender

# 1,000 jobs of random priority classes on the simulated fleet against the real console
# (bench/fairfleet.py, time compressed 60 times), every job's attempts checked against the
# preemption rules at the end. It loads the machine for up to an hour on 2 cores.
bench-preemption: $(VENV)/.installed
	$(PY) -m bench.fairfleet preemption

lint: $(VENV)/.installed node_modules/.installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	VULTURE=$(VENV)/bin/vulture lint/vulture.sh
	node_modules/.bin/eslint static/trainyard tests/js eslint.config.js

# ESLint for the page scripts, from the npm registry, at the versions package-lock.json pins.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

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

# Trainers run in a bubblewrap sandbox (workers/sandbox.py, docs/security.md). Without it they
# run, but can read whatever the agent can, and the Nodes page says so.
# A Python any user may run, for the Slurm test of jobs that run as people's own accounts
# (stack/slurm.py python_for_everyone): this virtualenv's when it is open to all, else
# .people-python, the system's Python of the same version reading this virtualenv.
people-python: $(VENV)/.installed
	@$(PY) -m stack.slurm --people-python >/dev/null || echo "no Python for everyone: the run-as-owner Slurm test will skip"

# podman and runc run the jobs whose image is a container (workers/containers.py,
# docs/deploy.md); mmdebstrap makes the Debian root of the trainer image built here.
containers:
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >/dev/null; \
		else \
			echo "podman is missing: the container tests will skip ('sudo apt-get install podman runc mmdebstrap')"; \
		fi; \
	fi

# The trainer image, built here without a registry once per machine and recipe
# (stack/trainer_image.py: Debian + Python + the trainers' wheels); prints its reference.
trainer-image: $(VENV)/.installed containers
	@if command -v podman >/dev/null; then $(PY) -m stack.trainer_image; fi

sandbox:
	@if ! command -v bwrap >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
		else \
			echo "bubblewrap is missing: trainers will run without a sandbox ('sudo apt-get install bubblewrap')"; \
		fi; \
	fi

# Debian's Slurm 22.05 and munge, for the Slurm tests (tests/integration/test_slurm.py) and
# `make slurm`; never slurm-wlm-emulator, whose slurmctld and slurmd cannot run.
# With slurmdbd and MariaDB, for Slurm's accounting (stack/slurm_accounting.py: sacct).
slurm-packages:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
		|| ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge slurmdbd mariadb-server >/dev/null; \
		else \
			echo "Slurm is missing: the Slurm tests will skip ('sudo apt-get install slurm-wlm munge slurmdbd mariadb-server')"; \
		fi; \
	fi

# Sign-in through an LDAP directory: django-auth-ldap and python-ldap (which builds against
# OpenLDAP's headers), and OpenLDAP's slapd, which the directory tests start as a private
# server of their own (stack/directory.py), as they start Redis and Slurm.
directory: $(VENV)/.installed
	@if ! command -v slapd >/dev/null || ! command -v ldapmodify >/dev/null \
		|| [ ! -e /usr/include/ldap.h ] || [ ! -e /usr/include/sasl/sasl.h ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slapd ldap-utils libldap2-dev libsasl2-dev >/dev/null; \
		else \
			echo "OpenLDAP is missing: the directory tests will skip ('sudo apt-get install slapd ldap-utils libldap2-dev libsasl2-dev')"; \
		fi; \
	fi
	@$(PY) -c "import django_auth_ldap, ldap" 2>/dev/null \
		|| $(PY) -m pip install --quiet -c constraints.txt -e ".[directory]" \
		|| echo "python-ldap did not build: the directory tests will skip"

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache
