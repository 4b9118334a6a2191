"""Per-client text corpora for collaborative language-model fine-tuning (CoBo 4.3).

``data.name: multilingual_text`` gives one client per entry of ``data.languages``; its
corpus comes from ``data.text_source``:

- ``libreoffice_help`` (offline default): the prose of LibreOffice's help pages in that
  language, from the Debian package ``libreoffice-help-<lang>``, unpacked (not installed)
  into ``data.root`` (default ``~/.cache/raycobo/libreoffice-help``). With
  ``data.download: true`` a missing package is fetched with ``apt-get download`` and
  unpacked with ``dpkg-deb -x``; otherwise the error names the commands.
- ``text_files``: ``data.text_files``, one file (or glob) per client, the user's corpora.
- ``huggingface``: ``datasets.load_dataset(data.hf_dataset, <config per client>)``, with
  ``data.hf_configs`` (e.g. Wiki-40B ``ca``, ``es``, ...) -- needs the hub or its cache.

Each corpus is tokenised with the model's tokenizer, cut into blocks of
``data.block_size`` tokens (at most ``data.tokens_per_client`` tokens per client), and
its blocks split into training and validation (``data.partition.test_split``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import ClassVar

import torch

from raycobo.config import ConfigError, DataConfig

DEFAULT_HELP_ROOT = "~/.cache/raycobo/libreoffice-help"


@dataclass
class TextData:
    """Token blocks per client: train[c] (n_c, L) and val[c] (m_c, L), int64."""

    uses_model: ClassVar[bool] = True
    reports_perplexity: ClassVar[bool] = True  # its loss is a language model's
    ops: ClassVar[str] = "lora"  # a LoRA language model (raycobo.engine.OPS)

    name: str
    train: list[torch.Tensor]
    val: list[torch.Tensor]
    clients: list[str]  # what each client's corpus is (a language, a file)
    clusters: list[int | None]
    vocab_size: int  # of the tokenizer that cut the blocks (sizes a fresh model)

    @property
    def n_clients(self) -> int:
        return len(self.train)

    def subset(self, clients: list[int]) -> TextData:
        return TextData(
            self.name,
            [self.train[c] for c in clients],
            [self.val[c] for c in clients],
            [self.clients[c] for c in clients],
            [self.clusters[c] for c in clients],
            self.vocab_size,
        )


class _Paragraphs(HTMLParser):
    """The text of the help pages' prose: <p class="paragraph|embedded">, <h1>, <h2>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._open: str | None = None  # the tag whose text is being collected
        self._buf: list[str] = []

    def handle_starttag(self, tag, attrs):
        if self._open is not None:
            return
        cls = dict(attrs).get("class") or ""
        if (tag == "p" and cls in ("paragraph", "embedded")) or tag in ("h1", "h2"):
            self._open, self._buf = tag, []

    def handle_endtag(self, tag):
        if tag == self._open:
            text = " ".join("".join(self._buf).split())
            if len(text) >= 20:
                self.out.append(text)
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._buf.append(data)


def html_paragraphs(path: str | Path) -> list[str]:
    parser = _Paragraphs()
    parser.feed(Path(path).read_text(encoding="utf-8", errors="replace"))
    return parser.out


def help_pages(root: Path, lang: str) -> list[Path]:
    return sorted((root / "usr/share/libreoffice/help" / lang / "text").rglob("*.html"))


