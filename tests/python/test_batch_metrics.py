"""The package's batch operations (reco.batch) and metrics (reco.metrics) against naive float64
implementations of their definitions written here (docs/batch_ops.md, docs/eval.md), and their
argument errors (ValueError naming the argument).

Against the installed package (scripts/test.sh), from outside the repository root:
    python tests/python/test_batch_metrics.py
Against a build's op library (ctest reco_python_batch_metrics_py): the package sources of this
checkout are staged in a temporary folder beside a link to that library:
    python tests/python/test_batch_metrics.py build/adapters/torch/libreco_torch_ops.so
"""
import math
import random
import sys
import unittest
from collections import Counter
from fractions import Fraction

import torch

from staged_package import stage_package  # noqa: E402

sys.argv = stage_package(sys.argv)

import reco  # noqa: E402

D = torch.float64


def close(test, got, want, tol=1e-12):
    got = [float(x) for x in (got.tolist() if isinstance(got, torch.Tensor) else got)]
    want = [float(x) for x in want]
    test.assertEqual(len(got), len(want))
    for g, w in zip(got, want):
        if math.isnan(w):
            test.assertTrue(math.isnan(g), (got, want))
        else:
            test.assertLessEqual(abs(g - w), tol * max(1.0, abs(w)), (got, want))


# ---- naive references ------------------------------------------------------------------------

def groups(offsets):
    return [(offsets[g], offsets[g + 1]) for g in range(len(offsets) - 1)]


def mean(xs):
    return sum(xs) / len(xs)


def std1(xs):  # unbiased
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def naive_advantages(name, s, offsets, lengths=None, eps=None, singleton="zero"):
    R = len(s)
    a = [0.0] * R
    for lo, hi in groups(offsets):
        g = s[lo:hi]
        G = len(g)
        if G == 0:
            continue
        if G == 1:
            if singleton == "raw_score":
                a[lo] = g[0] / (1 + (1e-6 if eps is None else eps)) if name in ("grpo", "pass_at_k") else g[0]
            continue
        m = mean(g)
        sd = std1(g)
        for j in range(lo, hi):
            if name == "grpo":
                e = 1e-6 if eps is None else eps
                a[j] = (s[j] - m) / (sd + e) if sd + e > 0 else 0.0
            elif name in ("dr_grpo", "batch_std", "gpg", "reinforce_pp"):
                a[j] = s[j] - m
            elif name == "rloo":
                a[j] = s[j] - mean([s[k] for k in range(lo, hi) if k != j])
            elif name == "opo":
                n = lengths[lo:hi]
                base = sum(x * y for x, y in zip(n, g)) / sum(n) if sum(n) > 0 else m
                a[j] = s[j] - base
        if name == "pass_at_k":
            best = max(range(G), key=lambda j: (g[j], -j))
            second = max(g[j] for j in range(G) if j != best)
            a[lo + best] = (g[best] - second) / (sd + 1e-6)
    if name == "batch_std":
        sb = std1(s)
        a = [x / (sb + 1e-6) for x in a]
    elif name == "gpg":
        nz = sum(1 for x in s if x != 0)
        a = [R / max(nz, 1) * x for x in a]
    elif name == "reinforce_pp":
        w = sum(lengths)
        mu = sum(n * x for n, x in zip(lengths, a)) / w
        var = sum(n * (x - mu) ** 2 for n, x in zip(lengths, a)) / (w - 1)
        a = [(x - mu) / math.sqrt(var + 1e-8) for x in a]
    return a


def ngrams(seq, n):
    return [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]


def naive_bleu(refs, hyp, N=4, smoothing="method1", eps=0.1):
    nums, dens = [], []
    for n in range(1, N + 1):
        hc = Counter(ngrams(hyp, n))
        most = Counter()
        for r in refs:
            for g, c in Counter(ngrams(r, n)).items():
                most[g] = max(most[g], c)
        nums.append(sum(min(c, most[g]) for g, c in hc.items()))
        dens.append(max(1, sum(hc.values())))
    if nums[0] == 0:
        return 0.0
    h = len(hyp)
    r = min((len(x) for x in refs), key=lambda L: (abs(L - h), L))
    bp = 1.0 if h > r else (0.0 if h == 0 else math.exp(1 - r / h))
    logs = 0.0
    for num, den in zip(nums, dens):
        if num == 0:
            p = eps / den if smoothing == "method1" else sys.float_info.min
        else:
            p = num / den
        logs += math.log(p) / N
    return bp * math.exp(logs)


def naive_self_bleu_each(resps, **kw):
    return [naive_bleu(resps[:h] + resps[h + 1:], resps[h], **kw) for h in range(len(resps))]


def naive_distinct(prompts, n, scope="pooled_per_prompt", denominator="ngrams"):
    values = []
    for resps in prompts:
        if scope == "pooled_per_prompt":
            grams = [g for r in resps for g in ngrams(r, n)]
            den = len(grams) if denominator == "ngrams" else sum(len(r) for r in resps)
            if den > 0:
                values.append(len(set(grams)) / den)
        else:
            per = []
            for r in resps:
                grams = ngrams(r, n)
                den = len(grams) if denominator == "ngrams" else len(r)
                if den > 0:
                    per.append(len(set(grams)) / den)
            if per:
                values.append(mean(per))
    return mean(values)


def words(texts):
    vocab = {}
    return [[vocab.setdefault(w, len(vocab)) for w in t.split()] for t in texts]


