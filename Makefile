# pycni — build, install, test, demo and benchmark entry points.
#
#   make demo      one-command demo on a fresh machine (installs what is missing, then cleans up)
#   make test      the whole pytest suite, after installing what is missing (as root: namespaces)
#   make long      the long versions of the tests `make test` runs short (marker `long`)
#   make drills    the fault drills at full size (each: "N tried, N survived, 0 lost")
#   make fuzz      the generated-input tests at full strength (make fuzz SEED=<n> replays)
#   make netpol-matrix  NetworkPolicy with real packets: 40 generated policy sets vs the model
#   make lint      ruff (lint + format check) and mypy over every package (CI runs it first)
#   make install   pip install . + plugin launchers, example conflist, daemon config, systemd unit
#   make soak      the whole product under churn on three nodes for 10 minutes: pycnid RSS/fds,
#                  ADD p99 a minute, errors, pycni doctor (make soak SOAK_ARGS="--minutes 3")
#   make bench     side-by-side benchmarks against the reference bridge + host-local
#                  (also: make bench-ipam, make bench-overlay, make bench-svc,
#                  make bench-svc-e2e, make bench-svc-api, make bench-netpol)
#
# Staged installs: make install DESTDIR=/tmp/stage (the launchers still point at the final paths).

PYTHON        ?= python3
DESTDIR       ?=
CNI_BIN_DIR   ?= /opt/cni/bin
CNI_CONF_DIR  ?= /etc/cni/net.d
PYCNI_CONF_DIR ?= /etc/pycni
SYSTEMD_DIR   ?= /etc/systemd/system
PIP_FLAGS     ?=
PYTEST_ARGS   ?=
PYTEST        ?= $(PYTHON) -m pytest -q -p no:cacheprovider --durations=15
# make test's worker processes (pytest-xdist): a module's tests stay on one worker (its
# module-scoped clusters are built once); most tests wait on namespaces, daemons and
# timeouts, so two workers on two cores halve the wall time. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 2
PARALLEL       = $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

CONFLIST      := 10-pycni.conflist
# where pip puts the package and console scripts for this interpreter (final paths, no DESTDIR)
PURELIB        = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
SCRIPTS_DIR    = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
# Debian's own python3 refuses pip installs (PEP 668) unless told; pyenv/venv interpreters don't care
PIP_SYSTEM     = $(shell $(PYTHON) -c 'import os, sysconfig; print("--break-system-packages" if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else "")')

.PHONY: help install install-python install-launchers install-conf install-unit uninstall \
        deps lint test test-unit long drills fuzz netpol-matrix demo bench bench-ipam bench-overlay \
        bench-svc bench-svc-e2e bench-svc-api bench-netpol soak launchers clean

help:
	@sed -n '2,15p' Makefile | sed 's/^# \{0,1\}//'

# --- install -----------------------------------------------------------------------------

install: install-python install-launchers install-conf install-unit
	@echo "pycni installed. Start the daemon: systemctl enable --now pycnid" \
	      "(or: pycnid --config $(PYCNI_CONF_DIR)/pycnid.json)"

# A staged install (DESTDIR) stages only this project, never its dependencies, and never
# touches what is installed in the running system.
install-python:
ifeq ($(strip $(DESTDIR)),)
	$(PYTHON) -m pip install $(PIP_SYSTEM) $(PIP_FLAGS) .
else
	$(PYTHON) -m pip install --root "$(DESTDIR)" --no-deps --ignore-installed \
	    --no-warn-script-location $(PIP_SYSTEM) $(PIP_FLAGS) .
endif
	@test -f "$(DESTDIR)$(PURELIB)/cni/exe.py" || \
	    { echo "pycni package not found in $(DESTDIR)$(PURELIB) after pip install" >&2; exit 1; }

install-launchers:
	$(PYTHON) -m cni.launcher "$(DESTDIR)$(CNI_BIN_DIR)" --root "$(PURELIB)"

# Configuration belongs to the operator once written: never overwrite an existing file.
install-conf:
	install -d -m 0755 "$(DESTDIR)$(CNI_CONF_DIR)" "$(DESTDIR)$(PYCNI_CONF_DIR)"
	@if [ -e "$(DESTDIR)$(CNI_CONF_DIR)/$(CONFLIST)" ]; then \
	    echo "kept existing $(DESTDIR)$(CNI_CONF_DIR)/$(CONFLIST)"; \
	else install -m 0644 conf/$(CONFLIST) "$(DESTDIR)$(CNI_CONF_DIR)/$(CONFLIST)" && \
	    echo "wrote $(DESTDIR)$(CNI_CONF_DIR)/$(CONFLIST)"; fi
	@if [ -e "$(DESTDIR)$(PYCNI_CONF_DIR)/pycnid.json" ]; then \
	    echo "kept existing $(DESTDIR)$(PYCNI_CONF_DIR)/pycnid.json"; \
	else install -m 0644 conf/pycnid.json "$(DESTDIR)$(PYCNI_CONF_DIR)/pycnid.json" && \
	    echo "wrote $(DESTDIR)$(PYCNI_CONF_DIR)/pycnid.json"; fi
	install -D -m 0644 conf/pycni-rt_protos.conf "$(DESTDIR)/etc/iproute2/rt_protos.d/pycni.conf"

