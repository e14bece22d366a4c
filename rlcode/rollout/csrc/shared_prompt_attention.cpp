// The shared-prompt decode attention as one CPU kernel (rlcode/rollout/attention_kernel.py builds it).
//
// Per prompt and key/value head, for the group's query rows (G rows x R query heads): scores against the
// prompt's keys, stored transposed so 16 keys fill one vector and the rows' scores accumulate in
// registers; each row's scores against its own generated keys; one softmax over both (a polynomial exp,
// ~1e-9 relative, that vectorises where libm's does not); the weighted values, the prompt's for the
// whole group in register blocks. No intermediate tensors; prompts x heads run on torch's threads.
// GCC/Clang vector extensions (v16) keep it portable: the compiler maps them to AVX-512, AVX2 or SSE.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

typedef float v16 __attribute__((vector_size(64)));

static inline v16 load16(const float* p) { v16 v; std::memcpy(&v, p, sizeof(v)); return v; }
static inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
static inline v16 splat(float x) { return v16{} + x; }

// e^x for x <= 0: 2^n * 2^f, f in [-0.5, 0.5], a degree-7 Taylor polynomial for 2^f.
static inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float t = x * 1.4426950408889634f;
  const float n = std::nearbyint(t);
  const float f = (t - n) * 0.6931471805599453f;
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// scores[i][p] = q[i] . keys_t[:, p] for N query rows and 16 keys at a time (N accumulators in
// registers); keys_t is [D, Pp], Pp a multiple of 16 (the padding's scores are never read).
template <int N>
static void block_scores(const float* q, int64_t D, const float* keys_t, int64_t Pp, float* scores, int64_t ld) {
  for (int64_t p0 = 0; p0 < Pp; p0 += 16) {
    v16 acc[N];
    for (int i = 0; i < N; ++i) acc[i] = v16{};
    for (int64_t d = 0; d < D; ++d) {
      const v16 k = load16(keys_t + d * Pp + p0);
      for (int i = 0; i < N; ++i) acc[i] += splat(q[i * D + d]) * k;
    }
    for (int i = 0; i < N; ++i) store16(scores + i * ld + p0, acc[i]);
  }
}

typedef void (*ScoresFn)(const float*, int64_t, const float*, int64_t, float*, int64_t);
static const ScoresFn SCORES[] = {nullptr, block_scores<1>, block_scores<2>, block_scores<3>, block_scores<4>,
                                  block_scores<5>, block_scores<6>, block_scores<7>, block_scores<8>};

// out[i][:] += sum_p w[i][p] * values[p][:] for N rows at once, D = 16 * DV (N x DV accumulators).
template <int N, int DV>
static void block_values(const float* w, int64_t ld, const float* values, int64_t count, int64_t stride, float* out) {
  v16 acc[N][DV];
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < DV; ++j) acc[i][j] = load16(out + i * 16 * DV + 16 * j);
  for (int64_t p = 0; p < count; ++p) {
    const float* v = values + p * stride;
    v16 row[DV];
    for (int j = 0; j < DV; ++j) row[j] = load16(v + 16 * j);
    for (int i = 0; i < N; ++i) {
      const v16 weight = splat(w[i * ld + p]);
      for (int j = 0; j < DV; ++j) acc[i][j] += weight * row[j];
    }
  }
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < DV; ++j) store16(out + i * 16 * DV + 16 * j, acc[i][j]);
}

static void values_generic(const float* w, int64_t ld, const float* values, int64_t count, int64_t stride, float* out,
                           int64_t n, int64_t D) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < count; ++p) {
      const float weight = w[i * ld + p];
      const float* v = values + p * stride;
      for (int64_t d = 0; d < D; ++d) out[i * D + d] += weight * v[d];
    }
}

static void add_values(const float* w, int64_t ld, const float* values, int64_t count, int64_t stride, float* out,
                       int64_t n, int64_t D) {
  int64_t i = 0;
  if (D == 64) {
    for (; i + 6 <= n; i += 6) block_values<6, 4>(w + i * ld, ld, values, count, stride, out + i * D);
    for (; i + 3 <= n; i += 3) block_values<3, 4>(w + i * ld, ld, values, count, stride, out + i * D);
    for (; i < n; ++i) block_values<1, 4>(w + i * ld, ld, values, count, stride, out + i * D);
  } else if (D == 128) {
    for (; i + 3 <= n; i += 3) block_values<3, 8>(w + i * ld, ld, values, count, stride, out + i * D);
    for (; i < n; ++i) block_values<1, 8>(w + i * ld, ld, values, count, stride, out + i * D);
  } else {
    values_generic(w, ld, values, count, stride, out, n, D);
  }
}

static inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

