// The model's small operations, its matrix products and its decode attention, each as one compiled
// call on the CPU.
//
// Why this file exists: a decode step of SmolLM2-135M makes about sixty PyTorch calls per layer
// besides its four matrix products. At one sequence each call does almost no arithmetic, so the
// step's time goes to dispatching them (a few microseconds each, 30 layers deep); at 32 sequences the
// attention's gather copies every cached K/V row before SDPA reads it again, and MKL runs the thin
// products well below what the cores can do. Each function below is
// the same math as a few lines of model/llama.py or attention/batched.py, which stay the oracle
// (tests/ch00_the_kv_cache/test_cpu_kernels.py asserts each equal to them). model/kernels.py builds
// this file with the C++ compiler on first use and falls back to the PyTorch code when it cannot.
//
// The work is spread with at::parallel_for, which runs on PyTorch's own OpenMP threads: no second
// thread pool competes with PyTorch's for the cores.
//
// Shapes as in model/llama.py: T tokens, D hidden size, N heads, Dh head size, F intermediate size;
// the cache is [num_blocks, block_size, KVH, Dh] per layer. float32 only.
//
// Not handled: other dtypes, tensors off the CPU (model/kernels.py sends those to the PyTorch code).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MINIPAGED_AVX2 1
#endif

namespace {

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
}

#ifdef MINIPAGED_AVX2
// the sum of a vector's 8 floats
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(s);
}
#endif

// a · b over n floats
inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef MINIPAGED_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  sum = hsum(acc);
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}


#ifdef MINIPAGED_AVX2
// exp of 8 floats at once, x <= 0 (a score minus its row's maximum, or -|gate| in silu): exp(x) = 2^k exp(r) with
// k = round(x / ln 2) and |r| <= ln(2) / 2, exp(r) by its Taylor series to r^6 (error below 1e-7,
// a float's own rounding). Below -87 the result is a tiny float instead of 0, which a sum of at least 1
// (the maximum's own term) cannot notice.
inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);  // ln 2 in two parts, for accuracy
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_k));
}

// the sums of eight vectors, as one vector: lane i = the sum of a[i]'s 8 floats
inline __m256 hsum8(const __m256* a) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#endif

}  // namespace

// RMSNorm: y = x / sqrt(mean(x²) + eps) * weight, row by row.   x [T, D], weight [D] -> [T, D]
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  check_float(x_in, "x");
  check_float(weight, "weight");
  const at::Tensor x = x_in.contiguous(), w = weight.contiguous();
  at::Tensor y = at::empty_like(x);
  const int64_t T = x.size(0), D = x.size(1);
  TORCH_CHECK(w.numel() == D, "rms_norm: weight must have one entry per column of x");
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = xp + t * D;
      const float inv = 1.f / std::sqrt(dot(row, row, D) / D + static_cast<float>(eps));
      for (int64_t d = 0; d < D; ++d) yp[t * D + d] = row[d] * inv * wp[d];
    }
  });
  return y;
}

// RoPE, "rotate half" layout: dimension i pairs with i + Dh/2.   x [T, N, Dh] (rows may be strided,
// each head contiguous: a slice of the stacked qkv), cos, sin [T, Dh] -> [T, N, Dh]
at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  check_float(x, "x");
  const int64_t T = x.size(0), N = x.size(1), Dh = x.size(2), half = Dh / 2;
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == Dh, "rotary: each row's heads must be contiguous");
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  TORCH_CHECK(cos.numel() == T * Dh && sin.numel() == T * Dh, "rotary: cos and sin must be [T, Dh]");
  at::Tensor y = at::empty({T, N, Dh}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t row_stride = x.stride(0);
  at::parallel_for(0, T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * Dh;
      const float* s = sp + t * Dh;
      for (int64_t h = 0; h < N; ++h) {
        const float* in = xp + t * row_stride + h * Dh;
        float* out = yp + (t * N + h) * Dh;
        for (int64_t i = 0; i < half; ++i) {  // (a, b) -> (a cos - b sin, b cos + a sin)
          out[i] = in[i] * c[i] - in[i + half] * s[i];
          out[i + half] = in[i + half] * c[i + half] + in[i] * s[i + half];
        }
      }
    }
  });
  return y;
}

