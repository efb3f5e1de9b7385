// CPU kernels for the JAX sampler's decode step, as XLA FFI custom calls (mle_jax/kernels/cpu_decode.py).
//
// A decode step of a small model on CPU reads every weight and the whole KV cache for a handful of rows, so it
// runs at the speed of memory, and XLA:CPU's dot and attention reach about half of it (docs/smollm2.md). These
// two kernels read what a step needs once, in the order memory streams it, on all of XLA's intra-op threads:
//
//   mle_dense_packed: x [M, K] f32 @ w [K, N] f32 -> [M, N] f32, with w handed over in panels of 32 columns,
//     [N / 32, K, 32] (`pack` in cpu_decode.py; a decode loop packs each weight once, outside its loop), so
//     that a tile of 8 rows x 32 columns streams its panel contiguously; only the rows a mask live [M] marks
//     are computed (the others are zeros: a decode's stopped rows cost nothing).
//   mle_split_cache_attention: one query per row against its prompt's prefix and its own filled suffix slots
//     (mle_jax.models.split_cache.split_cache_attention's contract), reading only the filled suffix.
//
// Written with GCC vector extensions; on x86-64 each hot function is compiled for x86-64-v4 (AVX-512), v3 (AVX2)
// and the baseline, chosen when the library loads (MLE_CLONES). Work is split into chunks claimed from an atomic counter by the
// calling thread and by tasks on XLA's thread pool: a task that starts late finds no chunk left and returns, so
// the call never waits on a task that has not started.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

#if defined(__x86_64__)
// AVX-512, AVX2 and the baseline, picked when the library loads
#define MLE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define MLE_PAUSE() __builtin_ia32_pause()
#else  // another architecture: its compiler's default vector width
#define MLE_CLONES
#define MLE_PAUSE()
#endif

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t vi16 __attribute__((vector_size(64), aligned(4)));

constexpr int kPanel = 32;  // columns per weight panel (two 16-float vectors)
constexpr int kRows = 8;    // rows per register tile of the dense kernel

struct Chunks {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// Claims chunks until none is left; `work` is called only for a claimed chunk, which the caller waits for.
void drain(Chunks& state, int64_t chunks, const std::function<void(int64_t)>& work) {
  for (int64_t c = state.next.fetch_add(1); c < chunks; c = state.next.fetch_add(1)) {
    work(c);
    state.done.fetch_add(1, std::memory_order_release);
  }
}

// Runs work(c) for c in [0, chunks) on the calling thread and on the pool's threads.
void parallel_chunks(ffi::ThreadPool& pool, int64_t chunks, const std::function<void(int64_t)>& work) {
  if (chunks <= 0) return;
  // The calling thread is one of the workers: pool threads beyond it would only share its cores.
  int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, chunks - 1);
  auto state = std::make_shared<Chunks>();
  for (int64_t t = 0; t < helpers; ++t) {
    // A task that outlives this call holds `state` and claims no chunk, so it never calls `work`.
    pool.Schedule([state, chunks, work_ptr = &work]() { drain(*state, chunks, *work_ptr); });
  }
  drain(*state, chunks, work);
  while (state->done.load(std::memory_order_acquire) < chunks) MLE_PAUSE();
}

// ---- dense ----------------------------------------------------------------------------------------------------

template <int MR>
inline __attribute__((always_inline)) void dense_tile(const float* x, const float* panel, float* const* y,
                                                      int64_t k_len, int64_t n0) {
  v16 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = (v16){};
  for (int64_t k = 0; k < k_len; ++k) {
    v16 w0 = *(const v16*)(panel + k * kPanel);
    v16 w1 = *(const v16*)(panel + k * kPanel + 16);
    for (int m = 0; m < MR; ++m) {
      float xs = x[m * k_len + k];
      acc[m][0] += xs * w0;
      acc[m][1] += xs * w1;
    }
  }
  for (int m = 0; m < MR; ++m) {
    *(v16*)(y[m] + n0) = acc[m][0];
    *(v16*)(y[m] + n0 + 16) = acc[m][1];
  }
}

