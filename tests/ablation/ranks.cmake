# reco_ablation --ranks: the same tiny study with 1 rank and with 2 and 3 data-parallel ranks
# (forked processes, Gloo on 127.0.0.1) must log the same per-step losses and diagnostics.
# cmake -P script, driven by ctest:
#   -DPROGRAM=<reco_ablation> -DCOMPARE=<reco_ablation_compare> -DOUT=<scratch directory>
#
# The policy is float32, so the logs agree to float rounding, not to 1e-9: the ranks' shares run
# the forward pass on fewer rows, the gradient is a float32 sum over ranks, and AdamW carries the
# differences into the next optimiser steps. The loss must agree to 1e-5 relative (+ 1e-9), the
# token and response means to 1e-5 relative + 1e-7 (PPO-KL is a mean of float32 log-ratio noise
# near 0); the cap hits, the groups trained on and the reward must be equal. The mechanism logged
# per step: the variance-vs-standard ratio gap is all-reduced from the ranks' token sums (1e-3
# relative: float32 differences of ratios near 1), the weight statistics come from the same
# rollouts on every rank. (Not GRPO or ReCo:
# on this task their sequence-mean losses are ~1e-10, a cancellation that tests nothing.)
file(REMOVE_RECURSE "${OUT}")
set(configs dapo_reco rule_80_20_reco)
string(REPLACE ";" "," config_list "${configs}")
# 3 RL steps of 4 optimiser steps, one prompt group (8 responses) per optimiser step: 2 ranks
# split every group 4 + 4, 3 ranks 2 + 3 + 3 (uneven, groups across ranks).
set(args --smoke --configs ${config_list} --seeds 1 --set rl.steps=3)

foreach(ranks 1 2 3)
  if(NOT ranks EQUAL 1)
    # The base policy is pretrained once: the runs share its cache (its key ignores --ranks).
    file(COPY "${OUT}/r1/cache" DESTINATION "${OUT}/r${ranks}")
  endif()
  execute_process(COMMAND "${PROGRAM}" ${args} --ranks ${ranks} --out "${OUT}/r${ranks}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "reco_ablation --ranks ${ranks} failed (${rc}):\n${log}")
  endif()
  file(STRINGS "${OUT}/r${ranks}/settings.txt" line REGEX "^ranks=")
  if(NOT line STREQUAL "ranks=${ranks}")
    message(FATAL_ERROR "settings.txt of the --ranks ${ranks} run has '${line}'")
  endif()
endforeach()

foreach(cfg IN LISTS configs)
  foreach(ranks 2 3)
    execute_process(COMMAND "${COMPARE}" "${OUT}/r1/runs/${cfg}_b1_s1/train.csv" "${OUT}/r${ranks}/runs/${cfg}_b1_s1/train.csv"
                            loss:1e-5:1e-9 clip_frac:1e-5:1e-7 ppo_kl:1e-5:1e-7 weight_mean:1e-5:1e-7
                            weight_max:1e-5:1e-7 cap_hits:0:0 groups_used:0:0 reward:0:0
                            ratio_gap:1e-3:1e-6 weight_spread:1e-5:1e-9 rare_pos_weighted:1e-5:1e-9
                    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log TIMEOUT 30)
    message(STATUS "${cfg}, 1 rank against ${ranks}:\n${log}")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${cfg}: the --ranks ${ranks} run does not match the 1-rank run")
    endif()
  endforeach()
endforeach()
message(STATUS "ablation ranks test: 2 and 3 ranks log the 1-rank run's losses")
