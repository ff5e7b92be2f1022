"""mini_vllm.entrypoints.reasoning: the <think> split, batch and streamed (more in test_entrypoints_text.py)."""

from mini_vllm.entrypoints.reasoning import StreamingReasoningParser, extract_reasoning


def test_a_think_tag_inside_the_reasoning_is_kept_and_streaming_still_equals_batch():
    text = "<think>I could write <think> here</think>done"
    want = ("I could write <think> here", "done")
    assert extract_reasoning(text) == want, (
        f"extract_reasoning gave {extract_reasoning(text)}: only the opening <think> is dropped, a later one is "
        "reasoning text (replace the first occurrence only)"
    )
    splits = [[text[:k], text[k:]] for k in range(1, len(text))] + [list(text)]  # every cut, and char by char
    for chunks in splits:
        p, r, c = StreamingReasoningParser(), "", ""
        for chunk in chunks:
            dr, dc = p.feed(chunk)
            r, c = r + dr, c + dc
        dr, dc = p.finish()
        got = ((r + dr) or None, (c + dc) or None)
        assert got == want, f"chunks {chunks[:2]}...: streamed {got}, batch {want}"
