"""Objectives composed at run time through torch.ops.reco (reco/composition.hpp): a name
"slot=kind ..." wherever a preset name goes.

- 240 random compositions, each the components of a preset (or peer preset) with a random
  aggregation, a KL term on or off and random constants by key, with rewards or with given
  advantages: the composition's loss, gradient and stats are bit for bit those of the preset's
  static form (the fixed C++ composition of the same components) with the same keys.
- A KL term added by key to a preset without one, against the plain-torch formula.
- Errors: unknown slot or kind, a key of a component not chosen, advantages against the
  composition's advantage slot, a self-clipped ratio with a clip.

Usage: python3 test_compose_ops.py <path to libreco_torch_ops.so>   (ctest passes it)
"""
import os
import random
import sys
import unittest

import torch

LIB = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RECO_TORCH_OPS", "")
torch.ops.load_library(LIB)
reco = torch.ops.reco
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_given_ops as given_ops  # noqa: E402  (its batches; it loads the same library)


def make_batch(seed):
    """test_given_ops' batch (a group of equal rewards, an empty response), plus response weights."""
    b = given_ops.make_batch(seed, prompts=4, G=4, T=9)
    b["weights"] = torch.rand(b["R"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5
    return b


def slots_of(spec):
    return dict(item.split("=", 1) for item in spec.split())


def call(name, b, overrides, given):
    """(loss, stats, d loss / d logp, d loss / d entropy) of one call."""
    slots = slots_of(name) if "=" in name else slots_of(list(reco.as_composition(name))[0])
    kw = dict(old_logp=b["old"], mask=b["mask"], overrides=overrides)
    if given == "token":  # advantages per token
        kw["token_advantages"] = torch.full_like(b["logp"], 0.25)
        kw["group_offsets"] = b["group_offsets"]
    elif given:
        kw["advantages"] = b["adv"]
        kw["group_offsets"] = b["group_offsets"]
    else:
        kw["rewards"] = b["rewards"]
        kw["group_offsets"] = b["group_offsets"]
    if slots.get("kl") == "kl_penalty" or any(k.startswith("kl.") for k in overrides):
        kw["ref_logp"] = b["ref"]
    if slots.get("select") == "top_entropy" or slots.get("clip") == "entropy_split" or slots.get("entropy") == "entropy_bonus":
        kw["entropy"] = b["entropy"].clone().requires_grad_(slots.get("entropy") == "entropy_bonus")
    if slots.get("weight") == "caller":
        kw["response_weights"] = b["weights"]
    logp = b["logp"].clone().requires_grad_(True)
    loss, stats = reco.policy_loss(name, logp, **kw)
    loss.backward()
    ent = kw.get("entropy")
    return loss.detach(), stats, logp.grad, (ent.grad if ent is not None and ent.requires_grad else None)


def presets_without_covariance():
    names = list(reco.presets()) + list(reco.peer_presets())[0::2]
    return [n for n in names if n not in ("clip_cov", "kl_cov")]


# Constants a draw may set (each kept only where the composition takes the key).
CANDIDATES = {
    "clip.eps_high": [0.28, 0.3], "clip.eps_low": [0.1, 0.2], "clip.dual_clip": [0.0, 1.0, 2.0],
    "ratio.log_ratio_clamp": [0.0, 20.0], "weight.cap": [0.0, 2.0, 10.0], "weight.normalise": [0.0, 1.0, 2.0],
    "select.rho": [0.2, 0.5], "select.denominator": [0.0, 1.0], "kl.beta": [0.001, 0.05],
    "kl.estimator": [0.0, 1.0, 2.0, 3.0], "advantage.eps": [1e-6, 1e-4], "entropy.coef": [0.01],
}


class Compositions(unittest.TestCase):
    def test_random_compositions_are_their_static_forms(self):
        rng = random.Random(20261124)
        names = presets_without_covariance()
        seen = set()
        for n in range(240):
            preset = rng.choice(names)
            given = rng.random() < 0.3
            spec, constants = reco.as_composition(preset)[0], reco.as_composition(preset)[1:]
            constants = dict((kv.split("=")[0], float(kv.split("=")[1])) for kv in constants)
            slots = slots_of(spec)
            overrides = {"aggregate.kind": float(rng.randrange(5))}
            if rng.random() < 0.5 and slots["kl"] == "none":
                overrides["kl.beta"] = 0.02  # the KL term added by key
            keys = set(reco.override_keys(preset)) | {"kl.beta", "kl.estimator"}
            for key, values in CANDIDATES.items():
                if key in keys and rng.random() < 0.3 and not (given and key.startswith("advantage.")):
                    if key.startswith("kl.") and slots["kl"] == "none" and "kl.beta" not in overrides:
                        continue
                    overrides[key] = rng.choice(values)
            # The composition: the preset's components by name; the KL term on if a key adds it.
            if any(k.startswith("kl.") for k in overrides):
                slots["kl"] = "kl_penalty"
            if given:
                slots["advantage"] = "given"
            composed = " ".join(f"{k}={v}" for k, v in slots.items())
            c_over = {k: v for k, v in constants.items() if not (given and k.startswith("advantage."))}
            if slots["kl"] == "kl_penalty" and "kl.beta" not in constants:
                c_over.update({"kl.beta": 0.001, "kl.estimator": 3.0, "kl.clamp": 1.0, "kl.straight_through": 0.0,
                               "kl.importance_weighted": 0.0})
            c_over.update(overrides)
            b = make_batch(1000 + n)
            want = call(preset, b, overrides, given)
            got = call(composed, b, c_over, given)
            label = f"#{n} {preset} given={given} {overrides} -> {composed}"
            self.assertTrue(torch.equal(got[0], want[0]), label + f": loss {got[0].item()} vs {want[0].item()}")
            self.assertTrue(torch.equal(got[1], want[1]), label + " stats")
            self.assertTrue(torch.equal(got[2], want[2]), label + " grad logp")
            if want[3] is not None:
                self.assertTrue(torch.equal(got[3], want[3]), label + " grad entropy")
            seen.add((composed, overrides["aggregate.kind"]))
        self.assertGreaterEqual(len(seen), 100)  # distinct combinations of components drawn

    def test_kl_added_by_key_is_the_formula(self):
        b = make_batch(7)
        base = call("dapo", b, {}, False)
        with_kl = call("dapo", b, {"kl.beta": 0.05, "kl.estimator": 2.0}, False)  # k2 = d^2 / 2
        d = b["logp"] - b["ref"]
        maskf = b["mask"].to(torch.float64)
        kl = 0.05 * ((0.5 * d * d) * maskf).sum() / maskf.sum()  # token-mean, as dapo's aggregation
        self.assertLessEqual(abs((with_kl[0] - base[0]).item() - kl.item()), 1e-14)
        grad_kl = 0.05 * d * maskf / maskf.sum()
        self.assertLessEqual((with_kl[2] - base[2] - grad_kl).abs().max().item(), 1e-15)
        self.assertIn("kl.beta", list(reco.override_keys("dapo")))

    def test_errors_name_the_argument(self):
        b = make_batch(3)
        cases = [
            ("ratio=varience", {}, False, "composition.ratio"),
            ("rato=variance", {}, False, "composition.rato"),
            ("ratio=token clip=none", {"clip.eps_high": 0.3}, False, "overrides.clip.eps_high"),
            ("ratio=cispo clip=ppo", {}, False, "clip.kind"),
            ("advantage=grpo ratio=token", {}, True, "advantages"),
            ("advantage=grpo ratio=token", {}, "token", "reco: token_advantages:"),
            ("advantage=given ratio=token", {}, False, "advantages"),
            ("ratio=token", {"kl.beta": 0.1}, False, "overrides.kl.beta"),
        ]
        for name, overrides, given, argument in cases:
            with self.assertRaises((RuntimeError, ValueError), msg=name) as ctx:
                call(name, b, overrides, given)
            self.assertIn(argument, str(ctx.exception), name)

    def test_slots_and_choices_are_listed(self):
        slots = dict(e.split("=", 1) for e in reco.composition_slots())
        self.assertEqual(list(slots), ["advantage", "ratio", "clip", "weight", "aggregate", "select", "kl", "entropy"])
        self.assertIn("variance", slots["ratio"].split("|"))
        labels = dict(e.split("=", 1) for e in reco.choice_labels("ratio=dppo clip=none"))
        self.assertEqual(labels["ratio.divergence"].split("|"), ["tv", "binary_kl"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=1)
