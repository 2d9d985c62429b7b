"""FedDG-ELCFS: the continuous frequency space interpolation and its window, the distribution
bank (setup exchange, ledger bytes), the boundary regions, the NT-Xent loss, the fast-weight
step, the meta gradient (second and first order) and an end-to-end run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import seg_cfg
from torch import nn
from torch.func import functional_call

from fedshift.algorithms.elcfs import (
    ELCFSParams,
    boundary_loss,
    boundary_regions,
    dilate,
    episodic_loss,
    erode,
    fast_weights,
    nt_xent,
)
from fedshift.augment.cfsi import (
    CFSI,
    CFSIParams,
    interpolate,
    low_freq_window,
    window_half_size,
)
from fedshift.core.errors import ConfigError
from fedshift.core.payload import Payload
from fedshift.core.tasks import joint_loss
from fedshift.models.unet import UNet

F32 = 1e-5  # float32 rounding of O(1) values


# ----------------------------------------------------------------------------- CFSI window
def test_window_size_for_alpha():
    # b = floor(min(H, W) * alpha): 64 * 0.003 = 0.19 -> 0 (DC only); 64 * 0.05 = 3.2 -> 3
    assert window_half_size(64, 64, 0.003) == 0
    assert window_half_size(64, 48, 0.05) == 2  # min side 48: 2.4 -> 2
    m = low_freq_window(64, 64, 0.003)
    assert m.sum() == 1 and m[0, 0] == 1
    m = low_freq_window(64, 64, 0.05)
    assert m.sum() == 7 * 7  # frequencies -3..3 on both axes
    # in the FFT's own layout: indices 0..3 and 61..63 on each axis
    rows = torch.nonzero(m.sum(1)).flatten().tolist()
    assert rows == [0, 1, 2, 3, 61, 62, 63]
    assert m[3, 61] == 1 and m[4, 0] == 0 and m[0, 60] == 0
    # b = 2 on a 4 x 4 spectrum covers every frequency (-2 == 2 mod 4)
    assert low_freq_window(4, 4, 0.5).sum() == 16


# ----------------------------------------------------------------------------- CFSI
def test_interpolation_by_hand_on_two_pixels():
    # x = [0.2, 0.6]: F = [0.8, -0.4]; other image [0.5, 0.5]: amplitude [1.0, 0.0].
    # alpha = 0: the window is the DC term; lam = 0.5: DC amplitude 0.5 * 0.8 + 0.5 * 1.0 = 0.9,
    # phase 0, so F' = [0.9, -0.4] and x' = [(0.9 - 0.4) / 2, (0.9 + 0.4) / 2] = [0.25, 0.65].
    x = torch.tensor([[[[0.2, 0.6]]]])
    other = torch.tensor([[[1.0, 0.0]]])
    out = interpolate(x, other, torch.tensor([0.5]), low_freq_window(1, 2, 0.0))
    assert torch.allclose(out, torch.tensor([[[[0.25, 0.65]]]]), atol=F32)


def test_lambda_zero_gives_the_image_back():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 8, 8, generator=g)
    other = torch.rand(2, 3, 8, 8, generator=g) * 10
    out = interpolate(x, other, torch.zeros(2), low_freq_window(8, 8, 0.5))
    assert torch.allclose(out, x, atol=F32)


def test_lambda_one_full_window_gives_the_other_amplitude_with_own_phase():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 1, 6, 6, generator=g)
    y = torch.rand(1, 1, 6, 6, generator=g)
    a_other = np.abs(np.fft.fft2(y.numpy().astype(np.float64)))[0]
    out = interpolate(
        x, torch.from_numpy(a_other).float(), torch.ones(1), low_freq_window(6, 6, 0.5)
    )
    f = np.fft.fft2(out.numpy().astype(np.float64))[0, 0]
    fx = np.fft.fft2(x.numpy().astype(np.float64))[0, 0]
    assert np.allclose(np.abs(f), a_other[0], atol=1e-4)
    # own phase: F(out) / |F(out)| == F(x) / |F(x)| (both spectra are Hermitian)
    assert np.allclose(f / np.abs(f), fx / np.abs(fx), atol=1e-4)
    # an independent rebuild: Re F^-1(A_other exp(j P(x)))
    ref = np.real(np.fft.ifft2(a_other[0] * np.exp(1j * np.angle(fx))))
    assert np.allclose(out.numpy()[0, 0], ref, atol=F32)


def test_window_leaves_high_frequencies_alone():
    g = torch.Generator().manual_seed(2)
    x = torch.rand(1, 1, 16, 16, generator=g)
    # a real image's amplitude (Hermitian-even, so the rebuilt image is real)
    other = torch.fft.fft2(torch.rand(1, 16, 16, generator=g).double() * 5).abs()
    win = low_freq_window(16, 16, 0.125)  # b = 2
    out = interpolate(x, other, torch.tensor([0.7]), win)
    fo, fx = torch.fft.fft2(out.double()), torch.fft.fft2(x.double())
    outside = win == 0
    assert torch.allclose(fo[..., outside], fx[..., outside], atol=1e-4)
    inside = win == 1
    want = 0.3 * fx.abs()[..., inside] + 0.7 * other.double()[..., inside]
    assert torch.allclose(fo.abs()[..., inside], want, atol=1e-3)


def _cfsi(n_clients=3, n=4, **params):
    aug = CFSI(CFSIParams(**params), seed=0, num_classes=2)
    g = torch.Generator().manual_seed(3)
    datas = {}
    for k in range(n_clients):
        x = torch.rand(n, 1, 8, 8, generator=g)
        datas[f"c{k}"] = type("D", (), {"train": type("S", (), {"x": x})()})()
    states = {cid: aug.init_client(cid, d, None) for cid, d in datas.items()}
    server: dict = {}
    aug.setup_aggregate(server, [(cid, aug.setup_reply(cid, s)) for cid, s in states.items()])
    for cid, s in states.items():
        aug.receive(Payload(aug.setup_broadcast(server, cid)), s, 0)
    return aug, datas, states


def test_bank_holds_the_other_clients_spectra():
    aug, datas, states = _cfsi()
    s0 = states["c0"]
    assert sorted(s0["bank"]) == ["c1", "c2"]
    want = torch.fft.fft2(datas["c1"].train.x.double()).abs().float()
    assert torch.allclose(s0["bank"]["c1"], want, atol=1e-5)
    # record sizes: each client up n_k x C x H x W float32
    assert aug.setup_reply("c0", s0)["cfsi_amplitudes"]["amplitude"].shape == (4, 1, 8, 8)
    # a client that sent no spectra (a held-out site: it never trains) is sent no bank
    server = {"bank": {"c0": s0["own"], "c1": states["c1"]["own"]}}
    assert aug.setup_broadcast(server, "held-out") == {}
    assert list(aug.setup_broadcast(server, "c1")["cfsi_bank"]) == ["c0"]
    # bank_fraction: a quarter of 4 images
    _, _, states = _cfsi(bank_fraction=0.25)
    assert states["c0"]["own"].shape[0] == 1 and states["c1"]["bank"]["c0"].shape[0] == 1


def test_train_batch_is_raw_then_transformed():
    aug, datas, states = _cfsi()
    x = datas["c0"].train.x
    y = torch.zeros(4, 8, 8, dtype=torch.long)
    xo, yo = aug.train_batch(x, y, states["c0"], torch.Generator().manual_seed(0))
    assert xo.shape == (8, 1, 8, 8) and yo.shape == (8, 8, 8)
    assert torch.equal(xo[:4], x) and not torch.allclose(xo[4:], x)
    assert xo.min() >= 0 and xo.max() <= 1
    # the released setting: full swap of the DC term gives the mean of another client's image
    aug, datas, states = _cfsi(alpha=0.0, lam_min=1.0, lam_max=1.0)
    xo, _ = aug.train_batch(datas["c0"].train.x, y, states["c0"], torch.Generator())
    means = torch.cat([d.train.x.mean((1, 2, 3)) for c, d in datas.items() if c != "c0"])
    shift = xo[4:].mean((1, 2, 3))  # clipping aside, the mean is the source image's mean
    assert all(bool((means - m).abs().min() < 0.02) for m in shift)


def test_cfsi_needs_another_client_and_a_sane_lambda_range():
    aug, _, states = _cfsi(n_clients=1)
    with pytest.raises(ConfigError, match="at least two training clients"):
        aug.train_batch(
            torch.rand(2, 1, 8, 8), torch.zeros(2, 8, 8), states["c0"], torch.Generator()
        )
    with pytest.raises(ConfigError, match="lam_min"):
        CFSI.check(CFSIParams(lam_min=0.8, lam_max=0.2), "elcfs", [])


# ----------------------------------------------------------------------------- boundary masks
def test_boundary_regions_on_a_hand_drawn_mask():
    y = torch.zeros(1, 6, 6, dtype=torch.long)
    y[0, 1:4, 1:4] = 1  # a 3 x 3 square
    contour, background = boundary_regions(y, 1, contour_iters=1, background_iters=1)
    # erosion by the cross keeps the centre (2, 2) only: the contour is the 8 other pixels
    want_c = torch.zeros(6, 6)
    want_c[1:4, 1:4] = 1
    want_c[2, 2] = 0
    assert torch.equal(contour[0], want_c)
    # one dilation adds the 4-neighbour ring without the corners: 3 pixels on each side
    want_b = torch.zeros(6, 6)
    want_b[0, 1:4] = want_b[4, 1:4] = want_b[1:4, 0] = want_b[1:4, 4] = 1
    assert torch.equal(background[0], want_b)
    # two dilations of one pixel: the diamond of radius 2 (13 pixels)
    one = torch.zeros(1, 6, 6)
    one[0, 2, 2] = 1
    assert dilate(one, 2).sum() == 13
    # outside the image is background: a mask touching the border loses its border pixels
    full = torch.ones(1, 6, 6)
    assert erode(full, 1)[0].sum() == 16 and erode(full, 1)[0, 1:5, 1:5].sum() == 16


# ----------------------------------------------------------------------------- NT-Xent
def test_nt_xent_by_hand_on_2d_embeddings():
    # a = b = (1, 0) labelled 1, c = d = (0, 1) labelled 0: every positive pair has cos 1 and
    # two negatives at cos 0: l = log(1 + 2 exp(-1 / tau)); all four pairs equal
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0], [0.0, 3.0]])
    labels = torch.tensor([1, 1, 0, 0])
    for tau in (1.0, 0.5):
        want = math.log(1 + 2 * math.exp(-1 / tau))
        assert abs(float(nt_xent(z, labels, tau)) - want) < 1e-5
    # a = (1, 0), b = (0, 1) labelled 1, c = (-1, 0) labelled 0; pairs (a, b): s = 0, the
    # negative of a at cos -1 -> log(1 + exp(-1/tau)); (b, a): the negative at cos 0 -> log 2;
    # c has no positive. Mean of the two.
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    tau = 0.5
    want = (math.log(1 + math.exp(-1 / tau)) + math.log(2)) / 2
    assert abs(float(nt_xent(z, torch.tensor([1, 1, 0]), tau)) - want) < 1e-5
    # no positive pair: 0
    assert float(nt_xent(z[:2], torch.tensor([1, 0]), tau)) == 0.0


def test_boundary_loss_skips_images_without_the_class():
    y = torch.zeros(2, 6, 6, dtype=torch.long)
    y[0, 1:4, 1:4] = 1
    emb = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    # image 1 has no class-1 pixel: only image 0's two embeddings (one per pass) per region
    got = boundary_loss([emb, emb * 2], y, 2, 0.05, 1, 1)
    contour, background = boundary_regions(y[:1], 1, 1, 1)
    zc = (emb[0] * contour[0]).sum((1, 2)) / contour.sum()
    zb = (emb[0] * background[0]).sum((1, 2)) / background.sum()
    z = torch.stack([zc, zb, 2 * zc, 2 * zb])
    want = nt_xent(z, torch.tensor([1, 0, 1, 0]), 0.05)
    assert torch.allclose(got, want, atol=1e-5)


# ----------------------------------------------------------------------------- fast weights
def test_fast_weight_step_is_a_clipped_sgd_step():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    x, t = torch.randn(5, 3), torch.randn(5, 2)
    loss = ((lin(x) - t) ** 2).sum()
    named = list(lin.named_parameters())
    fast = fast_weights(named, loss, 0.1, 1e9, second_order=False)
    grads = torch.autograd.grad(((lin(x) - t) ** 2).sum(), list(lin.parameters()))
    for (n, p), g in zip(named, grads, strict=True):
        assert torch.allclose(fast[n], p - 0.1 * g, atol=F32)
    # clip 0.5: every gradient element clamped to [-0.5, 0.5] first
    fast = fast_weights(named, ((lin(x) - t) ** 2).sum(), 0.1, 0.5, second_order=False)
    for (n, p), g in zip(named, grads, strict=True):
        assert torch.allclose(fast[n], p - 0.1 * g.clamp(-0.5, 0.5), atol=F32)


def test_meta_gradient_by_hand_second_and_first_order():
    # L_in = theta^2 / 2 -> theta' = (1 - beta) theta; L_out = theta'^2 / 2.
    # second order: dL_out/dtheta = theta' (1 - beta) = (1 - beta)^2 theta
    # first order (inner gradient a constant): dL_out/dtheta = theta' = (1 - beta) theta
    beta, th = 0.1, 2.0
    for second, want in ((True, (1 - beta) ** 2 * th), (False, (1 - beta) * th)):
        theta = torch.tensor(th, requires_grad=True)
        fast = fast_weights([("t", theta)], theta**2 / 2, beta, 100.0, second_order=second)
        (fast["t"] ** 2 / 2).backward()
        assert abs(float(theta.grad) - want) < 1e-6


def _tiny_unet():
    torch.manual_seed(0)
    return UNet(num_classes=3, in_channels=1, width=2)


def _batch():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2, 1, 16, 16, generator=g)
    xf = torch.rand(2, 1, 16, 16, generator=g)
    y = torch.zeros(2, 16, 16, dtype=torch.long)
    y[:, 3:9, 3:10] = 1
    y[:, 5:7, 5:8] = 2
    return x, xf, y


def test_outer_loss_reaches_theta_through_the_fast_weights_unet():
    """On a tiny U-Net, the gradient of the outer Dice term w.r.t. theta is, with
    theta' = theta - beta g_in (clip inactive), g' - beta H_in g' (second order) and g'
    (first order), g' = grad of L_out at theta'; H_in g' from an independent double backward."""
    x, xf, y = _batch()
    beta = 1e-2
    grads = {}
    for order in (1, 2):
        model = _tiny_unet()
        params = ELCFSParams(meta_step=beta, clip=1e6, order=order, gamma=0.0)
        _, parts = episodic_loss(model, joint_loss, x, xf, y, params, 3)
        grads[order] = torch.autograd.grad(parts["outer_seg"], list(model.parameters()))
    # reference: fast weights by hand, g' at theta', then the Hessian-vector product
    model = _tiny_unet()
    ps = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    g_in = torch.autograd.grad(joint_loss(model(x), y), ps, create_graph=True)
    theta_p = {
        n: (p - beta * g).detach().requires_grad_(True)
        for n, p, g in zip(names, ps, g_in, strict=True)
    }
    out = joint_loss(functional_call(model, theta_p, (xf,)), y)
    g_p = torch.autograd.grad(out, list(theta_p.values()))
    hvp = torch.autograd.grad(g_in, ps, grad_outputs=g_p)
    for a, gp in zip(grads[1], g_p, strict=True):
        assert torch.allclose(a, gp, atol=1e-5)
    for a, gp, h in zip(grads[2], g_p, hvp, strict=True):
        assert torch.allclose(a, gp - beta * h, atol=1e-5)
    assert any(not torch.allclose(a, b, atol=1e-7) for a, b in zip(grads[1], grads[2], strict=True))