def rand_seqs(rng, k, vocab=4, max_len=12):
    return [[rng.randrange(vocab) for _ in range(rng.randrange(max_len + 1))] for _ in range(k)]


def packed(per_response):
    offs = [0]
    for r in per_response:
        offs.append(offs[-1] + len(r))
    return (torch.tensor([x for r in per_response for x in r], dtype=D), torch.tensor(offs, dtype=torch.int64))


# ---- tests -----------------------------------------------------------------------------------

class Advantages(unittest.TestCase):
    def batch(self, seed):
        rng = random.Random(seed)
        sizes = [4, 1, 3, 5, 2, 4]
        offs = [0]
        for g in sizes:
            offs.append(offs[-1] + g)
        s = [rng.choice([0.0, 1.0, 0.5, -1.0, 2.25]) for _ in range(offs[-1])]
        s[offs[5]:offs[6]] = [0.75] * 4  # a group whose rewards are all equal
        lengths = [rng.randrange(0, 9) for _ in s]
        lengths[offs[2]:offs[3]] = [0, 0, 0]  # a group of empty responses (OPO: plain mean)
        return s, offs, lengths

    def test_estimators_match_definitions(self):
        for seed in (1, 2, 3):
            s, offs, lengths = self.batch(seed)
            st, ot, lt = torch.tensor(s, dtype=D), torch.tensor(offs), torch.tensor(lengths)
            for name in reco.ESTIMATORS:
                kw = {"lengths": lt} if name in ("opo", "reinforce_pp") else {}
                got = reco.advantages(name, st, group_offsets=ot, **kw)
                self.assertEqual(got.dtype, D)
                close(self, got, naive_advantages(name, s, offs, lengths), 1e-12)

    def test_presets_use_their_estimator(self):
        s, offs, _ = self.batch(4)
        st, ot = torch.tensor(s, dtype=D), torch.tensor(offs)
        for preset in ("grpo", "reco", "dapo", "gspo", "rule_80_20"):
            close(self, reco.advantages(preset, st, group_offsets=ot), naive_advantages("grpo", s, offs))
        close(self, reco.advantages("dr_grpo", st, group_offsets=ot), naive_advantages("dr_grpo", s, offs))

    def test_same_as_inside_the_loss(self):
        # On-policy DAPO (ratio 1, token-mean): d loss / d logp of every token is -A_i / N.
        s, offs, _ = self.batch(8)
        st, ot = torch.tensor(s, dtype=D), torch.tensor(offs)
        R, T = len(s), 5
        logp = (-torch.rand(R, T, dtype=D, generator=torch.Generator().manual_seed(8))).requires_grad_(True)
        reco.policy_loss("dapo", logp, rewards=st, group_offsets=ot).loss.backward()
        adv = reco.advantages("dapo", st, group_offsets=ot)
        close(self, -logp.grad[:, 0] * (R * T), adv.tolist(), 1e-12)
        close(self, -logp.grad[:, T - 1] * (R * T), naive_advantages("grpo", s, offs), 1e-12)

    def test_prompt_ids_float32_and_overrides(self):
        s, offs, _ = self.batch(5)
        ids = torch.tensor([g * 7 + 3 for g, (lo, hi) in enumerate(groups(offs)) for _ in range(lo, hi)])
        st = torch.tensor(s, dtype=D)
        close(self, reco.advantages("grpo", st, prompt_ids=ids), naive_advantages("grpo", s, offs))
        close(self, reco.advantages("grpo", st.float(), group_offsets=torch.tensor(offs, dtype=torch.int32)),
              naive_advantages("grpo", [float(torch.tensor(x).float()) for x in s], offs))
        ot = torch.tensor(offs)
        close(self, reco.advantages("grpo", st, group_offsets=ot, overrides={"advantage.eps": 0.5}),
              naive_advantages("grpo", s, offs, eps=0.5))
        close(self, reco.advantages("reco", st, group_offsets=ot, overrides={"advantage.scale_by_std": 0}),
              naive_advantages("dr_grpo", s, offs))
        close(self, reco.advantages("grpo", st, group_offsets=ot, overrides={"advantage.singleton": 1}),
              naive_advantages("grpo", s, offs, singleton="raw_score"))

    def test_errors(self):
        s, offs, lengths = self.batch(6)
        st, ot, lt = torch.tensor(s, dtype=D), torch.tensor(offs), torch.tensor(lengths)
        cases = [
            ("rewards", lambda: reco.advantages("grpo", torch.where(st > 1, torch.nan, st), group_offsets=ot)),
            ("rewards", lambda: reco.advantages("grpo", st.long(), group_offsets=ot)),
            ("rewards", lambda: reco.advantages("grpo", st.unsqueeze(0), group_offsets=ot)),
            ("group_offsets", lambda: reco.advantages("grpo", st, group_offsets=ot + 1)),
            ("group_offsets", lambda: reco.advantages("grpo", st, group_offsets=ot[:-1])),
            ("group_offsets", lambda: reco.advantages("grpo", st, group_offsets=ot.flip(0))),
            ("group_offsets", lambda: reco.advantages("grpo", st)),
            ("group_offsets", lambda: reco.advantages("grpo", st, group_offsets=ot, prompt_ids=ot[1:])),
            ("group_offsets", lambda: reco.advantages("grpo", st, group_offsets=ot,
                                                      overrides={"advantage.singleton": 2})),
            ("prompt_ids", lambda: reco.advantages("grpo", st, prompt_ids=torch.arange(len(s)) % 2)),
            ("prompt_ids", lambda: reco.advantages("grpo", st, prompt_ids=torch.zeros(3, dtype=torch.int64))),
            ("lengths", lambda: reco.advantages("grpo", st, group_offsets=ot, lengths=lt)),
            ("lengths", lambda: reco.advantages("opo", st, group_offsets=ot)),
            ("lengths", lambda: reco.advantages("opo", st, group_offsets=ot, lengths=lt[1:])),
            ("lengths", lambda: reco.advantages("opo", st, group_offsets=ot, lengths=-lt - 1)),
            ("estimator", lambda: reco.advantages("no_such", st, group_offsets=ot)),
            ("overrides.clip.eps_high", lambda: reco.advantages("grpo", st, group_offsets=ot,
                                                                overrides={"clip.eps_high": 0.3})),
            ("overrides.advantage.nope", lambda: reco.advantages("rloo", st, group_offsets=ot,
                                                                 overrides={"advantage.nope": 1.0})),
            ("overrides.advantage.eps", lambda: reco.advantages("grpo", st, group_offsets=ot,
                                                                overrides={"advantage.eps": math.nan})),
            ("advantage.params.eps", lambda: reco.advantages("grpo", st, group_offsets=ot,
                                                             overrides={"advantage.eps": -1.0})),
        ]
        for arg, call in cases:
            with self.assertRaisesRegex(ValueError, "^reco: " + arg.replace(".", r"\.") + ":", msg=arg):
                call()


