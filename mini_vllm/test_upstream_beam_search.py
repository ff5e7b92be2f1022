"""Differential (tier 1): mini's beam score equals vLLM 0.22.1's ``get_beam_search_score``."""

import os

import numpy as np
import pytest

from mini_vllm.beam_search import get_beam_search_score

pytestmark = pytest.mark.upstream

EOS = 256


def test_score_matches_vllm_on_random_sequences_and_penalties():
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from vllm.entrypoints.generate.beam_search import utils  # the conftest skips the file without vLLM

    rng = np.random.default_rng(0)
    checked = 0
    for length in (1, 2, 3, 7, 40):
        for lp in (-1.0, 0.0, 0.5, 1.0, 2.0, 3.5):
            for ends_in_eos in (False, True):
                tokens = rng.integers(0, EOS, size=length).tolist()
                if ends_in_eos:
                    if length == 1:
                        continue  # a lone EOS has length 0: both divide by zero
                    tokens[-1] = EOS
                cum = float(-rng.exponential(3.0) * length)
                want = utils.get_beam_search_score(tokens, cum, EOS, lp)
                got = get_beam_search_score(tokens, cum, EOS, lp)
                assert got == pytest.approx(want, rel=1e-15, abs=0), f"tokens {tokens}, lp {lp}: {got} != vLLM's {want}"
                checked += 1
    assert checked == 54