install-unit:
	install -d -m 0755 "$(DESTDIR)$(SYSTEMD_DIR)"
	sed 's|/usr/local/bin/pycnid|$(SCRIPTS_DIR)/pycnid|' conf/pycnid.service \
	    > "$(DESTDIR)$(SYSTEMD_DIR)/pycnid.service"
	chmod 0644 "$(DESTDIR)$(SYSTEMD_DIR)/pycnid.service"
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# Removes what install put in place, except configuration (conflist, pycnid.json) and state.
uninstall:
	rm -f "$(DESTDIR)$(CNI_BIN_DIR)/pycni-bridge" "$(DESTDIR)$(CNI_BIN_DIR)/pycni-ipam" \
	      "$(DESTDIR)$(CNI_BIN_DIR)/pycni-svc" "$(DESTDIR)$(SYSTEMD_DIR)/pycnid.service"
	-$(PYTHON) -m pip uninstall -y $(PIP_SYSTEM) pycni

# --- develop, test, demo, bench -------------------------------------------------------------

# What the tests need (Debian packages, pyproject's Python requirements), skipping what is
# present: with everything there it costs ~0.2 s, so the test targets run it every time.
deps:
	PYTHON=$(PYTHON) bash scripts/install-deps.sh

# ruff (lint and format) and mypy, configured in pyproject.toml; 0 findings is the bar
lint: deps
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy

test: deps
	$(PYTEST) $(PARALLEL) $(PYTEST_ARGS)

test-unit: deps
	$(PYTEST) tests/unit $(PYTEST_ARGS)

# The tests that `make test` runs at a short size, at the size they were written with (same
# assertions, more load: hundreds of calls in flight per node). Marker `long`; the sizes are in
# tests/fixtures/scale.py.
long: deps
	PYCNI_TEST_SCALE=long $(PYTEST) -m long $(PYTEST_ARGS)

# The fault drills at their long size (each prints "N tried, N survived, 0 lost"; the
# default suite runs them short). Marker `drill`.
drills: deps
	PYCNI_TEST_SCALE=long $(PYTEST) -s -m drill $(PYTEST_ARGS)

# Generated-input tests at full strength (>= 10,000 cases, shrinking on). The seed is printed
# first; replay a run with `make fuzz SEED=<n>`.
fuzz:
	@seed="$(SEED)"; seed="$${seed:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"; \
	echo "fuzz seed: $$seed (replay: make fuzz SEED=$$seed)"; \
	PYCNI_FUZZ_PROFILE=fuzz $(PYTEST) tests/fuzz --hypothesis-seed="$$seed" \
	    --hypothesis-show-statistics $(PYTEST_ARGS)

# NetworkPolicy enforcement against the model with real packets: 40 generated policy sets,
# each a full reachability matrix (the default suite runs 2); replay with SEED=<n>.
netpol-matrix:
	PYCNI_NETPOL_CASES=40 $(if $(SEED),PYCNI_NETPOL_SEED=$(SEED)) \
	    $(PYTEST) -s tests/netns/test_netpol_generated.py $(PYTEST_ARGS)

demo:
	bash scripts/demo.sh

bench:
	$(PYTHON) -m bench.run $(BENCH_ARGS)

# IPAM allocations/s and p50/p99 on a real etcd, one node and three
bench-ipam:
	$(PYTHON) -m bench.ipam_alloc $(BENCH_ARGS)

# Multi-node pod network: Pod<->Pod iperf3 against a hand-built topology, join/leave
# convergence with 20 node namespaces, full resync of 1,000 synthetic peers
bench-overlay:
	$(PYTHON) -m bench.overlay $(BENCH_ARGS)

# Service proxy rulesets: full sync of 1k/10k/30k Services x 5 endpoints and a
# one-Service update, pycni's renderer against a kube-proxy-shaped ruleset, in fresh netns
bench-svc:
	$(PYTHON) -m bench.svc $(BENCH_ARGS)
	$(PYTHON) -m bench.svc_e2e $(BENCH_E2E_ARGS)

# The Service proxy in pycnid on two vxlan nodes: `pycni svc create` -> first connect from the
# other node, pycnid's VmRSS, first pass and a one-endpoint update at 10k Services x 5 endpoints
bench-svc-e2e:
	$(PYTHON) -m bench.svc_e2e $(BENCH_E2E_ARGS)

# Services from the Kubernetes API server (a fake one on the control-plane host) against the
# store-fed proxy, in one run at 10k Services x 5 endpoints: first list -> programmed, pycnid's
# VmRSS API/store, one EndpointSlice change -> in the kernel
bench-svc-api:
	$(PYTHON) -m bench.svc_api $(BENCH_API_ARGS)

# NetworkPolicy at 1,000 policies x 10,000 Pods (~100 on the measured node), each figure beside
# an anchor of the same run: full sync, policy change -> other node's kernel (two pycnids on
# etcd), Pod label change, ADD cost, first packet (vs a linear ruleset), pycnid's VmRSS
bench-netpol:
	$(PYTHON) -m bench.netpol $(BENCH_NETPOL_ARGS)

# Three vxlan nodes with the Service proxy and NetworkPolicy under Pod churn, Service and policy
# changes and cross-node traffic: pycnid VmRSS and open fds (start, end, slope per hour), ADD
# p99 a minute, every error (exit 1 on any) and pycni doctor on every node at the end
soak:
	$(PYTHON) -m bench.soak $(SOAK_ARGS)

launchers:
	$(PYTHON) -m cni.launcher build/bin

clean:
	rm -rf build dist bench/results
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
