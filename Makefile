# The two set-up commands of the README: `make run` and `make test`. Both build the virtualenv
# (.venv) from nothing on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint unit bench clean

# setuptools' editable install of a package whose subpackages live in other folders (sdk/,
# ingress/, egress/ are statefun.sdk, ...) goes through an import hook, and setuptools then
# warns that same-named folders in the working directory may shadow the package. Here the
# same-named folder is the package itself, so the warning is dropped (only that one).
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

$(STAMP): pyproject.toml setup.py $(wildcard sdk/_proto/*.proto) statefun/_hotloops.c
	@echo "installing pystatefun into $(VENV) (first use, and when pyproject.toml changes)..."
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(QUIET_EDITABLE) $(BIN)/python -m pip install -q -e '.[dev,rocksdb]'
	@touch $@

run: $(STAMP)
	$(BIN)/statefun run module.yaml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# mypy sees the package as installed: statefun/ with sdk/, ingress/, egress/ inside it,
	@# laid out as links under build/typecheck. mypy has no setting that maps a folder to
	@# another package name (mypy_path and explicit_package_bases name packages by their
	@# folders), and it cannot follow the import hook of setuptools' editable install.
	@# setuptools' "strict" editable mode builds such a link tree too, but only new files at
	@# each reinstall; a tree made here at every lint sees every file.
	@rm -rf build/typecheck && mkdir -p build/typecheck/statefun
	@for f in statefun/*; do ln -s "$(CURDIR)/$$f" build/typecheck/statefun/; done
	@for d in sdk ingress egress; do ln -s "$(CURDIR)/$$d" build/typecheck/statefun/$$d; done
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p statefun

# Three workers on two cores: most tests wait on processes and a broker more than they compute.
# Each worker starts its own Kafka broker; tests/_parallel.py says which tests share a worker.
test: lint
	$(BIN)/python -m pytest -n 3 --durations=25

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

clean:
	rm -rf $(VENV) .cache build *.egg-info sdk/_proto/*_pb2.py statefun/*.so
