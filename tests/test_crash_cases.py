"""Issue #16: inputs that used to kill the interpreter, hang it or fail with the wrong error.

Each case of tests/crash_cases.py (the reproduction harness) runs here in a child process
with a time limit, and must end as the case says: an exception of the documented type
whose message names the cause, or normal completion; never a signal, a hang, or more time
than the case allows. The damaged-file cases of the same table are loaded by
tests/test_corrupt_gguf.py in one worker instead (much faster).

Cases marked heavy (over half a minute on 2 shared cores) run with POLYLLAMA_HEAVY_TESTS=1;
`python tests/crash_cases.py` runs all of them and prints counts per class.
"""
from __future__ import annotations

import os

import pytest

from crash_cases import CASES, prepare_files, run_case
from conftest import INSTALLED, SRC

HEAVY = os.environ.get("POLYLLAMA_HEAVY_TESTS") == "1"


@pytest.fixture(scope="module")
def case_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash-case-files")
    prepare_files(d)
    return d


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_adversarial_input_ends_in_a_documented_error(case, model_path, case_files):
    if case.heavy and not HEAVY:
        pytest.skip("heavy: set POLYLLAMA_HEAVY_TESTS=1")
    outcome = run_case(case, model_path, case_files, src=None if INSTALLED else SRC)
    assert outcome.verdict == "pass", f"[{case.klass}] {case.name}: {outcome.verdict}: {outcome.detail}"


def test_every_class_of_the_issue_has_cases():
    classes = {c.klass for c in CASES}
    assert {"grammar", "n_batch", "template", "nesting", "tokenize", "sigbus", "fork", "threads", "special",
            "types", "inject", "cli"} <= classes
    for klass in classes:   # each class also runs by default, not only on request
        assert any(c.klass == klass and not c.heavy for c in CASES), klass
