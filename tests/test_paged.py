"""The paged-cache arithmetic (pure logic): blocks per sequence, budgets refused before any engine starts, and the LRU
prediction of when a shared prefix survives."""

from __future__ import annotations

import pytest

from kvlab import paged
from kvlab.errors import KVLabError


def test_blocks_needed_rounds_up_to_whole_blocks():
    assert [paged.blocks_needed(n, 16) for n in (1, 16, 17, 32, 33)] == [1, 1, 2, 2, 3]


def test_a_budget_smaller_than_one_sequence_names_the_smallest_that_works():
    with pytest.raises(KVLabError, match=r"A KV budget of 3 blocks \(384 tokens\) cannot hold one sequence of max_model_len "
                                         r"1,024 tokens; use at least 8 blocks or a smaller max_model_len"):
        paged.check_budget(3, 128, 1024)
    paged.check_budget(8, 128, 1024)


def traffic(pattern: str, prefix_blocks: int = 4, block: int = 16) -> list[tuple[str, list[int]]]:
    """S = a shared-prefix request (prefix + 5 tokens), U = a unique request of 3 blocks + 2 tokens."""
    return [("shared", [0] * (prefix_blocks * block + 5)) if c == "S" else ("unique", [1] * (3 * block + 2)) for c in pattern]


def test_prefix_survives_while_prefix_plus_blocks_cached_since_plus_partial_and_null_block_fit():
    reqs = traffic("SUSUUS")
    # after S: 1 unique (3 full blocks) → needs 4 + 3 + 1 + 1 = 9; after the second S: 2 uniques → 4 + 6 + 2 = 12
    assert paged.predicted_prefix_hits(reqs, 4, 16, 2, pool_blocks=9) == [None, None, True, None, None, False]
    assert paged.predicted_prefix_hits(reqs, 4, 16, 2, pool_blocks=12) == [None, None, True, None, None, True]
    assert paged.survival_budget(reqs, 4, 16, 2) == 12


def test_output_tokens_that_fill_a_block_count_as_cached_blocks():
    reqs = [("shared", [0] * 64), ("unique", [1] * 47), ("shared", [0] * 64)]
    assert paged.survival_budget(reqs, 4, 16, output_tokens=0) == 4 + 2 + 2   # 47 tokens: 2 full blocks
    assert paged.survival_budget(reqs, 4, 16, output_tokens=1) == 4 + 3 + 2   # 48 tokens: 3 full blocks


def test_shared_prefix_traffic_has_the_asked_share_and_a_common_prefix():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def __len__(self):
            return 256

    reqs = paged.shared_prefix_traffic(Tok(), 200, 0.5, 64, 8, 40, seed=1)
    shared = [ids for label, ids in reqs if label == "shared"]
    assert 0.35 < len(shared) / 200 < 0.65 and all(ids[:64] == shared[0][:64] and len(ids) == 72 for ids in shared)
    with pytest.raises(KVLabError, match="shared_share must be a fraction"):
        paged.shared_prefix_traffic(Tok(), 10, 1.5, 64, 8, 40)
