# The two commands (README): `make qualify` runs the main job, `make test` the test command. Each
# does its set-up first (ci/setup.sh: a .venv with torch, the project and the emu plug-in; reused
# once made). ARGS passes options on: make qualify ARGS="--backend emu"; make test ARGS="-x".
VENV ?= .venv
ARGS ?=

.PHONY: setup qualify test

setup:
	ACCEL_VENV=$(VENV) bash ci/setup.sh

qualify: setup
	. $(VENV)/bin/activate && accel qualify -n 2 $(ARGS)

test: setup
	. $(VENV)/bin/activate && bash ci/test.sh $(ARGS)
