# keras-posenc: developer entry points.
#
#   make demo        bootstrap .venv from the lock, then run `keras-posenc demo`
#   make test        lint, then pytest in .venv (Keras 2) and .venv-keras3: what CI runs (.ci/run)
#   make test-keras2 lint, then pytest in .venv (TF 2.12 / Keras 2, requirements/tf212.txt)
#   make test-keras3 lint, then pytest in .venv-keras3 (TF 2.21 / Keras 3, requirements/tf221.txt):
#                    the suite on KERAS_BACKEND=tensorflow, the layer tests again on jax
#   make venv-keras3 bootstrap .venv-keras3 (Python 3.12) from requirements/tf221.txt
#   make test-thorough the property tests (tests/test_properties*.py) with hypothesis's `thorough`
#                    profile (10x the examples of `make test`, fresh ones each run), on every stack
#   make mutation MODULE=keras_posenc/layers/rope_scaling.py
#                    mutation testing of one module against its tests (tools/mutation.toml), mutmut
#                    pinned in requirements/mutation.txt; `make mutation` alone lists the modules
#   make test-edge   export targets run by the real GPU runtimes on CPU-emulated GPUs (.edge-cache),
#                    and .litertlm bundles on LiteRT-LM's engine, exported on Keras 2 (.venv) and
#                    on Keras 3 (.venv-keras3); the Jetson kit on tflite-runtime (Python 3.8, 3.10)
#   make edge-bootstrap  only fill .edge-cache with those runtimes (test-edge's first step)
#   make lint        ruff check . and hadolint docker/Dockerfile
#   make install     install the lock + the package into the interpreter $(PY) (a venv of yours)
#   make bench-env   .venv-bench = the lock + requirements/bench.txt (KerasNLP, Model Garden)
#   make bench       run benchmarks/*.py in .venv-bench
#   make corpus      the English -> German corpus of Debian's German gettext catalogues (train/dev/test
#                    by package, tools/debian_po_packages.tsv) in .cache/corpus/debian_po_en_de/
#   make ablate-translate  seed 002's six translation claims in BLEU on that corpus, 3 seeds
#                    (`keras-posenc ablate --task translate`, about 2 hours on 2 cores), runs/ablation-translate
#   make docker      build the GPU training image (needs a Docker engine and network)
#   make docker-demo run `keras-posenc demo` in that image, output in runs/docker-demo/
#   make docker-proof build the unedited Dockerfile with podman on a local Debian base (no registry;
#                    root, installs podman with apt-get), run the demo in it offline and check it
#   make docker-proof-twice the same, then rebuild with --no-cache: both images, same final loss
#   make clean       remove the venvs, caches (.edge-cache too) and build outputs
#
# requirements/tf212.txt is the one source of truth for the environment: .venv, .venv-bench and
# docker/Dockerfile all install exactly that list, then the package with --no-deps.
# requirements/tf221.txt is the same for .venv-keras3 (TF 2.21 / Keras 3, Python 3.12).
# Use another interpreter with e.g. `make PY=python3.11 test` (KERAS3_PY=... for Python 3.12).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PY ?= python3
VENV ?= .venv
BENCH_VENV ?= .venv-bench
LOCK := requirements/tf212.txt
# Keras 3 stack: Python 3.12 (python3.12 on the PATH, else a pyenv 3.12 install).
KERAS3_VENV ?= .venv-keras3
KERAS3_LOCK := requirements/tf221.txt
KERAS3_PY ?= $(or $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
  "$$p" -c '' >/dev/null 2>&1 && { echo "$$p"; break; }; done),python3.12)
# Backend-agnostic tests (and doctests) that run a second time on KERAS_BACKEND=jax; the test files
# written against TF graphs skip themselves there.
KERAS3_JAX_TESTS ?= tests/test_tables.py tests/test_readme.py tests/test_properties.py \
  tests/test_property_regressions.py tests/test_generate.py keras_posenc/generation.py \
  $(wildcard tests/test_keras3_*.py tests/test_interop_*.py) \
  keras_posenc/backend.py keras_posenc/tables.py keras_posenc/positions.py keras_posenc/schedules.py \
  keras_posenc/beam_search.py \
  $(addprefix keras_posenc/layers/,position_embedding_base.py sinusoidal_position_embedding.py \
    learned_position_embedding.py integer_position_embedding.py zero_position_embedding.py \
    token_and_position_embedding.py rotary_embedding.py rope_scaling.py decoder_layer.py)
