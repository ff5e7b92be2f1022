import dataclasses
import enum
import itertools
from collections.abc import Set as AbstractSet
from types import SimpleNamespace

import pytest

from course.runtime import lab_module
from course.runtime.pinned import compile_definitions
from mini_vllm.cudagraph import default_capture_sizes

lab = lab_module(__file__)   # solution.py by default; LAB_IMPL=starter grades starter.py


MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
# mode -> (decode batch, mixed batch, needs piecewise compilation)
TABLE = {
    "NONE": ("NONE", "NONE", False),
    "PIECEWISE": ("PIECEWISE", "PIECEWISE", True),
    "FULL": ("FULL", "FULL", False),
    "FULL_DECODE_ONLY": ("FULL", "NONE", False),
    "FULL_AND_PIECEWISE": ("FULL", "PIECEWISE", True),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("is_decode", [True, False], ids=["decode", "mixed"])
def test_routing_table(mode, is_decode):
    want = TABLE[mode][0 if is_decode else 1]
    got = lab.runtime_mode_for(mode, is_decode)
    kind = "pure-decode" if is_decode else "mixed prefill+decode"
    assert got == want, f"{mode} must run a {kind} batch as {want}, got {got}"


def test_composites_split_simple_modes_do_not():
    assert lab.separate_routine("FULL_AND_PIECEWISE") and lab.separate_routine("FULL_DECODE_ONLY")
    assert not any(lab.separate_routine(m) for m in ("NONE", "PIECEWISE", "FULL")), (
        "NONE, PIECEWISE and FULL are single routines: separate_routine must be False for them"
    )
    assert (lab.decode_mode("FULL_AND_PIECEWISE"), lab.mixed_mode("FULL_AND_PIECEWISE")) == ("FULL", "PIECEWISE")
    assert (lab.decode_mode("FULL_DECODE_ONLY"), lab.mixed_mode("FULL_DECODE_ONLY")) == ("FULL", "NONE")
    for m in ("NONE", "PIECEWISE", "FULL"):
        assert lab.decode_mode(m) == lab.mixed_mode(m) == m, f"a simple mode returns itself for both routines: {m}"
    with pytest.raises(ValueError):
        lab.decode_mode("FULL_AND_NONE")


def test_piecewise_compilation_follows_has_mode():
    for m, (_, _, needs) in TABLE.items():
        assert lab.requires_piecewise_compilation(m) is needs, (
            f"{m}: piecewise compilation is needed exactly when some routine is PIECEWISE ({needs})"
        )
    assert lab.has_mode("FULL_DECODE_ONLY", "NONE") and not lab.has_mode("FULL", "PIECEWISE")
    with pytest.raises(ValueError):
        lab.has_mode("FULL", "FULL_AND_PIECEWISE")  # upstream asserts the target is a runtime mode


def test_dispatch_pads_then_routes():
    d = lab.Dispatcher("FULL_AND_PIECEWISE", [1, 2, 4, 8], max_num_seqs=8)
    assert d.dispatch(5, uniform_decode=True) == ("FULL", 8), "a 5-request decode batch pads to 8 and replays FULL"
    assert d.dispatch(5, uniform_decode=False) == ("PIECEWISE", 8), "a mixed 5-token batch pads to 8, PIECEWISE"
    assert d.dispatch(9, uniform_decode=True) == ("NONE", 9), "above the top rung: no graph, no padding"
    only = lab.Dispatcher("FULL_DECODE_ONLY", [1, 2, 4, 8], max_num_seqs=8)
    assert only.dispatch(3, uniform_decode=False) == ("NONE", 3), "FULL_DECODE_ONLY runs mixed batches eagerly"
    full = lab.Dispatcher("FULL", [1, 2, 4, 8], max_num_seqs=8)
    assert full.dispatch(3, uniform_decode=False) == ("FULL", 4), "plain FULL uses one graph set for every batch"


def test_decode_graphs_capped_by_max_num_seqs():
    ladder = default_capture_sizes(512)
    counts = {seqs: {rt: len(s) for rt, s in lab.Dispatcher("FULL_AND_PIECEWISE", ladder, seqs).capture_plan()}
              for seqs in (256, 1024)}
    assert counts[256] == {"PIECEWISE": 51, "FULL": 35}, (
        f"default ladder (51 sizes) with max_num_seqs=256: 51 PIECEWISE graphs + 35 FULL decode graphs "
        f"(only sizes <= 256 requests), got {counts[256]}"
    )
    assert counts[1024] == {"PIECEWISE": 51, "FULL": 51}, f"max_num_seqs=1024 keeps all 51 decode sizes, got {counts[1024]}"


def test_decode_query_len_above_one():
    # speculative decoding: every decode request carries q = 2 tokens, so a uniform decode batch of r requests
    # has 2r tokens; FULL decode graphs cover q <= num_tokens <= q * max_num_seqs = 8
    d = lab.Dispatcher("FULL_AND_PIECEWISE", [1, 2, 4, 8, 16, 24, 32], max_num_seqs=4, uniform_decode_query_len=2)
    plan = d.capture_plan()
    assert plan == [("PIECEWISE", [32, 24, 16, 8, 4, 2, 1]), ("FULL", [8, 4, 2])], (
        f"with q = 2 and max_num_seqs = 4 the decode graphs are the sizes in [2, 8] (2, 4, 8), got {plan}: "
        f"the cap is q * max_num_seqs TOKENS, and the sizes start at q"
    )
    got = {n: d.dispatch(n, uniform_decode=True) for n in (3, 8, 10, 12)}
    assert got == {3: ("FULL", 4), 8: ("FULL", 8), 10: ("PIECEWISE", 16), 12: ("PIECEWISE", 16)}, (
        f"uniform decode batches of 3, 8, 10, 12 tokens with q = 2: {got}; a batch padded past q * max_num_seqs "
        f"tokens has no FULL decode graph and falls back to PIECEWISE"
    )


def test_capture_plan_order():
    plan = lab.Dispatcher("FULL_AND_PIECEWISE", [1, 2, 4, 8], max_num_seqs=4).capture_plan()
    assert plan == [("PIECEWISE", [8, 4, 2, 1]), ("FULL", [4, 2, 1])], (
        f"capture PIECEWISE then FULL, largest size first (smaller graphs reuse the big ones' pool), got {plan}"
    )
    assert lab.Dispatcher("NONE", [1, 2, 4, 8], max_num_seqs=4).capture_plan() == [], "NONE captures nothing"


# --- the pinned upstream code, compiled from upstream/ without importing vllm ---------------------


@pytest.fixture(scope="module")
def upstream():
    env = {"enum": enum, "dataclass": dataclasses.dataclass, "replace": dataclasses.replace,
           "product": itertools.product, "AbstractSet": AbstractSet, "VllmConfig": object,
           "logger": SimpleNamespace(debug=lambda *a, **k: None)}
    (mode_cls,) = compile_definitions("vllm/config/compilation.py", ["CUDAGraphMode"], env)
    compile_definitions("vllm/forward_context.py", ["BatchDescriptor"], env)
    (dispatcher_cls,) = compile_definitions("vllm/v1/cudagraph_dispatcher.py", ["CudagraphDispatcher"], env)

    def make(mode, sizes, max_num_seqs):
        d = object.__new__(dispatcher_cls)  # skip __init__: it imports vllm.compilation
        d.vllm_config = SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs), lora_config=None, speculative_config=None)
        d.compilation_config = SimpleNamespace(
            cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=sizes[-1], compile_sizes=None)
        d.uniform_decode_query_len, d.keys_initialized, d.specialize_lora_count = 1, False, False
        d.cudagraph_keys = {mode_cls.PIECEWISE: set(), mode_cls.FULL: set()}
        d.cudagraph_mode = mode_cls.NONE
        d.initialize_cudagraph_keys(mode_cls[mode], 1)
        return d

    return mode_cls, make


