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
// converting the weight row again for every input row. Here the same sums run for 32 outputs
// and up to 3 input rows at once (12 accumulator registers of AVX2's 16): the weight is stored
// once as [32 outputs][64 accumulators][K / 64 steps][32], so one load serves every row, and
// each output's accumulator p is a lane of a vector across outputs rather than across p.
//
// Built with -fopenmp where torch's CPU threads are OpenMP's (the Linux wheels): at::parallel_for
// is inline code that runs on one thread without it. The extension then links the libgomp.so.1
// torch has already loaded, so torch.set_num_threads governs it as every torch kernel.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 64;   // accumulators per dot product
constexpr int64_t kBlock = 32;   // outputs per weight block: 4 vectors of 8
constexpr int kVectors = 4;
constexpr int kMaxRows = 3;      // input rows per pass

// Within each 16 outputs of a block the weight is stored interleaved (output i at position
// 2 i, output 8 + i at 2 i + 1), so one 32-byte load gives both vectors of 8 as float32: the
// even bfloat16s shifted up, the odd ones masked in place.
inline int64_t slot_of(int64_t output) {
  const int64_t half = output / 16, q = output % 16;
  return 16 * half + (q < 8 ? 2 * q : 2 * (q - 8) + 1);
}

// float32 -> bfloat16 for 8 values, round to nearest even, NaN kept quiet (as c10::BFloat16)
inline __m128i to_bf16(__m256 values) {
  const __m256i u = _mm256_castps_si256(values);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i bits = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256 nan = _mm256_cmp_ps(values, values, _CMP_UNORD_Q);
  bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
  const __m256i packed = _mm256_packus_epi32(bits, bits);  // per 128-bit lane: 0-3 0-3 | 4-7 4-7
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// R rows of x laid out as [64][steps][R] floats, one block of weights: y[r][0..columns).
// Meanwhile `ahead_bytes` of the next block from `ahead` are fetched into the cache, spread
// over the pass: a block's first pass would otherwise wait on memory at every line.
template <int R>
void rows_block(const float* xs, const uint16_t* w, int64_t steps, const float* bias,
                uint16_t* y, int64_t ldy, int64_t columns, const char* ahead,
                int64_t ahead_bytes) {
  alignas(32) float sums[R][kLanes][kBlock];
  const __m256 high_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  for (int64_t p = 0; p < kLanes; ++p) {
    __m256 acc[R][kVectors];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm256_setzero_ps();
    const uint16_t* wp = w + p * steps * kBlock;
    const float* xp = xs + p * steps * R;
    if (ahead != nullptr)
      for (int64_t at = p * ahead_bytes / kLanes; at < (p + 1) * ahead_bytes / kLanes; at += 64)
        _mm_prefetch(ahead + at, _MM_HINT_T0);
    for (int64_t t = 0; t < steps; ++t) {
      __m256 xv[R];
      for (int r = 0; r < R; ++r) xv[r] = _mm256_broadcast_ss(xp + t * R + r);
      for (int half = 0; half < kVectors / 2; ++half) {
        const __m256i raw =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + t * kBlock + 16 * half));
        const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
        for (int r = 0; r < R; ++r)
          acc[r][2 * half] = _mm256_fmadd_ps(xv[r], even, acc[r][2 * half]);
        const __m256 odd = _mm256_and_ps(_mm256_castsi256_ps(raw), high_mask);
        for (int r = 0; r < R; ++r)
          acc[r][2 * half + 1] = _mm256_fmadd_ps(xv[r], odd, acc[r][2 * half + 1]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVectors; ++v) _mm256_store_ps(sums[r][p] + 8 * v, acc[r][v]);
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < kVectors; ++v) {
      if (8 * v >= columns) break;
      // torch's register i holds accumulators 8 i .. 8 i + 7: halved pairwise (i += i + 4,
      // then + 2, then + 1), so lane l ends as the sum below, written out so that the
      // compiler loads each value when it is needed instead of spilling 64 registers
      const float* base = &sums[r][0][8 * v];
      auto s = [&](int p) { return _mm256_load_ps(base + p * kBlock); };
      __m256 lane[8];
      for (int l = 0; l < 8; ++l) {
        const __m256 even = _mm256_add_ps(_mm256_add_ps(s(l), s(l + 32)),
                                          _mm256_add_ps(s(l + 16), s(l + 48)));
        const __m256 odd = _mm256_add_ps(_mm256_add_ps(s(l + 8), s(l + 40)),
                                         _mm256_add_ps(s(l + 24), s(l + 56)));
        lane[l] = _mm256_add_ps(even, odd);
      }
      __m256 dot = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(lane[0], lane[4]), _mm256_add_ps(lane[2], lane[6])),
          _mm256_add_ps(_mm256_add_ps(lane[1], lane[5]), _mm256_add_ps(lane[3], lane[7])));
      if (bias != nullptr) dot = _mm256_add_ps(_mm256_loadu_ps(bias + 8 * v), dot);
      const __m128i out = to_bf16(dot);
      uint16_t* yr = y + r * ldy + 8 * v;
      if (8 * v + 8 <= columns) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yr), out);
      } else {
        alignas(16) uint16_t last[8];
        _mm_store_si128(reinterpret_cast<__m128i*>(last), out);
        std::copy(last, last + (columns - 8 * v), yr);
      }
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
    for (int64_t row = begin; row < end; ++row) {
      uint16_t* block = dst + (row / kBlock) * kLanes * steps * kBlock + slot_of(row % kBlock);
      for (int64_t col = 0; col < k; ++col)
        block[((col % kLanes) * steps + col / kLanes) * kBlock] = src[row * k + col];
    }
  });
  return packed;
}

