// bfloat16 linear layers with the very bits of torch's own CPU kernel on AVX2 (no native
// bfloat16), several times faster at the few rows of a decode step.
//
// On such a CPU torch computes every output of a bfloat16 F.linear as one dot product in
// float32 (ReducedPrecisionFloatGemvFastPathKernel: dot_with_fp32_arith): 64 accumulators,
// accumulator p taking the products of elements p, p + 64, p + 128, ... in order (a product
// of two bfloat16 values is exact in float32, so each step rounds once), then the 8 registers
// of 8 lanes are halved pairwise (register i += register i + 4, then + 2, then + 1) and the
// last register's lanes summed as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); a bias is
// added in float32 before the one rounding to bfloat16. It does so one output at a time,
// converting the weight row again for every input row. Here the same sums run for 16 outputs
// and up to 4 input rows at once: the weight is stored once as [16 outputs][64 accumulators]
// [K / 64 steps][16], so one load serves every row, and each output's accumulator p is a lane
// of a vector across outputs rather than across p.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t kLanes = 64;   // accumulators per dot product
constexpr int64_t kBlock = 16;   // outputs per weight block
constexpr int kMaxRows = 4;      // input rows per pass

inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// float32 -> bfloat16, round to nearest even, NaN kept quiet (as c10::BFloat16)
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <int R>
void rows_block(const float* x, int64_t k, const uint16_t* w, int64_t steps, const float* bias,
                uint16_t* y, int64_t ldy, int64_t columns) {
  alignas(32) float sums[R][kLanes][kBlock];
  for (int64_t p = 0; p < kLanes; ++p) {
    __m256 low[R], high[R];
    for (int r = 0; r < R; ++r) low[r] = high[r] = _mm256_setzero_ps();
    const uint16_t* wp = w + p * steps * kBlock;
    for (int64_t t = 0; t < steps; ++t) {
      const __m256 w_low = load_bf16x8(wp + t * kBlock);
      const __m256 w_high = load_bf16x8(wp + t * kBlock + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xv = _mm256_broadcast_ss(x + r * k + t * kLanes + p);
        low[r] = _mm256_fmadd_ps(xv, w_low, low[r]);
        high[r] = _mm256_fmadd_ps(xv, w_high, high[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(sums[r][p], low[r]);
      _mm256_store_ps(sums[r][p] + 8, high[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int half = 0; half < 2; ++half) {
      __m256 a[kLanes];
      for (int64_t p = 0; p < kLanes; ++p) a[p] = _mm256_load_ps(sums[r][p] + 8 * half);
      // torch's register i holds accumulators 8 i .. 8 i + 7
      for (int offset = 4; offset >= 1; offset /= 2)
        for (int i = 0; i < offset; ++i)
          for (int lane = 0; lane < 8; ++lane)
            a[8 * i + lane] = _mm256_add_ps(a[8 * i + lane], a[8 * (i + offset) + lane]);
      __m256 dot = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
          _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
      if (bias != nullptr) dot = _mm256_add_ps(_mm256_loadu_ps(bias + 8 * half), dot);
      alignas(32) float out[8];
      _mm256_store_ps(out, dot);
      for (int c = 0; c < 8; ++c)
        if (8 * half + c < columns) y[r * ldy + 8 * half + c] = to_bf16(out[c]);
    }
  }
}

}  // namespace

torch::Tensor pack(const torch::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 2,
              "a 2-d bfloat16 weight");
  const auto w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(k % kLanes == 0, "in_features must be a multiple of 64, not ", k);
  const int64_t steps = k / kLanes, blocks = (n + kBlock - 1) / kBlock;
  auto packed = torch::zeros({blocks, kLanes, steps, kBlock}, w.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(packed.data_ptr());
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      for (int64_t col = 0; col < k; ++col)
        dst[(((row / kBlock) * kLanes + col % kLanes) * steps + col / kLanes) * kBlock +
            row % kBlock] = src[row * k + col];
  });
  return packed;
}

torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& packed, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && input.dim() == 2, "2-d bfloat16 rows");
  const int64_t m = input.size(0), k = input.size(1), steps = k / kLanes;
  const int64_t blocks = packed.size(0);
  TORCH_CHECK(k % kLanes == 0 && packed.size(2) == steps && blocks * kBlock >= n,
              "the input does not fit the packed weight");
  const auto x = input.to(at::kFloat).contiguous();  // exact
  auto y = torch::empty({m, n}, input.options());
  torch::Tensor b;
  if (bias.has_value()) {
    b = torch::zeros({blocks * kBlock}, input.options().dtype(at::kFloat));
    b.narrow(0, 0, n).copy_(*bias);
  }
  const float* xp = x.data_ptr<float>();
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const float* bp = bias.has_value() ? b.data_ptr<float>() : nullptr;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const uint16_t* w = wp + block * kLanes * steps * kBlock;
      const float* bb = bp != nullptr ? bp + block * kBlock : nullptr;
      const int64_t columns = std::min<int64_t>(kBlock, n - block * kBlock);
      for (int64_t row = 0; row < m; row += kMaxRows) {
        const float* xr = xp + row * k;
        uint16_t* yr = yp + row * n + block * kBlock;
        switch (std::min<int64_t>(kMaxRows, m - row)) {
          case 4: rows_block<4>(xr, k, w, steps, bb, yr, n, columns); break;
          case 3: rows_block<3>(xr, k, w, steps, bb, yr, n, columns); break;
          case 2: rows_block<2>(xr, k, w, steps, bb, yr, n, columns); break;
          default: rows_block<1>(xr, k, w, steps, bb, yr, n, columns);
        }
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("pack", &pack, "weight (out, in) bfloat16 -> the packed copy");
  module.def("linear", &linear, "rows, packed weight, out_features, bias -> bfloat16 rows");
}
