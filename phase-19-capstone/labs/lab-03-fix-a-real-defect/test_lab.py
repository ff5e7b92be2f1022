"""Lab 19-03: each submission is a regression test for a real defect at the pin and a fix for it.

Tier 1 (marker ``upstream``): the grader runs the real vllm 0.22.1 in child processes, twice per
defect (a few seconds each).
"""

import pytest

from course.defect_grader import GradeFailure, grade
from course.runtime import lab_module
from course.runtime.harness import lab_file

pytestmark = pytest.mark.upstream(needs="both")  # the installed vllm and the pinned tree

lab = lab_module(__file__)  # solution.py by default; LAB_IMPL=starter grades starter.py
IMPL = lab_file(__file__)

DEFECTS = {
    "pin-memory-default": "vllm/utils/torch_utils.py",
    "lora-no-adapter-rows": "vllm/lora/ops/torch_ops/lora_ops.py",
}


@pytest.mark.parametrize("name", DEFECTS)
def test_submission_is_a_regression_test_and_a_fix(name):
    test, patch = lab.SUBMISSIONS[name]
    try:
        report = grade(patch, f"{IMPL}::{test}")
    except GradeFailure as exc:
        pytest.fail(f"{name}: the grader refused it ({exc.kind}): {exc}")
    assert report.files == [DEFECTS[name]], (
        f"{name}: fix {DEFECTS[name]} and nothing else, not {report.files}"
    )
    assert (report.before, report.after) == ("failed", "passed"), report.render()
    assert report.nearby and set(report.nearby.values()) == {"passed"}, (
        f"{name}: nearby checks {report.nearby}"
    )
    assert not report.notes, report.notes