torch::Tensor linear(const torch::Tensor& input, const torch::Tensor& packed, int64_t n,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && input.dim() == 2, "2-d bfloat16 rows");
  const int64_t m = input.size(0), k = input.size(1), steps = k / kLanes;
  const int64_t blocks = packed.size(0);
  TORCH_CHECK(k % kLanes == 0 && packed.size(2) == steps && packed.size(3) == kBlock &&
                  blocks * kBlock >= n,
              "the input does not fit the packed weight");
  const auto x = input.contiguous();
  auto y = torch::empty({m, n}, input.options());
  if (m == 0) return y;
  torch::Tensor b;
  if (bias.has_value()) {
    b = torch::zeros({blocks * kBlock}, input.options().dtype(at::kFloat));
    b.narrow(0, 0, n).copy_(*bias);
  }
  // the rows in passes of at most kMaxRows, as even as can be; each pass's rows as float32
  // (exact) laid out [64][steps][rows], so one step's values for every row are adjacent
  const int64_t passes = (m + kMaxRows - 1) / kMaxRows;
  std::vector<int64_t> first(passes + 1);
  for (int64_t i = 0; i <= passes; ++i) first[i] = i * m / passes;
  std::vector<float> xs(m * k);
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  at::parallel_for(0, passes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r0 = first[i], rows = first[i + 1] - r0;
      float* dst = xs.data() + r0 * k;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < k; ++col) {
          const uint32_t bits = static_cast<uint32_t>(xp[(r0 + r) * k + col]) << 16;
          float value;
          std::memcpy(&value, &bits, sizeof value);
          dst[((col % kLanes) * steps + col / kLanes) * rows + r] = value;
        }
    }
  });
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  const float* bp = bias.has_value() ? b.data_ptr<float>() : nullptr;
  const int64_t block_size = kLanes * steps * kBlock;  // elements
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const uint16_t* w = wp + block * block_size;
      const float* bb = bp != nullptr ? bp + block * kBlock : nullptr;
      const int64_t columns = std::min<int64_t>(kBlock, n - block * kBlock);
      // this thread's next block, a share of it per pass (with one pass the hardware's own
      // prefetching streams the weights faster: measured)
      const char* next = passes > 1 && block + 1 < end
                             ? reinterpret_cast<const char*>(w + block_size) : nullptr;
      const int64_t bytes = block_size * static_cast<int64_t>(sizeof(uint16_t));
      for (int64_t i = 0; i < passes; ++i) {
        const int64_t r0 = first[i], rows = first[i + 1] - r0;
        const float* xr = xs.data() + r0 * k;
        uint16_t* yr = yp + r0 * n + block * kBlock;
        const char* ahead = next != nullptr ? next + i * bytes / passes : nullptr;
        const int64_t ahead_bytes = (i + 1) * bytes / passes - i * bytes / passes;
        switch (rows) {
          case 3: rows_block<3>(xr, w, steps, bb, yr, n, columns, ahead, ahead_bytes); break;
          case 2: rows_block<2>(xr, w, steps, bb, yr, n, columns, ahead, ahead_bytes); break;
          default: rows_block<1>(xr, w, steps, bb, yr, n, columns, ahead, ahead_bytes);
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
