"""ctypes declarations of reco's C interface (adapters/cuda/include/reco/cuda_adapter/reco_cuda.h),
for Python programs that drive libreco_cuda.so: the argument structs field for field, the
enumerations, and the function signatures. No torch needed here.

  lib = reco_cuda_ctypes.load("build/adapters/cuda/libreco_cuda.so")
  ctx = lib.reco_cuda_context_create()
  args = reco_cuda_ctypes.ObjectiveArgs(dtype=reco_cuda_ctypes.RECO_FLOAT32, responses=R, ...)
  rc = lib.reco_cuda_objective(ctx, b"grpo", ctypes.byref(args), stream, reco_cuda_ctypes.RECO_RESULT_HOST,
                               ctypes.byref(result), None)
"""
import ctypes

RECO_FLOAT32, RECO_FLOAT64, RECO_BFLOAT16, RECO_FLOAT16 = 0, 1, 2, 3
RECO_RESULT_HOST, RECO_RESULT_DEVICE, RECO_RESULT_WORKSPACE = 0, 1, 2
RECO_OK, RECO_INVALID_ARGUMENT, RECO_BAD_DATA, RECO_RUNTIME_ERROR = 0, 1, 2, 3


class ObjectiveArgs(ctypes.Structure):  # reco_cuda_objective_args
    _fields_ = [("dtype", ctypes.c_int), ("responses", ctypes.c_int64), ("tokens", ctypes.c_int64),
                ("max_length", ctypes.c_int64), ("offsets", ctypes.c_void_p), ("groups", ctypes.c_int64),
                ("group_offsets", ctypes.c_void_p), ("logp", ctypes.c_void_p), ("old_logp", ctypes.c_void_p),
                ("ref_logp", ctypes.c_void_p), ("entropy", ctypes.c_void_p), ("mask", ctypes.c_void_p),
                ("token_weights", ctypes.c_void_p), ("rewards", ctypes.c_void_p), ("advantages", ctypes.c_void_p),
                ("response_weights", ctypes.c_void_p), ("grad_logp", ctypes.c_void_p),
                ("grad_entropy", ctypes.c_void_p), ("global_tokens", ctypes.c_int64),
                ("global_responses", ctypes.c_int64), ("global_kept_tokens", ctypes.c_int64),
                ("global_kept_responses", ctypes.c_int64)]


class LogitsArgs(ctypes.Structure):  # reco_cuda_logits_args
    _fields_ = [("dtype", ctypes.c_int), ("logits", ctypes.c_void_p), ("rows", ctypes.c_int64),
                ("vocab", ctypes.c_int64), ("row_stride", ctypes.c_int64), ("tokens", ctypes.c_void_p),
                ("temperature", ctypes.c_double), ("row_mask", ctypes.c_void_p), ("logp", ctypes.c_void_p),
                ("entropy", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("sum_p_squared", ctypes.c_void_p),
                ("grad_logp", ctypes.c_void_p), ("grad_entropy", ctypes.c_void_p), ("saved_lse", ctypes.c_void_p),
                ("saved_entropy", ctypes.c_void_p), ("dlogits", ctypes.c_void_p), ("error_flags", ctypes.c_void_p)]


class Diagnostics(ctypes.Structure):  # reco_cuda_diagnostics
    _fields_ = [(name, ctypes.c_double) for name in (
        "clip_frac", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "ppo_kl", "ratio_mean", "ratio_min",
        "ratio_max", "ref_kl_mean", "entropy_mean", "entropy_kept_mean", "kept_frac", "weight_mean", "weight_min",
        "weight_max")] + [("weight_cap_hits", ctypes.c_int64)] + [(name, ctypes.c_double) for name in (
        "zero_std_group_frac", "advantage_mean", "advantage_std")] + [
        ("token_variance", ctypes.c_double * 3), ("valid_tokens", ctypes.c_int64),
        ("policy_tokens", ctypes.c_int64), ("nonempty_responses", ctypes.c_int64)]


class Result(ctypes.Structure):  # reco_cuda_result
    _fields_ = [("loss", ctypes.c_double), ("policy_loss", ctypes.c_double), ("kl_loss", ctypes.c_double),
                ("entropy_loss", ctypes.c_double), ("stats", Diagnostics), ("status", ctypes.c_uint32),
                ("reserved", ctypes.c_uint32)]


def load(path):
    lib = ctypes.CDLL(path)
    lib.reco_cuda_context_create.restype = ctypes.c_void_p
    lib.reco_cuda_context_destroy.argtypes = [ctypes.c_void_p]
    lib.reco_cuda_objective.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ObjectiveArgs),
                                        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.POINTER(ctypes.c_void_p)]
    lib.reco_cuda_logits_forward.argtypes = [ctypes.POINTER(LogitsArgs), ctypes.c_void_p]
    lib.reco_cuda_logits_backward.argtypes = [ctypes.POINTER(LogitsArgs), ctypes.c_void_p]
    lib.reco_cuda_context_set_options.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.reco_cuda_last_error.restype = ctypes.c_char_p
    lib.reco_cuda_describe_status.restype = ctypes.c_char_p
    lib.reco_cuda_describe_status.argtypes = [ctypes.c_uint32]
    lib.reco_cuda_preset_name.restype = ctypes.c_char_p
    lib.reco_cuda_preset_name.argtypes = [ctypes.c_int]
    keys_values = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_double), ctypes.c_int64]
    lib.reco_cuda_objective_overrides.argtypes = [ctypes.c_void_p, ctypes.c_char_p] + keys_values + [
        ctypes.POINTER(ObjectiveArgs), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p)]
    lib.reco_cuda_check_overrides.argtypes = [ctypes.c_char_p] + keys_values
    lib.reco_cuda_override_key.restype = ctypes.c_char_p
    lib.reco_cuda_override_key.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return lib


def override_arrays(overrides):
    """A dict {"clip.eps_high": 0.28, ...} as the (keys, values, count) arguments of
    reco_cuda_objective_overrides / reco_cuda_check_overrides."""
    items = list((overrides or {}).items())
    keys = (ctypes.c_char_p * max(1, len(items)))(*[k.encode() for k, _ in items])
    values = (ctypes.c_double * max(1, len(items)))(*[float(v) for _, v in items])
    return keys, values, len(items)


def override_keys(lib, preset):
    keys, k = [], 0
    while True:
        key = lib.reco_cuda_override_key(preset.encode(), k)
        if key is None:
            return keys
        keys.append(key.decode())
        k += 1


def preset_names(lib):
    names, k = [], 0
    while True:
        name = lib.reco_cuda_preset_name(k)
        if name is None:
            return names
        names.append(name.decode())
        k += 1


