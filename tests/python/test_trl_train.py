"""TRL's GRPOTrainer trained for real with reco's loss (reco.integrations.trl), nothing downloaded.

A tiny Qwen2 causal LM (2 layers, hidden size 32) is built from a config and saved to a
temporary folder, a word-level tokenizer is built here, the prompts are made here, and two reward
functions score the completions; TRL generates, scores, computes advantages and steps the
optimiser as always (TRL 1.16 with transformers, accelerate and datasets from PyPI,
HF_HUB_OFFLINE=1). Each run is several optimizer steps with gradient accumulation 2 and
num_iterations 2 (the second pass over a generation batch has ratios away from 1).

  (a) One run whose loss is ``grpo_trainer(None)``: at every micro-step, on the trainer's own
      inputs and model, TRL's own ``_compute_loss`` and reco's are evaluated for every loss_type
      (and the knobs: entropy_coef, adaptive entropy, off_policy_mask_threshold, cispo at TRL's
      default epsilon_high, top_entropy_quantile, the sequence level) and their losses and
      gradients in every model parameter compared; the adaptive entropy
      controller's state must move the same way. TRL's fused LM head gives float32 log-probs:
      the tolerance is float32's (2e-5). Two more runs, one with TRL's loss and one with
      reco's, from the same seed: their logged losses agree at every logged step.
  (b) Every reco preset trains (a run each): finite logged losses, the loss moves the model, and
      reco's ``reco/`` metrics are in the log.
  (c) The same comparison as (a) with the model on a CUDA device, when one is present and the
      op library has the CUDA ops (skipped otherwise).
  (d) GDPO: with ``multi_objective_aggregation="normalize_then_sum"`` TRL's advantages equal
      ``reco.gdpo_advantages`` of the reward functions' outputs (captured in the run).
  (e) ``lm_head="reco"``: the policy's log-probabilities and entropies from its hidden states by
      reco, against TRL's fused head and eager logits (values and gradients), then a run.

Run with a python that has reco, torch, trl, transformers, accelerate and datasets; skipped (exit
code 0, with a message) when TRL's runtime is missing and RECO_REQUIRE_TRL_TRAIN is unset.
"""
import collections
import contextlib
import copy
import importlib.util
import math
import os
import sys
import tempfile
import unittest
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: a hub access is an error
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

_MISSING = [m for m in ("trl", "transformers", "accelerate", "datasets") if importlib.util.find_spec(m) is None]
if _MISSING:
    if os.environ.get("RECO_REQUIRE_TRL_TRAIN"):
        raise SystemExit(f"test_trl_train: {_MISSING} not installed (RECO_REQUIRE_TRL_TRAIN is set)")
    print(f"test_trl_train: {_MISSING} not installed; skipped")
    sys.exit(0)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import reco  # noqa: E402
import reco.integrations.trl as reco_trl  # noqa: E402

hf_logging.set_verbosity_error()
# TRL's fused LM head gives float32 log-probabilities: TRL's loss is float32 arithmetic, reco's
# float64 arithmetic rounded to float32.
TOL = 2e-5
WORDS = [f"w{i}" for i in range(30)]
# The TRL configurations compared at every micro-step: TRL's loss types and the knobs on top.
CASES = [
    ("grpo", {}),
    ("grpo + entropy_coef", dict(entropy_coef=0.01)),
    ("grpo + off_policy_mask_threshold 0", dict(off_policy_mask_threshold=0.0)),
    ("grpo sequence level", dict(importance_sampling_level="sequence", beta=0.0)),
    ("bnpo", dict(loss_type="bnpo")),
    ("dr_grpo", dict(loss_type="dr_grpo")),
    ("dapo", dict(loss_type="dapo", epsilon_high=0.28)),
    ("dapo + adaptive entropy", dict(loss_type="dapo", use_adaptive_entropy=True, entropy_target=10.0,
                                     entropy_coef=0.02, entropy_coef_delta=0.01)),
    ("dapo + top_entropy_quantile 0.5 + entropy_coef", dict(loss_type="dapo", top_entropy_quantile=0.5,
                                                            entropy_coef=0.01, beta=0.0)),
    ("cispo epsilon_high 5", dict(loss_type="cispo", epsilon_high=5.0)),
    ("cispo at TRL's default epsilon_high", dict(loss_type="cispo", epsilon_high=None)),
    ("sapo", dict(loss_type="sapo")),
    ("luspo", dict(loss_type="luspo")),
    ("luspo sequence level", dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.0)),
    ("vespo", dict(loss_type="vespo")),
]
_ENTROPY_STATE = ("entropy_coef", "_last_world_entropy", "_entropy_window_stats")


def tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def save_model(folder, seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(WORDS) + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1, tie_word_embeddings=True)
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def dataset(n=16):
    return Dataset.from_dict({"prompt": [" ".join(WORDS[(3 * i) % 27:(3 * i) % 27 + 3]) for i in range(n)]})


def reward_w7(completions, **kw):
    return [float(c.split().count("w7")) for c in completions]


def reward_length(completions, **kw):
    return [0.1 * len(c.split()) for c in completions]


def config(folder, device="cpu", **kw):
    args = dict(output_dir=folder, per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2,
                num_iterations=2, max_steps=4, max_completion_length=6, logging_steps=1, report_to="none",
                use_cpu=device == "cpu", save_strategy="no", learning_rate=5e-3, seed=0, beta=0.04,
                disable_tqdm=True, loss_type="grpo", temperature=1.0)
    args.update(kw)
    return GRPOConfig(**args)


@contextlib.contextmanager
def configured(trainer, cfg):
    """The trainer as GRPOTrainer.__init__ sets it up from a GRPOConfig changed by ``cfg``."""
    args = trainer.args
    fields = dict(cfg)
    saved_args = {k: getattr(args, k) for k in fields}
    attrs = ("loss_type", "epsilon_high", "importance_sampling_level", "top_entropy_quantile", "beta",
             "off_policy_mask_threshold", "entropy_coef", "use_adaptive_entropy", "_entropy_bonus_enabled")
    saved = {k: getattr(trainer, k) for k in attrs}
    for k, v in fields.items():
        setattr(args, k, v)
    trainer.loss_type = args.loss_type
    trainer.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    for k in ("importance_sampling_level", "top_entropy_quantile", "beta", "off_policy_mask_threshold",
              "use_adaptive_entropy"):
        setattr(trainer, k, getattr(args, k))
    if "entropy_coef" in fields:
        trainer.entropy_coef = args.entropy_coef
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0 or trainer.use_adaptive_entropy
    try:
        yield
    finally:
        for k, v in saved_args.items():
            setattr(args, k, v)
        for k, v in saved.items():
            setattr(trainer, k, v)


def rel(a, b):
    return (a - b).abs().max().item() / max(1e-300, b.abs().max().item())


class Comparing(reco_trl.RecoLoss, GRPOTrainer):
    """grpo_trainer(None) that, at every micro-step, also evaluates TRL's loss and reco's for every
    case of CASES on the step's inputs and one model forward, and records the largest
    differences of the losses and of their gradients in the forward's log-probabilities and
    entropies (what the model's backward starts from)."""

    reco_preset = None
    worst = None  # case -> [loss err., rel. grad, compared micro-steps, state mismatches]
    cases = CASES

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        forward = self._get_per_token_logps_and_entropies
        held = []

        def once(*args, **kwargs):  # one forward for every case of this micro-step
            if not held:
                held.append(forward(*args, **kwargs))
            return held[0]

        self._get_per_token_logps_and_entropies = once
        try:
            for case, cfg in self.cases:
                self._compare(case, cfg, model, inputs, held, mode)
        finally:
            del self._get_per_token_logps_and_entropies
        return reco_trl.RecoLoss._compute_loss(self, model, inputs)

    def _compare(self, case, cfg, model, inputs, held, mode):
        def grads(loss):
            logps, entropies, _ = held[0]
            return [torch.zeros_like(x) if g is None else g
                    for g, x in zip(torch.autograd.grad(loss, [logps, entropies], retain_graph=True,
                                                        allow_unused=True), (logps, entropies))]

        with configured(self, cfg):
            metrics = copy.deepcopy(self._metrics[mode])
            state = {k: copy.deepcopy(getattr(self, k, None)) for k in _ENTROPY_STATE}
            trl_loss = GRPOTrainer._compute_loss(self, model, inputs)
            trl_grad = grads(trl_loss)
            trl_state = {k: copy.deepcopy(getattr(self, k, None)) for k in _ENTROPY_STATE}
            for k, v in state.items():
                setattr(self, k, v)
            reco_loss = reco_trl.RecoLoss._compute_loss(self, model, inputs)
            reco_grad = grads(reco_loss)
            reco_state = {k: getattr(self, k, None) for k in _ENTROPY_STATE}
            self._metrics[mode] = metrics
            for k, v in state.items():
                setattr(self, k, v)
        w = self.worst[case]
        # The loss relative to max(|TRL's loss|, 1): at a generation's first step the ratios are 1
        # and the loss is the mean advantage, zero up to rounding.
        w[0] = max(w[0], abs(reco_loss.item() - trl_loss.item()) / max(1.0, abs(trl_loss.item())))
        w[1] = max(w[1], rel(reco_grad[0], trl_grad[0]))
        if cfg.get("entropy_coef") or cfg.get("use_adaptive_entropy"):
            w[1] = max(w[1], rel(reco_grad[1], trl_grad[1]))
        w[2] += 1
        w[4] = max(w[4], trl_grad[0].abs().max().item())
        for k in _ENTROPY_STATE:
            a, b = trl_state[k], reco_state[k]
            if torch.is_tensor(a) or torch.is_tensor(b):
                same = torch.is_tensor(a) and torch.is_tensor(b) and torch.allclose(a, b, rtol=1e-6)
            else:
                same = a == b or (a is not None and b is not None and abs(a - b) <= 1e-6 * abs(a))
            if not same:
                w[3].append(f"{k}: TRL {a} vs reco {b}")