def fetch_libreoffice_help(root: Path, lang: str) -> None:
    """apt-get download + dpkg-deb -x of libreoffice-help-<lang> into root."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise ConfigError(
            "invalid config key 'data.download': fetching libreoffice-help needs apt-get and "
            "dpkg-deb (Debian/Ubuntu); use data.text_source=text_files instead"
        )
    root.mkdir(parents=True, exist_ok=True)
    pkg = f"libreoffice-help-{lang}"
    res = subprocess.run(["apt-get", "download", pkg], cwd=root, capture_output=True, text=True)
    debs = sorted(root.glob(f"{pkg}_*.deb"))
    if res.returncode != 0 or not debs:
        first = (res.stderr.strip().splitlines() or ["no .deb written"])[-1]
        raise ConfigError(f"invalid config key 'data.languages': apt-get download {pkg}: {first}")
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True)
    debs[-1].unlink()


def libreoffice_corpus(cfg: DataConfig, lang: str) -> str:
    root = Path(os.path.expanduser(cfg.root or DEFAULT_HELP_ROOT))
    pages = help_pages(root, lang)
    cache = root / f"{lang}.txt"  # the extracted prose, parsed once
    if not pages and cache.is_file():  # the pages may be deleted once their prose is kept
        return cache.read_text(encoding="utf-8")
    if not pages:
        if not cfg.download:
            raise ConfigError(
                f"invalid config key 'data.root': no LibreOffice help pages for '{lang}' under "
                f"{root}; set data.download=true, or run: cd {root} && apt-get download "
                f"libreoffice-help-{lang} && dpkg-deb -x libreoffice-help-{lang}_*.deb ."
            )
        fetch_libreoffice_help(root, lang)
        pages = help_pages(root, lang)
    if cache.is_file() and cache.stat().st_mtime >= max(p.stat().st_mtime for p in pages):
        return cache.read_text(encoding="utf-8")
    seen: set[str] = set()
    paras = []
    for page in pages:
        for p in html_paragraphs(page):
            if p not in seen:  # the help repeats shared snippets on many pages
                seen.add(p)
                paras.append(p)
    text = "\n".join(paras)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(cache)
    return text


def text_file_corpus(spec: str) -> str:
    paths = sorted(glob.glob(os.path.expanduser(spec))) or [os.path.expanduser(spec)]
    texts = []
    for p in paths:
        if not os.path.isfile(p):
            raise ConfigError(f"invalid config key 'data.text_files': no file {spec}")
        texts.append(Path(p).read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def hf_corpus(cfg: DataConfig, config_name: str | None, max_chars: int) -> str:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "invalid config key 'data.text_source': huggingface needs the 'datasets' package "
            "(pip install datasets)"
        ) from None
    if not cfg.hf_dataset:
        raise ConfigError("invalid config key 'data.hf_dataset': name a Hugging Face dataset")
    ds = datasets.load_dataset(cfg.hf_dataset, config_name, split=cfg.hf_split, streaming=True)
    out, total = [], 0
    for row in ds:
        text = row[cfg.hf_text_field]
        out.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "\n".join(out)


def corpora(cfg: DataConfig) -> tuple[list[str], list[str]]:
    """(client labels, raw texts) for the configured source."""
    src = cfg.text_source
    # a generous character budget: BPE averages 3-5 characters per token
    max_chars = 8 * cfg.tokens_per_client
    if src == "libreoffice_help":
        return list(cfg.languages), [libreoffice_corpus(cfg, lang) for lang in cfg.languages]
    if src == "text_files":
        if not cfg.text_files:
            raise ConfigError("invalid config key 'data.text_files': list one file per client")
        return list(cfg.text_files), [text_file_corpus(s) for s in cfg.text_files]
    configs = cfg.hf_configs or list(cfg.languages)
    return configs, [hf_corpus(cfg, c, max_chars) for c in configs]


def blocks(ids: list[int], block: int, limit: int) -> torch.Tensor:
    """Consecutive, non-overlapping blocks of ``block`` tokens (the remainder dropped)."""
    ids = ids[:limit]
    k = len(ids) // block
    return torch.tensor(ids[: k * block], dtype=torch.int64).view(k, block)


def load_text(cfg: DataConfig, tokenizer, seed: int) -> TextData:
    labels, texts = corpora(cfg)
    train, val = [], []
    for label, text in zip(labels, texts, strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        B = blocks(ids, cfg.block_size, cfg.tokens_per_client)
        if B.shape[0] < 2:
            raise ConfigError(
                f"invalid config key 'data.block_size': client '{label}' has {len(ids)} tokens, "
                f"fewer than two blocks of {cfg.block_size}"
            )
        g = torch.Generator().manual_seed(seed)
        B = B[torch.randperm(B.shape[0], generator=g)]
        n_val = min(B.shape[0] - 1, max(1, round(cfg.partition.test_split * B.shape[0])))
        val.append(B[:n_val].clone())
        train.append(B[n_val:].clone())
    return TextData("multilingual_text", train, val, labels, [None] * len(labels), len(tokenizer))
