#!/usr/bin/env python3
"""The C interface from Python (ctypes), without a GPU: the declarations in
benchmarks/cuda/reco_cuda_ctypes.py must match reco_cuda.h field for field, which the argument
errors prove (each names the field the test broke), and the library must refuse bad calls before
touching a device. Usage: test_c_api_ctypes.py <libreco_cuda.so> <benchmarks/cuda dir>"""
import ctypes
import sys

lib_path, module_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, module_dir)
import reco_cuda_ctypes as rc  # noqa: E402

lib = rc.load(lib_path)
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)


def fake(k):  # aligned addresses that are never dereferenced
    return 0x7F0000000000 + 0x1000 * k


ctx = lib.reco_cuda_context_create()
expect(bool(ctx), "context created")
good = rc.ObjectiveArgs(dtype=rc.RECO_FLOAT32, responses=6, tokens=40, offsets=fake(1), groups=2,
                        group_offsets=fake(2), logp=fake(3), old_logp=fake(4), ref_logp=fake(5), mask=fake(7),
                        rewards=fake(8), grad_logp=fake(9))
out = ctypes.c_void_p()
# Each field set to a bad value must be the one the error names.
for field, value in [("ref_logp", None), ("rewards", None), ("grad_logp", None), ("group_offsets", None),
                     ("global_tokens", -1), ("global_kept_responses", -2), ("responses", -1), ("dtype", 3),
                     ("logp", fake(3) + 2)]:
    a = rc.ObjectiveArgs.from_buffer_copy(good)
    setattr(a, field, value)
    code = lib.reco_cuda_objective(ctx, b"grpo", ctypes.byref(a), None, rc.RECO_RESULT_WORKSPACE, None,
                                   ctypes.byref(out))
    message = lib.reco_cuda_last_error().decode()
    expect(code == rc.RECO_INVALID_ARGUMENT, f"{field}: code {code}")
    expect(message.startswith(f"reco: args.{field}:"), f"{field}: message {message!r}")
code = lib.reco_cuda_objective(ctx, b"no_such_preset", ctypes.byref(good), None, rc.RECO_RESULT_WORKSPACE, None,
                               ctypes.byref(out))
expect(code == rc.RECO_INVALID_ARGUMENT and lib.reco_cuda_last_error().startswith(b"reco: preset:"), "preset")

logits = rc.LogitsArgs(dtype=rc.RECO_BFLOAT16, logits=fake(1), rows=10, vocab=100, row_stride=100, tokens=fake(2),
                       temperature=0.7, logp=fake(3), saved_lse=fake(4), dlogits=fake(5), grad_logp=fake(6))
for field, value, backward in [("row_stride", 50, False), ("temperature", 0.0, False), ("tokens", None, False),
                               ("vocab", 0, True), ("saved_lse", None, True), ("dlogits", None, True)]:
    a = rc.LogitsArgs.from_buffer_copy(logits)
    setattr(a, field, value)
    call = lib.reco_cuda_logits_backward if backward else lib.reco_cuda_logits_forward
    code = call(ctypes.byref(a), None)
    message = lib.reco_cuda_last_error().decode()
    expect(code == rc.RECO_INVALID_ARGUMENT and message.startswith(f"reco: args.{field}:"), f"logits {field}: {message!r}")

expect(lib.reco_cuda_context_set_options(ctx, -1, 1, 0) == rc.RECO_INVALID_ARGUMENT, "negative max_blocks refused")
expect(lib.reco_cuda_context_set_options(ctx, 16, 1, 0) == rc.RECO_OK, "options set")
names = rc.preset_names(lib)
expect(len(names) == 21 and names[0] == "grpo" and names[-1] == "dppo", f"preset names {names}")
# Parameters by key: listed per preset, checked without a device, and a bad key refused by the
# objective entry before the arguments are looked at.
keys = rc.override_keys(lib, "rule_80_20")
expect("select.rho" in keys and "clip.eps_high" in keys and "kl.beta" not in keys, f"override keys {keys}")
expect(lib.reco_cuda_check_overrides(b"grpo", *rc.override_arrays({"clip.eps_high": 0.28, "kl.beta": 0.01}))
       == rc.RECO_OK, "good overrides")
for overrides, key in [({"kl.clamp": 0.5}, "kl.clamp"), ({"clip.dual_clip": 3}, "clip.dual_clip"),
                       ({"weight.cap": 2}, "weight.cap")]:
    code = lib.reco_cuda_check_overrides(b"grpo", *rc.override_arrays(overrides))
    message = lib.reco_cuda_last_error().decode()
    expect(code == rc.RECO_INVALID_ARGUMENT and message.startswith(f"reco: overrides.{key}:"), f"{key}: {message!r}")
bad = rc.ObjectiveArgs.from_buffer_copy(good)
bad.ref_logp = None
code = lib.reco_cuda_objective_overrides(ctx, b"grpo", *rc.override_arrays({"clip.eps_lo": 0.1}), ctypes.byref(bad),
                                         None, rc.RECO_RESULT_WORKSPACE, None, ctypes.byref(out))
expect(code == rc.RECO_INVALID_ARGUMENT and lib.reco_cuda_last_error().startswith(b"reco: overrides.clip.eps_lo:"),
       "objective with a bad key")
code = lib.reco_cuda_objective_overrides(ctx, b"grpo", *rc.override_arrays({"clip.eps_high": 0.3}), ctypes.byref(bad),
                                         None, rc.RECO_RESULT_WORKSPACE, None, ctypes.byref(out))
expect(code == rc.RECO_INVALID_ARGUMENT and lib.reco_cuda_last_error().startswith(b"reco: args.ref_logp:"),
       "objective with good overrides checks the arguments")
expect(lib.reco_cuda_describe_status(0) == b"ok", "status 0")
expect(lib.reco_cuda_describe_status(1 << 3).startswith(b"batch.old_logp:"), "status bit 3")
# reco_cuda_result on LP64: 4 doubles, 15 doubles + int64 + 3 doubles + double[3] + 3 int64, uint32 + padding.
expect(ctypes.sizeof(rc.Result) == 32 + 15 * 8 + 8 + 3 * 8 + 24 + 24 + 8, f"Result size {ctypes.sizeof(rc.Result)}")
lib.reco_cuda_context_destroy(ctx)

for f in failures:
    print("FAILED:", f)
print("ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
