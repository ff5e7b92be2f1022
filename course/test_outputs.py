"""The output refresher: finds blocks, catches stale ones, rewrites them, runs each command once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course import outputs

SCRIPT = """import os
from pathlib import Path

counter = Path(__file__).with_name("runs.txt")
counter.write_text(counter.read_text() + "x" if counter.exists() else "x")
assert os.environ["COURSE_OUTPUTS"] == "1" and os.environ["PYTHONHASHSEED"] == "0"
print("blocks per request: 3   ")
print("speedup: 4.0x")
"""


def page(body: str, command: str = "python numbers.py") -> str:
    return (
        f"# Lab\n\nIntro.\n\n<!-- output: {command} -->\n```text\n{body}\n```\n<!-- /output -->\n\nAfter.\n"
    )


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "numbers.py").write_text(SCRIPT, encoding="utf-8")
    return tmp_path


def run(root: Path, check: bool) -> int:
    return outputs.run(argparse.Namespace(paths=[], check=check, jobs=2, root=root))


def test_check_catches_a_stale_block_and_changes_nothing(course: Path, capsys: pytest.CaptureFixture[str]):
    md = course / "README.md"
    md.write_text(page("blocks per request: 2\nspeedup: 4.0x"), encoding="utf-8")
    before = md.read_text()
    assert run(course, check=True) == 1
    out = capsys.readouterr().out
    assert "README.md:5: stale output of `python numbers.py`" in out
    assert "-blocks per request: 2" in out and "+blocks per request: 3" in out
    assert md.read_text() == before, "--check must not rewrite anything"


def test_refresh_rewrites_the_block_then_check_passes(course: Path):
    md = course / "README.md"
    md.write_text(page("(placeholder)"), encoding="utf-8")
    assert run(course, check=False) == 0
    assert md.read_text() == page("blocks per request: 3\nspeedup: 4.0x"), (
        "trailing spaces are stripped per line"
    )
    assert run(course, check=True) == 0


def test_each_distinct_command_runs_once(course: Path):
    (course / "a.md").write_text(page("old") + page("old"), encoding="utf-8")
    (course / "b.md").write_text(page("old"), encoding="utf-8")
    assert run(course, check=False) == 0
    assert (course / "runs.txt").read_text() == "x", "three blocks with one command should run it once"


def test_a_failing_command_is_an_error_with_its_stderr(course: Path, capsys: pytest.CaptureFixture[str]):
    (course / "boom.py").write_text("import sys\nsys.exit('kaboom: no such table')\n", encoding="utf-8")
    (course / "README.md").write_text(page("x", "python boom.py"), encoding="utf-8")
    assert run(course, check=True) == 1
    assert "kaboom: no such table" in capsys.readouterr().err


def test_a_malformed_block_is_an_error(tmp_path: Path):
    md = tmp_path / "README.md"
    md.write_text("<!-- output: python x.py -->\n```\nno text tag\n```\n<!-- /output -->\n", encoding="utf-8")
    with pytest.raises(outputs.BlockError, match="```text"):
        outputs.find_blocks(md)
    md.write_text("<!-- output: python x.py -->\n```text\nunclosed\n```\n", encoding="utf-8")
    with pytest.raises(outputs.BlockError, match="closed"):
        outputs.find_blocks(md)


def test_shell_syntax_is_refused_and_python_means_this_interpreter():
    import sys

    assert outputs.argv_for("python a.py --n 3")[0] == sys.executable
    with pytest.raises(outputs.BlockError, match="shell"):
        outputs.argv_for("python a.py | head")


def test_an_example_block_inside_a_code_fence_is_not_a_block(tmp_path: Path):
    md = tmp_path / "CONTRIBUTING.md"
    md.write_text("````markdown\n" + page("(filled in by the tool)") + "````\n", encoding="utf-8")
    assert outputs.find_blocks(md) == []


# -- figures: a command that draws an image is checked like one that prints ------------------------

DRAW = """from pathlib import Path
import sys
colour = Path("colour.txt").read_text().strip() if Path("colour.txt").exists() else "red"
Path("figs").mkdir(exist_ok=True)
Path("figs/box.svg").write_text(f'<svg xmlns="http://www.w3.org/2000/svg"><rect fill="{colour}"/></svg>\\n')
print("wrote figs/box.svg")
"""


@pytest.fixture
def drawing(tmp_path: Path) -> Path:
    (tmp_path / "draw.py").write_text(DRAW, encoding="utf-8")
    (tmp_path / "README.md").write_text(page("wrote figs/box.svg", "python draw.py"), encoding="utf-8")
    return tmp_path


def test_a_new_figure_is_stale_under_check_and_left_out(drawing: Path, capsys: pytest.CaptureFixture[str]):
    assert run(drawing, check=True) == 1
    assert "figs/box.svg: new figure (drawn by `python draw.py`)" in capsys.readouterr().out
    assert not (drawing / "figs" / "box.svg").exists(), "--check must not leave a new figure behind"


def test_a_redrawn_figure_is_stale_under_check_and_restored(drawing: Path, capsys: pytest.CaptureFixture[str]):
    assert run(drawing, check=False) == 0
    svg = drawing / "figs" / "box.svg"
    assert 'fill="red"' in svg.read_text()
    assert run(drawing, check=True) == 0, "a figure the command redraws byte for byte is fresh"
    (drawing / "colour.txt").write_text("blue")
    capsys.readouterr()
    assert run(drawing, check=True) == 1
    assert "figs/box.svg: stale figure" in capsys.readouterr().out
    assert 'fill="red"' in svg.read_text(), "--check must put the committed figure back"
    assert run(drawing, check=False) == 0 and 'fill="blue"' in svg.read_text()


def test_a_png_counts_as_the_same_when_its_pixels_are(tmp_path: Path):
    image = pytest.importorskip("PIL.Image")
    import io

    picture = image.new("RGBA", (8, 4), (10, 20, 30, 255))
    picture.putpixel((3, 2), (200, 0, 0, 255))
    fast, small = io.BytesIO(), io.BytesIO()
    picture.save(fast, format="PNG", compress_level=0)
    picture.save(small, format="PNG", compress_level=9)
    assert fast.getvalue() != small.getvalue()
    path = tmp_path / "x.png"
    assert outputs.same_image(path, fast.getvalue(), small.getvalue()), "same pixels, other encoding"
    picture.putpixel((0, 0), (0, 0, 0, 255))
    other = io.BytesIO()
    picture.save(other, format="PNG")
    assert not outputs.same_image(path, fast.getvalue(), other.getvalue()), "one pixel differs"
    assert not outputs.same_image(tmp_path / "x.svg", b"<svg/>", b"<svg />"), "SVG compares bytes"


# -- GPU blocks: a recorded run replaces the prediction ----------------------------------------------

SAMPLE = Path(__file__).with_name("samples") / "gpu-results.sample.json"
GPU_BLOCK = "python numbers.py | gpu: python bench.py"


def test_a_gpu_block_shows_the_prediction_until_a_run_is_recorded(course: Path):
    md = course / "README.md"
    md.write_text(page("(placeholder)", GPU_BLOCK), encoding="utf-8")
    [block] = outputs.find_blocks(md)
    assert (block.command, block.gpu_command) == ("python numbers.py", "python bench.py")
    assert outputs.run(argparse.Namespace(paths=[], check=False, jobs=1, root=course)) == 0
    assert "speedup: 4.0x" in md.read_text(), "no results/gpu/: the block shows what the first command prints"


def test_the_recorded_sample_renders_as_a_labelled_measurement(course: Path):
    """Exercises the results-file path with course/samples/gpu-results.sample.json (a SAMPLE, made up)."""
    results = course / "results" / "gpu"
    results.mkdir(parents=True)
    (results / "sample.json").write_text(SAMPLE.read_text(), encoding="utf-8")
    md = course / "README.md"
    md.write_text(page("(placeholder)", GPU_BLOCK), encoding="utf-8")
    _, errors, _ = outputs.refresh([md], course, check=False, allow_sample=True)
    assert not errors
    body = md.read_text()
    assert "SAMPLE, not a measurement: measured on Sample GPU (not a measurement)" in body
    assert "results/gpu/sample.json" in body and "SAMPLE bench line" in body
    assert "speedup" not in body and not (course / "runs.txt").exists(), "a measured block runs nothing"


def test_a_sample_file_is_refused_where_real_results_live(course: Path):
    results = course / "results" / "gpu"
    results.mkdir(parents=True)
    (results / "sample.json").write_text(SAMPLE.read_text(), encoding="utf-8")
    md = course / "README.md"
    md.write_text(page("x", GPU_BLOCK), encoding="utf-8")
    _, errors, _ = outputs.refresh([md], course, check=True)
    assert any("is not a measurement" in e for e in errors)
