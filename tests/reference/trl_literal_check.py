"""TRL's GRPO loss types and switches, written as TRL's _compute_loss writes them in PyTorch
(autograd for the gradient), against the reference's loss and gradient on random padded batches.

Covers delta (two-sided clip), use_bias_correction_kl, vespo (get_gamma_weights), luspo at
sequence-level importance sampling, and bnpo. Usage: trl_literal_check.py <reco_reference_trl_dump>.
"""
import json
import math
import subprocess
import sys

import torch

torch.set_default_dtype(torch.float64)


def trl_loss(d, loss_type, epsilon=0.2, epsilon_high=0.2, delta=None, beta=0.0, bias_correction_kl=False,
             level="token", k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    R, T = d["R"], d["T"]
    logp = torch.tensor(d["logp"]).view(R, T).clone().requires_grad_(True)
    old = torch.tensor(d["old_logp"]).view(R, T)
    ref = torch.tensor(d["ref_logp"]).view(R, T)
    mask = torch.tensor(d["mask"]).view(R, T)
    adv = torch.tensor(d["advantages"]).unsqueeze(1)

    log_ratio = logp - old
    if level == "token":
        log_weights = log_ratio
    else:
        log_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_weights)
    if beta != 0.0:
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        if bias_correction_kl:
            kl = kl * coef_1
    if loss_type == "vespo":
        with torch.no_grad():  # the gamma weight is detached
            seq = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
            log_w = torch.clamp(seq, math.log(1e-8), 20.0)
            k = torch.where(adv >= 0, torch.tensor(k_pos), torch.tensor(k_neg))
            lam = torch.where(adv >= 0, torch.tensor(lambda_pos), torch.tensor(lambda_neg))
            phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        per_token = -phi * adv * logp
    else:
        coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon_high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    if beta != 0.0:
        per_token = per_token + beta * kl
    if loss_type in ("bnpo", "vespo"):
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "luspo":
        loss = (per_token * mask).sum(-1).mean()
    else:
        raise ValueError(loss_type)
    loss.backward()
    return loss.item(), (logp.grad * mask).reshape(-1)


CASES = {
    "bnpo": dict(loss_type="bnpo"),
    "bnpo_delta_1.5": dict(loss_type="bnpo", delta=1.5),
    "bnpo_delta_1.1": dict(loss_type="bnpo", delta=1.1),
    "bnpo_delta_0.95_eps_high_0.28": dict(loss_type="bnpo", delta=0.95, epsilon_high=0.28),
    "bnpo_kl": dict(loss_type="bnpo", beta=0.04),
    "bnpo_kl_bias_correction": dict(loss_type="bnpo", beta=0.04, bias_correction_kl=True),
    "vespo": dict(loss_type="vespo"),
    "luspo": dict(loss_type="luspo", level="sequence"),
}
# Each switch must change the result on some batch, or the comparison would prove nothing.
SWITCHES = [("bnpo_delta_1.5", "bnpo"), ("bnpo_delta_1.1", "bnpo"), ("bnpo_delta_0.95_eps_high_0.28", "bnpo"),
            ("bnpo_kl_bias_correction", "bnpo_kl")]


def main():
    dump = sys.argv[1]
    worst = 0.0
    changed = {pair: 0.0 for pair in SWITCHES}
    failures = 0
    for seed in range(1, 41):
        d = json.loads(subprocess.run([dump, str(seed)], capture_output=True, text=True, check=True).stdout)
        for name, kwargs in CASES.items():
            loss, grad = trl_loss(d, **kwargs)
            want = d["cases"][name]
            want_grad = torch.tensor(want["grad"])
            scale = 1.0 + want_grad.abs().max().item()
            err = max(abs(loss - want["loss"]) / (1.0 + abs(loss)), (grad - want_grad).abs().max().item() / scale)
            worst = max(worst, err)
            if not err <= 1e-12:
                failures += 1
                print(f"seed {seed} {name}: TRL loss {loss!r}, reference {want['loss']!r}, relative error {err:.3g}")
        for on, off in SWITCHES:
            changed[(on, off)] += abs(d["cases"][on]["loss"] - d["cases"][off]["loss"])
    for (on, off), total in changed.items():
        if total == 0.0:
            failures += 1
            print(f"{on} never differs from {off}: the switch is not exercised")
    print(f"worst relative difference {worst:.3g} over 40 batches x {len(CASES)} cases")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
