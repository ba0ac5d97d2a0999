// The fp32 attention's key tile (SIMT, one query row per thread), shared by the scoring kernel
// (attention.cu) and the paged chunked prefill (attention_paged_prefill.cu), so that a row sees
// the same arithmetic whichever of them runs it: a chunked prefill gets the bits of a whole one.
#pragma once

#include <cmath>

namespace lfm2::cuda {

// Keys and values k0 .. k0 + kKeys - 1 (ks, vs: staged in shared memory as fp32) against the
// thread's query row qr (pre-scaled by log2(e) / sqrt(head_dim)) at position qpos: the tile's scores,
// keys past qpos masked, then the online softmax's update of the running max m, sum l and output o.
template <int HD, int kKeys, typename Pos>
__device__ __forceinline__ void simt_key_tile(const float (&ks)[kKeys][HD], const float (&vs)[kKeys][HD],
                                              const float (&qr)[HD], float (&o)[HD], float& m, float& l, Pos k0,
                                              Pos qpos) {
  float sc[kKeys];
  float tmax = -INFINITY;
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    float acc = 0.f;
#pragma unroll
    for (int d = 0; d < HD; d += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(&ks[j][d]);
      acc += qr[d] * kk.x + qr[d + 1] * kk.y + qr[d + 2] * kk.z + qr[d + 3] * kk.w;
    }
    sc[j] = (k0 + j <= qpos) ? acc : -INFINITY;
    tmax = fmaxf(tmax, sc[j]);
  }
  const float m_new = fmaxf(m, tmax);
  if (m_new == -INFINITY) return;  // no key visible yet
  const float alpha = exp2f(m - m_new);
  l *= alpha;
#pragma unroll
  for (int d = 0; d < HD; ++d) o[d] *= alpha;
#pragma unroll
  for (int j = 0; j < kKeys; ++j) {
    const float p = exp2f(sc[j] - m_new);
    l += p;
#pragma unroll
    for (int d = 0; d < HD; d += 4) {
      const float4 vv = *reinterpret_cast<const float4*>(&vs[j][d]);
      o[d] += p * vv.x;
      o[d + 1] += p * vv.y;
      o[d + 2] += p * vv.z;
      o[d + 3] += p * vv.w;
    }
  }
  m = m_new;
}

}  // namespace lfm2::cuda