// SwiGLU's middle: silu(gate) * up, where gate_up = [gate | up] and silu(g) = g * sigmoid(g).
//   gate_up [T, 2F] -> [T, F]
at::Tensor silu_and_mul(const at::Tensor& gate_up_in) {
  check_float(gate_up_in, "gate_up");
  const at::Tensor gate_up = gate_up_in.contiguous();
  const int64_t T = gate_up.size(0), F = gate_up.size(1) / 2;
  at::Tensor y = at::empty({T, F}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = gp + t * 2 * F;
      const float* up = gate + F;
      float* out = yp + t * F;
      int64_t f = 0;
#ifdef MINIPAGED_AVX2
      // sigmoid(g) from e = exp(-|g|), which cannot overflow: 1 / (1 + e) for g >= 0, e / (1 + e) below
      const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
      for (; f + 8 <= F; f += 8) {
        const __m256 g = _mm256_loadu_ps(gate + f);
        const __m256 e = exp_nonpositive(_mm256_or_ps(g, sign));  // exp(-|g|)
        const __m256 numer = _mm256_blendv_ps(one, e, g);  // the sign bit of g picks e
        const __m256 sig = _mm256_div_ps(numer, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + f, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + f)));
      }
#endif
      for (; f < F; ++f) out[f] = gate[f] / (1.f + std::exp(-gate[f])) * up[f];
    }
  });
  return y;
}

constexpr int64_t PANEL = 16;  // output columns per panel of a packed weight: two AVX2 vectors

