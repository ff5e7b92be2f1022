from types import SimpleNamespace

import pytest

from course.runtime import lab_module
from course.runtime.pinned import compile_definitions

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


LADDER_64 = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_ladder_shape():
    got = lab.default_capture_sizes(64)
    assert got == LADDER_64, f"max 64 must give [1, 2, 4] + every multiple of 8 up to 64, got {got}"
    assert lab.default_capture_sizes(3) == [1, 2], "below 4 only the rungs that fit: [1, 2]"
    with pytest.raises(ValueError):
        lab.default_capture_sizes(0)


def test_exact_rung_pays_nothing():
    for b in LADDER_64:
        assert lab.select_capture_size(b, LADDER_64) == b, f"batch {b} is a rung: it uses its own graph"
        assert lab.padded_tokens(b, LADDER_64) == 0, f"batch {b} sits on a rung and pays no padding"


def test_between_rungs_rounds_up():
    assert lab.select_capture_size(33, LADDER_64) == 40, "33 pads UP to the next rung, 40 (never down to 32)"
    assert lab.padded_tokens(33, LADDER_64) == 7, f"33 -> 40 adds 7 junk rows, got {lab.padded_tokens(33, LADDER_64)}"
    assert lab.padded_tokens(3, LADDER_64) == 1 and lab.padded_tokens(5, LADDER_64) == 3, "3 -> 4 and 5 -> 8"


def test_oversize_batch_runs_eager():
    assert lab.select_capture_size(65, LADDER_64) is None, (
        "above the top rung there is no graph: return None (the batch runs eagerly), do not raise"
    )
    assert lab.padded_tokens(65, LADDER_64) == 0, "an eager batch is not padded: 0 junk rows"
    assert lab.select_capture_size(513, lab.default_capture_sizes(512)) is None


def test_trace_accounting():
    trace = [1, 3, 5, 33, 64, 65, 100]
    got = lab.trace_waste(trace, LADDER_64)
    assert got == 11, f"0 + 1 + 3 + 7 + 0 + 0 (eager) + 0 (eager) = 11 padded rows, got {got}"
    assert lab.trace_waste([], LADDER_64) == 0, "an empty trace wastes nothing"


def test_finer_ladder_trades_graphs_for_padding():
    trace = [1, 3, 5, 9, 17, 33, 60, 64, 65, 100, 130, 250]
    default = lab.default_capture_sizes(512)
    every4 = [1, 2] + list(range(4, 513, 4))
    d, f = lab.trace_waste(trace, default), lab.trace_waste(trace, every4)
    assert (len(default), d) == (51, 52) and (len(every4), f) == (130, 20), (
        f"a denser ladder pads less but captures more graphs: default 51 rungs / 52 rows, every-4 "
        f"130 rungs / 20 rows; got {len(default)}/{d} and {len(every4)}/{f}"
    )


def test_default_ladder_for_512_has_51_rungs():
    ladder = lab.default_capture_sizes(512)
    assert len(ladder) == 51, (
        f"vLLM 0.22.1's default ladder for max 512 has 3 + 31 + 17 = 51 rungs (not 23), got {len(ladder)}: "
        f"stride 8 stops below 256, stride 16 from 256"
    )
    assert ladder[-1] == 512 and 248 in ladder and 264 not in ladder and 272 in ladder


def test_engine_ladder_follows_config():
    cases = {(256, 8192): (51, 512), (1024, 16384): (51, 512), (8, 8192): (5, 16), (256, 100): (16, 100)}
    for (seqs, tokens), want in cases.items():
        ladder = lab.engine_capture_sizes(seqs, tokens)
        assert (len(ladder), ladder[-1]) == want, (
            f"max_num_seqs={seqs}, max_num_batched_tokens={tokens}: expected {want[0]} rungs topped by "
            f"{want[1]}, got {len(ladder)} topped by {ladder[-1]}; top = min(tokens, min(2 * seqs, 512))"
        )
    assert lab.engine_capture_sizes(256, 100)[-2:] == [96, 100], "an off-stride token budget is captured too"


