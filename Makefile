# Two entry points (see README): `make serve` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0 lies on the dev/CI machines' disk; a GPU host with its own
# CUDA torch can run `make serve TORCH_SPEC=` to keep it.
TORCH_SPEC ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	if [ -n "$(TORCH_SPEC)" ]; then $(PY) -m pip install -q "$(TORCH_SPEC)"; fi
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

.PHONY: serve test
serve: $(VENV)/.installed
	$(VENV)/bin/ddtree serve

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider --durations=15
