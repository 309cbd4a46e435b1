// The BLAS inside PyTorch's CPU build (sgemm_/dgemm_ and MKL's per-thread thread count, exported by libtorch_cpu),
// shared by tf_family's native kernels.
#pragma once

#include <type_traits>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
            const double* a, const int* lda, const double* b, const int* ldb, const double* beta, double* c,
            const int* ldc);
int MKL_Set_Num_Threads_Local(int nt);  // MKL's C name (mkl_service.h maps mkl_set_num_threads_local onto it)
}

namespace tf_family {

// Column-major BLAS on row-major data: C (m x n, row-major) = op(A) op(B) is computed as C^T = op(B)^T op(A)^T.
template <typename scalar_t>
inline void gemm_rm(bool trans_a, bool trans_b, int m, int n, int k, scalar_t alpha, const scalar_t* a, int lda,
                    const scalar_t* b, int ldb, scalar_t beta, scalar_t* c, int ldc) {
  const char ta = trans_b ? 'T' : 'N';
  const char tb = trans_a ? 'T' : 'N';
  if constexpr (std::is_same_v<scalar_t, float>) {
    sgemm_(&ta, &tb, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
  } else {
    dgemm_(&ta, &tb, &n, &m, &k, &alpha, b, &ldb, a, &lda, &beta, c, &ldc);
  }
}

}  // namespace tf_family