class BatchOps(unittest.TestCase):
    def test_filter_groups(self):
        rng = random.Random(7)
        for trial in range(20):
            sizes = [rng.randrange(0, 5) for _ in range(rng.randrange(1, 7))]
            offs = [0]
            for g in sizes:
                offs.append(offs[-1] + g)
            s = [float(rng.choice([0, 1])) if trial % 2 else rng.choice([0.0, 0.5, 1.0]) for _ in range(offs[-1])]
            for rule, kw in (("nonzero_std", {}), ("nonzero_std", {"keep_singletons": False}),
                             ("mean_in_range", {"low": 0.2, "high": 0.9})):
                keep = []
                for lo, hi in groups(offs):
                    g = s[lo:hi]
                    if rule == "nonzero_std":
                        k = len(set(g)) > 1 or (len(g) == 1 and kw.get("keep_singletons", True))
                    else:
                        k = len(g) > 0 and kw["low"] < mean(g) < kw["high"]
                    keep.append(k)
                want_kept = [j for (lo, hi), k in zip(groups(offs), keep) if k for j in range(lo, hi)]
                want_offs = [0]
                for (lo, hi), k in zip(groups(offs), keep):
                    if k:
                        want_offs.append(want_offs[-1] + hi - lo)
                out = reco.filter_groups(torch.tensor(s, dtype=torch.float32), torch.tensor(offs), rule=rule, **kw)
                self.assertEqual(out.kept_responses.tolist(), want_kept)
                self.assertEqual(out.group_offsets.tolist(), want_offs)
                self.assertEqual(out.kept_responses.dtype, torch.int64)

    def test_filter_groups_errors(self):
        s, o = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 2, 3])
        for arg, call in (("rule", lambda: reco.filter_groups(s, o, rule="std")),
                          ("low", lambda: reco.filter_groups(s, o, rule="mean_in_range", low=0.5, high=0.5)),
                          ("low", lambda: reco.filter_groups(s, o, rule="mean_in_range", low=math.nan)),
                          ("rewards", lambda: reco.filter_groups(torch.tensor([1.0, math.inf, 0.0]), o)),
                          ("group_offsets", lambda: reco.filter_groups(s, torch.tensor([0, 2, 4]))),
                          ("group_offsets", lambda: reco.filter_groups(s, o.double()))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()

    def test_overlong_penalty(self):
        L_max, b, f = 20.0, 4.0, 0.5
        lengths = [0, 10, 16, 17, 19, 20, 23]
        rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, -1.0]
        want = [r + min(-(L - (L_max - b)) / b * f, 0.0) for r, L in zip(rewards, lengths)]
        got = reco.overlong_penalty(torch.tensor(rewards, dtype=D), torch.tensor(lengths), max_length=L_max,
                                    buffer=b, factor=f)
        close(self, got, want)
        self.assertEqual(reco.overlong_penalty(torch.tensor(rewards), torch.tensor(lengths)).dtype, torch.float32)
        # DAPO's defaults: no penalty up to 16,384 tokens, -1 at 20,480.
        close(self, reco.overlong_penalty(torch.zeros(3, dtype=D), torch.tensor([16384, 18432, 20480])),
              [0.0, -0.5, -1.0])
        r, L = torch.tensor(rewards), torch.tensor(lengths)
        for arg, call in (("buffer", lambda: reco.overlong_penalty(r, L, buffer=0.0)),
                          ("max_length", lambda: reco.overlong_penalty(r, L, max_length=10.0, buffer=20.0)),
                          ("max_length", lambda: reco.overlong_penalty(r, L, max_length=math.nan)),
                          ("factor", lambda: reco.overlong_penalty(r, L, factor=math.nan)),
                          ("lengths", lambda: reco.overlong_penalty(r, L[1:])),
                          ("lengths", lambda: reco.overlong_penalty(r, -L)),
                          ("lengths", lambda: reco.overlong_penalty(r, L.double())),
                          ("rewards", lambda: reco.overlong_penalty(r * math.nan, L))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()

    def test_kl_reward(self):
        def k(a, b, est, clamp):
            d = a - b
            if est == "k1":
                return d
            if est == "abs":
                return abs(d)
            if est == "k2":
                return d * d / 2
            e = min(max(-d, -20.0), 20.0) if clamp else -d
            v = math.exp(e) - e - 1
            return min(max(v, -10.0), 10.0) if clamp else v

        g = torch.Generator().manual_seed(31)
        R, T = 5, 6
        logp = -torch.rand(R, T, dtype=D, generator=g) * 3
        ref = -torch.rand(R, T, dtype=D, generator=g) * 3
        logp[0, 0], ref[0, 0] = -30.0, -1.0  # k3's clamps bite here
        mask = torch.rand(R, T, generator=g) > 0.3
        logp[~mask] = math.nan  # masked tokens are never read
        rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, -1.0], dtype=D)
        for est in ("k1", "abs", "k2", "k3"):
            for clamp in (True, False):
                want = [rewards[i].item() - 0.05 * sum(k(logp[i, t].item(), ref[i, t].item(), est, clamp)
                                                       for t in range(T) if mask[i, t])
                        for i in range(R)]
                got = reco.kl_reward(rewards, logp, ref, mask=mask, beta=0.05, estimator=est, clamp=clamp)
                close(self, got, want, 1e-12)
                # The same batch packed.
                offs = torch.cat([torch.zeros(1, dtype=torch.int64), mask.sum(1).cumsum(0)])
                close(self, reco.kl_reward(rewards, logp[mask], ref[mask], offsets=offs, beta=0.05, estimator=est,
                                           clamp=clamp), want, 1e-12)
        lp = logp.nan_to_num(-1.0)
        for arg, call in (("estimator", lambda: reco.kl_reward(rewards, lp, ref, estimator="k4")),
                          ("beta", lambda: reco.kl_reward(rewards, lp, ref, beta=-1.0)),
                          ("logp", lambda: reco.kl_reward(rewards, logp, ref)),  # NaN in a valid token
                          ("logp", lambda: reco.kl_reward(rewards, -lp, ref)),
                          ("ref_logp", lambda: reco.kl_reward(rewards, lp, ref[:, :3])),
                          ("rewards", lambda: reco.kl_reward(rewards[1:], lp, ref)),
                          ("mask", lambda: reco.kl_reward(rewards, lp, ref, mask=mask[:, 1:]))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()

    def test_mask_truncated(self):
        eos = 2
        tokens = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 9, 9, 9], [4, 4, 2, 1]])
        mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
        ended = [any(t == eos and m for t, m in zip(tr, mr)) for tr, mr in zip(tokens.tolist(), mask.tolist())]
        want = [[m and e for m in mr] for mr, e in zip(mask.tolist(), ended)]
        self.assertEqual(reco.mask_truncated(tokens, eos, mask=mask).tolist(), want)
        self.assertEqual(reco.mask_truncated(tokens, eos).tolist(),
                         [[2 in tr] * 4 for tr in tokens.tolist()])
        offs = torch.tensor([0, 2, 2, 5])
        flat = torch.tensor([1, 2, 3, 4, 5])
        self.assertEqual(reco.mask_truncated(flat, 2, offsets=offs).tolist(), [True, True, False, False, False])
        with self.assertRaisesRegex(ValueError, "^reco: mask:"):
            reco.mask_truncated(tokens, eos, mask=mask[:, :3])
        with self.assertRaisesRegex(ValueError, "^reco: tokens:"):
            reco.mask_truncated(tokens.float(), eos)
        with self.assertRaisesRegex(ValueError, "^reco: offsets:"):
            reco.mask_truncated(flat, 2, offsets=torch.tensor([0, 2, 6]))

    def test_prompt_groups(self):
        ids = torch.tensor([4, 4, 9, 9, 9, 1])
        self.assertEqual(reco.group_offsets(ids).tolist(), [0, 2, 5, 6])
        mixed = torch.tensor([3, 1, 3, 2, 1])
        g = reco.group_by_prompt(mixed)
        self.assertEqual(g.order.tolist(), [0, 2, 1, 4, 3])
        self.assertEqual(g.group_offsets.tolist(), [0, 2, 4, 5])
        with self.assertRaisesRegex(ValueError, "^reco: prompt_ids:"):
            reco.group_offsets(mixed)