def test_ladder_boundaries_around_256():
    tops = {m: lab.default_capture_sizes(m)[-1] for m in (248, 255, 256, 257, 271, 272)}
    assert tops == {248: 248, 255: 248, 256: 256, 257: 256, 271: 256, 272: 272}, (
        f"the last rung for max 248/255/256/257/271/272 must be 248/248/256/256/256/272, got {tops}: stride 8 "
        f"runs below 256, and 256 itself is the first stride-16 rung (include it when max_size >= 256)"
    )
    ladder = lab.default_capture_sizes(512)
    picks = {b: lab.select_capture_size(b, ladder) for b in (248, 249, 256, 257, 511, 512)}
    assert picks == {248: 248, 249: 256, 256: 256, 257: 272, 511: 512, 512: 512}, (
        f"on the 512 ladder batches 248, 249, 256, 257, 511, 512 go to 248, 256, 256, 272, 512, 512; got {picks}"
    )
    with pytest.raises(ValueError):
        lab.select_capture_size(0, ladder)          # the docstring promises it: a batch has at least one row


def test_engine_ladder_decode_query_len_and_cap():
    # decode_query_len > 1 (speculative decoding) raises the top; max_capture_size overrides it, but the token
    # budget still caps both
    cases = [((64, 8192), {}, (19, 128)), ((64, 8192), {"decode_query_len": 4}, (51, 512)),
             ((256, 8192), {"max_capture_size": 100}, (15, 96)), ((256, 300), {"max_capture_size": 1000}, (38, 300))]
    for args, kwargs, want in cases:
        ladder = lab.engine_capture_sizes(*args, **kwargs)
        assert (len(ladder), ladder[-1]) == want, (
            f"engine_capture_sizes{args} with {kwargs}: expected {want[0]} rungs topped by {want[1]}, got "
            f"{len(ladder)} topped by {ladder[-1]}. top = max_capture_size if given, else "
            f"min(max_num_seqs * decode_query_len * 2, 512); then top = min(top, max_num_batched_tokens)"
        )


def _pinned_set_cudagraph_sizes():
    """Compile the pinned VllmConfig._set_cudagraph_sizes from upstream/ (no vllm import needed)."""
    env = {
        "CUDAGraphMode": SimpleNamespace(NONE="NONE"),
        "logger": SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None),
    }
    (fn,) = compile_definitions("vllm/config/vllm.py", ["VllmConfig._set_cudagraph_sizes"], env)
    return fn


@pytest.mark.upstream(needs="tree")
def test_matches_pinned_set_cudagraph_sizes():
    real = _pinned_set_cudagraph_sizes()
    for seqs, tokens in [(256, 8192), (1024, 16384), (8, 8192), (256, 100), (3, 8192), (200, 300)]:
        cc = SimpleNamespace(
            cudagraph_mode="FULL_AND_PIECEWISE", max_cudagraph_capture_size=None, cudagraph_capture_sizes=None,
            pass_config=SimpleNamespace(enable_sp=False), post_init_cudagraph_sizes=lambda: None,
        )
        cfg = SimpleNamespace(
            model_config=SimpleNamespace(enforce_eager=False), compilation_config=cc, speculative_config=None,
            scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
            performance_mode="balanced", parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        real(cfg)
        mine = lab.engine_capture_sizes(seqs, tokens)
        assert mine == cc.cudagraph_capture_sizes, (
            f"max_num_seqs={seqs}, max_num_batched_tokens={tokens}: the pinned vLLM code builds "
            f"{cc.cudagraph_capture_sizes}, yours built {mine}"
        )


@pytest.mark.upstream(needs="tree")
def test_matches_pinned_with_spec_decode_and_a_cap():
    real = _pinned_set_cudagraph_sizes()
    for seqs, tokens, spec, cap in [(64, 8192, 3, None), (20, 8192, 1, None), (256, 8192, 0, 100), (256, 300, 0, 1000)]:
        cc = SimpleNamespace(
            cudagraph_mode="FULL_AND_PIECEWISE", max_cudagraph_capture_size=cap, cudagraph_capture_sizes=None,
            pass_config=SimpleNamespace(enable_sp=False), post_init_cudagraph_sizes=lambda: None,
        )
        cfg = SimpleNamespace(
            model_config=SimpleNamespace(enforce_eager=False), compilation_config=cc,
            speculative_config=SimpleNamespace(num_speculative_tokens=spec) if spec else None,
            scheduler_config=SimpleNamespace(max_num_seqs=seqs, max_num_batched_tokens=tokens),
            performance_mode="balanced", parallel_config=SimpleNamespace(tensor_parallel_size=1),
        )
        real(cfg)
        mine = lab.engine_capture_sizes(seqs, tokens, max_capture_size=cap, decode_query_len=1 + spec)
        assert mine == cc.cudagraph_capture_sizes, (
            f"max_num_seqs={seqs}, tokens={tokens}, {spec} speculative tokens, max_capture_size={cap}: the pinned "
            f"vLLM code builds {cc.cudagraph_capture_sizes}, yours built {mine}"
        )