#ifdef MINIPAGED_AVX2
namespace {

constexpr int64_t KC = 128;  // inputs summed in registers before they are added to y

// Ask for the cache line `ahead` floats past `at` to be brought into the nearest cache. The address is
// worked out as an integer: it may lie past the end of the buffer, where a prefetch is harmless (it
// never faults) but a C++ pointer may not point.
inline void prefetch(const float* at, int64_t ahead) {
  const auto address = reinterpret_cast<std::uintptr_t>(at) + static_cast<std::uintptr_t>(ahead) * sizeof(float);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// y[0 .. MR, 0 .. 16] (+)= x[0 .. MR, k0 .. k1] · panel[k0 .. k1]: MR rows of x against one panel of 16
// output columns, all 2 x MR sums in registers. Each step of k loads the panel's 16 weights (two
// vectors) once and multiplies them by one number of each row of x, broadcast to a vector: 2 + MR
// loads for 2 x MR multiply-adds. Each sum is a named variable: written as an array, GCC keeps the sums
// in memory and stores all of them at every step, which halves the speed.
//
// Each step also asks for the weights one chunk (KC steps) ahead: one cache line, the 16 weights of
// input k + KC. The tiles of a chunk walk it again and again, and the CPU's own prefetcher did not run
// far enough ahead into the next chunk. It changes no arithmetic; what it is worth to a decode step,
// at batch 1 to 64, is a row of the ledger in docs/pages/speed.md. Past the panel's end it asks for
// the next panel's first weights.
template <int MR>
inline void panel_tile(const float* x, int64_t in, const float* panel, int64_t k0, int64_t k1, float* y, int64_t out,
                       bool add) {
  __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0,
         a5 = a0, b5 = a0;
  for (int64_t k = k0; k < k1; ++k) {
    prefetch(panel + k * PANEL, KC * PANEL);
    const __m256 lo = _mm256_loadu_ps(panel + k * PANEL), hi = _mm256_loadu_ps(panel + k * PANEL + 8);
    __m256 xv = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(xv, lo, a0), b0 = _mm256_fmadd_ps(xv, hi, b0);
    if constexpr (MR > 1) {
      xv = _mm256_broadcast_ss(x + in + k);
      a1 = _mm256_fmadd_ps(xv, lo, a1), b1 = _mm256_fmadd_ps(xv, hi, b1);
    }
    if constexpr (MR > 2) {
      xv = _mm256_broadcast_ss(x + 2 * in + k);
      a2 = _mm256_fmadd_ps(xv, lo, a2), b2 = _mm256_fmadd_ps(xv, hi, b2);
    }
    if constexpr (MR > 3) {
      xv = _mm256_broadcast_ss(x + 3 * in + k);
      a3 = _mm256_fmadd_ps(xv, lo, a3), b3 = _mm256_fmadd_ps(xv, hi, b3);
    }
    if constexpr (MR > 4) {
      xv = _mm256_broadcast_ss(x + 4 * in + k);
      a4 = _mm256_fmadd_ps(xv, lo, a4), b4 = _mm256_fmadd_ps(xv, hi, b4);
    }
    if constexpr (MR > 5) {
      xv = _mm256_broadcast_ss(x + 5 * in + k);
      a5 = _mm256_fmadd_ps(xv, lo, a5), b5 = _mm256_fmadd_ps(xv, hi, b5);
    }
  }
  const __m256 sums[6][2] = {{a0, b0}, {a1, b1}, {a2, b2}, {a3, b3}, {a4, b4}, {a5, b5}};
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) {
      float* dst = y + r * out + h * 8;
      _mm256_storeu_ps(dst, add ? _mm256_add_ps(_mm256_loadu_ps(dst), sums[r][h]) : sums[r][h]);
    }
}

// All T rows of x against one panel, six rows at a time, into y [T, 16] (row stride `out`).
inline void panel_rows(const float* x, int64_t T, int64_t in, const float* panel, float* y, int64_t out) {
  for (int64_t k0 = 0; k0 < in; k0 += KC) {
    const int64_t k1 = std::min(in, k0 + KC);
    const bool add = k0 > 0;
    int64_t t = 0;
    for (; t + 6 <= T; t += 6) panel_tile<6>(x + t * in, in, panel, k0, k1, y + t * out, out, add);
    switch (T - t) {  // the last rows of x
      case 5: panel_tile<5>(x + t * in, in, panel, k0, k1, y + t * out, out, add); break;
      case 4: panel_tile<4>(x + t * in, in, panel, k0, k1, y + t * out, out, add); break;
      case 3: panel_tile<3>(x + t * in, in, panel, k0, k1, y + t * out, out, add); break;
      case 2: panel_tile<2>(x + t * in, in, panel, k0, k1, y + t * out, out, add); break;
      case 1: panel_tile<1>(x + t * in, in, panel, k0, k1, y + t * out, out, add); break;
      default: break;
    }
  }
}

}  // namespace
#endif

// y = x Wᵀ, with W given as panels.   x [T, in], packed [ceil(out / 16), in, 16] -> y [T, out]
//
// packed[p, k, c] = W[16 p + c, k] (zero past the last row of W): model/llama.py's Linear.packed()
// makes it once per weight. In this layout the 16 weights that one input k contributes to 16 outputs
// sit side by side, so the loop above reads each panel straight through, once per six rows of x, and
// keeps the 6 x 16 sums in registers (the register tile of every fast CPU matrix product). At one row
// that streams the weight in order; at a few dozen rows it keeps both of the CPU's multiply-add units
// busy, which the dot-product form could not (each of its sums ends in a sum across a vector). The
// panels are split over the threads. The sums of a panel run in chunks of KC inputs, added up in y:
// a long sum in one register gathers more rounding than MKL's, a sum of short chunks about as much.
// Without AVX2 it unpacks and calls at::linear.
at::Tensor packed_linear(const at::Tensor& x_in, const at::Tensor& packed, int64_t out) {
  check_float(x_in, "x");
  check_float(packed, "packed");
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 3,
              "packed_linear: x [T, in] and packed [ceil(out / 16), in, 16] must agree");
  const int64_t T = x.size(0), in = x.size(1), panels = (out + PANEL - 1) / PANEL;
  TORCH_CHECK(in > 0 && out > 0 && packed.is_contiguous() && packed.size(0) == panels && packed.size(1) == in &&
                  packed.size(2) == PANEL,
              "packed_linear: x [T, in] and packed [ceil(out / 16), in, 16] must agree");
