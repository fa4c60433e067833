# examples/: short programs written against the installed headers only (-I include, no src/),
# linked with the shared library users get (libmpitrain.la, exported symbols only). Built by
# make, run by make check (tests/test_examples.sh, under mpirun where they are distributed).
noinst_PROGRAMS += examples/custom_model examples/hand_loop examples/custom_op examples/dp_vs_ddp
EXAMPLES_CPPFLAGS = -I$(top_srcdir)/include
examples_custom_model_SOURCES = examples/custom_model.c
examples_custom_model_CPPFLAGS = $(EXAMPLES_CPPFLAGS)
examples_custom_model_LDADD = libmpitrain.la -lm
examples_hand_loop_SOURCES = examples/hand_loop.c
examples_hand_loop_CPPFLAGS = $(EXAMPLES_CPPFLAGS)
examples_hand_loop_LDADD = libmpitrain.la -lm
examples_custom_op_SOURCES = examples/custom_op.c
examples_custom_op_CPPFLAGS = $(EXAMPLES_CPPFLAGS)
examples_custom_op_LDADD = libmpitrain.la -lm
examples_dp_vs_ddp_SOURCES = examples/dp_vs_ddp.c
examples_dp_vs_ddp_CPPFLAGS = $(EXAMPLES_CPPFLAGS)
examples_dp_vs_ddp_LDADD = libmpitrain.la -lm
TESTS += tests/test_examples.sh
EXTRA_DIST += tests/test_examples.sh
