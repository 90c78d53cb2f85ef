# Makefile for the idempotency extension (PGXS).
#
#   make run     install what is missing, build, start a demo cluster
#   make test    install what is missing, build, run every test suite
#   make bench   install what is missing, build, run the benchmarks
#   make stop    stop the demo cluster started by make run

EXTENSION = idempotency
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)

MODULE_big = idempotency
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard src/*.c)))

# The install script of the current version is assembled from one file per
# concern in sql/parts (in name order); scripts of released versions and the
# upgrade scripts between them are kept as they are in sql/.
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard sql/$(EXTENSION)--*.sql))

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)

# Warnings are errors in the test build (make test sets WERROR=1).
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter
ifeq ($(WERROR),1)
PG_CFLAGS += -Werror
endif

EXTRA_CLEAN = build test/expected.tmp

ifneq ($(PGXS),)
include $(PGXS)
else
# A new machine has no PostgreSQL yet: make run / make test install it first.
all install:
	@echo "pg_config was not found: run 'make deps' (or 'make run' / 'make test'), which install postgresql-server-dev-15" >&2
	@exit 1
endif

sql/$(EXTENSION)--$(EXTVERSION).sql: $(sort $(wildcard sql/parts/*.sql)) idempotency.control
	cat $(sort $(wildcard sql/parts/*.sql)) > $@

.PHONY: run test bench stop deps
deps:
	@scripts/deps.sh

run:
	@scripts/run.sh

stop:
	@scripts/stop.sh

test:
	@scripts/test.sh

bench:
	@scripts/bench.sh
