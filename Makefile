# Makefile for the idempotency extension (PGXS).  PostgreSQL 15 to 18.
#
#   make run            install what is missing, build, start a demo cluster
#   make test           install what is missing, build, run every test suite
#                       on throwaway clusters (PG_CONFIG=... for another server)
#   make test-matrix    make test on PostgreSQL 15, 17 and 18 (17 and 18 put
#                       together once in a cache), then the Debian package
#   make bench          install what is missing, build, run the benchmarks
#   make model          the model-based test with a longer budget, for the
#                       seeds named: make model SEEDS="7 31337" EXAMPLES=400
#                       STEPS=100 (scripts/model.sh)
#   make stop           stop the demo cluster started by make run
#   make include-graph  the modules of src/ in layers, from their #include
#                       lines (make test fails on a cycle among them, and
#                       when CONTRIBUTING.md's table of them differs)
#   make function-lengths  the longest functions and files of src/ (make
#                       test fails on a function over 120 lines)
#
# The standard PGXS targets work as for any extension:
#
#   make && make install
#   make installcheck        pg_regress and isolation tests against a running
#                            server with the library preloaded
#   make prove_installcheck  the TAP tests, on clusters of their own
#   make dist                a release tarball made by git archive

# The source tree: this Makefile's folder.  A build out of the tree
# ("make -f ../Makefile VPATH=..", as Debian's pg_buildext runs it) finds the
# sources there; every file name below is relative to it.
SRCDIR := $(patsubst %/,%,$(if $(VPATH),$(VPATH),$(dir $(firstword $(MAKEFILE_LIST)))))
# the files of the source tree matching the patterns $1, relative to it
src_files = $(patsubst $(SRCDIR)/%,%,$(sort $(wildcard $(addprefix $(SRCDIR)/,$(1)))))

EXTENSION = idempotency
EXTVERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(SRCDIR)/idempotency.control)