class PassAtK(unittest.TestCase):
    @staticmethod
    def exact(n, c, k):
        return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))

    def test_values(self):
        for n, c, k in ((10, 3, 1), (10, 3, 5), (10, 0, 4), (10, 10, 1), (7, 5, 3), (1024, 3, 256), (128, 1, 64),
                        (50, 25, 50), (300, 2, 17)):
            got = reco.pass_at_k(n, c, k)
            self.assertLessEqual(abs(got - self.exact(n, c, k)), 1e-14 * max(1e-300, self.exact(n, c, k)) + 1e-16,
                                 (n, c, k))
        self.assertEqual(reco.pass_at_k(10, 8, 3), 1.0)  # n - c < k: every 3-subset holds a correct one

    def test_curve(self):
        ns, cs, ks = [16, 20, 16, 32], [0, 3, 16, 5], [1, 2, 8, 16]
        curve = reco.pass_at_k_curve(ns, cs, ks)
        want = [[self.exact(n, c, k) for n, c in zip(ns, cs)] for k in ks]
        close(self, curve.per_problem.flatten(), [x for row in want for x in row], 1e-13)
        close(self, curve.mean, [mean(row) for row in want], 1e-13)
        same = reco.pass_at_k_curve(16, [0, 3, 9], [1, 4])
        close(self, same.mean, [mean([self.exact(16, c, k) for c in (0, 3, 9)]) for k in (1, 4)], 1e-13)

    def test_errors(self):
        for arg, call in (("k", lambda: reco.pass_at_k(10, 3, 11)), ("k", lambda: reco.pass_at_k(10, 3, 0)),
                          ("c", lambda: reco.pass_at_k(10, 11, 1)), ("c", lambda: reco.pass_at_k(10, -1, 1)),
                          ("n", lambda: reco.pass_at_k(0, 0, 1)),
                          ("ks", lambda: reco.pass_at_k_curve([4, 8], [1, 1], [1, 6])),
                          ("cs", lambda: reco.pass_at_k_curve([4, 8], [1], [1])),
                          ("cs", lambda: reco.pass_at_k_curve(4, torch.tensor([1.0]), [1]))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()
        with self.assertRaises(TypeError):
            reco.pass_at_k(10, 3, 2.5)


class Diversity(unittest.TestCase):
    def test_sentence_and_self_bleu(self):
        rng = random.Random(11)
        for trial in range(30):
            resps = rand_seqs(rng, rng.randrange(2, 7))
            N = rng.choice([1, 2, 4])
            sm = rng.choice(["method0", "method1"])
            kw = dict(max_order=N, smoothing=sm, epsilon=0.1)
            want = naive_self_bleu_each(resps, N=N, smoothing=sm)
            tensors = [torch.tensor(r, dtype=torch.int64) for r in resps]
            close(self, reco.self_bleu_per_response(tensors, **kw), want, 1e-12)
            close(self, reco.self_bleu_per_response(resps, **kw), want, 1e-12)  # lists of ints
            self.assertLessEqual(abs(reco.self_bleu(tensors, **kw) - mean(want)), 1e-12)
            close(self, [reco.sentence_bleu(resps[1:], resps[0], **kw)],
                  [naive_bleu(resps[1:], resps[0], N=N, smoothing=sm)], 1e-12)
        # The documented short-response case: three copies of one token score 0.1^(3/4) at BLEU-4.
        self.assertAlmostEqual(reco.self_bleu(["yes", "yes", "yes"]), 0.1 ** 0.75, delta=1e-15)
        texts = ["the cat sat on the mat", "the cat sat on a mat today", "a dog ran"]
        close(self, reco.self_bleu_per_response(texts), naive_self_bleu_each(words(texts)), 1e-12)

    def test_self_bleu_among_correct(self):
        rng = random.Random(12)
        prompts = [rand_seqs(rng, 4), rand_seqs(rng, 3), rand_seqs(rng, 5)]
        correct = [[True, False, True, True], [True, False, False], [False, True, True, False, True]]
        out = reco.self_bleu_among_correct(prompts, correct)
        per = []
        for p, c in zip(prompts, correct):
            kept = [r for r, f in zip(p, c) if f]
            per.append(mean(naive_self_bleu_each(kept)) if len(kept) >= 2 else math.nan)
        close(self, out.per_prompt, per, 1e-12)
        self.assertEqual(out.prompts_used, 2)
        self.assertLessEqual(abs(out.mean - mean([x for x in per if not math.isnan(x)])), 1e-12)
        with self.assertRaisesRegex(ValueError, "^reco: correct:"):
            reco.self_bleu_among_correct(prompts, [[True] + [False] * (len(p) - 1) for p in prompts])
        with self.assertRaisesRegex(ValueError, "^reco: correct:"):
            reco.self_bleu_among_correct(prompts, correct[:2])

    def test_distinct_n(self):
        rng = random.Random(13)
        for trial in range(20):
            prompts = [rand_seqs(rng, rng.randrange(1, 5), vocab=3, max_len=8) for _ in range(rng.randrange(1, 4))]
            for n in (1, 2, 3):
                for scope in ("pooled_per_prompt", "per_response"):
                    for den in ("ngrams", "tokens"):
                        try:
                            want = naive_distinct(prompts, n, scope, den)
                        except ZeroDivisionError:  # no unit has a value: documented as an error
                            with self.assertRaisesRegex(ValueError, "^reco: responses:"):
                                reco.distinct_n(prompts, n, scope=scope, denominator=den)
                            continue
                        got = reco.distinct_n(prompts, n, scope=scope, denominator=den)
                        self.assertLessEqual(abs(got - want), 1e-14, (prompts, n, scope, den))
            # One prompt given as its list of sequences.
            one = [torch.tensor(r, dtype=torch.int64) for r in prompts[0]]
            if any(len(r) >= 2 for r in prompts[0]):
                self.assertLessEqual(abs(reco.distinct_n(one, 2) - naive_distinct([prompts[0]], 2)), 1e-14)
        texts = ["a b a b", "b a c"]
        self.assertLessEqual(abs(reco.distinct_n(texts, 2) - naive_distinct([words(texts)], 2)), 1e-15)

    def test_path_uniqueness(self):
        prompts = [["αβγ-one", "αβγ-two", "xyz", "αβγ-one"], ["same", "same"], ["日本語テキスト", "日本"]]
        for C in (1, 3, 4, 300):
            want = mean([len({r[:C] for r in p}) / len(p) for p in prompts])
            self.assertLessEqual(abs(reco.path_uniqueness(prompts, C) - want), 1e-15, C)
        self.assertEqual(reco.path_uniqueness(prompts[0], 3), 2 / 4)

    def test_errors(self):
        seqs = [torch.tensor([1, 2, 3]), torch.tensor([1, 2])]
        for arg, call in (("responses", lambda: reco.self_bleu([seqs[0]])),
                          ("max_order", lambda: reco.self_bleu(seqs, max_order=0)),
                          ("smoothing", lambda: reco.self_bleu(seqs, smoothing="method7")),
                          ("epsilon", lambda: reco.self_bleu(seqs, epsilon=math.nan)),
                          ("responses", lambda: reco.self_bleu([torch.tensor([1.0, 2.0]), seqs[1]])),
                          ("responses", lambda: reco.self_bleu(["a b", seqs[1]])),
                          ("references", lambda: reco.sentence_bleu([], seqs[0])),
                          ("n", lambda: reco.distinct_n(seqs, 0)),
                          ("scope", lambda: reco.distinct_n(seqs, 1, scope="all")),
                          ("denominator", lambda: reco.distinct_n(seqs, 1, denominator="chars")),
                          ("responses", lambda: reco.distinct_n(seqs, 4)),
                          ("responses", lambda: reco.distinct_n([seqs, 5], 1)),
                          ("prefix_code_points", lambda: reco.path_uniqueness(["a", "b"], 0)),
                          ("rollouts", lambda: reco.path_uniqueness([["a"], []]))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()


class BoxedAnswer(unittest.TestCase):
    def test_documented_cases(self):
        # (response, reference, reward, numeric tier decided), from the rules of docs/eval.md.
        cases = [(r"so the answer is \boxed{\frac12}.", r"\frac{1}{2}", 1.0, False),
                 (r"\boxed{0.5}", r"\frac{1}{2}", 1.0, True),
                 (r"\boxed{27.0}", "27", 1.0, True),
                 (r"\boxed{1,000}", "1000", 1.0, True),
                 (r"\boxed{x = 5}", "5", 1.0, False),
                 (r"\boxed{10\text{ cm}^2}", "10", 1.0, False),
                 (r"\boxed{3} then \boxed{4}", "3", 0.0, False),  # the last box counts
                 (r"\boxed{x^2-1}", "(x-1)(x+1)", 0.0, False),      # not a symbolic checker
                 ("no box here: 5", "5", 0.0, False)]
        for response, reference, reward, numeric in cases:
            r = reco.boxed_answer_reward(response, reference)
            self.assertEqual((r.reward, r.numeric_match), (reward, numeric), response)
        self.assertFalse(reco.boxed_answer_reward("5", "5").found_box)
        self.assertEqual(reco.boxed_answer_reward(r"\boxed{\frac12}", "2").extracted, r"\frac12")
        self.assertEqual(reco.boxed_answer_reward(r"\boxed{27.00001}", "27", relative_tolerance=0.0).reward, 0.0)
        got = reco.boxed_answer_rewards([c[0] for c in cases], [c[1] for c in cases])
        self.assertEqual(got.tolist(), [c[2] for c in cases])
        with self.assertRaisesRegex(ValueError, "^reco: reference:"):
            reco.boxed_answer_reward(r"\boxed{1}", "$ $")
        with self.assertRaisesRegex(ValueError, "^reco: references:"):
            reco.boxed_answer_rewards([r"\boxed{1}"], [])
        with self.assertRaisesRegex(ValueError, "^reco: references: entry 1"):
            reco.boxed_answer_rewards([r"\boxed{1}", "2"], ["1", ""])
        with self.assertRaisesRegex(ValueError, "^reco: relative_tolerance:"):
            reco.boxed_answer_reward("1", "1", relative_tolerance=math.nan)


class TokenSummaries(unittest.TestCase):
    def responses(self, seed):
        rng = random.Random(seed)
        return [[rng.random() for _ in range(rng.randrange(0, 9))] for _ in range(7)]

    def test_token_variance_by_position(self):
        for seed in (21, 22):
            per = self.responses(seed)
            sums, counts, means = [0.0] * 3, [0] * 3, [[], [], []]
            for r in per:
                L = len(r)
                rs, rc = [0.0] * 3, [0] * 3
                for t, p in enumerate(r):
                    b = (3 * t) // L
                    rs[b] += p * (1 - p)
                    rc[b] += 1
                for b in range(3):
                    if rc[b]:
                        sums[b] += rs[b]
                        counts[b] += rc[b]
                        means[b].append(rs[b] / rc[b])
            want_mean = [sums[b] / counts[b] if counts[b] else math.nan for b in range(3)]
            want_se = [std1(means[b]) / math.sqrt(len(means[b])) if len(means[b]) >= 2 else math.nan
                       for b in range(3)]
            values, offs = packed(per)
            out = reco.token_variance_by_position(values, offs)
            close(self, out.mean, want_mean, 1e-13)
            close(self, out.standard_error, want_se, 1e-12)
            self.assertEqual(out.tokens.tolist(), counts)
            self.assertEqual(out.responses.tolist(), [len(m) for m in means])
            logs = reco.token_variance_by_position(values.log(), offs, log_probability=True)
            close(self, logs.mean, want_mean, 1e-12)
            # Padded with a mask: the same responses.
            T = max(len(r) for r in per)
            padded = torch.zeros(len(per), T, dtype=D)
            mask = torch.zeros(len(per), T, dtype=torch.bool)
            for i, r in enumerate(per):
                padded[i, :len(r)] = torch.tensor(r, dtype=D)
                mask[i, :len(r)] = True
            close(self, reco.token_variance_by_position(padded, mask=mask).mean, want_mean, 1e-13)

    def test_entropy_kl_and_likelihood(self):
        rng = random.Random(23)
        ent = [[rng.random() * 3 for _ in range(rng.randrange(0, 6))] for _ in range(6)]
        ent[0] = [1.0, 2.0]
        lp = [[-rng.random() * 4 for _ in r] for r in ent]
        ref = [[-rng.random() * 4 for _ in r] for r in ent]
        flat = [x for r in ent for x in r]
        nonempty = [r for r in ent if r]
        e, offs = packed(ent)
        out = reco.mean_token_entropy(e, offs)
        self.assertLessEqual(abs(out.token_mean - mean(flat)), 1e-14)
        self.assertLessEqual(abs(out.response_mean - mean([mean(r) for r in nonempty])), 1e-14)
        self.assertEqual((out.tokens, out.responses), (len(flat), len(nonempty)))
        kl = reco.mean_abs_kl(packed(lp)[0], packed(ref)[0], offs)
        diffs = [[abs(a - b) for a, b in zip(x, y)] for x, y in zip(lp, ref)]
        self.assertLessEqual(abs(kl.token_mean - mean([d for r in diffs for d in r])), 1e-14)
        self.assertLessEqual(abs(kl.response_mean - mean([mean(r) for r in diffs if r])), 1e-14)
        ll = reco.mean_log_likelihood_per_response(packed(lp)[0], offs)
        self.assertEqual(ll.shape[0], len(lp))
        for got, r in zip(ll.tolist(), lp):
            if r:
                self.assertLessEqual(abs(got - mean(r)), 1e-14)

    def test_gaussian_kde(self):
        rng = random.Random(24)
        x = [rng.gauss(-1.5, 0.4) for _ in range(37)]
        n = len(x)
        for rule, adjust, size, cut in (("scott", 1.0, 200, 3.0), ("silverman", 0.7, 50, 2.0)):
            factor = (n ** -0.2 if rule == "scott" else (3 * n / 4) ** -0.2) * adjust
            h = factor * std1(x)
            lo, hi = min(x) - cut * h, max(x) + cut * h
            grid = [lo + (hi - lo) * i / (size - 1) for i in range(size)]
            dens = [sum(math.exp(-0.5 * ((g - xi) / h) ** 2) for xi in x) / (n * h * math.sqrt(2 * math.pi))
                    for g in grid]
            kde = reco.gaussian_kde(torch.tensor(x, dtype=D), rule=rule, adjust=adjust, grid_size=size, cut=cut)
            self.assertLessEqual(abs(kde.bandwidth - h), 1e-13 * h)
            self.assertLessEqual(abs(kde.factor - factor), 1e-13)
            self.assertLessEqual(abs(kde.sample_std - std1(x)), 1e-13)
            close(self, kde.grid, grid, 1e-12)
            close(self, kde.density, dens, 1e-11)
            pts = torch.tensor([-2.0, -1.5, 0.0], dtype=D)
            close(self, reco.gaussian_kde_evaluate(torch.tensor(x, dtype=D), h, pts),
                  [sum(math.exp(-0.5 * ((p - xi) / h) ** 2) for xi in x) / (n * h * math.sqrt(2 * math.pi))
                   for p in pts.tolist()], 1e-11)

    def test_errors(self):
        v, o = torch.tensor([0.2, 0.5, 0.9], dtype=D), torch.tensor([0, 1, 3])
        for arg, call in (("probabilities", lambda: reco.token_variance_by_position(v + 1, o)),
                          ("probabilities", lambda: reco.token_variance_by_position(v * math.nan, o)),
                          ("probabilities", lambda: reco.token_variance_by_position(v, o, log_probability=True)),
                          ("probabilities", lambda: reco.token_variance_by_position((v * 10).long(), o)),
                          ("offsets", lambda: reco.token_variance_by_position(v, torch.tensor([0, 2, 1, 3]))),
                          ("offsets", lambda: reco.token_variance_by_position(v, torch.tensor([0, 1, 4]))),
                          ("offsets", lambda: reco.token_variance_by_position(v, o, mask=torch.ones(1, 3).bool())),
                          ("offsets", lambda: reco.mean_token_entropy(v)),
                          ("mask", lambda: reco.mean_token_entropy(v.view(1, 3), mask=torch.ones(1, 3))),
                          ("entropy", lambda: reco.mean_token_entropy(v * math.inf, o)),
                          ("ref_logp", lambda: reco.mean_abs_kl(-v, -v[:2], o)),
                          ("samples", lambda: reco.gaussian_kde(torch.ones(4, dtype=D))),
                          ("samples", lambda: reco.gaussian_kde(torch.tensor([1.0]))),
                          ("samples", lambda: reco.gaussian_kde(torch.tensor([1.0, math.nan, 2.0]))),
                          ("grid_size", lambda: reco.gaussian_kde(v, grid_size=1)),
                          ("cut", lambda: reco.gaussian_kde(v, cut=-1.0)),
                          ("adjust", lambda: reco.gaussian_kde(v, adjust=0.0)),
                          ("rule", lambda: reco.gaussian_kde(v, rule="isj")),
                          ("bandwidth", lambda: reco.gaussian_kde_evaluate(v, 0.0, v))):
            with self.assertRaisesRegex(ValueError, f"^reco: {arg}:", msg=arg):
                call()


class RolloutCorrectionPeers(unittest.TestCase):
    """reco.rollout_correction in the settings that docs/batch_ops.md gives for TRL's
    vllm_importance_sampling_mode / off_policy_mask_threshold and OpenRLHF's tis / icepop /
    seq-mask-tis, against those definitions written out here on padded float64 batches (the peers'
    own packages do not import in CI). l = old - rollout; the peers leave masked tokens out of the
    loss, so only valid tokens are compared (reco writes 0 there)."""

    def batch(self, gen, B, T):
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
        old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2 - 0.05
        rollout = (old - torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4).clamp(max=-1e-4)
        adv = torch.randn(B, generator=gen, dtype=torch.float64)
        return old, rollout, mask, adv

    def close(self, got, want, mask, what):
        err = ((got - want).abs() / want.abs().clamp(min=1.0))[mask].max().item()
        self.assertLessEqual(err, 1e-12, what)

    def test_trl_and_openrlhf_modes(self):
        gen = torch.Generator().manual_seed(99)
        inf = math.inf
        for trial in range(24):
            old, rollout, mask, adv = self.batch(gen, 2 + trial % 6, 3 + trial % 9)
            m = mask.double()
            diff = (old - rollout) * m
            lo, hi = (0.5, 2.0) if trial % 2 else (0.8, 1.25)
            # TRL: token / sequence ratio, truncated into [clip_min, clip_max] or zeroed outside.
            for level in ("token", "sequence"):
                ratio = torch.exp(diff if level == "token" else diff.sum(-1, keepdim=True)).expand_as(old)
                truncated = ratio.clamp(min=lo, max=hi)
                masked = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
                for bound, want in (("truncate", truncated), ("mask", masked)):
                    got = reco.rollout_correction(old, rollout, mask=mask, level=level, bound=bound, lower=lo,
                                                  upper=hi, log_ratio_bound=None).weights
                    self.close(got, want, mask, f"TRL {level}_{bound}, trial {trial}")
                no_max = ratio.masked_fill(ratio < lo, 0.0)  # clip_max None: no upper bound
                got = reco.rollout_correction(old, rollout, mask=mask, level=level, bound="mask", lower=lo,
                                              upper=None, log_ratio_bound=None).weights
                self.close(got, no_max, mask, f"TRL {level}_mask without clip_max, trial {trial}")
            # TRL's off-policy sequence mask: keep when A >= 0 or mean(rollout - trainer) <= delta.
            delta = 0.05 * (trial % 5)
            kl = ((rollout - old) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
            keep = ((adv >= 0) | (kl <= delta)).unsqueeze(-1) & mask
            out = reco.rollout_correction(old, rollout, mask=mask, level="none", log_ratio_bound=None,
                                          filters=[reco.RolloutFilter("seq_mean_k1", -inf, delta, True)],
                                          advantages=adv)
            self.assertTrue(torch.equal(out.keep_mask, keep), f"TRL off-policy mask, trial {trial}")
            # OpenRLHF: tis (clamp), icepop (zero outside), seq-mask-tis (raw ratio, responses whose
            # geometric-mean ratio leaves [low, high] dropped).
            r = torch.exp(old - rollout)
            got = reco.rollout_correction(old, rollout, mask=mask, lower=lo, upper=hi, log_ratio_bound=None)
            self.close(got.weights, r.clamp(min=lo, max=hi), mask, f"OpenRLHF tis, trial {trial}")
            got = reco.rollout_correction(old, rollout, mask=mask, bound="mask", lower=lo, upper=hi,
                                          log_ratio_bound=None)
            self.close(got.weights, r * ((r >= lo) & (r <= hi)), mask, f"OpenRLHF icepop, trial {trial}")
            seq = torch.exp(((old - rollout) * m).sum(-1) / m.sum(-1))
            seq_keep = ((seq >= lo) & (seq <= hi)).unsqueeze(-1) & mask
            got = reco.rollout_correction(old, rollout, mask=mask, upper=None, log_ratio_bound=None,
                                          filters=[("seq_mean_k1", -math.log(hi), -math.log(lo))])
            self.close(got.weights, r, mask, f"OpenRLHF seq-mask-tis weights, trial {trial}")
            self.assertTrue(torch.equal(got.keep_mask, seq_keep), f"OpenRLHF seq-mask-tis mask, trial {trial}")

    def test_packed_equals_padded_and_metrics(self):
        gen = torch.Generator().manual_seed(5)
        old, rollout, mask, _ = self.batch(gen, 5, 7)
        pad = reco.rollout_correction(old, rollout, mask=mask, level="sequence", normalise=True,
                                      filters=[("token_k2", -math.inf, 0.02)])
        lengths = mask.sum(-1)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        packed = reco.rollout_correction(old[mask], rollout[mask], offsets=offsets, level="sequence", normalise=True,
                                         filters=[("token_k2", -math.inf, 0.02)])
        self.assertTrue(torch.allclose(packed.weights, pad.weights[mask], rtol=1e-14, atol=0))
        self.assertTrue(torch.equal(packed.keep_mask, pad.keep_mask[mask]))
        self.assertEqual(set(pad.metrics), set(reco.ROLLOUT_METRICS))
        self.assertEqual(pad.metrics["valid_tokens"], float(mask.sum()))
        k1 = ((rollout - old)[mask]).mean().item()
        self.assertAlmostEqual(pad.metrics["k1_mean"], k1, places=13)
        self.assertAlmostEqual(pad.metrics["rejected_token_fraction"],
                               (mask & ~pad.keep_mask).sum().item() / mask.sum().item(), places=14)
        f32 = reco.rollout_correction(old.float(), rollout.float(), mask=mask)
        self.assertEqual(f32.weights.dtype, torch.float32)
        self.assertEqual(f32.keep_mask.dtype, torch.bool)


if __name__ == "__main__":
    unittest.main()
