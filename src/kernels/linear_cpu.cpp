// Linear on the CPU: threads split the output columns (weight rows); each thread walks blocks of
// weight rows (kept in cache) against every input row, two rows by two columns at a time.
// Every output element gets exactly kernels/dot.h's arithmetic (same lanes, same final
// combine), so the result does not depend on the blocking or on the thread split.
#include "kernels/linear.h"

#include <algorithm>
#include <cstring>

#include "common/parallel.h"
#include "kernels/dot.h"

namespace lfm2::cpu {

namespace {

// y[r][c] = dot(x_r, w_c) for r, c in {0, 1}, each with dot()'s 8-lane order: lanes 0-3 and 4-7
// of each dot live in two 4-wide vectors (GCC/Clang vector extensions, any target), the tail and
// the final combine are dot()'s.
typedef float V4 __attribute__((vector_size(16)));

inline V4 load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void dot_2x2(const float* x0, const float* x1, const float* w0, const float* w1, int64_t n, float* y00,
                    float* y01, float* y10, float* y11) {
  V4 a00l = {}, a00h = {}, a01l = {}, a01h = {}, a10l = {}, a10h = {}, a11l = {}, a11h = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V4 x0l = load4(x0 + i), x0h = load4(x0 + i + 4), x1l = load4(x1 + i), x1h = load4(x1 + i + 4);
    const V4 w0l = load4(w0 + i), w0h = load4(w0 + i + 4), w1l = load4(w1 + i), w1h = load4(w1 + i + 4);
    a00l += x0l * w0l;
    a00h += x0h * w0h;
    a01l += x0l * w1l;
    a01h += x0h * w1h;
    a10l += x1l * w0l;
    a10h += x1h * w0h;
    a11l += x1l * w1l;
    a11h += x1h * w1h;
  }
  float a00[8], a01[8], a10[8], a11[8];
  auto spill = [](float* a, V4 lo, V4 hi) {
    std::memcpy(a, &lo, sizeof(lo));
    std::memcpy(a + 4, &hi, sizeof(hi));
  };
  spill(a00, a00l, a00h);
  spill(a01, a01l, a01h);
  spill(a10, a10l, a10h);
  spill(a11, a11l, a11h);
  for (int j = 0; i < n; ++i, ++j) {
    a00[j] += x0[i] * w0[i];
    a01[j] += x0[i] * w1[i];
    a10[j] += x1[i] * w0[i];
    a11[j] += x1[i] * w1[i];
  }
  auto combine = [](const float* a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); };
  *y00 = combine(a00);
  *y01 = combine(a01);
  *y10 = combine(a10);
  *y11 = combine(a11);
}

// Output columns [j0, j1) for every row.
void linear_block(float* out, const float* in, const float* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
                  int64_t j0, int64_t j1) {
  int64_t i = 0;
  for (; i + 2 <= n_rows; i += 2) {
    const float* x0 = in + i * n_in;
    const float* x1 = x0 + n_in;
    float* y0 = out + i * n_out;
    float* y1 = y0 + n_out;
    int64_t j = j0;
    for (; j + 2 <= j1; j += 2)
      dot_2x2(x0, x1, weight + j * n_in, weight + (j + 1) * n_in, n_in, &y0[j], &y0[j + 1], &y1[j], &y1[j + 1]);
    for (; j < j1; ++j) {
      y0[j] = dot(x0, weight + j * n_in, n_in);
      y1[j] = dot(x1, weight + j * n_in, n_in);
    }
  }
  for (; i < n_rows; ++i)
    for (int64_t j = j0; j < j1; ++j) out[i * n_out + j] = dot(in + i * n_in, weight + j * n_in, n_in);
}

}  // namespace

void linear(float* out, const float* in, const float* weight, int64_t n_rows, int64_t n_in, int64_t n_out,
            int n_threads) {
  constexpr int64_t kColBlock = 16;
  const int64_t n_blocks = (n_out + kColBlock - 1) / kColBlock;
  const int64_t min_blocks = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n_rows * n_in * kColBlock));
  parallel_for(n_blocks, n_threads, [&](int64_t bb, int64_t be, int) {
    for (int64_t blk = bb; blk < be; ++blk)
      linear_block(out, in, weight, n_rows, n_in, n_out, blk * kColBlock, std::min(n_out, (blk + 1) * kColBlock));
  }, min_blocks);
}

}  // namespace lfm2::cpu