#ifdef MINIPAGED_AVX2
  at::Tensor y = at::empty({T, out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 4, [&](int64_t begin, int64_t end) {
    float tail[6 * PANEL];
    for (int64_t p = begin; p < end; ++p) {
      const float* panel = pp + p * in * PANEL;
      const int64_t cols = std::min(PANEL, out - p * PANEL);
      if (cols == PANEL) {
        panel_rows(xp, T, in, panel, yp + p * PANEL, out);
        continue;
      }
      for (int64_t t = 0; t < T; t += 6) {  // the last panel, part of it past W's end: via a buffer
        const int64_t rows = std::min<int64_t>(6, T - t);
        panel_rows(xp + t * in, rows, in, panel, tail, PANEL);
        for (int64_t r = 0; r < rows; ++r)
          std::copy(tail + r * PANEL, tail + r * PANEL + cols, yp + (t + r) * out + p * PANEL);
      }
    }
  });
  return y;
#else
  const at::Tensor weight = packed.transpose(1, 2).reshape({panels * PANEL, in}).narrow(0, 0, out);
  return at::linear(x, weight);
#endif
}

// Store the step's new keys and values in their slots (slot s = block s / block_size, row
// s % block_size).   k, v [T, KVH, Dh]; caches [num_blocks, block_size, KVH, Dh]; slots [T] int64
void write_kv(const at::Tensor& k_in, const at::Tensor& v_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
              const at::Tensor& slots) {
  check_float(k_cache, "k_cache");
  check_float(v_cache, "v_cache");
  check_float(k_in, "k");
  check_float(v_in, "v");
  const at::Tensor k = k_in.contiguous(), v = v_in.contiguous();
  const int64_t T = k.size(0), row = k.size(1) * k.size(2);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && v.sizes() == k.sizes() &&
                  k_cache.size(2) * k_cache.size(3) == row && v_cache.sizes() == k_cache.sizes(),
              "write_kv: k, v [T, KVH, Dh] and contiguous caches [blocks, block_size, KVH, Dh] must agree");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T,
              "write_kv: slots must be T contiguous int64 values");
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "write_kv: slot out of range");
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    std::copy(kp + t * row, kp + (t + 1) * row, kc + sp[t] * row);
    std::copy(vp + t * row, vp + (t + 1) * row, vc + sp[t] * row);
  }
}


