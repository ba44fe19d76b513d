"""The module API reco.nn.PolicyLoss against the functional reco.policy_loss: the same loss,
gradient and stats (bit for bit) for presets, peer presets and compositions given as a mapping,
with its typed arguments and choices given by label; its argument errors; the named result; the
documentation help() shows; the package's type marker.

Run with the interpreter the package was installed into:  python tests/python/test_nn.py
"""
import importlib.resources
import inspect
import os
import pydoc
import sys
import typing
import unittest

import torch

import reco
import reco.nn

os.environ["RECO_TORCH_OPS"] = reco.library_path()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
_argv, sys.argv = sys.argv, sys.argv[:1]
import test_ops as formulas  # noqa: E402
sys.argv = _argv


def batch(seed):
    b = formulas.make_batch(seed)
    return b, dict(old_logp=b["old"], ref_logp=b["ref"], mask=b["mask"], rewards=b["rewards"],
                   group_offsets=b["group_offsets"])


def run(fn, logp, **kw):
    x = logp.clone().requires_grad_(True)
    out = fn(x, **kw)
    out.loss.backward()
    return out, x.grad


class Module(unittest.TestCase):
    def same(self, module, preset, overrides, seed=1, **extra):
        b, kw = batch(seed)
        kw.update(extra)
        got, g_got = run(module, b["logp"], **kw)
        want, g_want = run(lambda x, **k: reco.policy_loss(preset, x, overrides=overrides, **k), b["logp"], **kw)
        self.assertTrue(torch.equal(got.loss, want.loss), preset)
        self.assertTrue(torch.equal(g_got, g_want), preset)
        self.assertTrue(torch.equal(got.stats, want.stats), preset)
        self.assertNotEqual(got.loss.item(), 0.0)
        return got

    def test_equals_the_functional_api(self):
        self.same(reco.nn.PolicyLoss("grpo"), "grpo", {})
        self.same(reco.nn.PolicyLoss("dapo", eps_high=0.3, dual_clip="off", kl_beta=0.01, kl_estimator="k2"), "dapo",
                  {"clip.eps_high": 0.3, "clip.dual_clip": 0.0, "kl.beta": 0.01, "kl.estimator": 2.0}, seed=2)
        self.same(reco.nn.PolicyLoss("reco", weight_cap=5.0, dual_clip="soft", aggregation="token_mean"), "reco",
                  {"weight.cap": 5.0, "clip.dual_clip": 2.0, "aggregate.kind": 0.0}, seed=3)
        self.same(reco.nn.PolicyLoss("verl_vanilla"), "verl_vanilla", {}, seed=4)
        slots = {"advantage": "rloo", "ratio": "variance", "clip": "ppo", "weight": "expected_count",
                 "kl": "kl_penalty"}
        name = reco.compose(**slots)
        self.same(reco.nn.PolicyLoss(slots, weight_cap=2.0, kl_importance_weighted=True,
                                     overrides={"weight.normalise": "batch_mean"}),
                  name, {"weight.cap": 2.0, "kl.importance_weighted": 1.0, "weight.normalise": 2.0}, seed=5)

    def test_group_size_and_given_advantages(self):
        b, kw = batch(6)
        G = b["G"]
        adv = formulas.group_advantages(b["rewards"], G)
        module = reco.nn.PolicyLoss("reco", group_size=G)
        given = dict(old_logp=b["old"], ref_logp=b["ref"], mask=b["mask"], advantages=adv)
        got = module(b["logp"], **given).loss
        want = reco.policy_loss("reco", b["logp"], group_size=G, **given).loss
        self.assertTrue(torch.equal(got, want))
        # Groups given at the call take the place of the constructor's group size.
        self.assertTrue(torch.equal(module(b["logp"], group_offsets=b["group_offsets"], **given).loss, want))

    def test_named_result(self):
        b, kw = batch(7)
        out = reco.nn.PolicyLoss("grpo")(b["logp"], **kw)
        self.assertIsInstance(out, reco.nn.LossOutput)
        self.assertEqual(out._fields, ("loss", "stats"))
        metrics = out.metrics()
        self.assertEqual(list(metrics), reco.stat_names())
        self.assertEqual(metrics["clip_frac"], reco.policy_loss("grpo", b["logp"], **kw).stats_dict()["clip_frac"])

    def test_errors_name_the_argument(self):
        cases = [
            (lambda: reco.nn.PolicyLoss("nope"), "objective: unknown preset 'nope'"),
            (lambda: reco.nn.PolicyLoss("grpo", weight_cap=5.0), "weight_cap: 'grpo' has no weight.cap"),
            (lambda: reco.nn.PolicyLoss("grpo", dual_clip="firm"), "dual_clip: 'firm' is not one of off, hard, soft"),
            (lambda: reco.nn.PolicyLoss("grpo", dual_clip=1), "dual_clip: clip.dual_clip is a choice"),
            (lambda: reco.nn.PolicyLoss("grpo", eps_high="wide"), "eps_high: clip.eps_high is a number"),
            (lambda: reco.nn.PolicyLoss("grpo", eps_high=float("nan")), "eps_high: nan must be finite"),
            (lambda: reco.nn.PolicyLoss("grpo", overrides={"clip.eps_hi": 0.1}), "no key 'clip.eps_hi'"),
            (lambda: reco.nn.PolicyLoss("grpo", eps_high=0.3, overrides={"clip.eps_high": 0.1}),
             "also set by a named argument"),
            (lambda: reco.nn.PolicyLoss({"ratio": "varience"}), "varience"),
            (lambda: reco.nn.PolicyLoss("grpo", group_size=-1), "group_size"),
        ]
        for make, message in cases:
            with self.assertRaisesRegex(ValueError, message):
                make()
        b, kw = batch(8)
        # Ranges are checked by the op at the call; the error names the module's argument.
        with self.assertRaisesRegex(ValueError, "reco.nn.PolicyLoss: eps_high = -1: must be finite and >= 0"):
            reco.nn.PolicyLoss("grpo", eps_high=-1.0)(b["logp"], **kw)
        with self.assertRaisesRegex(ValueError, r"reco.nn.PolicyLoss: overrides\['clip.eps_low'\] = -0.5"):
            reco.nn.PolicyLoss("grpo", overrides={"clip.eps_low": -0.5})(b["logp"], **kw)

    def test_documented_and_typed(self):
        text = pydoc.render_doc(reco.nn.PolicyLoss, renderer=pydoc.plaintext)
        for word in ("eps_high", "dual_clip", '"hard"', "weight_cap", "group_size", "reco.override_keys"):
            self.assertIn(word, text)
        self.assertIn("one batch", pydoc.render_doc(reco.nn.PolicyLoss.forward, renderer=pydoc.plaintext))
        hints = typing.get_type_hints(reco.nn.PolicyLoss.__init__)
        self.assertEqual(hints["eps_high"], typing.Optional[float])
        self.assertEqual(hints["dual_clip"], typing.Optional[str])
        self.assertEqual(hints["group_size"], int)
        self.assertIs(typing.get_type_hints(reco.nn.PolicyLoss.forward)["return"], reco.nn.LossOutput)
        # Every public function of the package is annotated, and the package carries py.typed.
        for module in (reco, reco.batch, reco.metrics, reco.nn):
            for name in module.__all__:
                obj = getattr(module, name)
                if inspect.isfunction(obj):
                    self.assertIn("return", typing.get_type_hints(obj), f"{module.__name__}.{name}")
        self.assertTrue(importlib.resources.files("reco").joinpath("py.typed").is_file())


if __name__ == "__main__":
    unittest.main()
