# KV Lab. The two commands of the README:
#   make course   set everything up, execute every notebook headless, write build/index.html
#   make test     set everything up, run all tests (quick mode)
# and `make lab` opens JupyterLab on the course (127.0.0.1 only).

VENV := .venv
BIN := $(VENV)/bin
export KVLAB_BUILD_DIR ?= $(CURDIR)/build

.PHONY: course test setup browser lab lint format clean

course: setup
	$(BIN)/kvlab build

test: setup browser
	KVLAB_QUICK=$${KVLAB_QUICK:-1} $(BIN)/python -m pytest -p no:cacheprovider tests notebooks --nbval-lax

setup:
	@bash scripts/setup.sh

browser:
	@bash scripts/setup-browser.sh

lab: setup
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=$(CURDIR) $$([ "$$(id -u)" = 0 ] && echo --allow-root)

lint: setup
	$(BIN)/ruff check kvlab tests tools

clean:
	rm -rf build
