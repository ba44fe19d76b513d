// RECO_EVAL_PARALLEL_FOR: an OpenMP work-sharing loop when the translation unit is compiled with
// OpenMP, nothing otherwise. A macro (not a bare #pragma) so that builds without -fopenmp do not
// warn about an unknown pragma. The loops it marks never throw: inputs are validated first.
#pragma once

// RECO_EVAL_PARALLEL_FOR suits loops whose iterations are heavy and uneven (one prompt each);
// RECO_EVAL_PARALLEL_FOR_STATIC suits many light, even iterations (contiguous blocks, so the
// threads do not write to the same cache lines).
#if defined(_OPENMP)
#define RECO_EVAL_PARALLEL_FOR _Pragma("omp parallel for schedule(dynamic, 1)")
#define RECO_EVAL_PARALLEL_FOR_STATIC _Pragma("omp parallel for schedule(static)")
#else
#define RECO_EVAL_PARALLEL_FOR
#define RECO_EVAL_PARALLEL_FOR_STATIC
#endif