BENCH_LOCK := requirements/bench.txt
# pip itself is bootstrapping tooling, not part of the resolved set; setuptools and wheel come
# from the lock (they are dependencies of TF's stack and the build backend of this package).
PIP_VERSION := 24.0
BOOTSTRAP_PINS = pip==$(PIP_VERSION) $$(grep -E '^(setuptools|wheel)==' $(LOCK))
KERAS3_BOOTSTRAP_PINS = pip==$(PIP_VERSION) $$(grep -E '^(setuptools|wheel)==' $(KERAS3_LOCK))

IMAGE ?= keras-posenc:tf2.12-gpu
# e.g. `make docker-demo DOCKER_GPUS=` on a host without the NVIDIA container toolkit.
DOCKER_GPUS ?= --gpus all
PYTEST_ARGS ?=
BENCH_SCRIPTS ?= $(sort $(filter-out benchmarks/_%,$(wildcard benchmarks/*.py)))
BENCH_ARGS ?=
DEMO_ARGS ?=
# The goal named in error messages (sub-makes get it passed down).
GOAL ?= $(or $(MAKECMDGOALS),venv)

export TF_CPP_MIN_LOG_LEVEL ?= 2
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv demo test lint install bench-env bench docker docker-demo docker-check \
        check-python clean venv-keras3 check-python-keras3 test-keras2 test-keras3 pytest-keras2 \
        pytest-keras3 pytest-keras3-tensorflow pytest-keras3-jax test-edge edge-bootstrap test-thorough edge-keras2 edge-keras3 docker-proof docker-proof-twice \
        mutation corpus ablate-translate

help:
	@sed -n '3,30p' Makefile | sed 's/^# \{0,1\}//'

# --- interpreter check -------------------------------------------------------------------
# TF 2.12 publishes wheels for CPython 3.8-3.11 only: on any other version pip would fail deep
# inside the resolver, so say it plainly instead.
check-python:
	@if ! command -v "$(PY)" >/dev/null 2>&1; then \
	  echo "error: '$(PY)' was not found."; \
	  echo "keras-posenc needs Python 3.8-3.11 (TensorFlow 2.12 has no wheels for other versions)."; \
	  echo "Install Python 3.11, e.g. 'sudo apt-get install python3.11 python3.11-venv'"; \
	  echo "or 'pyenv install 3.11', then run: make PY=python3.11 $(GOAL)"; \
	  exit 1; \
	fi
	@if ! found=$$("$(PY)" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null); then \
	  echo "error: '$(PY)' exists but does not run as Python (e.g. a pyenv shim of a version not selected)."; \
	  echo "keras-posenc needs Python 3.8-3.11 (TensorFlow 2.12 has no wheels for other versions)."; \
	  echo "Install Python 3.11, e.g. 'sudo apt-get install python3.11 python3.11-venv'"; \
	  echo "or 'pyenv install 3.11', then run: make PY=python3.11 $(GOAL)"; \
	  exit 1; \
	fi; \
	if ! "$(PY)" -c 'import sys; sys.exit(0 if (3, 8) <= sys.version_info[:2] <= (3, 11) else 1)' 2>/dev/null; then \
	  echo "error: $(PY) is Python $$found; keras-posenc needs Python 3.8-3.11"; \
	  echo "(TensorFlow 2.12, pinned in $(LOCK), publishes no wheels for Python $$found)."; \
	  echo "Install Python 3.11, e.g. 'sudo apt-get install python3.11 python3.11-venv'"; \
	  echo "or 'pyenv install 3.11', then run: make PY=python3.11 $(GOAL)"; \
	  exit 1; \
	fi; \
	if ! "$(PY)" -c 'import venv, ensurepip' >/dev/null 2>&1; then \
	  echo "error: $(PY) (Python $$found) cannot create virtual environments: venv/ensurepip missing."; \
	  echo "On Debian/Ubuntu: sudo apt-get install python$${found%.*}-venv"; \
	  exit 1; \
	fi

# --- .venv -------------------------------------------------------------------------------
# Two stamps: a new lock rebuilds the venv from scratch (so removed pins really go away); a new
# setup.cfg/pyproject.toml only reinstalls the package (entry points, package data).
venv: $(VENV)/.stamp

$(VENV)/.lock-stamp: $(LOCK)
	@$(MAKE) check-python GOAL="$(GOAL)"
	rm -rf $(VENV)
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet $(BOOTSTRAP_PINS)
	$(VENV)/bin/python -m pip install --quiet -r $(LOCK)
	touch $@

$(VENV)/.stamp: $(VENV)/.lock-stamp setup.cfg pyproject.toml
	$(VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(VENV)/bin/python -m pip check
	touch $@

demo: venv
	$(VENV)/bin/keras-posenc demo $(DEMO_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/hadolint docker/Dockerfile

# --- .venv-keras3 (TF 2.21 / Keras 3, Python 3.12) ------------------------------------------
# Same two-stamp pattern as .venv.
venv-keras3: $(KERAS3_VENV)/.stamp

check-python-keras3:
	@if ! "$(KERAS3_PY)" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' >/dev/null 2>&1; then \
	  echo "error: '$(KERAS3_PY)' is not a working Python 3.12 with venv: $(KERAS3_LOCK) is locked for CPython 3.12."; \
	  echo "Install it (e.g. 'pyenv install 3.12' or 'sudo apt-get install python3.12 python3.12-venv'),"; \
	  echo "then run: make KERAS3_PY=/path/to/python3.12 $(GOAL)"; \
	  exit 1; \
	fi

$(KERAS3_VENV)/.lock-stamp: $(KERAS3_LOCK)
	@$(MAKE) check-python-keras3 GOAL="$(GOAL)"
	rm -rf $(KERAS3_VENV)
	"$(KERAS3_PY)" -m venv $(KERAS3_VENV)
	$(KERAS3_VENV)/bin/python -m pip install --quiet $(KERAS3_BOOTSTRAP_PINS)
	$(KERAS3_VENV)/bin/python -m pip install --quiet -r $(KERAS3_LOCK)
	touch $@

$(KERAS3_VENV)/.stamp: $(KERAS3_VENV)/.lock-stamp setup.cfg pyproject.toml
	$(KERAS3_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(KERAS3_VENV)/bin/python -m pip check
	touch $@

# pytest exits 5 when it collects no test: make treats that as a failure, on purpose.
pytest-keras2: venv
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

pytest-keras3: pytest-keras3-tensorflow pytest-keras3-jax

pytest-keras3-tensorflow: venv-keras3
	KERAS_BACKEND=tensorflow $(KERAS3_VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

pytest-keras3-jax: venv-keras3
	KERAS_BACKEND=jax $(KERAS3_VENV)/bin/python -m pytest -q $(PYTEST_ARGS) $(KERAS3_JAX_TESTS)

# The stacks are independent processes in separate venvs: all three run at once, sharing the cores
# (on two cores the short JAX run no longer waits for a long one to end, and the two long ones end
# together), each one's output printed in one piece when it ends (--output-sync); any failing fails
# `test`.
test: lint
	@$(MAKE) -j3 --output-sync=target pytest-keras2 pytest-keras3-tensorflow pytest-keras3-jax

test-keras2: lint
	@$(MAKE) pytest-keras2

test-keras3: lint
	@$(MAKE) pytest-keras3

# Property tests under the `thorough` profile (tests/conftest.py); a failure is saved in
# .hypothesis/ and replayed first by the next run. `make test` runs them under `ci`.
PROPERTY_TESTS := $(sort $(wildcard tests/test_propert*.py))

test-thorough: venv venv-keras3
	HYPOTHESIS_PROFILE=thorough $(VENV)/bin/python -m pytest -q $(PROPERTY_TESTS) $(PYTEST_ARGS)
	HYPOTHESIS_PROFILE=thorough KERAS_BACKEND=tensorflow $(KERAS3_VENV)/bin/python -m pytest -q \
	  $(PROPERTY_TESTS) $(PYTEST_ARGS)
	HYPOTHESIS_PROFILE=thorough KERAS_BACKEND=jax $(KERAS3_VENV)/bin/python -m pytest -q \
	  $(filter $(PROPERTY_TESTS),$(KERAS3_JAX_TESTS)) $(PYTEST_ARGS)

# --- mutation testing (a developer tool, not part of `make test` or CI) -------------------
# mutmut and its own dependencies (requirements/mutation.txt, pinned) go with --no-deps into
# .cache/mutmut-site and run on .venv's interpreter, so the lock's pytest is the one used. The run
# happens in .cache/mutation/<module>/, a copy of the package and tests (tools/mutation.py).
MUTATION_SITE := .cache/mutmut-site
MUTATION_LOCK := requirements/mutation.txt
MODULE ?=
MUTATION_ARGS ?=

$(MUTATION_SITE)/.stamp: $(MUTATION_LOCK) $(VENV)/.lock-stamp
	rm -rf $(MUTATION_SITE)
	$(VENV)/bin/python -m pip install --quiet --no-deps --target $(MUTATION_SITE) -r $(MUTATION_LOCK)
	touch $@

mutation: venv $(MUTATION_SITE)/.stamp
	$(VENV)/bin/python tools/mutation.py $(MODULE) $(MUTATION_ARGS)

# --- edge GPU runtimes -------------------------------------------------------------------
# tests/edge/runtime/bootstrap.sh fills .edge-cache/ (Mesa lavapipe, ai-edge-litert, mediapipe's GL delegate,
# tf2onnx + onnxruntime, onnxruntime-genai) once; tests/edge/edge_*.py then run the exported files on them.
EDGE_TESTS := $(sort $(wildcard tests/edge/edge_*.py))

# Both stacks: the TF 2.12 converter (.venv) and TF 2.21's with Keras 3 (.venv-keras3).
test-edge: edge-bootstrap
	@$(MAKE) -j2 --output-sync=target edge-keras2 edge-keras3

edge-bootstrap: venv venv-keras3
	PY=$(PY) KERAS3_PY=$(KERAS3_VENV)/bin/python tests/edge/runtime/bootstrap.sh

edge-keras2:
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(EDGE_TESTS) $(PYTEST_ARGS)

edge-keras3:
	KERAS_BACKEND=tensorflow $(KERAS3_VENV)/bin/python -m pytest -q -p no:cacheprovider $(EDGE_TESTS) $(PYTEST_ARGS)

# Into the interpreter $(PY) itself: meant for a virtualenv/conda env of yours, e.g.
# `make install PY=~/envs/posenc/bin/python`. Refuses a system interpreter unless SYSTEM=1.
install: check-python
	@if [ "$(SYSTEM)" != 1 ] && "$(PY)" -c 'import sys, os; sys.exit(0 if sys.prefix == sys.base_prefix and not os.environ.get("CONDA_PREFIX") else 1)'; then \
	  echo "error: $(PY) is not a virtual environment; 'make install' would change the system Python."; \
	  echo "Use 'make venv' (.venv), activate a venv of yours, or force it with 'make install SYSTEM=1'."; \
	  exit 1; \
	fi
	$(PY) -m pip install -r $(LOCK)
	$(PY) -m pip install --no-deps --no-build-isolation .

# --- benchmarks --------------------------------------------------------------------------
bench-env: $(BENCH_VENV)/.stamp

$(BENCH_VENV)/.stamp: $(LOCK) $(BENCH_LOCK) setup.cfg pyproject.toml
	@$(MAKE) check-python GOAL="$(GOAL)"
	rm -rf $(BENCH_VENV)
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet $(BOOTSTRAP_PINS)
	$(BENCH_VENV)/bin/python -m pip install --quiet -r $(LOCK)
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-deps -r $(BENCH_LOCK)
	$(BENCH_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@want=$$(grep -E '^tensorflow==' $(LOCK)); \
	have=$$($(BENCH_VENV)/bin/python -m pip freeze | grep -E '^tensorflow=='); \
	if [ "$$want" != "$$have" ]; then echo "error: $(BENCH_LOCK) moved $$want to $$have"; exit 1; fi
	$(BENCH_VENV)/bin/python -W ignore::UserWarning -c 'import keras_nlp.layers as K, official.nlp.modeling.layers as M; K.TransformerEncoder; M.TransformerEncoderBlock; print("bench peers: keras_nlp", __import__("keras_nlp").__version__, "+ tf-models-official OK")'
	touch $@

# Every benchmarks/*.py script except helpers named _*.py, from the repo root; pick some with
# e.g. `make bench BENCH_SCRIPTS=benchmarks/bench_encoder.py BENCH_ARGS="--reps 1"`.
bench: bench-env
	@if [ -z "$(strip $(BENCH_SCRIPTS))" ]; then echo "error: no benchmarks/*.py scripts to run"; exit 1; fi
	@for s in $(BENCH_SCRIPTS); do echo "== $$s $(BENCH_ARGS)"; $(BENCH_VENV)/bin/python "$$s" $(BENCH_ARGS); done

# --- parallel corpus ---------------------------------------------------------------------
# tools/make_parallel_corpus.py needs only the standard library (plus apt-get and dpkg-deb for the
# .deb files, cached in $(CORPUS_DIR)/debs so that a rebuild is offline); the stamp skips the build
# while the manifest and the tool are older than it.
CORPUS_DIR := .cache/corpus/debian_po_en_de
CORPUS_PY = $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)

corpus: $(CORPUS_DIR)/.stamp

$(CORPUS_DIR)/.stamp: tools/make_parallel_corpus.py tools/debian_po_packages.tsv
	$(CORPUS_PY) tools/make_parallel_corpus.py --debian $(CORPUS_DIR)
	touch $@

ablate-translate: venv corpus
	$(VENV)/bin/keras-posenc ablate --task translate --corpus-dir $(CORPUS_DIR) --out runs/ablation-translate

# --- docker ------------------------------------------------------------------------------
docker-check:
	@if ! command -v docker >/dev/null 2>&1; then \
	  echo "error: the 'docker' command is not installed: 'make $(GOAL)' needs a Docker engine."; \
	  echo "Install Docker Engine (and the NVIDIA Container Toolkit to train on GPUs); see docker/README.md."; \
	  exit 1; \
	fi
	@if ! docker info >/dev/null 2>&1; then \
	  echo "error: no Docker engine is reachable ('docker info' failed): the Docker engine is missing or not running,"; \
	  echo "or this user may not talk to it. Start the daemon (e.g. 'sudo systemctl start docker') or join the 'docker' group."; \
	  echo "Building also needs network access to Docker Hub (base image tensorflow/tensorflow:2.12.0-gpu) and PyPI."; \
	  exit 1; \
	fi

docker: docker-check
	docker build -f docker/Dockerfile -t $(IMAGE) .

docker-demo: docker
	mkdir -p runs/docker-demo
	docker run --rm $(DOCKER_GPUS) --user "$$(id -u):$$(id -g)" \
	  -v "$(CURDIR)/runs/docker-demo:/out" $(IMAGE) demo --out /out/demo $(DEMO_ARGS)

# No Docker engine or registry needed: tools/docker_proof.py (docker/README.md, "Prove the image
# without a registry"). DOCKER_PROOF=skip passes where the machine cannot (not root, no podman).
docker-proof:
	$(PY) tools/docker_proof.py

docker-proof-twice:
	$(PY) tools/docker_proof.py --twice

clean:
	rm -rf $(VENV) $(KERAS3_VENV) $(BENCH_VENV) .edge-cache build dist *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
