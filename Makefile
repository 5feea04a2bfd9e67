# gpuremediate — every target installs what it needs into a local venv.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-test
LINTSTAMP = $(VENV)/.installed-lint

.PHONY: test demo sandbox lint shellcheck bench bench-scale bench-100k bench-burst bench-burst-sources bench-kmsg bench-slow-api bench-preflight bench-isolation bench-degradation bench-nic e2e e2e-kind image clean help

help:
	@echo "make demo      the embedded default: emulated cluster + gpu-sim + controller, faults walking their states"
	@echo "make sandbox   the demo, then its cluster and controller keep running over TLS with a kubeconfig (Ctrl-C ends it)"
	@echo "make test      the whole test suite (unit, property, e2e against the emulator)"
	@echo "make lint      ruff + mypy on gpuremediate/, shellcheck on e2e/kind/ when installed (INSTALL_SHELLCHECK=1: apt-get it)"
	@echo "make bench     benchmarks (bench/)"
	@echo "make bench-scale  the controller at 1,000 / 2,500 / 5,000 GPU nodes on a real Prometheus (N=... for one size)"
	@echo "make bench-100k  100,000 nodes: one replica of --shards 20 (then 10) reading only its shard (N=... for another size)"
	@echo "make bench-burst  750 of 5,000 nodes faulting within 10 s: time to cordon (issue 27)"
	@echo "make bench-burst-sources  the same burst through a real Prometheus and through direct scraping"
	@echo "make bench-kmsg   Xid line in a node's kernel log -> cordoned, at 5,000 nodes: one at a time, 750 in 10 s, a storm (issue 48)"
	@echo "make bench-slow-api  8 nodes faulting at once on an API server taking 3 s a request: --loop-workers 1 vs 4 (issue 41)"
	@echo "make bench-preflight  pod creations at 100/s through the emulator calling the preflight webhook: admission P50/P99 (issue 46)"
	@echo "make bench-isolation  a month of 1,000 nodes replayed node-level and GPU-level: GPU-hours (issue 26)"
	@echo "make bench-nic    the agent's NIC read (8 NICs x 1 port) CPU/RSS beside its GPU reads; port down -> condition -> cordon (issue 45)"
	@echo "make bench-degradation  slow-gpu / link-degraded precision, recall, latency on a labelled fleet (FULL=1: 1,000 nodes x 7 days)"
	@echo "make e2e-kind  the e2e scenarios on a kind cluster (needs Docker + kind + kubectl)"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	@# PYTHONWARNINGS: setuptools' "Editable installation ... folders with the same name" banner says nothing here
	PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(PY) -m pip install -q -e '.[test]'
	@# helm-sdkpy (test-only): Helm v4's library for tests/charts (lint, install, upgrade on the API emulator); it
	@# declares Python >= 3.12 and runs on 3.11. Without it those tests try to install it, else skip saying why.
	$(PY) -m pip install -q --ignore-requires-python helm-sdkpy || echo "helm-sdkpy not installed: tests/charts will skip"
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

demo:
	$(PYTHON) -m gpuremediate demo

# The sandbox: kubectl and the CLI (from another terminal) against the demo's cluster, until Ctrl-C.
sandbox:
	$(PYTHON) -m gpuremediate demo --keep

$(LINTSTAMP): $(STAMP)
	$(PY) -m pip install -q ruff mypy
	touch $@

lint: $(LINTSTAMP) shellcheck
	$(VENV)/bin/ruff check gpuremediate sim
	$(VENV)/bin/mypy gpuremediate