MODULE_big = idempotency
OBJS = $(patsubst %.c,%.o,$(call src_files,src/*.c))

# The install script of the current version is assembled from one file per
# concern in sql/parts (in name order); scripts of released versions and the
# upgrade scripts between them are kept as they are in sql/.
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(call src_files,sql/$(EXTENSION)--*.sql))
# A second, small extension for the proxy database of a deployment sharded
# with PL/Proxy (doc/scaling.md, "Scaling out"): its control file and script.
DATA += $(call src_files,sql/plproxy/idempotency_plproxy*)
# The documentation, installed by PGXS into a folder of its own in the
# extensions' documentation folder: $(pg_config --docdir)/extension/idempotency
# (docmoduledir, set below PGXS's include: its names would clash there).
DOCS = $(call src_files,README.md CHANGELOG.md doc/*.md)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)

# Warnings are errors in the test build (make test sets WERROR=1).
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter
ifeq ($(WERROR),1)
PG_CFLAGS += -Werror
endif

EXTRA_CLEAN = build test/expected.tmp src/.pg_server

# Tests, found by their files: test/sql/*.sql (pg_regress), test/specs/*.spec
# (isolation tester), test/t/*.pl (TAP); expected output in test/expected.
# Tests named nopreload_* need a server without the library preloaded: make
# test runs them on a cluster of their own.
REGRESS = $(filter-out nopreload_%,$(patsubst test/sql/%.sql,%,$(call src_files,test/sql/*.sql)))
REGRESS_OPTS = --inputdir=$(SRCDIR)/test
ISOLATION = $(patsubst test/specs/%.spec,%,$(call src_files,test/specs/*.spec))
ISOLATION_OPTS = --inputdir=$(SRCDIR)/test
TAP_TESTS = 1
# run from the source tree (PGXS's prove_installcheck goes there first)
PROVE_TESTS = $(call src_files,test/t/*.pl)

ifneq ($(PGXS),)
include $(PGXS)
docmoduledir := extension/$(EXTENSION)
# PGXS's uninstall removes DOCS by their paths in the tree (doc/...), not by
# the names they were installed under: this removes those, and the folder
uninstall: uninstall-docs
.PHONY: uninstall-docs
uninstall-docs:
	rm -f $(addprefix '$(DESTDIR)$(docdir)/$(docmoduledir)'/, $(notdir $(DOCS)))
	-rmdir '$(DESTDIR)$(docdir)/$(docmoduledir)' 2>/dev/null
# the module the TAP tests share (test/perl/IdemTest.pm); prove runs in the
# source tree
PG_PROVE_FLAGS += -I test/perl
# pg_regress counts a test that skipped itself (its output the notice
# "skipped: ...", matched by expected/NAME_1.out) as passed: "make
# installcheck" runs it through scripts/installcheck-summary.sh, which
# prints after it each such test with its reason and the line
# "installcheck: N passed, M skipped, F failed".
# (Expanded here, where what it names is known: PGXS's definition of
# 18 holds a "#", which an $(eval) of its unexpanded text would cut.)
IDEM_PG_REGRESS := $(top_builddir)/src/test/regress/pg_regress
pg_regress_installcheck := $(subst $(IDEM_PG_REGRESS),bash $(SRCDIR)/scripts/installcheck-summary.sh $(IDEM_PG_REGRESS),$(pg_regress_installcheck))
else
# A new machine has no PostgreSQL yet: make run / make test install it first.
all install:
	@echo "pg_config was not found: install PostgreSQL's server development files (Debian: postgresql-server-dev-15, which 'make run' and 'make test' install), or name one with PG_CONFIG=/path/to/pg_config" >&2
	@exit 1
endif

ifeq ($(EXTVERSION),)
$(error no default_version found in $(SRCDIR)/idempotency.control)
endif

sql/$(EXTENSION)--$(EXTVERSION).sql: $(addprefix $(SRCDIR)/,$(call src_files,sql/parts/*.sql)) $(SRCDIR)/idempotency.control
	@mkdir -p sql
	cat $(filter %.sql,$^) > $@

# Objects compiled against another server's headers are compiled again: the
# stamp names the server, and changes only when the server does.
$(OBJS) $(OBJS:.o=.bc): src/.pg_server
# PGXS tracks no header: every object is compiled again when a header
# changes (a struct's layout may have changed under it).
$(OBJS) $(OBJS:.o=.bc): $(call src_files,src/*.h)
src/.pg_server: FORCE
	@mkdir -p src; s='$(VERSION) $(includedir_server)'; [ "$$(cat $@ 2>/dev/null)" = "$$s" ] || echo "$$s" > $@
.PHONY: FORCE

# PGXS runs the TAP tests in "make installcheck"; this runs them alone.
# They start clusters of their own, which initdb refuses to do as root (make
# test runs them as the postgres user).
ifeq ($(shell id -u),0)
prove_installcheck = @echo "TAP tests skipped: initdb cannot run as root (make test runs them as the postgres user)"
endif
.PHONY: prove_installcheck
prove_installcheck:
	$(prove_installcheck)

# A release tarball of the committed tree (HEAD), for PGXN and packagers:
# idempotency-VERSION.tar.gz.  META.json must give the control file's version.
.PHONY: dist
dist:
	@test "$$(grep -c '"version": "$(EXTVERSION)"' $(SRCDIR)/META.json)" = 3 || \
		{ echo "META.json does not give version $(EXTVERSION) (the control file's) for the distribution and both extensions" >&2; exit 1; }
	@grep -q "^default_version = '$(EXTVERSION)'" $(SRCDIR)/sql/plproxy/idempotency_plproxy.control && test -f $(SRCDIR)/sql/plproxy/idempotency_plproxy--$(EXTVERSION).sql || \
		{ echo "idempotency_plproxy is not at version $(EXTVERSION) (its control file and script in sql/plproxy)" >&2; exit 1; }
	git -C $(SRCDIR) archive --format=tar.gz --prefix=$(EXTENSION)-$(EXTVERSION)/ \
		-o $(CURDIR)/$(EXTENSION)-$(EXTVERSION).tar.gz HEAD

.PHONY: run test test-matrix bench model stop include-graph function-lengths
run:
	@$(SRCDIR)/scripts/run.sh

stop:
	@$(SRCDIR)/scripts/stop.sh

# PG_CONFIG named on the command line (or in the environment): that server
test:
	@TEST_PG_CONFIG='$(filter-out pg_config,$(PG_CONFIG))' $(SRCDIR)/scripts/test.sh

test-matrix:
	@$(SRCDIR)/scripts/test-matrix.sh

bench:
	@$(SRCDIR)/scripts/bench.sh

# SEEDS, EXAMPLES, STEPS and SHRINK from the command line or the environment
model:
	@MODEL_PG_CONFIG='$(filter-out pg_config,$(PG_CONFIG))' SEEDS='$(SEEDS)' EXAMPLES='$(EXAMPLES)' \
		STEPS='$(STEPS)' SHRINK='$(SHRINK)' $(SRCDIR)/scripts/model.sh

include-graph:
	@python3 $(SRCDIR)/scripts/include_graph.py --layers $(SRCDIR)/src

function-lengths:
	@python3 $(SRCDIR)/scripts/function_lengths.py --list $(SRCDIR)/src
