"""The pip-installed package `reco` (python/reco): its typed functions against the plain-torch
formulas of tests/torch/test_ops.py (forward and gradient), a step split into two micro-batches
through plan_summary / planned_policy_loss against one call on the whole step, the stats dict,
token_logp_entropy against log_softmax, and its argument errors.

Run with the interpreter the package was installed into, from outside the repository root:
    python tests/python/test_package.py
"""
import os
import sys
import unittest

import torch

import reco

# The formulas of the op tests, loaded against the installed library.
os.environ["RECO_TORCH_OPS"] = reco.library_path()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "torch"))
_argv, sys.argv = sys.argv, sys.argv[:1]
import test_ops as formulas  # noqa: E402
sys.argv = _argv


def inputs(b):
    return dict(old_logp=b["old"], ref_logp=b["ref"], mask=b["mask"], rewards=b["rewards"],
                group_offsets=b["group_offsets"])


class Package(unittest.TestCase):
    def test_policy_loss_matches_formulas(self):
        for name, fn in (("grpo", formulas.grpo_loss), ("reco", formulas.reco_loss)):
            for seed in (1, 2):
                b = formulas.make_batch(seed)
                logp = b["logp"].clone().requires_grad_(True)
                out = reco.policy_loss(name, logp, **inputs(b))
                out.loss.backward()
                want, want_grad = formulas.run_formula(fn, b)
                self.assertLessEqual(abs(out.loss.item() - want.item()), 1e-10, name)
                self.assertLessEqual((logp.grad - want_grad).abs().max().item(), 1e-10, name)
                self.assertEqual(logp.grad[~b["mask"]].abs().sum().item(), 0.0)
                stats = out.stats_dict()
                self.assertEqual(list(stats), reco.stat_names())
                self.assertEqual(stats[reco.stat_names()[0]], out.stats[0].item())

    def test_compositions_by_name_and_config(self):
        import json
        import tempfile
        b = formulas.make_batch(5)
        # The reco preset spelled as a composition, by compose() and by a JSON config with a choice
        # given by its label: bit for bit the preset.
        name = reco.compose(advantage="grpo", ratio="variance", clip="ppo", weight="expected_count", kl="kl_penalty")
        self.assertEqual(name, "advantage=grpo ratio=variance clip=ppo weight=expected_count kl=kl_penalty")
        keys = {"clip.dual_clip_c": 3.0, "weight.cap": 10.0}
        want = reco.policy_loss("reco", b["logp"], **inputs(b)).loss
        got = reco.policy_loss(name, b["logp"], overrides={**keys, "clip.dual_clip": 1.0}, **inputs(b)).loss
        self.assertTrue(torch.equal(got, want))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "objective.json")
            with open(path, "w") as f:
                json.dump({"objective": {"advantage": "grpo", "ratio": "variance", "weight": "expected_count",
                                         "kl": "kl_penalty"},
                           "overrides": {**keys, "clip.dual_clip": "hard"}}, f)
            cname, coverrides = reco.load_objective(path)
        self.assertEqual(coverrides["clip.dual_clip"], 1.0)
        self.assertTrue(torch.equal(reco.policy_loss(cname, b["logp"], overrides=coverrides, **inputs(b)).loss, want))
        # as_composition: a preset's spelling reproduces it; varying one slot changes the loss.
        pname, pover = reco.as_composition("reco")
        self.assertTrue(torch.equal(reco.policy_loss(pname, b["logp"], overrides=pover, **inputs(b)).loss, want))
        self.assertIn("variance", reco.composition_slots()["ratio"])
        self.assertEqual(reco.choice_labels("grpo")["clip.dual_clip"], ["off", "hard", "soft"])
        for bad in (lambda: reco.compose(rato="token"), lambda: reco.compose(ratio="varience"),
                    lambda: reco.load_objective({"objective": {"ratio": "token"}, "preset": "grpo"}),
                    lambda: reco.load_objective({"preset": "grpo", "overrides": {"clip.dual_clip": "firm"}})):
            with self.assertRaises(ValueError):
                bad()

    def test_overrides_change_the_loss(self):
        b = formulas.make_batch(3)
        self.assertIn("clip.eps_high", reco.override_keys("grpo"))
        base = reco.policy_loss("grpo", b["logp"], **inputs(b)).loss.item()
        wide = reco.policy_loss("grpo", b["logp"], overrides={"clip.eps_high": 0.5}, **inputs(b)).loss.item()
        want = formulas.grpo_loss(b, b["logp"], eps_high=0.5).item()
        self.assertLessEqual(abs(wide - want), 1e-10)
        self.assertNotEqual(base, wide)

    def test_split_step_equals_whole_step(self):
        b = formulas.make_batch(4)
        R, G = b["logp"].shape[0], b["G"]
        half = (R // G // 2) * G  # whole groups in each micro-batch
        whole = reco.policy_loss("reco", b["logp"], **inputs(b)).loss.item()
        parts = []
        for lo, hi in ((0, half), (half, R)):
            t = {k: v[lo:hi] for k, v in (("logp", b["logp"]), ("old_logp", b["old"]), ("ref_logp", b["ref"]),
                                          ("mask", b["mask"]), ("rewards", b["rewards"]))}
            t["group_offsets"] = torch.arange(0, hi - lo + 1, G, dtype=torch.int64)
            parts.append(([1, R, lo, lo // G], t))
        summaries = []
        while True:
            s = sum(reco.plan_summary("reco", p, 1.0, summaries, t["logp"],
                                      **{k: v for k, v in t.items() if k != "logp"}) for p, t in parts)
            if s.numel() == 0:
                break
            summaries.append(s)
        total = sum(reco.planned_policy_loss("reco", p, 1.0, summaries, t["logp"],
                                             **{k: v for k, v in t.items() if k != "logp"}).loss.item()
                    for p, t in parts)
        self.assertLessEqual(abs(total - whole), 1e-12 * max(1.0, abs(whole)))

    def test_given_advantages_and_group_size(self):
        # The estimator's advantages given with group_size reproduce the rewards-based loss, in
        # one call and in a split step.
        b = formulas.make_batch(6)
        R, G = b["logp"].shape[0], b["G"]
        adv = formulas.group_advantages(b["rewards"], G)
        want = reco.policy_loss("reco", b["logp"], **inputs(b)).loss.item()
        given = dict(old_logp=b["old"], ref_logp=b["ref"], mask=b["mask"], advantages=adv)
        got = reco.policy_loss("reco", b["logp"], group_size=G, **given).loss.item()
        self.assertLessEqual(abs(got - want), 1e-12 * max(1.0, abs(want)))
        parts = [([2, R, 0, 0], {k: v[:G] for k, v in given.items()}),
                 ([2, R, G, 1], {k: v[G:] for k, v in given.items()})]
        logps = [b["logp"][:G], b["logp"][G:]]
        summaries = []
        while True:
            s = sum(reco.plan_summary("reco", p, 1.0, summaries, lp, group_size=G, **t)
                    for (p, t), lp in zip(parts, logps))
            if s.numel() == 0:
                break
            summaries.append(s)
        total = sum(reco.planned_policy_loss("reco", p, 1.0, summaries, lp, group_size=G, **t).loss.item()
                    for (p, t), lp in zip(parts, logps))
        self.assertLessEqual(abs(total - want), 1e-12 * max(1.0, abs(want)))
        with self.assertRaisesRegex(Exception, "group_size"):
            reco.policy_loss("reco", b["logp"], **given)

    def test_token_logp_entropy(self):
        g = torch.Generator().manual_seed(5)
        logits = torch.randn(3, 7, 11, generator=g)
        tokens = torch.randint(0, 11, (3, 7), generator=g)
        logp, ent = reco.token_logp_entropy(logits, tokens, temperature=0.7)
        ls = torch.log_softmax(logits.double() / 0.7, -1)
        self.assertLessEqual((logp.double() - ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)).abs().max().item(), 1e-5)
        self.assertLessEqual((ent.double() + (ls.exp() * ls).sum(-1)).abs().max().item(), 1e-5)

    def test_build_info(self):
        # What the installed op library was built with: the torch it runs with, and the CUDA ops
        # exactly when the build had them (RECO_EXPECT_CUDA_OPS, set by scripts/test.sh).
        info = reco.build_info()
        self.assertEqual(info["torch"], torch.__version__)
        self.assertEqual(info["torch_runtime"], torch.__version__)
        self.assertEqual(info["torch_cuda"], torch.version.cuda or "")
        self.assertEqual(info["cxx11_abi"], torch.compiled_with_cxx11_abi())
        self.assertTrue(info["compiler"])
        expected = os.environ.get("RECO_EXPECT_CUDA_OPS")
        if expected is not None:
            self.assertEqual(info["cuda"], expected == "1")
        if info["cuda"]:
            self.assertTrue(info["cuda_architectures"] and info["nvcc"])
        # CPU tensors run either way; CUDA tensors exactly when the CUDA ops were built (and a
        # device exists).
        b = formulas.make_batch(1)
        self.assertTrue(torch.isfinite(reco.policy_loss("grpo", b["logp"], **inputs(b)).loss))
        if torch.cuda.is_available():
            cuda = {k: v.cuda() for k, v in inputs(b).items()}
            if info["cuda"]:
                out = reco.policy_loss("grpo", b["logp"].cuda(), **cuda)
                want = reco.policy_loss("grpo", b["logp"], **inputs(b)).loss
                self.assertLessEqual(abs(out.loss.item() - want.item()), 1e-10)
            else:
                with self.assertRaises(Exception):
                    reco.policy_loss("grpo", b["logp"].cuda(), **cuda)

    def test_errors_name_the_argument(self):
        b = formulas.make_batch(6)
        with self.assertRaisesRegex(ValueError, "advantages: preset .grpo. computes advantages from rewards"):
            reco.policy_loss("grpo", b["logp"], advantages=b["rewards"], **inputs(b))
        with self.assertRaisesRegex(TypeError, "unknown input"):
            reco.plan_summary("grpo", [0, 20, 0, 0], 1.0, [], b["logp"], reward=b["rewards"])
        with self.assertRaisesRegex((RuntimeError, ValueError), "no_such_preset"):
            reco.policy_loss("no_such_preset", b["logp"], **inputs(b))


if __name__ == "__main__":
    unittest.main()