// Panels [p0, p1) of y = x @ w for M rows (x [M, K] contiguous, packed w [N / 32, K, 32], y[m] the output row of
// x's row m): tiles of 8 rows, then one tile of the rows left (1 to 7), so that the work is the rows', not 8's.
MLE_CLONES void dense_panels(const float* x, const float* w, float* const* y, int64_t m_len, int64_t k_len,
                             int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = w + p * k_len * kPanel;
    const int64_t n0 = p * kPanel;
    int64_t m0 = 0;
    for (; m0 + kRows <= m_len; m0 += kRows) dense_tile<kRows>(x + m0 * k_len, panel, y + m0, k_len, n0);
    const float* xr = x + m0 * k_len;
    float* const* yr = y + m0;
    switch (m_len - m0) {
      case 1: dense_tile<1>(xr, panel, yr, k_len, n0); break;
      case 2: dense_tile<2>(xr, panel, yr, k_len, n0); break;
      case 3: dense_tile<3>(xr, panel, yr, k_len, n0); break;
      case 4: dense_tile<4>(xr, panel, yr, k_len, n0); break;
      case 5: dense_tile<5>(xr, panel, yr, k_len, n0); break;
      case 6: dense_tile<6>(xr, panel, yr, k_len, n0); break;
      case 7: dense_tile<7>(xr, panel, yr, k_len, n0); break;
      default: break;
    }
  }
}

// y = x @ w for the rows `live` marks; the other rows of y are zeros and cost nothing (the decode's rows that have
// stopped: the step's work shrinks with the rows still generating, with no change of shape).
ffi::Error DenseImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                     ffi::Buffer<ffi::PRED> live, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kPanel || wd[1] != xd[1])
    return ffi::Error::InvalidArgument("mle_dense_packed: x [M, K] and w [N/32, K, 32] expected");
  if (live.element_count() != static_cast<size_t>(xd[0]))
    return ffi::Error::InvalidArgument("mle_dense_packed: live [M] expected");
  int64_t m_len = xd[0], k_len = xd[1], panels = wd[0], n = panels * kPanel;
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  const bool* lp = live.typed_data();
  float* yp = y->typed_data();
  std::vector<int64_t> rows;
  for (int64_t m = 0; m < m_len; ++m) {
    if (lp[m]) rows.push_back(m);
    else std::memset(yp + m * n, 0, sizeof(float) * n);
  }
  const int64_t live_len = static_cast<int64_t>(rows.size());
  if (live_len == 0) return ffi::Error::Success();
  std::vector<float> gathered;  // the live rows of x, contiguous (only when some row is not live)
  if (live_len < m_len) {
    gathered.resize(live_len * k_len);
    for (int64_t i = 0; i < live_len; ++i)
      std::memcpy(gathered.data() + i * k_len, xp + rows[i] * k_len, sizeof(float) * k_len);
    xp = gathered.data();
  }
  std::vector<float*> out(live_len);
  for (int64_t i = 0; i < live_len; ++i) out[i] = yp + rows[i] * n;
  int64_t chunk = std::max<int64_t>(1, panels / (4 * std::max<int64_t>(1, pool.num_threads() + 1)));
  int64_t chunks = (panels + chunk - 1) / chunk;
  parallel_chunks(pool, chunks, [&](int64_t c) {
    dense_panels(xp, wp, out.data(), live_len, k_len, c * chunk, std::min(panels, (c + 1) * chunk));
  });
  return ffi::Error::Success();
}

// ---- attention -----------------------------------------------------------------------------------------------

inline __attribute__((always_inline)) v16 exp16(v16 x) {
  // exp(x) = 2^n * exp(r), n = round(x / ln 2), |r| <= ln 2 / 2; a degree-6 polynomial (float32 rounding).
  const v16 lo = (v16){} - 87.0f, hi = (v16){} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
  v16 t = x * 1.44269504088896341f + magic;
  v16 nf = t - magic;
  vi16 ni = (vi16)t - (vi16)((v16){} + magic);
  v16 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  v16 p = (v16){} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi16 scale = (ni + 127) << 23;
  return p * (v16)scale;
}

struct AttentionShape {
  int64_t rows, q_heads, head_dim, prompts, kv_heads, prefix, suffix, filled;
};