def test_boundary_term_reaches_every_pass():
    x, xf, y = _batch()
    model = _tiny_unet()
    total, parts = episodic_loss(model, joint_loss, x, xf, y, ELCFSParams(), 3)
    assert float(parts["boundary"].detach()) > 0
    assert torch.allclose(total, parts["inner"] + parts["outer_seg"] + 0.1 * parts["boundary"])
    g = torch.autograd.grad(parts["boundary"], list(model.stages.parameters()), allow_unused=True)
    assert all(t is not None and t.abs().sum() > 0 for t in g)


# ----------------------------------------------------------------------------- runs
def test_run_accounts_the_bank_in_the_setup_exchange(tmp_path):
    """toyseg: 3 clients x 12 training images x 3 x 32 x 32 float32 spectra go up once; each
    client receives the other two clients' spectra (twice the upload in total)."""
    from fedshift.runtime.simulation import run_experiment

    res = run_experiment(
        seg_cfg("algorithm.name=elcfs", "algorithm.order=1", rounds=1),
        run_dir=tmp_path / "run", progress=False, workers=1,
    ).summary  # fmt: skip
    up = 3 * 12 * 3 * 32 * 32 * 4
    assert res["bytes_setup_by_direction"] == {"up": up, "down": 2 * up}
    assert res["bytes_by_record"]["up"]["cfsi_amplitudes"] == up
    assert res["bytes_by_record"]["down"]["cfsi_bank"] == 2 * up
    assert math.isfinite(res["test_mean"])
    assert [a["name"] for a in res["config"]["augment"]] == ["cfsi"]
    # client2 held out: the bank holds two clients' spectra, each sent to the other only
    res = run_experiment(
        seg_cfg("algorithm.name=elcfs", "algorithm.order=1", "federation.holdout=[client2]",
                rounds=1),
        run_dir=tmp_path / "held", progress=False, workers=1,
    ).summary  # fmt: skip
    assert res["bytes_setup_by_direction"] == {"up": 2 * up // 3, "down": 2 * up // 3}
    assert math.isfinite(res["target_test_mean"])


def test_elcfs_refuses_classification(make_cfg):
    with pytest.raises(ConfigError, match="segmentation only"):
        make_cfg("algorithm.name=elcfs")
