# ragen-rs: the two commands the README promises, and the steps they use.
#
#   make plugins   build every environment plugin into target/plugins/*.wasm
#   make test      build the plugins, then run every test

CARGO ?= cargo
# Where cargo puts its output (CI may keep it outside the clone).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
PLUGIN_DIR := target/plugins
RUST_PLUGINS := bandit sokoban frozenlake
# The authoring kit's worked example (examples/corridor), built and tested
# so the example cannot rot; it is not a shipped plugin.
EXAMPLE_DIR := target/examples

# Deliberately broken plugins the host's tests must survive (tests/faulty-plugin),
# one build per fault.
TEST_PLUGIN_DIR := target/test-plugins
FAULTS := loop-in-step grow-memory trap-in-reset nan-reward

.PHONY: all plugins test-plugins test clean-plugins gpu-backends

all: plugins

plugins:
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

test-plugins: plugins
	@mkdir -p $(TEST_PLUGIN_DIR)
	@for f in $(FAULTS); do \
	  $(CARGO) build -q --target wasm32-wasip2 --profile plugin -p ragen-test-faulty --features $$f || exit 1; \
	  cp $(TARGET_DIR)/wasm32-wasip2/plugin/ragen_test_faulty.wasm $(TEST_PLUGIN_DIR)/$$f.wasm; \
	  echo "  built $(TEST_PLUGIN_DIR)/$$f.wasm (faults on purpose)"; \
	done

test: plugins test-plugins
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) RAGEN_EXAMPLE_DIR=$(CURDIR)/$(EXAMPLE_DIR) \
	  RAGEN_TEST_PLUGIN_DIR=$(CURDIR)/$(TEST_PLUGIN_DIR) $(CARGO) test --workspace

# The GPU backends are cargo features of ragen-host. Build both (CUDA needs no
# toolkit to compile: it loads the driver at run time), then train one small
# step on wgpu when a Vulkan driver is present (on a machine without a GPU,
# Mesa's software driver lavapipe: Debian's mesa-vulkan-drivers).
gpu-backends: plugins
	$(CARGO) build -p ragen-host --features cuda
	$(CARGO) build -p ragen-host --features wgpu
	@if ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then \
	  rm -rf $(TARGET_DIR)/wgpu-smoke && \
	  $(TARGET_DIR)/debug/ragen-host train --env $(PLUGIN_DIR)/bandit.wasm --config examples/configs/smoke.toml \
	    --backend wgpu --out $(TARGET_DIR)/wgpu-smoke && \
	  grep -q '"step":1' $(TARGET_DIR)/wgpu-smoke/metrics.jsonl && echo "  wgpu: two training steps ran"; \
	else echo "  wgpu: no Vulkan driver found (apt-get install mesa-vulkan-drivers); built, not run"; fi

clean-plugins:
	rm -rf $(PLUGIN_DIR) $(EXAMPLE_DIR) $(TEST_PLUGIN_DIR)

# The sandbox-boundary measurement behind wit/README.md's batching decision.
# Uses the dev profile (dependencies are optimised there) so it reuses the
# test build instead of compiling wasmtime a second time.
.PHONY: bench-boundary
bench-boundary: plugins
	RAGEN_PLUGIN_DIR=$(CURDIR)/$(PLUGIN_DIR) $(CARGO) bench --profile dev -p ragen-e2e --bench boundary