@pytest.mark.upstream(needs="tree")
def test_matches_pinned_cudagraph_mode(upstream):
    mode_cls, _ = upstream
    for m in MODES:
        real = mode_cls[m]
        assert lab.separate_routine(m) == real.separate_routine(), f"separate_routine({m}) disagrees with vLLM"
        assert lab.decode_mode(m) == real.decode_mode().name, f"decode_mode({m}) disagrees with vLLM"
        assert lab.mixed_mode(m) == real.mixed_mode().name, f"mixed_mode({m}) disagrees with vLLM"
        assert lab.requires_piecewise_compilation(m) == real.requires_piecewise_compilation(), m
        for t in ("NONE", "PIECEWISE", "FULL"):
            assert lab.has_mode(m, t) == real.has_mode(mode_cls[t]), f"has_mode({m}, {t}) disagrees with vLLM"


@pytest.mark.upstream(needs="tree")
def test_matches_pinned_dispatcher(upstream):
    _, make = upstream
    sizes = [1, 2, 4, 8, 16, 24, 32]
    for m in MODES:
        for seqs in (4, 32):
            real, mine = make(m, sizes, seqs), lab.Dispatcher(m, sizes, max_num_seqs=seqs)
            for n, u in itertools.product(range(1, 35), (True, False)):
                rt, desc = real.dispatch(n, uniform_decode=u)
                want = (rt.name, desc.num_tokens)
                assert mine.dispatch(n, u) == want, (
                    f"{m}, max_num_seqs={seqs}: dispatch({n}, uniform_decode={u}) is {want} in vLLM, "
                    f"yours gave {mine.dispatch(n, u)}"
                )
            got = [(rt, len(s)) for rt, s in mine.capture_plan()]
            want = [(rt.name, len(d)) for rt, d in real.get_capture_descs()]
            assert got == want, f"{m}, max_num_seqs={seqs}: vLLM captures {want}, yours plans {got}"


@pytest.mark.upstream(needs="tree")
def test_matches_pinned_dispatcher_decode_query_len(upstream):
    mode_cls, make = upstream
    # upstream keeps decode capture sizes multiples of q (it adjusts the ladder for speculative decoding)
    for q, sizes in ((2, [1, 2, 4, 8, 16, 24, 32]), (3, [1, 3, 6, 12, 24, 48])):
        for m in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"):
            real = make(m, sizes, 4)
            real.cudagraph_keys = {mode_cls.PIECEWISE: set(), mode_cls.FULL: set()}
            real.uniform_decode_query_len, real.keys_initialized = q, False
            real.initialize_cudagraph_keys(mode_cls[m], q)          # re-key with q tokens per decode request
            mine = lab.Dispatcher(m, sizes, max_num_seqs=4, uniform_decode_query_len=q)
            got = [(rt, len(s)) for rt, s in mine.capture_plan()]
            want = [(rt.name, len(d)) for rt, d in real.get_capture_descs()]
            assert got == want, f"{m}, q={q}: vLLM captures {want}, yours plans {got}"
            for n, u in [(r * q, True) for r in range(1, 6)] + [(n, False) for n in range(1, sizes[-1] + 2)]:
                rt, desc = real.dispatch(n, uniform_decode=u)
                assert mine.dispatch(n, u) == (rt.name, desc.num_tokens), (
                    f"{m}, q={q}: dispatch({n}, uniform_decode={u}) is {(rt.name, desc.num_tokens)} in vLLM, "
                    f"yours gave {mine.dispatch(n, u)}"
                )
