# docs: the manual page, generated from `mpitrain --help` by scripts/make_man.sh and committed
# (so that building needs no generator); `make man` regenerates it after --help changed, and
# tests/test_man.sh fails while the committed page and --help disagree.
man_MANS = docs/mpitrain.1
EXTRA_DIST += docs/mpitrain.1 scripts/make_man.sh tests/test_man.sh
TESTS += tests/test_man.sh

man: mpitrain$(EXEEXT)
	$(SHELL) $(srcdir)/scripts/make_man.sh ./mpitrain$(EXEEXT) > $(srcdir)/docs/mpitrain.1.tmp
	mv $(srcdir)/docs/mpitrain.1.tmp $(srcdir)/docs/mpitrain.1
.PHONY: man
