// detail::parallel_for: the eval metrics' loop over prompts / problems / grid points. An OpenMP
// work-sharing loop when the translation unit is compiled with OpenMP, a plain loop otherwise.
//
// An exception must never leave an OpenMP region (the runtime calls std::terminate), and any
// iteration can throw (an allocation failure, a check inside the body). So every iteration runs
// inside a try block; the exception of the lowest failing iteration is kept and rethrown once the
// loop is over. Iterations above a failure already recorded are skipped, those below it always
// run, so the caller sees the same error a serial loop would throw, with or without OpenMP.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>
#include <utility>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {
namespace detail {

enum class loop_schedule {
  dynamic,  // heavy, uneven iterations (one prompt each)
  blocks,   // many light, even iterations: contiguous blocks, no shared cache lines
};

// Calls body(i) for i in [0, count); rethrows the lowest failing iteration's exception after the
// loop (see above).
template <class Body>
void parallel_for(std::int64_t count, loop_schedule schedule, Body&& body) {
  std::atomic<std::int64_t> first_failed{std::numeric_limits<std::int64_t>::max()};
  std::exception_ptr error;
  const auto run = [&](std::int64_t i) noexcept {
    if (i > first_failed.load(std::memory_order_relaxed)) return;
    try {
      body(i);
    } catch (...) {
      std::exception_ptr e = std::current_exception();
#if defined(_OPENMP)
#pragma omp critical(reco_eval_parallel_for)
#endif
      {
        if (i < first_failed.load(std::memory_order_relaxed)) {
          error = std::move(e);
          first_failed.store(i, std::memory_order_relaxed);
        }
      }
    }
  };
#if defined(_OPENMP)
  if (schedule == loop_schedule::dynamic) {
#pragma omp parallel for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < count; ++i) run(i);
  } else {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < count; ++i) run(i);
  }
#else
  (void)schedule;
  for (std::int64_t i = 0; i < count; ++i) run(i);
#endif
  // The region's end is a barrier (and a flush): `error` is complete here.
  if (error) std::rethrow_exception(error);
}

}  // namespace detail
}  // namespace eval
RECO_NAMESPACE_END
