"""KL penalty estimators (Schulman 2020 k1/k2/k3), hand-computed."""

import math

import pytest
import torch

from harness.algo import KL_CONTROLLERS, KL_ESTIMATORS, kl_penalty

LOGP = torch.tensor([[-1.0]])
REF = torch.tensor([[-1.5]])


@pytest.mark.parametrize(
    "form,expected",
    [
        ("k1", 0.5),  # -1.0 - (-1.5)
        ("k2", 0.125),  # 0.5 * 0.5^2
        ("k3", math.exp(-0.5) + 0.5 - 1.0),  # 0.106531
        ("kl", 0.5),
        ("mse", 0.125),
        ("low_var_kl", 0.106531),
    ],
)
def test_kl_forms_hand(form, expected):
    assert float(kl_penalty(LOGP, REF, form)) == pytest.approx(expected, abs=1e-6)


def test_k3_gradient_and_nonnegativity():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    kl_penalty(logp, REF, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    assert float(logp.grad) == pytest.approx(1 - math.exp(-0.5), abs=1e-6)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    assert (kl_penalty(a, b, "k3") >= 0).all() and (kl_penalty(a, b, "k2") >= 0).all()
    assert torch.equal(kl_penalty(a, a, "k3"), torch.zeros(4, 7))


def test_clamp_default_none_and_mask():
    logp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[30.0, -1.5]])
    raw = kl_penalty(logp, ref, "k3")
    assert float(raw[0, 0]) == pytest.approx(math.exp(30) - 31, rel=1e-5)  # no clamp by default
    clamped = kl_penalty(logp, ref, "k3", clamp=10.0)
    assert float(clamped[0, 0]) == 10.0
    assert float(clamped[0, 1]) == pytest.approx(0.106531, abs=1e-6)
    masked = kl_penalty(LOGP.expand(1, 2), REF.expand(1, 2), "k1", mask=torch.tensor([[1, 0]]))
    assert masked.tolist() == [[0.5, 0.0]]


def test_errors_list_valid_names():
    with pytest.raises(ValueError) as e:
        kl_penalty(LOGP, REF, "k4")
    for name in ("k1", "k2", "k3", "low_var_kl"):
        assert name in str(e.value)
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(LOGP, torch.zeros(1, 2), "k1")
    with pytest.raises(ValueError, match="clamp"):
        kl_penalty(LOGP, REF, "k3", clamp=0.0)


def _verl_adaptive(value: float, current_kl: float, n_steps: int, target: float, horizon: int) -> float:
    """verl ``AdaptiveKLController.update`` (core_algos.py), written out from its formula."""
    err = min(max(current_kl / target - 1, -0.2), 0.2)
    return value * (1 + err * n_steps / horizon)


def test_adaptive_kl_controller_hand_values_verl_golden_and_floor():
    adaptive = KL_CONTROLLERS.get("adaptive")
    # hand values: KL at half the target -> e = -0.2 (clipped from -0.5); 16 samples over 100
    assert adaptive(0.1, 0.05, 16, 0.1, 100) == pytest.approx(0.1 * (1 - 0.2 * 0.16), rel=1e-12)
    # KL 10% above target -> e = +0.1
    assert adaptive(0.1, 0.11, 16, 0.1, 100) == pytest.approx(0.1 * (1 + 0.1 * 0.16), rel=1e-12)
    # golden: a trajectory where verl's coefficient stays positive is reproduced step by step
    ours = verl = 0.05
    for kl in (0.02, 0.3, 0.12, 0.09, 0.0, 0.5, 0.1):
        ours, verl = adaptive(ours, kl, 64, 0.1, 1000), _verl_adaptive(verl, kl, 64, 0.1, 1000)
        assert ours == pytest.approx(verl, rel=1e-12)
    # n / horizon > 5 with a KL under 0.8 target: verl's factor 1 - 0.2 * 8 = -0.6 turns beta
    # negative (rewarding distance from the reference); ours stops at 0 and stays there
    assert _verl_adaptive(0.1, 0.01, 80, 0.1, 10) == pytest.approx(-0.06)
    assert adaptive(0.1, 0.01, 80, 0.1, 10) == 0.0
    assert adaptive(0.0, 0.5, 80, 0.1, 10) == 0.0
    assert KL_CONTROLLERS.get("fixed")(0.1, 0.5, 80, 0.1, 10) == 0.1
    with pytest.raises(ValueError, match="kl.target"):
        adaptive(0.1, 0.1, 8, 0.0, 10)