// dst[i] = sum_t p[i * n + t] * values[t] for ROWS rows, over t < last.   values[t] -> [Dh]
//
// A cache line of V (16 floats) at a time, two keys per step, each row's sums in four registers: twelve
// independent sums for three rows, enough that the CPU never waits on one multiply-add to start the next
template <int ROWS>
inline void weighted_sum(const float* const* values, const float* p, int64_t n, int64_t last, int64_t Dh,
                         float* const* dst) {
  int64_t d = 0;
#ifdef MINIPAGED_AVX2
  for (; d + 16 <= Dh; d += 16) {
    __m256 acc[ROWS][4];  // [row][low half, high half] x [even key, odd key]
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < 4; ++c) acc[i][c] = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 2 <= last; t += 2) {
      const __m256 a0 = _mm256_loadu_ps(values[t] + d), a1 = _mm256_loadu_ps(values[t] + d + 8);
      const __m256 b0 = _mm256_loadu_ps(values[t + 1] + d), b1 = _mm256_loadu_ps(values[t + 1] + d + 8);
      for (int i = 0; i < ROWS; ++i) {
        const __m256 wa = _mm256_set1_ps(p[i * n + t]), wb = _mm256_set1_ps(p[i * n + t + 1]);
        acc[i][0] = _mm256_fmadd_ps(wa, a0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(wa, a1, acc[i][1]);
        acc[i][2] = _mm256_fmadd_ps(wb, b0, acc[i][2]);
        acc[i][3] = _mm256_fmadd_ps(wb, b1, acc[i][3]);
      }
    }
    if (t < last) {
      const __m256 a0 = _mm256_loadu_ps(values[t] + d), a1 = _mm256_loadu_ps(values[t] + d + 8);
      for (int i = 0; i < ROWS; ++i) {
        const __m256 wa = _mm256_set1_ps(p[i * n + t]);
        acc[i][0] = _mm256_fmadd_ps(wa, a0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(wa, a1, acc[i][1]);
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      _mm256_storeu_ps(dst[i] + d, _mm256_add_ps(acc[i][0], acc[i][2]));
      _mm256_storeu_ps(dst[i] + d + 8, _mm256_add_ps(acc[i][1], acc[i][3]));
    }
  }
#endif
  for (; d < Dh; ++d)
    for (int i = 0; i < ROWS; ++i) {
      float sum = 0.f;
      for (int64_t t = 0; t < last; ++t) sum += p[i * n + t] * values[t][d];
      dst[i][d] = sum;
    }
}

// Attention of short queries (decodes, chapter 09's drafts) over the paged cache, reading K and V
// where they lie: no gathered copy.
//
//   q [T, H, Dh]; caches [num_blocks, block_size, KVH, Dh]; tables [S, max_blocks] int64;
//   context_lens, query_starts, query_lens [S] int64 -> out [T, H, Dh]
//
// Sequence s owns query rows query_starts[s] .. + query_lens[s]; its query j sits at position
// context_lens[s] - query_lens[s] + j and sees the keys at positions 0 .. that position. One job per
// (sequence, K/V head): R = query_lens[s] * G score rows (the G query heads that share the K/V head,
// for every query token), then
//   1. scores[r, t] = q_r · K[t] * scale, for the keys row r sees (eight keys at a time per row);
//   2. a softmax along each row (max, exp, sum, divide);
//   3. out_r = sum_t p[r, t] V[t], eight output dimensions at a time, four rows at a time.
// Where row r cannot see key t its weight stays 0.
at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& tables_in, const at::Tensor& context_lens,
                           const at::Tensor& query_starts, const at::Tensor& query_lens, double scale) {
  check_float(q_in, "q");
  check_float(k_cache, "k_cache");
  check_float(v_cache, "v_cache");
  const at::Tensor q = q_in.contiguous(), tables = tables_in.contiguous();
  const int64_t S = context_lens.size(0), H = q.size(1), Dh = q.size(2);
  const int64_t block_size = k_cache.size(1), KVH = k_cache.size(2), G = H / KVH, max_blocks = tables.size(1);
  TORCH_CHECK(H % KVH == 0, "paged_attention: query heads must be a multiple of K/V heads");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                  k_cache.size(3) == Dh, "paged_attention: contiguous caches [blocks, block_size, KVH, Dh]");
  TORCH_CHECK(tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong &&
                  query_starts.scalar_type() == at::kLong && query_lens.scalar_type() == at::kLong,
              "paged_attention: tables and lengths must be int64");
  for (int64_t s = 0; s < S; ++s) {  // what each job will read, checked before any job starts
    const int64_t n = context_lens.data_ptr<int64_t>()[s], m = query_lens.data_ptr<int64_t>()[s];
    const int64_t first = query_starts.data_ptr<int64_t>()[s];
    TORCH_CHECK(m >= 1 && m <= n && n <= tables.size(1) * block_size && first >= 0 && first + m <= q.size(0),
                "paged_attention: sequence ", s, " has inconsistent lengths");
    for (int64_t b = 0; b < (n + block_size - 1) / block_size; ++b) {
      const int64_t block = tables.data_ptr<int64_t>()[s * tables.size(1) + b];
      TORCH_CHECK(block >= 0 && block < k_cache.size(0), "paged_attention: block table entry out of range");
    }
  }
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int64_t* np_ = context_lens.data_ptr<int64_t>();
  const int64_t* first_row = query_starts.data_ptr<int64_t>();
  const int64_t* mp = query_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t token_stride = KVH * Dh, block_stride = block_size * KVH * Dh;
  const float sc = static_cast<float>(scale);

  at::parallel_for(0, S * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs, scores;
    std::vector<const float*> keys, values;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t s = job / KVH, kv_head = job % KVH;
      const int64_t n = np_[s], m = mp[s], past = n - m, R = m * G;  // row r = j * G + g
      const int64_t* table = tp + s * max_blocks;
      keys.resize(n);
      values.resize(n);
      for (int64_t t = 0; t < n; ++t) {  // where key t lies: block table[t / block_size], row t % block_size
        const int64_t at = table[t / block_size] * block_stride + (t % block_size) * token_stride + kv_head * Dh;
        keys[t] = kp + at;
        values[t] = vp + at;
      }
#ifdef MINIPAGED_AVX2
      // ask for every K and V row of the job now: the rows lie 16 to a block, blocks anywhere in the
      // pool, a pattern the CPU's own prefetcher does not follow far ahead; many requests in flight at
      // once hide the memory's latency (K into the nearest cache, V, read last, into the next one)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t d = 0; d < Dh; d += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(keys[t] + d), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(values[t] + d), _MM_HINT_T1);
        }