def train(cls, folder, device="cpu", reward_funcs=(reward_w7, reward_length), **cfg):
    trainer = cls(model=folder + "/model", reward_funcs=list(reward_funcs), args=config(folder, device, **cfg),
                  train_dataset=dataset(), processing_class=tokenizer())
    trainer.train()
    return trainer


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h and "train_runtime" not in h]


class TrlTraining(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        save_model(cls.tmp.name + "/model")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def compare_every_case(self, device):
        Comparing.worst = collections.defaultdict(lambda: [0.0, 0.0, 0, [], 0.0])
        cases = CASES
        if device == "cuda":
            # A KL term added by key (TRL's beta with cispo, sapo, vespo) runs on CPU tensors only.
            cases = [(c, dict(cfg, beta=0.0) if cfg.get("loss_type") in ("cispo", "sapo", "vespo") else cfg)
                     for c, cfg in CASES]
        Comparing.cases = cases
        trainer = train(Comparing, self.tmp.name, device)
        Comparing.cases = CASES
        self.assertEqual(trainer.state.global_step, 4)
        print(f"  {'case (' + device + ', every micro-step)':52s} loss err.  rel. grad  steps")
        for case, _ in CASES:
            el, eg, n, state, scale = Comparing.worst[case]
            print(f"  {case:52s} {el:9.1e}  {eg:9.1e}  {n:5d}")
            self.assertEqual(n, 8, case)  # 4 optimizer steps x 2 micro-batches
            self.assertLessEqual(el, TOL, case)
            self.assertLessEqual(eg, TOL, case)
            self.assertEqual(state, [], case)
            self.assertGreater(scale, 0.0, case)  # the loss has a gradient
        losses = logged(trainer, "loss")
        self.assertEqual(len(losses), 4)
        self.assertTrue(all(math.isfinite(x) for x in losses))

    def test_a_every_loss_type_equals_trl_at_every_micro_step(self):
        self.compare_every_case("cpu")

    def test_a_logged_losses_of_two_runs(self):
        # TRL's loss and reco's from the same seed: the same completions (sampling from the same
        # parameters), hence the same logged losses at every step.
        for cfg in (dict(loss_type="dapo", epsilon_high=0.28, entropy_coef=0.01),):
            mine = train(reco_trl.grpo_trainer(None), self.tmp.name, **cfg)
            theirs = train(GRPOTrainer, self.tmp.name, **cfg)
            a, b = logged(mine, "loss"), logged(theirs, "loss")
            self.assertEqual(len(a), 4)
            for x, y in zip(a, b):
                self.assertLessEqual(abs(x - y), 1e-6 * max(1.0, abs(y)), (cfg, a, b))
            self.assertEqual(logged(mine, "reward"), logged(theirs, "reward"))
            self.assertIn("reco/ratio_mean", mine.state.log_history[0])

    def test_b_every_preset_trains(self):
        for preset in reco.presets():
            with self.subTest(preset=preset):
                beta = 0.04 if reco.has_kl_term(preset) else 0.0
                before = [p.detach().clone() for p in
                          Qwen2ForCausalLM.from_pretrained(self.tmp.name + "/model").parameters()]
                trainer = train(reco_trl.grpo_trainer(preset), self.tmp.name, beta=beta, max_steps=2)
                losses = logged(trainer, "loss")
                self.assertEqual(len(losses), 2, preset)
                self.assertTrue(all(math.isfinite(x) for x in losses), (preset, losses))
                moved = max((p.detach().cpu() - q).abs().max().item()
                            for p, q in zip(trainer.model.parameters(), before))
                self.assertGreater(moved, 0.0, preset)
                keys = {k for h in trainer.state.log_history for k in h if k.startswith("reco/")}
                self.assertIn("reco/ratio_mean", keys, preset)
                for h in trainer.state.log_history:
                    for k, v in h.items():
                        if k.startswith("reco/"):
                            self.assertTrue(math.isfinite(v), (preset, k, v))

    @unittest.skipUnless(torch.cuda.is_available() and reco.build_info().get("cuda"),
                         "no CUDA device, or the op library has no CUDA ops")
    def test_c_on_cuda(self):
        self.compare_every_case("cuda")

    def test_d_gdpo_advantages_equal_trl(self):
        captured = []

        class Capture(reco_trl.RecoLoss, GRPOTrainer):
            reco_preset = None

            def _calculate_rewards(self, *a, **kw):
                captured.append(super()._calculate_rewards(*a, **kw))
                return captured[-1]

            def _generate_and_score_completions(self, *a, **kw):
                out = super()._generate_and_score_completions(*a, **kw)
                captured.append(out["advantages"])
                return out

        for weights in (None, [1.0, 0.5]):
            captured.clear()
            train(Capture, self.tmp.name, multi_objective_aggregation="normalize_then_sum", max_steps=4,
                  reward_weights=weights, beta=0.0)
            self.assertEqual(len(captured), 4)  # two generation batches: rewards, advantages
            for rewards, advantages in zip(captured[0::2], captured[1::2]):
                mine = reco.gdpo_advantages(rewards, group_size=4, weights=weights, eps=1e-4, batch_eps=1e-4,
                                            batch_normalise="response")
                self.assertLessEqual((mine - advantages).abs().max().item(), 1e-5)

    def test_e_reco_lm_head(self):
        # lm_head="reco": the policy's log-probabilities and entropies from its hidden states by
        # reco.linear_logp_entropy. On one batch, against TRL's fused head (log-probabilities and
        # their gradient; TRL's leaves the entropy's gradient out) and against eager logits
        # (entropy and its gradient); then a run trains.
        cls = reco_trl.grpo_trainer("reco", lm_head="reco")
        trainer = cls(model=self.tmp.name + "/model", reward_funcs=[reward_w7], args=config(self.tmp.name, temperature=0.7),
                      train_dataset=dataset(), processing_class=tokenizer())
        model = trainer.model
        self.assertIn("add_reco_lm_head", model.forward.__qualname__)
        torch.manual_seed(1)
        ids = torch.randint(2, len(WORDS) + 2, (3, 9))
        attention = torch.ones_like(ids)
        attention[1, :2] = 0  # left padding
        labels = ids.masked_fill(attention == 0, -100)
        labels[:, :4] = -100  # only the completion is scored
        valid = labels[:, 1:] != -100
        g, gh = torch.randn(valid.shape), torch.randn(valid.shape)
        head = model.get_output_embeddings()

        def run(fused):
            model.zero_grad()
            out = fused(input_ids=ids, attention_mask=attention, labels=labels)
            lp, en = out.log_probs.float() * valid, out.entropy.float() * valid
            ((lp * g).sum() + (en * gh).sum()).backward()
            return lp.detach(), en.detach(), head.weight.grad.clone()

        # TRL's fused head, as GRPOTrainer.__init__ adds it, on a copy of the same parameters.
        theirs_model = Qwen2ForCausalLM.from_pretrained(self.tmp.name + "/model")
        from trl.trainer.utils import add_fused_lm_head
        add_fused_lm_head(theirs_model, temperature=0.7, outputs=("log_probs", "entropy"))
        theirs_model.load_state_dict(model.state_dict())
        mine = run(lambda **kw: model(**kw, fused_lm_head=True))
        theirs_head = theirs_model.get_output_embeddings()
        theirs_model.zero_grad()
        out = theirs_model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
        (out.log_probs.float() * valid * g).sum().backward()
        self.assertLessEqual((mine[0] - out.log_probs.detach().float() * valid).abs().max().item(), TOL)
        self.assertLessEqual((mine[1] - out.entropy.detach().float() * valid).abs().max().item(), TOL)
        # Eager: the logits of the backbone's hidden states, log-softmax, the gradient of both terms.
        model.zero_grad()
        hidden = model.base_model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
        logits = torch.nn.functional.linear(hidden, head.weight, head.bias) / 0.7
        lsm = torch.log_softmax(logits.double(), -1)
        e_lp = lsm.gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1) * valid
        e_en = -(lsm.exp() * lsm).sum(-1) * valid
        ((e_lp * g).sum() + (e_en * gh).sum()).backward(retain_graph=True)
        self.assertLessEqual((mine[1] - e_en.detach()).abs().max().item(), TOL)
        self.assertLessEqual(rel(mine[2], head.weight.grad), TOL)
        model.zero_grad()
        (e_lp * g).sum().backward()  # the log-probability term alone, as TRL's head differentiates it
        self.assertLessEqual(rel(theirs_head.weight.grad, head.weight.grad), 1e-4)
        trainer.train()
        losses = logged(trainer, "loss")
        self.assertEqual(len(losses), 4)
        self.assertTrue(all(math.isfinite(x) for x in losses), losses)
        with self.assertRaisesRegex(ValueError, "lm_head"):
            reco_trl.grpo_trainer("reco", lm_head="fused")


if __name__ == "__main__":
    unittest.main()
