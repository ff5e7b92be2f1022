"""The glossary test: every glossary link resolves, every New-words term has an entry."""

from pathlib import Path

from course import ROOT
from course.glossary import anchor_for, check, parse_glossary

ENTRY_ROW = '| <a id="kv-cache"></a>**KV cache** | KV 缓存 | The stored keys and values of every token so far. |'


def _course(tmp_path: Path, glossary_rows: list[str], page: str) -> Path:
    (tmp_path / "GLOSSARY.md").write_text("| Term | 中文 | Definition |\n|---|---|---|\n" + "\n".join(glossary_rows) + "\n")
    (tmp_path / "phase-00-x").mkdir()
    (tmp_path / "phase-00-x" / "00-guide.md").write_text(page)
    return tmp_path


def test_anchor_rule():
    assert anchor_for("KV cache") == "kv-cache"
    assert anchor_for("Q/K/V") == "q-k-v"
    assert anchor_for("head_dim") == "head-dim"
    assert anchor_for("TTFT") == "ttft"


def test_good_new_words_line_passes(tmp_path):
    root = _course(tmp_path, [ENTRY_ROW], "> **🆕 New words:** [KV cache](../GLOSSARY.md#kv-cache)\n")
    assert check(root) == []


def test_dangling_anchor_is_caught(tmp_path):
    root = _course(tmp_path, [ENTRY_ROW], "See [prefill](../GLOSSARY.md#prefill).\n")
    problems = check(root)
    assert any("#prefill" in str(p) for p in problems), problems


def test_unlinked_new_word_is_caught(tmp_path):
    root = _course(tmp_path, [ENTRY_ROW], "> **🆕 New words:** [KV cache](../GLOSSARY.md#kv-cache), roofline\n")
    problems = check(root)
    assert any("roofline" in str(p) for p in problems), problems


def test_entry_without_chinese_is_caught(tmp_path):
    row = '| <a id="kv-cache"></a>**KV cache** | kv cache | The stored keys and values of every token so far. |'
    root = _course(tmp_path, [row], "")
    assert any("Chinese" in str(p) for p in check(root))


def test_the_course_glossary_is_complete():
    entries = parse_glossary(ROOT / "GLOSSARY.md")
    assert len(entries) >= 80, f"GLOSSARY.md should define the course's terms; found only {len(entries)} entries"
    problems = check(ROOT)
    assert not problems, "glossary problems:\n" + "\n".join(map(str, problems))