#endif
      qs.resize(R * Dh);  // the job's query rows, scaled, side by side
      for (int64_t r = 0; r < R; ++r) {
        const float* src = qp + ((first_row[s] + r / G) * H + kv_head * G + r % G) * Dh;
        for (int64_t d = 0; d < Dh; ++d) qs[r * Dh + d] = src[d] * sc;
      }
      scores.assign(R * n, 0.f);
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = qs.data() + r * Dh;
        float* row = scores.data() + r * n;
        const int64_t seen = past + r / G + 1;
        int64_t t = 0;
#ifdef MINIPAGED_AVX2
        if (Dh % 8 == 0) {
          for (; t + 8 <= seen; t += 8) {  // 1. eight keys at a time
            __m256 acc[8];
            for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
            for (int64_t d = 0; d < Dh; d += 8) {
              const __m256 qv = _mm256_loadu_ps(qr + d);
              for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[t + i] + d), acc[i]);
            }
            _mm256_storeu_ps(row + t, hsum8(acc));
          }
        }
#endif
        for (; t < seen; ++t) row[t] = dot(qr, keys[t], Dh);
        // 2. softmax over the seen keys
        const float best = *std::max_element(row, row + seen);
        float total = 0.f;
        t = 0;
#ifdef MINIPAGED_AVX2
        __m256 sum8 = _mm256_setzero_ps();
        for (; t + 8 <= seen; t += 8) {
          const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + t), _mm256_set1_ps(best)));
          _mm256_storeu_ps(row + t, e);
          sum8 = _mm256_add_ps(sum8, e);
        }
        total = hsum(sum8);
#endif
        for (; t < seen; ++t) total += (row[t] = std::exp(row[t] - best));
        const float inv = 1.f / total;
        for (t = 0; t < seen; ++t) row[t] *= inv;
      }
      // 3. out_r = sum_t p[r, t] V[t], three rows at a time
      for (int64_t r0 = 0; r0 < R; r0 += 3) {
        const int64_t rows = std::min<int64_t>(3, R - r0);
        const int64_t last = past + (r0 + rows - 1) / G + 1;  // keys any of these rows sees
        float* dst[3];
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t r = r0 + i;
          dst[i] = op + ((first_row[s] + r / G) * H + kv_head * G + r % G) * Dh;
        }
        const float* p = scores.data() + r0 * n;
        if (rows == 3) weighted_sum<3>(values.data(), p, n, last, Dh, dst);
        else if (rows == 2) weighted_sum<2>(values.data(), p, n, last, Dh, dst);
        else weighted_sum<1>(values.data(), p, n, last, Dh, dst);
      }
    }
  });
  return out;
}

TORCH_LIBRARY(minipaged, m) {
  m.def("rms_norm", &rms_norm);
  m.def("rotary", &rotary);
  m.def("silu_and_mul", &silu_and_mul);
  m.def("packed_linear", &packed_linear);
  m.def("write_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots) -> ()", &write_kv);
  m.def("paged_attention", &paged_attention);
}
