// reco::logits::cblas_gemm: the GEMM object of reco/logits/linear_logp_entropy.hpp over a CBLAS
// (cblas_sgemm / cblas_dgemm; Debian: libopenblas-dev). Link reco::blas, which puts the CBLAS
// header and library on the target. The BLAS's own threads run each GEMM (OpenBLAS: its
// OPENBLAS_NUM_THREADS / OMP_NUM_THREADS).
#pragma once

#include <climits>
#include <string>

#include "reco/config.hpp"

#if !__has_include(<cblas.h>)
#error "reco/logits/cblas_gemm.hpp needs <cblas.h>: link reco::blas (a CBLAS such as OpenBLAS)"
#endif
#include <cblas.h>

RECO_NAMESPACE_BEGIN
namespace logits {

struct cblas_gemm {
  // Row-major C[m, n] = alpha op(A) op(B) + beta C.
  void operator()(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, float alpha, const float* a,
                  index_t lda, const float* b, index_t ldb, float beta, float* c, index_t ldc) const {
    check(m, n, k, lda, ldb, ldc);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }
  void operator()(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, double alpha, const double* a,
                  index_t lda, const double* b, index_t ldb, double beta, double* c, index_t ldc) const {
    check(m, n, k, lda, ldb, ldc);
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
                static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  }

 private:
  // CBLAS takes 32-bit int sizes.
  static void check(index_t m, index_t n, index_t k, index_t lda, index_t ldb, index_t ldc) {
    for (index_t v : {m, n, k, lda, ldb, ldc})
      if (v > INT_MAX)
        ::reco::detail::fail("hidden", "a GEMM dimension of " + std::to_string(v) + " exceeds the CBLAS int range");
  }
};

}  // namespace logits
RECO_NAMESPACE_END
