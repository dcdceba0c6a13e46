"""The build's own tools: run by the Makefile and CMakeLists.txt from the checkout, never
installed with polyllama. `from buildtools import buildconfig` works from the repository
root (the tests and the docs' examples do that)."""
