# KV Lab. The two commands of the README:
#   make course   set everything up, execute every notebook headless, write build/index.html
#   make test     set everything up (with the dev and ray extras), run all tests (quick mode)
#   make unit     the tests that need no engine and no notebook kernel (under a minute)
# and `make lab` opens JupyterLab on the course (127.0.0.1 only).

VENV := .venv
BIN := $(VENV)/bin
export KVLAB_BUILD_DIR ?= $(CURDIR)/build
NOTEBOOKS := notebooks/*.ipynb labs/*.ipynb instructors/*.ipynb

.PHONY: test-models course preview test unit setup browser redis lab sync lint lock compare-vllm clean

course: setup redis
	$(BIN)/kvlab build

preview: setup  ## the course's pages from the notebooks as written, no execution: prose and links in seconds
	$(BIN)/kvlab build --no-run --out $(KVLAB_BUILD_DIR)/preview

test: export KVLAB_EXTRAS = dev,ray
test: setup browser redis
	KVLAB_QUICK=$${KVLAB_QUICK:-1} $(BIN)/python -m pytest -p no:cacheprovider tests notebooks --nbval-lax -m "not models" --durations=20 -rs

test-models: export KVLAB_EXTRAS = dev,ray
test-models: setup redis  ## every lesson on the hybrid, the second and the base model (CI runs it too)
	KVLAB_QUICK=$${KVLAB_QUICK:-1} $(BIN)/python -m pytest -p no:cacheprovider tests/test_second_model.py -m models --durations=20 -rs

unit: export KVLAB_EXTRAS = dev
unit: setup  ## the tests that need no engine, no notebook kernel and no slow measurement: under a minute
	KVLAB_QUICK=1 $(BIN)/python -m pytest -p no:cacheprovider tests -m "not engine and not notebook and not slow" -q

setup:
	@bash scripts/setup.sh

browser:
	@bash scripts/setup-browser.sh

redis:  ## Debian's redis-server for the gateway's response cache (lessons 03 and 06), when missing
	@bash scripts/setup-redis.sh

lab: setup redis
	$(BIN)/jupyter lab --ip=127.0.0.1 --no-browser --notebook-dir=$(CURDIR) $$([ "$$(id -u)" = 0 ] && echo --allow-root)

sync: setup  ## after editing a notebook or its .py outside JupyterLab: bring each pair in step (the newer side wins)
	$(BIN)/jupytext --sync $(NOTEBOOKS)

lint: export KVLAB_EXTRAS = dev
lint: setup
	$(BIN)/ruff check kvlab tests benchmarks notebooks labs instructors

lock:  ## after changing a dependency in pyproject.toml
	bash scripts/lock.sh

compare-vllm: setup  ## kvlab's TTFT/TPOT against `vllm bench latency` on the same settings
	$(BIN)/python benchmarks/compare_vllm_bench.py

clean:
	rm -rf build