constexpr int kQueryTile = 6;   // queries per register tile of the scores (x 4 vectors of 16 slots)
constexpr int kValueTile = 6;   // queries per register tile of the weighted values (x 4 vectors of 16)
constexpr int kRowBlock = 8;    // rows of a prompt that share one pass over its prefix

// s[i, p] = scale * q[i] . kt[:, p] for QT queries q [QT, Dh] (rows of stride dh) and keys kt [Dh, L] (row
// stride `stride`), slots [0, len); s rows of stride s_stride. Each key vector is loaded once per tile.
template <int QT>
inline __attribute__((always_inline)) void scores_tile(const float* q, const float* kt, int64_t stride, int64_t len,
                                                       int64_t dh, float scale, float* s, int64_t s_stride) {
  int64_t p = 0;
  for (; p + 64 <= len; p += 64) {  // 64 slots: four vectors of each key row (256 contiguous bytes)
    v16 acc[QT][4];
    for (int i = 0; i < QT; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = (v16){};
    for (int64_t d = 0; d < dh; ++d) {
      const float* row = kt + d * stride + p;
      v16 kv[4];
      for (int j = 0; j < 4; ++j) kv[j] = *(const v16*)(row + 16 * j);
      for (int i = 0; i < QT; ++i) {
        float qi = q[i * dh + d];
        for (int j = 0; j < 4; ++j) acc[i][j] += qi * kv[j];
      }
    }
    for (int i = 0; i < QT; ++i)
      for (int j = 0; j < 4; ++j) *(v16*)(s + i * s_stride + p + 16 * j) = acc[i][j] * scale;
  }
  for (; p + 16 <= len; p += 16) {
    v16 acc[QT];
    for (int i = 0; i < QT; ++i) acc[i] = (v16){};
    for (int64_t d = 0; d < dh; ++d) {
      v16 kv = *(const v16*)(kt + d * stride + p);
      for (int i = 0; i < QT; ++i) acc[i] += q[i * dh + d] * kv;
    }
    for (int i = 0; i < QT; ++i) *(v16*)(s + i * s_stride + p) = acc[i] * scale;
  }
  for (; p < len; ++p)
    for (int i = 0; i < QT; ++i) {
      float acc = 0.f;
      for (int64_t d = 0; d < dh; ++d) acc += q[i * dh + d] * kt[d * stride + p];
      s[i * s_stride + p] = acc * scale;
    }
}

inline __attribute__((always_inline)) void scores(const float* q, int64_t nq, const float* kt, int64_t stride,
                                                  int64_t len, int64_t dh, float scale, float* s, int64_t s_stride) {
  for (int64_t i0 = 0; i0 < nq; i0 += kQueryTile) {
    const float* qi = q + i0 * dh;
    float* si = s + i0 * s_stride;
    switch (std::min<int64_t>(kQueryTile, nq - i0)) {
      case 1: scores_tile<1>(qi, kt, stride, len, dh, scale, si, s_stride); break;
      case 2: scores_tile<2>(qi, kt, stride, len, dh, scale, si, s_stride); break;
      case 3: scores_tile<3>(qi, kt, stride, len, dh, scale, si, s_stride); break;
      case 4: scores_tile<4>(qi, kt, stride, len, dh, scale, si, s_stride); break;
      case 5: scores_tile<5>(qi, kt, stride, len, dh, scale, si, s_stride); break;
      default: scores_tile<6>(qi, kt, stride, len, dh, scale, si, s_stride); break;
    }
  }
}

// out [QT, Dh] += e [QT, L] @ v [L, Dh] (e rows of stride e_stride).
template <int QT>
inline __attribute__((always_inline)) void values_tile(const float* e, int64_t e_stride, const float* v, int64_t len,
                                                       int64_t dh, float* out) {
  for (int64_t d0 = 0; d0 + 16 <= dh; d0 += 64) {
    int64_t nv = std::min<int64_t>(4, (dh - d0) / 16);
    v16 acc[QT][4];
    for (int i = 0; i < QT; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = (v16){};
    for (int64_t p = 0; p < len; ++p) {
      const float* row = v + p * dh + d0;
      v16 vv[4];
      for (int j = 0; j < 4; ++j) vv[j] = j < nv ? *(const v16*)(row + 16 * j) : (v16){};
      for (int i = 0; i < QT; ++i) {
        float ei = e[i * e_stride + p];
        for (int j = 0; j < 4; ++j) acc[i][j] += ei * vv[j];
      }
    }
    for (int i = 0; i < QT; ++i)
      for (int j = 0; j < nv; ++j) *(v16*)(out + i * dh + d0 + 16 * j) += acc[i][j];
  }
  for (int64_t d = dh - dh % 16; d < dh; ++d)  // a head size not a multiple of 16: the last dims one by one
    for (int i = 0; i < QT; ++i) {
      float acc = 0.f;
      for (int64_t p = 0; p < len; ++p) acc += e[i * e_stride + p] * v[p * dh + d];
      out[i * dh + d] += acc;
    }
}

inline __attribute__((always_inline)) void weighted_values(const float* e, int64_t nq, int64_t e_stride,
                                                           const float* v, int64_t len, int64_t dh, float* out) {
  for (int64_t i0 = 0; i0 < nq; i0 += kValueTile) {
    const float* ei = e + i0 * e_stride;
    float* oi = out + i0 * dh;
    switch (std::min<int64_t>(kValueTile, nq - i0)) {
      case 1: values_tile<1>(ei, e_stride, v, len, dh, oi); break;
      case 2: values_tile<2>(ei, e_stride, v, len, dh, oi); break;
      case 3: values_tile<3>(ei, e_stride, v, len, dh, oi); break;
      case 4: values_tile<4>(ei, e_stride, v, len, dh, oi); break;
      case 5: values_tile<5>(ei, e_stride, v, len, dh, oi); break;
      default: values_tile<6>(ei, e_stride, v, len, dh, oi); break;
    }
  }
}

// softmax numerators in place over s [nq, len] (masked slots hold -inf -> 0); each query's sum -> total.
inline __attribute__((always_inline)) void exp_rows(float* s, int64_t nq, int64_t len, float* total) {
  for (int64_t i = 0; i < nq; ++i) {
    float* row = s + i * len;
    float peak = -INFINITY;
    int64_t p0 = 0;
    v16 vpeak = (v16){} - INFINITY;
    for (; p0 + 16 <= len; p0 += 16) {
      v16 x = *(v16*)(row + p0);
      vpeak = x > vpeak ? x : vpeak;
    }
    for (int j = 0; j < 16; ++j) peak = std::max(peak, vpeak[j]);
    for (; p0 < len; ++p0) peak = std::max(peak, row[p0]);
    float sum = 0.f;
    if (peak == -INFINITY) {  // no valid slot: the query attends to nothing (a padding row)
      std::fill(row, row + len, 0.f);
    } else {
      int64_t p = 0;
      v16 acc = (v16){};
      for (; p + 16 <= len; p += 16) {
        v16 x = *(v16*)(row + p);
        v16 e = exp16(x - peak);
        e = x == -INFINITY ? (v16){} : e;
        *(v16*)(row + p) = e;
        acc += e;
      }
      for (int j = 0; j < 16; ++j) sum += acc[j];
      for (; p < len; ++p) {
        float e = row[p] == -INFINITY ? 0.f : std::exp(row[p] - peak);
        row[p] = e;
        sum += e;
      }
    }
    total[i] = sum;
  }
}

// Rows [j0, j0 + nr) of prompt u, kv head h: their nr * G queries read the prompt's prefix once together, then each
// row its own filled suffix.
MLE_CLONES void attend(
    const AttentionShape& a, const float* q, const float* pk, const float* pv, const bool* valid, const float* kt,
    const float* vt, float* out, int64_t u, int64_t h, int64_t j0, int64_t nr, std::vector<float>* buf) {
  const int64_t dh = a.head_dim, n = a.rows / a.prompts, g_len = a.q_heads / a.kv_heads, nq = nr * g_len;
  const int64_t len = a.prefix + a.filled;
  const float scale = 1.0f / std::sqrt((float)dh);
  buf->resize(nq * len + nq + 2 * nq * dh);
  float* s = buf->data();
  float* total = s + nq * len;
  float* qb = total + nq;  // the block's queries, contiguous [nq, Dh]
  float* ob = qb + nq * dh;
  for (int64_t j = 0; j < nr; ++j)
    std::memcpy(qb + j * g_len * dh, q + ((u * n + j0 + j) * a.q_heads + h * g_len) * dh, sizeof(float) * g_len * dh);
  const float* pkt = pk + (u * a.kv_heads + h) * dh * a.prefix;
  const float* pvt = pv + (u * a.kv_heads + h) * a.prefix * dh;
  scores(qb, nq, pkt, a.prefix, a.prefix, dh, scale, s, len);
  for (int64_t j = 0; j < nr; ++j) {
    const int64_t r = u * n + j0 + j;
    scores(qb + j * g_len * dh, g_len, kt + (r * a.kv_heads + h) * dh * a.suffix, a.suffix, a.filled, dh, scale,
           s + j * g_len * len + a.prefix, len);
  }
  const bool* vu = valid + u * a.prefix;
  for (int64_t p = 0; p < a.prefix; ++p)
    if (!vu[p])
      for (int64_t i = 0; i < nq; ++i) s[i * len + p] = -INFINITY;
  exp_rows(s, nq, len, total);
  std::fill(ob, ob + nq * dh, 0.f);
  weighted_values(s, nq, len, pvt, a.prefix, dh, ob);
  for (int64_t j = 0; j < nr; ++j) {
    const int64_t r = u * n + j0 + j;
    weighted_values(s + j * g_len * len + a.prefix, g_len, len, vt + (r * a.kv_heads + h) * a.suffix * dh, a.filled,
                    dh, ob + j * g_len * dh);
  }
  for (int64_t i = 0; i < nq; ++i) {
    float inv = total[i] > 0.f ? 1.0f / total[i] : 0.f;
    const int64_t j = i / g_len, g = i % g_len;
    float* o = out + ((u * n + j0 + j) * a.q_heads + h * g_len + g) * dh;
    for (int64_t d = 0; d < dh; ++d) o[d] = ob[i * dh + d] * inv;
  }
}

ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> pk,
                         ffi::Buffer<ffi::F32> pv, ffi::Buffer<ffi::PRED> valid, ffi::Buffer<ffi::F32> kt,
                         ffi::Buffer<ffi::F32> vt, ffi::Buffer<ffi::S32> filled, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), pkd = pk.dimensions(), ktd = kt.dimensions();
  if (qd.size() != 3 || pkd.size() != 4 || ktd.size() != 4)
    return ffi::Error::InvalidArgument("mle_split_cache_attention: q [R, Hq, Dh], prefix [U, Hkv, Dh, P] expected");
  AttentionShape a{qd[0], qd[1], qd[2], pkd[0], pkd[1], pkd[3], ktd[3], 0};
  a.filled = std::clamp<int64_t>(*filled.typed_data(), 0, a.suffix);
  int64_t group = a.q_heads / a.kv_heads;
  if (group < 1 || a.q_heads % a.kv_heads || a.rows % a.prompts)
    return ffi::Error::InvalidArgument("mle_split_cache_attention: unsupported head layout");
  const float *qp = q.typed_data(), *pkp = pk.typed_data(), *pvp = pv.typed_data();
  const bool* vp = valid.typed_data();
  const float *ktp = kt.typed_data(), *vtp = vt.typed_data();
  float* op = out->typed_data();
  const int64_t n = a.rows / a.prompts, blocks = (n + kRowBlock - 1) / kRowBlock;
  parallel_chunks(pool, a.prompts * a.kv_heads * blocks, [&](int64_t c) {
    thread_local std::vector<float> buf;
    const int64_t b = c % blocks, h = (c / blocks) % a.kv_heads, u = c / (blocks * a.kv_heads);
    attend(a, qp, pkp, pvp, vp, ktp, vtp, op, u, h, b * kRowBlock, std::min<int64_t>(kRowBlock, n - b * kRowBlock), &buf);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MleDensePacked, DenseImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MleSplitCacheAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