# shellcheck checks $(SHELL_SCRIPTS) (the kind scripts and CI's) when it is installed; when it is not, make says
# so and installs nothing unless asked: INSTALL_SHELLCHECK=1 runs Debian's apt-get (as root, or through sudo) and
# says that it does.
SHELL_SCRIPTS = e2e/kind/*.sh .ci/run .ci/*.sh

shellcheck:
	@if command -v shellcheck >/dev/null 2>&1; then \
	  shellcheck $(SHELL_SCRIPTS); \
	elif [ -n "$(INSTALL_SHELLCHECK)" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  echo "make: installing shellcheck: $${SUDO:+sudo }apt-get install -y shellcheck (Debian's package)"; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq shellcheck >/dev/null && shellcheck $(SHELL_SCRIPTS); \
	else \
	  echo "make: shellcheck is not installed: $(SHELL_SCRIPTS) were not checked. Install it (Debian: apt-get install -y" \
	    "shellcheck, as root) or run make $(MAKECMDGOALS) INSTALL_SHELLCHECK=1 to have make run apt-get." >&2; \
	fi

bench: $(STAMP)
	$(PY) -m pip install -q prometheus_client
	$(PY) bench/run.py

# Fleet scale (issue 16): a real Prometheus (Debian's package, installed here as root when missing), the
# API emulator with N Nodes, the controller; N=200 for one quick size. A benchmark: CI does not run it.
bench-scale: $(STAMP)
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
		{ echo "bench-scale needs Debian's prometheus package (apt-get install -y prometheus, as root)" >&2; exit 2; }
	$(PY) bench/scale.py $(if $(N),$(N),1000 2500 5000)
	$(PY) bench/scale.py --direct $(if $(N),$(N),1000)

# 100,000 nodes measured (issue 48): one replica of S = 20, then S = 10, with per-shard Prometheus reads against a
# stand-in serving only its shard, the other replicas' Leases and budget claims simulated; ~15 minutes per S.
bench-100k: $(STAMP)
	$(PY) bench/scale_100k.py $(if $(N),$(N),100000) --shards 20 10

# Mass failure (issue 27): the cordon burst on the API emulator; `bench/burst.py --help` for the other shapes.
bench-burst: $(STAMP)
	$(PY) bench/burst.py

# The same burst (750 of 5,000) through the two real sources: a real Prometheus, then direct scraping.
bench-burst-sources: $(STAMP)
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
		{ echo "bench-burst-sources needs Debian's prometheus package (apt-get install -y prometheus, as root)" >&2; exit 2; }
	$(PY) bench/scale.py 5000 --burst 750 --faults 3 --modes raw
	$(PY) bench/scale.py --direct 5000 --burst 750

# Kernel fault -> cordon (issue 48): the agents' kmsg followers, their conditions, the controller's Node watch.
# A uniformly slow API server (issue 41): each node's milestones with 1 and 4 workers per loop.
bench-slow-api: $(STAMP)
	$(PY) bench/slow_api.py

bench-kmsg: $(STAMP)
	$(PY) bench/kmsg_latency.py

# GPU-level isolation (issue 26): GPU-hours out of service per fault class, node-level vs GPU-level.
bench-preflight: $(STAMP)
	$(PY) bench/preflight_admission.py

bench-isolation: $(STAMP)
	$(PY) bench/isolation_month.py

# The degradation detector over sim/degradation_fleet.py (issue 29): 100 nodes x 2 days, or FULL=1 for the issue's
# 1,000 nodes x 8 GPUs x 7 days (15-25 minutes on 2 shared cores); JOBS=N processes (racks are independent).
bench-degradation: $(STAMP)
	$(PY) bench/degradation.py $(if $(FULL),--full,) --jobs $(if $(JOBS),$(JOBS),2)

# The NIC watch (issue 45): per-read CPU, the agent process with and without NICs, port down -> cordon on the emulator.
bench-nic: $(STAMP)
	$(PY) bench/nic_cost.py

e2e: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider e2e

e2e-kind: shellcheck
	bash e2e/kind/run.sh

# The images: gpuremediate (controller + node agent) and gpu-sim, tagged :dev and :<version>. BASE_IMAGE is the
# base both build on: by default the local Debian bookworm + python3 base .ci/base-image.sh makes (debootstrap, as
# root; no registry needed); BASE_IMAGE= builds on the Dockerfiles' release default (python:3.11-slim by digest).
BASE_IMAGE ?= gpuremediate-base:bookworm
VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' gpuremediate/__init__.py)

image:
	@if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then \
	  echo "make image: no Docker engine here; nothing built" >&2; exit 1; fi
	$(if $(filter gpuremediate-base:%,$(BASE_IMAGE)),.ci/base-image.sh $(BASE_IMAGE))
	docker build $(if $(BASE_IMAGE),--build-arg BASE=$(BASE_IMAGE)) --build-arg VERSION=$(VERSION) \
	  -t gpuremediate:$(VERSION) -t gpuremediate:dev -f Dockerfile .
	docker build $(if $(BASE_IMAGE),--build-arg BASE=$(BASE_IMAGE)) -t gpu-sim:$(VERSION) -t gpu-sim:dev -f sim/Dockerfile .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
