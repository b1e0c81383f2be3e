# Capsule Networks, an interactive book. Two commands (see README.md):
#   make book   create .venv if needed and build the HTML book into _build/html
#   make test   lint, unit tests, every chapter on both data paths, strict book build (.ci/make_test.sh)
#   make check  the inner loop (about 2-5 minutes): lint, the fast unit tests, one chapter in smoke mode
SHELL := /bin/bash
.DEFAULT_GOAL := book

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.capsule-installed

# One data root for builds and tests: $CAPSULE_DATA if set, else ./data.
ifeq ($(strip $(CAPSULE_DATA)),)
CAPSULE_DATA := $(abspath data)
endif
export CAPSULE_DATA
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: venv book serve test check screenshots clean

JOBS    ?= $(shell nproc)
CHAPTER ?= book/primer.ipynb

## venv: create .venv and install requirements.txt + capsule_lib (editable); redone when they change
venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -r requirements.txt
	$(VENV)/bin/python -m pip install -e .
	@touch $@

## book: build the HTML book (chapters executed with TRAIN off, cached in _build/.jupyter_cache)
book: $(STAMP)
	@echo "make book: data root $(CAPSULE_DATA)"
	$(VENV)/bin/python book/_tools/cache_guard.py
	@$(VENV)/bin/python book/_tools/build_report.py --clean
	$(VENV)/bin/jupyter-book build .
	@$(VENV)/bin/python book/_tools/build_report.py
	@echo
	@echo "Book built. Open: file://$(CURDIR)/_build/html/index.html"
	@echo "(the live widgets need it served: make serve, then http://127.0.0.1:8000/)"

## serve: serve the built book on http://127.0.0.1:8000/ (what the live widgets need; file:// shows their twins)
serve:
	@test -f _build/html/index.html || $(MAKE) book
	$(VENV)/bin/python -m http.server --bind 127.0.0.1 --directory _build/html 8000

## test: pytest tests, nbval, papermill, book build with -W (see .ci/make_test.sh)
test: $(STAMP)
	@bash .ci/make_test.sh

## check: lint, the unit tests not marked slow (JOBS workers), CHAPTER (default: the primer) under nbval in smoke mode
check: $(STAMP)
	@t0=$$(date +%s); \
	ruff check . && ruff format --check . && \
	python -m pytest -q -n $(JOBS) --dist loadfile -m "not slow" tests && \
	CAPSULE_SMOKE=1 python -m pytest -q --nbval-lax -p no:cacheprovider $(CHAPTER) && \
	echo "make check: passed in $$(( $$(date +%s) - t0 )) s"

## screenshots: full-page screenshots of the built pages into _build/screenshots (headless chromium)
screenshots: $(STAMP)
	@test -f _build/html/index.html || $(MAKE) book
	$(VENV)/bin/python book/_tools/screenshots.py --html _build/html --out _build/screenshots

## clean: remove _build (keeps .venv)
clean:
	rm -rf _build
