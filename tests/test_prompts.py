"""Prompt builder on the real tokenizer: exact lengths from real text, distinct or shared prefixes."""

import pytest

from kvlab import prompts
from kvlab.errors import KVLabError


@pytest.fixture(scope="module")
def tok(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.mark.parametrize("n", [1, 17, 128, 1000, 5000])
def test_prompt_has_exact_token_length(tok, n):
    ids = prompts.prompt_of_length(tok, n, offset=123)
    assert len(ids) == n


def test_text_is_real_prose_not_a_repeated_word(tok):
    words = tok.decode(prompts.prompt_of_length(tok, 2000)).split()
    assert len(set(words)) > 400


def test_distinct_prompts_share_no_prefix(tok):
    ps = prompts.distinct_prompts(tok, 64, 4)
    assert len({tuple(p[:4]) for p in ps}) == 4


def test_shared_prefix_prompts(tok):
    ps = prompts.shared_prefix_prompts(tok, 100, 20, 3)
    assert all(len(p) == 120 for p in ps)
    assert all(p[:100] == ps[0][:100] for p in ps)
    assert len({tuple(p[100:]) for p in ps}) == 3


def test_too_long_is_one_sentence():
    with pytest.raises(KVLabError, match=r"prompt of 8,000 tokens plus 500 output tokens exceeds the engine's context of 8,192"):
        prompts.check_fits(8000, 500, 8192)


def test_bad_length_refused(tok):
    with pytest.raises(KVLabError, match="n_tokens must be a positive"):
        prompts.prompt_of_length(tok, 0)
