"""The README's Python program runs as printed and gives examples/basic's numbers.

The section "A first Python program" of README.md holds two python blocks run one after the other
in one namespace: the functional call with the grpo preset (whose loss and clip fraction must be
those of examples/basic/expected_output.txt) and the same batch through reco.nn.PolicyLoss (whose
loss must equal the functional call with the same preset and overrides)."""
import math
import os
import re
import sys

import torch

import reco

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
section = readme.split("## A first Python program", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```python\n(.*?)\n```", section, re.S)
assert len(blocks) == 2, f"README's Python section has {len(blocks)} python blocks, expected 2"

expected = open(os.path.join(root, "examples", "basic", "expected_output.txt"), encoding="utf-8").read()
grpo_block = expected.split("grpo\n", 1)[1]
want_loss = float(re.search(r"loss\s+(-?[0-9.]+)", grpo_block).group(1))
want_clip = float(re.search(r"clipped tokens\s+([0-9.]+)", grpo_block).group(1))

ns = {}
exec(compile(blocks[0], "README.md (first python block)", "exec"), ns)
got_loss, got_clip = ns["out"].loss.item(), ns["out"].stats_dict()["clip_frac"]
assert abs(got_loss - want_loss) < 5e-6, (got_loss, want_loss)
assert abs(got_clip - want_clip) < 5e-5, (got_clip, want_clip)
assert ns["logp"].grad is not None and torch.isfinite(ns["logp"].grad).all()

ns["logp"].grad = None
exec(compile(blocks[1], "README.md (second python block)", "exec"), ns)
module_loss = ns["out"].loss.item()
functional = reco.policy_loss("reco", ns["logp"].detach(), old_logp=ns["old_logp"], ref_logp=ns["ref_logp"],
                              mask=ns["mask"], rewards=ns["rewards"], group_offsets=ns["group_offsets"],
                              overrides={"clip.eps_high": 0.28, "weight.cap": 5.0})
assert math.isclose(module_loss, functional.loss.item(), rel_tol=0, abs_tol=1e-15), \
    (module_loss, functional.loss.item())
print(f"README python program: grpo loss {got_loss:.6f} clip_frac {got_clip:.4f}, module loss {module_loss:.6f}")
sys.exit(0)
