"""Prefix-caching helpers: prompt variants (pure logic) and the real engine's reuse, counters and response cache."""

import pytest

from kvlab import caching


def test_variants_edit_where_they_say():
    system = caching.static_prefix(n_tools=2)
    v = caching.variants(system)
    assert v["identical"] == system
    assert v["one character changed at the start"][1:] == system[1:] and v["one character changed at the start"][0] != system[0]
    assert v["one character changed at the end"][:-1] == system[:-1] and v["one character changed at the end"] != system
    assert v["version string first (bumped)"].endswith(system) and v["version string last (bumped)"].startswith(system)


def test_common_prefix():
    assert caching.common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert caching.common_prefix([1, 2], [1, 2, 3]) == 2


def test_a_slower_machine_gets_fewer_tools_never_none():
    lengths = {1: 1000, 2: 1300, 3: 1600, 4: 2000}  # tools → prompt tokens; the longest timed
    assert caching.tools_within(lengths, ttft_s=3.0, target_s=4.5) == 4  # fast: all of them
    assert caching.tools_within(lengths, ttft_s=6.0, target_s=4.5) == 2  # 1,600 / 2,000 × 6 s = 4.8 s > 4.5
    assert caching.tools_within(lengths, ttft_s=6.0, target_s=4.8) == 3  # 4.8 s: within
    assert caching.tools_within(lengths, ttft_s=7.0, target_s=4.5) == 1  # 1,300 tokens: 4.55 s
    assert caching.tools_within(lengths, ttft_s=60.0, target_s=4.5) == 1  # at least one tool, however slow


def test_static_prefix_is_a_few_thousand_tokens(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = caching.chat_ids(tok, caching.static_prefix(), caching.user_turns()[0])
    assert 2000 < len(ids) < 6000
    assert len(set(caching.user_turns())) >= 15


@pytest.mark.engine
def test_token_traffic_hits_only_shared_requests(engine):
    df, counters = caching.token_traffic(engine, prefix_tokens=256, suffix_tokens=16, requests=4, shared_fraction=0.5, seed=2)
    shared = df[df.label == "shared prefix"]
    assert (df[df.label == "unique"].cached_tokens == 0).all()
    assert (shared.cached_tokens.iloc[1:] == 256).all()  # the first shared request fills the cache
    assert 0 < counters["token_hit_rate"] < 1
    off, counters_off = caching.token_traffic(engine, 256, 16, 4, 0.5, seed=2, caching=False)
    assert (off.cached_tokens == 0).all() and counters_off["hit_tokens"] == 0