@pytest.mark.parametrize("form,plain", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_forms_have_the_value_of_k_and_the_gradient_of_k2(form, plain):
    """verl's "+" forms: k1 / k3 in value, k2's gradient d/dlogp = logp - logref (float64)."""
    logp = torch.tensor([[-1.0, -2.0, -0.25]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5, -0.25]], dtype=torch.float64)
    st = kl_penalty(logp, ref, form)
    # by hand: x = ref - logp = [-0.5, 1.5, 0]; k1 = -x, k3 = e^x - x - 1
    want = {"k1": [0.5, -1.5, 0.0], "k3": [math.exp(-0.5) + 0.5 - 1, math.exp(1.5) - 1.5 - 1, 0.0]}[plain]
    assert st.tolist()[0] == pytest.approx(want, rel=1e-14, abs=0)
    assert torch.equal(st.detach(), kl_penalty(logp, ref, plain).detach())  # bit for bit
    st.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.5, -1.5, 0.0], rel=1e-14, abs=0)  # logp - ref
    g_plain = torch.autograd.grad(kl_penalty(logp, ref, plain).sum(), logp)[0]
    assert not torch.allclose(g_plain, logp.grad)  # k1's gradient is 1, k3's 1 - e^x: not k2's
    # the clamp bounds the value only (verl clamps the forward score); the gradient stays k2's
    lp = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    far = kl_penalty(lp, torch.tensor([[-30.0]], dtype=torch.float64), form, clamp=10.0)
    far.sum().backward()
    assert float(far.detach()) == 10.0 and float(lp.grad) == 30.0


@pytest.mark.parametrize("form", ["k1", "k3"])
def test_importance_corrected_kl_is_rho_times_k_with_the_unbiased_gradient(form):
    """DeepSeek-V3.2 / TRL use_bias_correction_kl: rho * k, rho = pi_theta / pi_old not detached.
    Gradient by hand: k3: rho (1 - e^x) + rho k3 = rho (logp - logref); k1: rho (1 + logp - logref)."""
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5]], dtype=torch.float64)
    old = torch.tensor([[-1.25, -2.0]], dtype=torch.float64)  # rho = [e^0.25, 1]
    out = kl_penalty(logp, ref, form, old_logprobs=old)
    rho = [math.exp(0.25), 1.0]
    k = {"k1": [0.5, -1.5], "k3": [math.exp(-0.5) + 0.5 - 1, math.exp(1.5) - 1.5 - 1]}[form]
    assert out.tolist()[0] == pytest.approx([rho[0] * k[0], k[1]], rel=1e-14, abs=0)
    out.sum().backward()
    grad = {"k1": [rho[0] * 1.5, -0.5], "k3": [rho[0] * 0.5, -1.5]}[form]
    assert logp.grad.tolist()[0] == pytest.approx(grad, rel=1e-14, abs=0)
    # on-policy (old = logp): the value is k's, k3's gradient becomes k2's (logp - logref)
    lp = logp.detach().clone().requires_grad_()
    on = kl_penalty(lp, ref, form, old_logprobs=lp.detach())
    assert torch.equal(on.detach(), kl_penalty(lp, ref, form).detach())
    with pytest.raises(ValueError, match="importance-corrected KL"):
        kl_penalty(lp, ref, "k2", old_logprobs=lp.detach())
    with pytest.raises(ValueError, match="old_logprobs must have the shape"):
        kl_penalty(lp, ref, "k3", old_logprobs=torch.zeros(1, 3))


def test_importance_corrected_kl_is_unbiased_off_policy():
    """Exact expectations over a 3-token vocabulary (no sampling): under pi_old,
    E[rho k3] = KL(pi_theta || pi_ref) and E[d(rho k3)/d theta] = d KL / d theta, while plain k3
    sampled from pi_old is biased in both."""
    theta = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    logp_all = torch.log_softmax(theta, -1)
    ref_all = torch.log_softmax(torch.tensor([0.0, 0.4, -0.3], dtype=torch.float64), -1)
    old_all = torch.log_softmax(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64), -1)
    w = old_all.exp()  # the tokens are drawn from pi_old
    kl_true = (logp_all.exp() * (logp_all - ref_all)).sum()
    corrected = (w * kl_penalty(logp_all[None], ref_all[None], "k3", old_logprobs=old_all[None])[0]).sum()
    plain = (w * kl_penalty(logp_all[None], ref_all[None], "k3")[0]).sum()
    assert float(corrected.detach()) == pytest.approx(float(kl_true.detach()), rel=1e-12)
    assert abs(float(plain.detach()) - float(kl_true.detach())) > 1e-3
    g_true, g_corr, g_plain = (torch.autograd.grad(v, theta, retain_graph=True)[0] for v in (kl_true, corrected, plain))
    assert g_corr.tolist() == pytest.approx(g_true.tolist(), rel=1e-12, abs=1e-15)
    assert not torch.allclose(g_plain, g_true, atol=1e-3)
