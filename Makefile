# `make install` (or `make install PREFIX=~/.local`): see scripts/install.sh.
PREFIX ?= /usr/local

.PHONY: install test demo
install:
	bash scripts/install.sh "$(PREFIX)"
test:
	bash scripts/test.sh
demo:
	bash scripts/demo.sh
