"""Models: batched forward equals the nn.Module; the fused MLP gradient equals autograd."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from raycobo.config import ConfigError, ModelConfig
from raycobo.models import build_model


@pytest.mark.parametrize("hidden", [[], [16], [32, 8]])
def test_batched_forward_matches_module(hidden):
    model = build_model(ModelConfig(name="mlp", hidden=hidden), (1, 8, 8), 10)
    g = torch.Generator().manual_seed(0)
    P = torch.randn(3, model.dim, generator=g) * 0.1
    x = torch.randn(3, 5, 1, 8, 8, generator=g)
    out = model.forward(P, x)
    for k in range(3):
        model.load_into(model.module, P[k])
        assert_close(out[k], model.module(x[k]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hidden", [[], [16], [32, 8]])
def test_fused_mlp_gradient_matches_autograd(hidden):
    model = build_model(ModelConfig(name="mlp", hidden=hidden), (1, 8, 8), 10)
    g = torch.Generator().manual_seed(1)
    m, B = 4, 6
    P = torch.randn(m, model.dim, generator=g) * 0.3
    x = torch.randn(m, B, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (m, B), generator=g)
    G = torch.empty_like(P)
    loss = model.loss_grad(P, x, y, G)
    Pa = P.clone().requires_grad_(True)
    la = F.cross_entropy(model.forward(Pa, x).reshape(m * B, 10), y.reshape(-1), reduction="none")
    la = la.view(m, B).mean(1)
    (Ga,) = torch.autograd.grad(la.sum(), Pa)
    assert_close(loss, la.detach(), atol=1e-6, rtol=1e-5)
    assert_close(G, Ga, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("R", "means"), [(4, 2), (6, 3), (3, 1)])
def test_fused_mlp_gradient_of_shared_points_and_minibatch_means(R, means):
    """U points each asked for R rows; each run of ``means`` rows answered as one
    gradient: the mean of autograd's per-row gradients at the row's point (float
    rounding apart), and each row's own loss."""
    model = build_model(ModelConfig(name="mlp", hidden=[16]), (1, 8, 8), 10)
    g = torch.Generator().manual_seed(2)
    U, B = 3, 5
    P = torch.randn(U, model.dim, generator=g) * 0.3
    x = torch.randn(U * R, B, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (U * R, B), generator=g)
    G = torch.full((U * R // means, model.dim), float("nan"))
    loss = model.loss_grad(P, x, y, G, R, means)
    Pa = P.repeat_interleave(R, dim=0).requires_grad_(True)
    logits = model.forward(Pa, x).reshape(U * R * B, 10)
    la = F.cross_entropy(logits, y.reshape(-1), reduction="none").view(U * R, B).mean(1)
    (Ga,) = torch.autograd.grad(la.sum(), Pa)
    assert_close(loss, la.detach(), atol=1e-6, rtol=1e-5)
    assert_close(G, Ga.view(-1, means, model.dim).mean(1), atol=1e-6, rtol=1e-5)


def test_parameter_count_and_init_are_deterministic():
    model = build_model(ModelConfig(name="mlp", hidden=[64]), (1, 28, 28), 10)
    assert model.dim == 784 * 64 + 64 + 64 * 10 + 10  # 50,890
    assert torch.equal(model.init_flat(3), model.init_flat(3))
    assert not torch.equal(model.init_flat(3), model.init_flat(4))


def test_unknown_model_names_the_key():
    with pytest.raises(ConfigError, match="model.name"):
        build_model(ModelConfig(name="transformer9"), (1, 8, 8), 10)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "count"),
    [
        ("cnn", (1, 28, 28), 10, 454_922),
        ("cnn", (3, 32, 32), 10, 579_402),
        ("fedavg_cnn", (1, 28, 28), 10, 582_026),
        ("fedavg_cnn", (3, 32, 32), 10, 878_538),
        ("resnet9", (3, 32, 32), 100, 6_619_300),
        ("cnn1d", (1, 40), 10, 5_210),
    ],
)
def test_conv_models_shapes_and_parameter_counts(name, shape, classes, count):
    model = build_model(ModelConfig(name=name), shape, classes)
    assert model.dim == count
    P = model.init_flat(0).expand(2, -1).clone()
    x = torch.randn(2, 3, *shape)
    out = model.forward(P, x)
    assert out.shape == (2, 3, classes)
    model.load_into(model.module, P[1])
    assert_close(out[1], model.module(x[1]), atol=1e-4, rtol=1e-4)


def test_bad_input_shape_for_conv_models():
    with pytest.raises(ConfigError, match="model.name"):
        build_model(ModelConfig(name="cnn"), (1, 40), 10)


@pytest.mark.parametrize(
    ("name", "shape", "ok"),
    [
        ("cnn", (1, 8, 8), True),  # digits' 8x8 images: the small CNN pools twice
        ("cnn", (1, 10, 10), False),
        ("fedavg_cnn", (1, 16, 16), True),  # two valid 5x5 convs and two pools leave 1x1
        ("fedavg_cnn", (1, 15, 15), False),
        ("fedavg_cnn", (1, 8, 8), False),
    ],
)
def test_each_conv_model_refuses_only_the_images_it_cannot_take(name, shape, ok):
    """A bound of one model is not another's: the CNN takes digits' 8x8 images, FedAvgCNN
    needs at least 16x16; a refusal names the key and the shape."""
    if ok:
        assert build_model(ModelConfig(name=name), shape, 10).dim > 0
    else:
        with pytest.raises(ConfigError, match=rf"model.name.*{name}.*{re.escape(str(shape))}"):
            build_model(ModelConfig(name=name), shape, 10)


@pytest.mark.parametrize(("hidden", "k"), [([], 1), ([16], 2), ([32, 8], 3)])
def test_pair_grams_are_the_inner_products_of_the_ends_gradients(hidden, k):
    """U points, each asked by a pair's two ends with k minibatches each: the per-sample
    factors give <g_i, g_j>, ||g_i||^2 and ||g_j||^2 of the ends' mean gradients, the
    ones the written gradients give (float rounding apart)."""
    model = build_model(ModelConfig(name="mlp", hidden=hidden), (1, 8, 8), 10)
    g = torch.Generator().manual_seed(3)
    U, B = 4, 5
    P = torch.randn(U, model.dim, generator=g) * 0.3
    x = torch.randn(U * 2 * k, B, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (U * 2 * k, B), generator=g)
    G = torch.empty(U * 2, model.dim)
    model.loss_grad(P, x, y, G, 2 * k, k)
    Gi, Gj = G[0::2], G[1::2]
    expected = torch.stack([(Gi * Gj).sum(1), Gi.square().sum(1), Gj.square().sum(1)], 1)
    assert_close(model.pair_grams(P, x, y), expected, atol=1e-6, rtol=1e-5)


def test_pair_grams_pay_where_a_layer_is_wide_against_the_samples():
    """The factors' S x S products cost 3 S^2 (in + out) a layer against the weight
    gradients' 2 S (in out + out): at the default 784-64-10 with 2 minibatches of 32 an
    end the written gradients are cheaper, from 128 hidden units the factors."""

    def pays(hidden, samples):
        model = build_model(ModelConfig(name="mlp", hidden=hidden), (1, 28, 28), 10)
        return model.pair_grams.pays(samples)

    assert not pays([64], 64) and not pays([96], 64)
    assert pays([128], 64) and pays([256], 64) and pays([64], 16)
    assert not pays([256], 256)
