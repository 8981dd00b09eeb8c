# The two commands the README opens with:
#   make run    installs what is missing, builds, and runs toolhostd in the foreground (state in ./var)
#   make test   installs what is missing, builds, and runs the whole suite
# Other targets: build, release, asan (address + undefined sanitizers, with tests), bench, clean.

PRESET ?= debug
JOBS ?= $(shell nproc)
BUILD_DIR := build/$(PRESET)
STATE_DIR := $(CURDIR)/var
SOCKET := $(STATE_DIR)/run/toolhost.sock

.PHONY: deps configure build run test release asan bench clean

deps:
	@./scripts/deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	@mkdir -p $(STATE_DIR)/run
	@echo "toolhostd: socket $(SOCKET)  (toolhostctl --socket $(SOCKET) ping, or export TOOLHOST_SOCKET=$(SOCKET))"
	@exec $(BUILD_DIR)/daemon/toolhostd --socket $(SOCKET) --state-dir $(STATE_DIR) \
		$(if $(wildcard $(CURDIR)/toolhost.toml),--config $(CURDIR)/toolhost.toml)

test: build
	@ctest --preset $(PRESET) -j $(JOBS)

release:
	@$(MAKE) build PRESET=release

asan:
	@$(MAKE) test PRESET=asan

bench:
	@$(MAKE) build PRESET=release
	@./bench/run.sh build/release

clean:
	@rm -rf build
