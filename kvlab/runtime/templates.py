"""Chat templates: the model's own, or a plain "Role: text" one for a base model that ships none (vLLM refuses a chat
without one), used the same way by the in-process engine, the server, the gateway and every token count."""

from __future__ import annotations

from typing import Any

#: How KV Lab writes a chat for a model whose tokenizer has no chat template (a base model, such as vLLM's quickstart
#: model facebook/opt-125m): each message as "Role: text" on its own line, then "Assistant:". vLLM refuses such chats
#: ("default chat template is no longer allowed": ``vllm/renderers/hf.py``, ``safe_apply_chat_template``), so the
#: same template goes to ``llm.chat``, to the server (``--chat-template``) and to the token counts here: all three agree.
PLAIN_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}Assistant:{% endif %}")

_NOTED: set[str] = set()


def chat_template(tokenizer: Any) -> str | None:
    """None when the model's tokenizer has its own chat template (it is used); else ``PLAIN_CHAT_TEMPLATE``, said once
    per model in a printed note (its answers are then plain text continuation, not an instruction-tuned chat)."""
    if getattr(tokenizer, "chat_template", None):
        return None
    name = str(getattr(tokenizer, "name_or_path", "") or "this model")
    if name not in _NOTED:
        _NOTED.add(name)
        print(f"Note: {name} has no chat template (a base model); KV Lab writes its chats as plain 'User: …' / "
              "'Assistant:' lines (kvlab.runtime.templates.PLAIN_CHAT_TEMPLATE).")
    return PLAIN_CHAT_TEMPLATE


def chat_template_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat in the model's own chat template (or ``PLAIN_CHAT_TEMPLATE`` where it has none), generation
    prompt added: what the server would send."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        chat_template=chat_template(tokenizer))
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