// query [B, H, R, D] fp32 contiguous, rows grouped by prompt (row_prompt non-decreasing);
// prefix_keys_t [U, H, D, Pp] (Pp a multiple of 16, P <= Pp real keys); prefix_values [U, H, P, D];
// suffix_keys/values [B, H, S, D] (last dim contiguous); row_mask [B, >= P] bool (True: attend; the
// first P columns are the prompt's) or empty. -> [B, H, R, D]
torch::Tensor shared_prompt_attention(torch::Tensor query, torch::Tensor prefix_keys_t, torch::Tensor prefix_values,
                                      torch::Tensor suffix_keys, torch::Tensor suffix_values, torch::Tensor row_prompt,
                                      torch::Tensor row_mask, double scale) {
  for (const auto& t : {query, prefix_keys_t, prefix_values, suffix_keys, suffix_values})
    TORCH_CHECK(t.scalar_type() == torch::kFloat && t.device().is_cpu() && t.stride(-1) == 1, "fp32 CPU tensors, last dim contiguous");
  TORCH_CHECK(query.is_contiguous() && prefix_keys_t.is_contiguous() && prefix_values.is_contiguous(), "contiguous query and prompt");
  TORCH_CHECK(prefix_keys_t.size(3) % 16 == 0 && row_prompt.scalar_type() == torch::kLong, "keys padded to 16, int64 prompts");
  TORCH_CHECK(!row_mask.numel() || (row_mask.scalar_type() == torch::kBool && row_mask.stride(1) == 1), "a bool row mask");
  const int64_t B = query.size(0), H = query.size(1), R = query.size(2), D = query.size(3);
  const int64_t U = prefix_keys_t.size(0), Pp = prefix_keys_t.size(3), P = prefix_values.size(2), S = suffix_keys.size(2);
  auto scaled = (query * scale).contiguous();
  auto out = torch::empty_like(query);  // every row belongs to one prompt: each element is written below
  const float* q = scaled.data_ptr<float>();
  const float* kt = prefix_keys_t.data_ptr<float>();
  const float* pv = prefix_values.data_ptr<float>();
  const float* sk = suffix_keys.data_ptr<float>();
  const float* sv = suffix_values.data_ptr<float>();
  const int64_t* prompt = row_prompt.data_ptr<int64_t>();
  const bool* mask = row_mask.numel() ? row_mask.data_ptr<bool>() : nullptr;
  const int64_t mask_stride = row_mask.numel() ? row_mask.stride(0) : 0;
  float* o = out.data_ptr<float>();
  const int64_t skb = suffix_keys.stride(0), skh = suffix_keys.stride(1), sks = suffix_keys.stride(2);
  const int64_t svb = suffix_values.stride(0), svh = suffix_values.stride(1), svs = suffix_values.stride(2);
  std::vector<int64_t> first(U + 1, B);  // rows [first[u], first[u + 1]) decode prompt u
  for (int64_t b = B - 1; b >= 0; --b) {
    TORCH_CHECK(prompt[b] >= 0 && prompt[b] < U && (b == 0 || prompt[b - 1] <= prompt[b]), "rows in prompt order");
    first[prompt[b]] = b;
  }
  for (int64_t u = U - 1; u >= 0; --u) first[u] = std::min(first[u], first[u + 1]);
  const int64_t ld = Pp + S;
  at::parallel_for(0, U * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs, scores, acc;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t u = task / H, h = task % H;
      const int64_t b0 = first[u], rows = first[u + 1] - b0, n = rows * R;
      if (n == 0) continue;
      qs.resize(n * D);
      scores.resize(n * ld);
      for (int64_t b = 0; b < rows; ++b)  // this prompt's query rows side by side: [rows * R, D]
        std::memcpy(qs.data() + b * R * D, q + ((b0 + b) * H + h) * R * D, R * D * sizeof(float));
      const float* keys_t = kt + (u * H + h) * D * Pp;
      for (int64_t i = 0; i < n; i += 8) {
        const int64_t m = std::min<int64_t>(8, n - i);
        SCORES[m](qs.data() + i * D, D, keys_t, Pp, scores.data() + i * ld, ld);
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t b = b0 + i / R;
        float* row = scores.data() + i * ld;
        const float* query_row = qs.data() + i * D;
        for (int64_t s = 0; s < S; ++s) row[Pp + s] = dot(query_row, sk + b * skb + h * skh + s * sks, D);
        if (mask) {
          const bool* prompt_mask = mask + b * mask_stride;
          for (int64_t p = 0; p < P; ++p)
            if (!prompt_mask[p]) row[p] = -INFINITY;
        }
        float top = -INFINITY;
        for (int64_t p = 0; p < P; ++p) top = std::max(top, row[p]);
        for (int64_t s = 0; s < S; ++s) top = std::max(top, row[Pp + s]);
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t p = 0; p < P; ++p) {
          const float e = row[p] == -INFINITY ? 0.0f : exp_nonpositive(row[p] - top);
          row[p] = e;
          total += e;
        }
#pragma omp simd reduction(+ : total)
        for (int64_t s = 0; s < S; ++s) {
          const float e = exp_nonpositive(row[Pp + s] - top);
          row[Pp + s] = e;
          total += e;
        }
        const float inverse = 1.0f / total;
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) row[p] *= inverse;
#pragma omp simd
        for (int64_t s = 0; s < S; ++s) row[Pp + s] *= inverse;
      }
      // values: the prompt's for the whole group at once, then each row's own generated tokens
      acc.assign(n * D, 0.0f);
      add_values(scores.data(), ld, pv + (u * H + h) * P * D, P, D, acc.data(), n, D);
      for (int64_t b = 0; b < rows; ++b)
        add_values(scores.data() + b * R * ld + Pp, ld, sv + (b0 + b) * svb + h * svh, S, svs, acc.data() + b * R * D, R, D);
      for (int64_t b = 0; b < rows; ++b)
        std::memcpy(o + ((b0 + b) * H + h) * R * D, acc.data() + b * R * D, R * D * sizeof(float));
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("shared_prompt_attention", &shared_prompt_attention); }
