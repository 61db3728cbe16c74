# Each target creates .venv and installs what it needs on a machine with only Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs goldens benchmarks clean

# The [lmms-eval] extra shares this venv (lmms-eval 0.7.3 keeps our torch and transformers;
# only filelock is held below 4), so its tests run in every `make test` and never skip in CI.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,lmms-eval]"
	touch $(STAMP)

demo: $(STAMP)
	rm -rf runs/demo  # the demo's own folder: each demo is a fresh run
	$(BIN)/posdebias evaluate --out runs/demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache  # layers point down, no cycles (pyproject.toml)
	$(BIN)/mypy  # strictness in pyproject.toml [tool.mypy]
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup  # harness tests on one worker (tests/integrations)
	$(MAKE) docs

# The documentation site (mkdocs.yml): --strict fails on any warning, broken links and anchors
# included; offline (built-in theme). Output in site/.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

# Regenerate the golden metrics of the seeded default runs (tests/goldens/) after a deliberate
# change of the numbers; commit them with the change.
goldens: $(STAMP)
	$(BIN)/python -m tests.golden --regenerate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache .mypy_cache
