"""Models with random weights made locally (no hub): the second and third course models, and the saving they share with
the lessons' variants (``kvlab.variants``). Real shapes and timings, gibberish text."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab.runtime import config
from kvlab.runtime.gguf import STAMP, prepare_default_model
from kvlab.runtime.quiet import quiet


def _random_model(auto_class: Any, cfg: Any) -> Any:
    """A bf16 model with random weights: built on the meta device and filled once — N(0, the config's init std) for
    matrices, 1 for norm scales, 0 for biases, as transformers' own init — in half the time of ``from_config`` (which
    initialises every layer twice, in float32). A model with persistent buffers is built the slow, exact way."""
    import torch

    with torch.device("meta"):
        model = auto_class.from_config(cfg, dtype=torch.bfloat16)
    if set(model.state_dict()) - {name for name, _ in model.named_parameters(remove_duplicate=False)}:
        return auto_class.from_config(cfg).to(torch.bfloat16)  # persistent buffers: to_empty would leave them unset
    text = cfg.get_text_config()
    std = getattr(text, "initializer_range", None) or getattr(text, "init_std", None) or 0.02
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # a norm's scale
                p.fill_(1.0)
            else:
                p.normal_(0.0, std)
    model.tie_weights()
    return model


def save_random_model(target: Path, make_config: Callable[[], Any], tokenizer_from: str, stamp: dict) -> Path:
    """Build a model with random weights (seed 0, bf16: half the disk) from a config, save it with a tokenizer into
    ``target`` atomically (temporary folder, then rename: never half-written), and stamp it."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    import transformers.utils.logging  # noqa: F401 - loaded first, so quiet() can switch its progress bars off

    try:
        with quiet():
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            cfg = make_config()
            torch.manual_seed(0)
            _random_model(AutoModelForCausalLM, cfg).save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(tmp)
        (tmp / STAMP).write_text(json.dumps(stamp | {"weights": "random (seed 0)"}, default=str))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target

SECOND_MODEL = "Qwen2-Tiny-Random"


#: A model of another family than the course's, to prove the course holds beyond it: Qwen2 layout (q/k/v biases,
#: 8 query heads sharing 2 KV heads of 64, 24 layers), random weights, the course model's tokenizer.
SECOND_MODEL_CONFIG = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 512,
                       "intermediate_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 8,
                       "num_key_value_heads": 2, "max_position_embeddings": 8192, "rope_theta": 1000000.0,
                       "tie_word_embeddings": True, "use_sliding_window": False}


def _prepare_local_model(name: str, fields: dict[str, Any], chat_template: bool) -> Path:
    """A named random-weight model made once with transformers from ``fields`` and cached, with the course model's
    tokenizer (its chat template removed where ``chat_template`` is False, as a base model ships)."""
    target = config.cache_dir() / "models" / name
    if (target / STAMP).is_file():
        return target
    base = str(prepare_default_model())

    def make_config() -> Any:
        from transformers import AutoConfig, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(base)
        rest = dict(fields)
        return AutoConfig.for_model(rest.pop("model_type"), vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                    eos_token_id=tok.eos_token_id, **rest)

    made = save_random_model(target, make_config, base, {"config": fields, "tokenizer": base,
                                                          "chat_template": chat_template})
    if not chat_template:
        path = made / "tokenizer_config.json"
        settings = json.loads(path.read_text())
        settings.pop("chat_template", None)
        path.write_text(json.dumps(settings, indent=2))
        (made / "chat_template.jinja").unlink(missing_ok=True)
    return made


def prepare_second_model() -> Path:
    """The second architecture (``KVLAB_MODEL=Qwen2-Tiny-Random``): made once with transformers and cached."""
    return _prepare_local_model(SECOND_MODEL, SECOND_MODEL_CONFIG, chat_template=True)

BASE_MODEL = "OPT-Tiny-Random-Base"


#: A third layout, the opposite of the course model's on every axis the course measures: OPT (vLLM's quickstart
#: family: facebook/opt-125m) — one KV head per query head and no setting for fewer, learned positions, a ReLU MLP
#: without a gate, LayerNorm with biases — and a base model: no chat template (``templates.PLAIN_CHAT_TEMPLATE``).
BASE_MODEL_CONFIG = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 512, "ffn_dim": 2048,
                     "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 2048,
                     "word_embed_proj_dim": 512}


def prepare_base_model() -> Path:
    """The base-model layout (``KVLAB_MODEL=OPT-Tiny-Random-Base``): made once with transformers and cached."""
    return _prepare_local_model(BASE_MODEL, BASE_MODEL_CONFIG, chat_template=False)


HYBRID_MODEL = "Gemma3-Tiny-Random"


#: A hybrid-attention layout: Gemma-3's local:global pattern (5 sliding-window layers of 512 tokens to 1 full-attention
#: layer, transformers' ``layer_types``), so vLLM keeps two KV cache groups — what lessons 01, 03 and 08 must get right
#: beyond one group. One KV head of 64 per 4 query heads, random weights, the course model's tokenizer.
HYBRID_MODEL_CONFIG = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
                       "intermediate_size": 768, "num_hidden_layers": 12, "num_attention_heads": 4,
                       "num_key_value_heads": 1, "head_dim": 64, "sliding_window": 512, "max_position_embeddings": 8192}


def prepare_hybrid_model() -> Path:
    """The hybrid-attention layout (``KVLAB_MODEL=Gemma3-Tiny-Random``): made once with transformers and cached."""
    return _prepare_local_model(HYBRID_MODEL, HYBRID_MODEL_CONFIG, chat_template=True)
