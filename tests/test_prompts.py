"""Prompt builder on the real tokenizer: exact lengths from real text, distinct or shared prefixes."""

import pytest

from kvlab import prompts
from kvlab.runtime import templates
from kvlab.runtime.errors import KVLabError


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


def test_a_model_with_its_own_chat_template_keeps_it(tok):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert templates.chat_template(tok) is None
    assert templates.chat_template_ids(tok, messages) == list(tok.apply_chat_template(messages, add_generation_prompt=True,
                                                                                      tokenize=True)["input_ids"])


def test_a_base_model_gets_the_plain_template_and_one_note(model_dir, capsys):
    """Without a template vLLM refuses chats (vllm/renderers/hf.py); KV Lab writes 'Role: text' lines, said once."""
    from transformers import AutoTokenizer

    base = AutoTokenizer.from_pretrained(model_dir)
    base.chat_template = None
    base.name_or_path = "a-base-model-for-this-test"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = templates.chat_template_ids(base, messages)
    assert base.decode(ids) == "System: Be brief.\nUser: Hi there\nAssistant:"
    assert templates.chat_template_ids(base, messages) == ids
    assert capsys.readouterr().out.count("has no chat template") == 1
