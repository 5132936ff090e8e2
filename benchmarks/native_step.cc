// An experiment, not part of the library (benchmarks/native_step.py): FOAM's
// step for one float32 matrix folded along axis -2 (blocks of k rows) as one
// hand-written loop, called from JAX through the XLA FFI.
//
// Per block of k rows, with column j's block mean gm_j and mean of squares
// sm_j (read while the k rows are in cache):
//   mu_j <- b1 mu_j + (1 - b1) gm_j,   nu_j <- b2 nu_j + (1 - b2) sm_j
//   r = g - gm_j,  M = mu_j + r,  V = nu_j + r^2
//   u = step_scale M / (sqrt(V) + eps)   (step_scale = sqrt(1-b2^t)/(1-b1^t))
// FoamApplyF32 writes p <- p - lr (u + wd p) in place (FOAM, weight decay,
// learning rate and the apply in one pass: reads g and p, writes p);
// FoamUpdateF32 writes u to a buffer of its own (what optax's
// update/apply_updates split needs). mu and nu are updated in place in both
// (hence `ivdep`: an output may be its input's buffer, entry for entry).
#include <cmath>
#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One block of k rows of g (row length cols): updates the moments' row in
// place, mu <- b1 mu + (1 - b1) mean(g), nu <- b2 nu + (1 - b2) mean(g^2),
// and leaves the block mean of each column in gm (sm is scratch).
inline void BlockMoments(const float* gb, int64_t k, int64_t cols, float b1, float b2,
                         const float* m0, const float* v0, float* m1, float* v1,
                         float* gm, float* sm) {
  const float inv_k = 1.0f / static_cast<float>(k);
  for (int64_t j = 0; j < cols; ++j) gm[j] = sm[j] = 0.0f;
  for (int64_t r = 0; r < k; ++r) {
    const float* gr = gb + r * cols;
#pragma GCC ivdep
    for (int64_t j = 0; j < cols; ++j) {
      gm[j] += gr[j];
      sm[j] += gr[j] * gr[j];
    }
  }
#pragma GCC ivdep
  for (int64_t j = 0; j < cols; ++j) {
    gm[j] *= inv_k;
    m1[j] = b1 * m0[j] + (1.0f - b1) * gm[j];
    v1[j] = b2 * v0[j] + (1.0f - b2) * (sm[j] * inv_k);
  }
}

template <bool kApply>
ffi::Error FoamStep(ffi::Buffer<ffi::F32> p, ffi::Buffer<ffi::F32> g,
                    ffi::Buffer<ffi::F32> mu, ffi::Buffer<ffi::F32> nu,
                    ffi::Buffer<ffi::F32> scalars, float b1, float b2, float eps,
                    float wd, int64_t k, ffi::ResultBuffer<ffi::F32> out,
                    ffi::ResultBuffer<ffi::F32> mu_out,
                    ffi::ResultBuffer<ffi::F32> nu_out) {
  auto dims = p.dimensions();
  if (dims.size() != 2 || k < 1 || dims[0] % k != 0) {
    return ffi::Error::InvalidArgument("a 2-D leaf whose rows divide into blocks of k");
  }
  const int64_t rows = dims[0], cols = dims[1];
  const float step_scale = scalars.typed_data()[0];
  const float lr = scalars.typed_data()[1];
  const float* gp = g.typed_data();
  const float* pp = p.typed_data();
  const float* m0 = mu.typed_data();
  const float* v0 = nu.typed_data();
  float* op = out->typed_data();
  float* m1 = mu_out->typed_data();
  float* v1 = nu_out->typed_data();
  std::vector<float> gm(cols), sm(cols);
  for (int64_t b = 0; b < rows / k; ++b) {
    const float* gb = gp + b * k * cols;
    const int64_t s = b * cols;
    BlockMoments(gb, k, cols, b1, b2, m0 + s, v0 + s, m1 + s, v1 + s, gm.data(), sm.data());
    for (int64_t r = 0; r < k; ++r) {
      const int64_t e = (b * k + r) * cols;
#pragma GCC ivdep
      for (int64_t j = 0; j < cols; ++j) {
        const float res = gp[e + j] - gm[j];
        const float u = step_scale * (m1[s + j] + res) /
                        (std::sqrt(v1[s + j] + res * res) + eps);
        if constexpr (kApply) {
          op[e + j] = pp[e + j] - lr * (u + wd * pp[e + j]);
        } else {
          op[e + j] = u;
        }
      }
    }
  }
  return ffi::Error::Success();
}

// The moments alone, in place (one pass over g for both), and optionally the
// block means gm: FOAM's update stays XLA code that reads them.
template <bool kMean>
ffi::Error FoamMoments(ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> mu,
                       ffi::Buffer<ffi::F32> nu, float b1, float b2, int64_t k,
                       ffi::ResultBuffer<ffi::F32> mu_out,
                       ffi::ResultBuffer<ffi::F32> nu_out,
                       ffi::ResultBuffer<ffi::F32> mean_out) {
  auto dims = g.dimensions();
  if (dims.size() != 2 || k < 1 || dims[0] % k != 0) {
    return ffi::Error::InvalidArgument("a 2-D leaf whose rows divide into blocks of k");
  }
  const int64_t rows = dims[0], cols = dims[1];
  const float* gp = g.typed_data();
  const float* m0 = mu.typed_data();
  const float* v0 = nu.typed_data();
  float* m1 = mu_out->typed_data();
  float* v1 = nu_out->typed_data();
  float* mean = mean_out->typed_data();
  std::vector<float> gm(cols), sm(cols);
  for (int64_t b = 0; b < rows / k; ++b) {
    const int64_t s = b * cols;
    BlockMoments(gp + b * k * cols, k, cols, b1, b2, m0 + s, v0 + s, m1 + s, v1 + s,
                 gm.data(), sm.data());
    if constexpr (kMean) {
      for (int64_t j = 0; j < cols; ++j) mean[s + j] = gm[j];
    }
  }
  return ffi::Error::Success();
}

}  // namespace

#define FOAM_BIND                                         \
  ffi::Ffi::Bind()                                        \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Attr<float>("b1")                                  \
      .Attr<float>("b2")                                  \
      .Attr<float>("eps")                                 \
      .Attr<float>("wd")                                  \
      .Attr<int64_t>("k")                                 \
      .Ret<ffi::Buffer<ffi::F32>>()                       \
      .Ret<ffi::Buffer<ffi::F32>>()                       \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoamApplyF32, FoamStep<true>, FOAM_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FoamUpdateF32, FoamStep<false>, FOAM_BIND);

#define FOAM_MOMENTS_BIND                                 \
  ffi::Ffi::Bind()                                        \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Arg<ffi::Buffer<ffi::F32>>()                       \
      .Attr<float>("b1")                                  \
      .Attr<float>("b2")                                  \
      .Attr<int64_t>("k")                                 \
      .Ret<ffi::Buffer<ffi::F32>>()                       \
      .Ret<ffi::Buffer<ffi::F32>>()                       \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(FoamMomentsF32, FoamMoments<false>, FOAM_MOMENTS_BIND);
XLA_FFI_DEFINE_HANDLER_SYMBOL(FoamMomentsMeanF32, FoamMoments<true>, FOAM_MOMENTS_BIND);
