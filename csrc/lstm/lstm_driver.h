// Host side of the fused LSTM, shared by the CPU and CUDA kernels: the one validation path (run_forward /
// run_backward check every argument, then dispatch on dtype; both backends register exactly these, so they
// reject the same inputs with the same text), the step plan (sequences sorted by length so the alive ones
// are a prefix), and the layer / time loops, which issue the GEMMs through the backend (on the CPU the
// library csrc/common/gemm.h chooses per dtype, MKL or oneDNN; cuBLAS on the current stream on CUDA) and
// call its fused pointwise step (csrc/lstm/lstm_cpu.cpp, lstm_cuda.cu; per-element math in lstm.h).
//
// Precision: T is the storage dtype (the input's), A the accumulation dtype (float for float16/bfloat16,
// else T). Every GEMM accumulates in A and every value is rounded to T at most once: the pre-activations
// x·W_ihᵀ + h·W_hhᵀ + b are summed in A, the cell state and its gradient are A, and the hidden-state
// gradient dH is A through the whole backward (only dG, a GEMM operand, is stored in T). Every product of 16-bit
// operands has an A (float32) output (csrc/common/gemm.h: one bf16 contract on every CPU).
// Lengths are host data (a CPU tensor, as PackedSequence.batch_sizes): no check ever reads the device.
//
// Work layout ("time-major packed", as PyTorch's PackedSequence): row step_off[t] + r holds the sequence
// of rank r (r-th longest; ties by index) at step t, for r < batch_sizes[t]. The previous step of that
// row is row step_off[t − 1] + r, so a step's recurrent input is a contiguous prefix of the last step's
// rows and every GEMM runs on contiguous row blocks. Workspaces have one row per input row (M ≥ N).
// On the CPU each layer's time loop runs in parts, one per thread: ranks [r0, r1) own the rows
// step_off[t] + r0 .. at every step (split_ranks), so the parts share no row and need no synchronization.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/util/Exception.h>

#include <ATen/Dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/safe_numerics.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace stfast {
namespace lstm {

// Input layouts (the op's `layout` argument); the output has the same one.
enum Layout : int64_t {
  kPackedCsr = 0,         // (N, I): sequence b at rows offsets[b] .. offsets[b + 1] − 1
  kPaddedBatchFirst = 1,  // (B, Tp, I)
  kPaddedTimeFirst = 2,   // (Tp, B, I)
  kPackedTimeMajor = 3,   // (N, I) as PackedSequence.data: lengths non-increasing, step t's rows together
};

// L layers, B sequences, T longest length, Tp padded length (padded input), M input rows, N valid
// positions (Σ len), I input size, H hidden size.
struct Dims {
  int64_t L, B, T, Tp, M, N, I, H, layout;
  bool has_bias, padded;
  int64_t per_layer() const { return has_bias ? 4 : 2; }
};

inline void check_same(const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), "stfast.lstm: ", name, " is on ", t.device(), " but input on ",
              ref.device());
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "stfast.lstm: ", name, " has dtype ", t.scalar_type(),
              " but input has ", ref.scalar_type());
}

inline Dims check_args(const at::Tensor& input, const at::Tensor& lengths, at::TensorList weights,
                       const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0, int64_t num_layers,
                       int64_t layout) {
  Dims d{};
  TORCH_CHECK_VALUE(layout >= kPackedCsr && layout <= kPackedTimeMajor, "stfast.lstm: layout must be 0..3, got ",
                    layout);
  TORCH_CHECK_VALUE(num_layers >= 1, "stfast.lstm: num_layers must be >= 1, got ", num_layers);
  const auto st = input.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kDouble || st == at::kHalf || st == at::kBFloat16,
              "stfast.lstm: input must be float32, float64, float16 or bfloat16, got ", st);
  d.layout = layout;
  d.padded = layout == kPaddedBatchFirst || layout == kPaddedTimeFirst;
  TORCH_CHECK_VALUE(input.dim() == (d.padded ? 3 : 2), "stfast.lstm: input must be ",
                    d.padded ? "(B, T, I) / (T, B, I) padded" : "(N, I) packed", " for layout ", layout,
                    ", got shape ", input.sizes());
  TORCH_CHECK_VALUE(lengths.dim() == 1 && lengths.scalar_type() == at::kLong && lengths.device().is_cpu(),
                    "stfast.lstm: lengths must be a 1-D int64 CPU tensor (host lengths, like "
                    "PackedSequence.batch_sizes), got ", lengths.scalar_type(), " ", lengths.sizes(), " on ",
                    lengths.device());
  d.L = num_layers;
  d.I = input.size(-1);
  d.B = lengths.size(0);
  if (d.padded) {
    const bool batch_first = layout == kPaddedBatchFirst;
    const int64_t B = batch_first ? input.size(0) : input.size(1);
    d.Tp = batch_first ? input.size(1) : input.size(0);
    TORCH_CHECK_VALUE(B == d.B, "stfast.lstm: lengths has ", d.B, " entries but the padded input holds ", B,
                      " sequences");
    // Why: with I = 0 a (B, T, 0) input holds no memory whatever B·T is; the row count must still fit.
    TORCH_CHECK_VALUE(!c10::mul_overflows(d.B, d.Tp, &d.M), "stfast.lstm: padded input ", input.sizes(),
                      " has too many rows");
  } else {
    d.Tp = 0;
    d.M = input.size(0);
  }
  const auto len_c = lengths.contiguous();
  const int64_t* len = len_c.const_data_ptr<int64_t>();
  d.N = 0;
  d.T = 0;
  for (int64_t b = 0; b < d.B; ++b) {
    TORCH_CHECK_VALUE(len[b] >= 1, "stfast.lstm: sequence ", b, " has length ", len[b], "; lengths must be >= 1");
    TORCH_CHECK_VALUE(!d.padded || len[b] <= d.Tp, "stfast.lstm: sequence ", b, " has length ", len[b],
                      " > padded length ", d.Tp);
    TORCH_CHECK_VALUE(layout != kPackedTimeMajor || b == 0 || len[b] <= len[b - 1], "stfast.lstm: time-major packed "
                      "input needs non-increasing lengths (PackedSequence order), got ", len[b - 1], " then ", len[b]);
    // Why checked per sequence: the sum must not wrap around int64 and come out equal to the row count.
    TORCH_CHECK_VALUE(d.padded || len[b] <= d.M - d.N, "stfast.lstm: lengths sum to more than the ", d.M,
                      " rows of the packed input (at sequence ", b, ")");
    d.N += len[b];
    d.T = std::max(d.T, len[b]);
  }
  TORCH_CHECK_VALUE(d.padded || d.N == d.M, "stfast.lstm: lengths sum to ", d.N, " but the packed input has ", d.M,
                    " rows");
  const int64_t n_w = static_cast<int64_t>(weights.size());
  // Why L is bounded by n_w first: 4 * L must not wrap around int64 and match n_w by accident
  TORCH_CHECK_VALUE(d.L <= n_w && (n_w == 4 * d.L || n_w == 2 * d.L), "stfast.lstm: weights must hold 4 (with "
                    "biases) or 2 tensors per layer for num_layers=", d.L, ", got ", n_w);
  d.has_bias = n_w == 4 * d.L;
  TORCH_CHECK_VALUE(weights[1].dim() == 2, "stfast.lstm: weight_hh_l0 must be (4H, H), got ", weights[1].sizes());
  d.H = weights[1].size(1);
  // Why: 4H is every gate buffer's width; a shape-only (0-element) weight can claim any H
  TORCH_CHECK_VALUE(d.H <= std::numeric_limits<int32_t>::max(), "stfast.lstm: weight_hh_l0 must be (4H, H) with "
                    "H < 2^31, got ", weights[1].sizes());
  for (int64_t k = 0; k < d.L; ++k) {
    const at::Tensor& w_ih = weights[k * d.per_layer()];
    const at::Tensor& w_hh = weights[k * d.per_layer() + 1];
    const int64_t in_k = k == 0 ? d.I : d.H;
    // weight_hh first: H is read from it, so a wrong weight_hh is named as such, not as a wrong weight_ih
    TORCH_CHECK_VALUE(w_hh.dim() == 2 && w_hh.size(0) == 4 * d.H && w_hh.size(1) == d.H, "stfast.lstm: weight_hh_l",
                      k, " must be (4H, H) = (", 4 * d.H, ", ", d.H, "), got ", w_hh.sizes());
    TORCH_CHECK_VALUE(w_ih.dim() == 2 && w_ih.size(0) == 4 * d.H && w_ih.size(1) == in_k, "stfast.lstm: weight_ih_l",
                      k, " must be (4H, ", in_k, ") = (", 4 * d.H, ", ", in_k, "), got ", w_ih.sizes());
    check_same(input, w_ih, "weight_ih");
    check_same(input, w_hh, "weight_hh");
    if (d.has_bias) {
      for (int j = 2; j < 4; ++j) {
        const at::Tensor& bias = weights[k * 4 + j];
        TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == 4 * d.H, "stfast.lstm: biases of layer ", k,
                          " must be (", 4 * d.H, ",), got ", bias.sizes());
        check_same(input, bias, "bias");
      }
    }
  }
  for (const auto* st : {&h0, &c0}) {
    if (!st->has_value()) continue;
    const at::Tensor& s = st->value();
    const char* name = st == &h0 ? "h0" : "c0";
    TORCH_CHECK_VALUE(s.dim() == 3 && s.size(0) == d.L && s.size(1) == d.B && s.size(2) == d.H, "stfast.lstm: ",
                      name, " must be (num_layers, B, H) = (", d.L, ", ", d.B, ", ", d.H, "), got ", s.sizes());
    check_same(input, s, name);
  }
  return d;
}

// Backward-only arguments: grad_output has the output's shape; grad_h_n / grad_c_n are (L, B, H); the saved
// workspaces are those lstm_forward returned for these inputs.
inline void check_saved(const Dims& d, const at::Tensor& input, const at::Tensor& grad_output,
                        const std::optional<at::Tensor>& grad_h_n, const std::optional<at::Tensor>& grad_c_n,
                        const at::Tensor& gates, const at::Tensor& cells, const at::Tensor& hiddens) {
  auto out_sizes = input.sizes().vec();
  out_sizes.back() = d.H;
  TORCH_CHECK_VALUE(grad_output.sizes() == at::IntArrayRef(out_sizes), "stfast.lstm_backward: grad_output must be ",
                    at::IntArrayRef(out_sizes), ", got ", grad_output.sizes());
  check_same(input, grad_output, "grad_output");
  for (const auto* g : {&grad_h_n, &grad_c_n}) {
    if (!g->has_value()) continue;
    TORCH_CHECK_VALUE((*g)->dim() == 3 && (*g)->size(0) == d.L && (*g)->size(1) == d.B && (*g)->size(2) == d.H,
                      "stfast.lstm_backward: grad_h_n / grad_c_n must be (", d.L, ", ", d.B, ", ", d.H, "), got ",
                      (*g)->sizes());
    check_same(input, **g, "grad_h_n / grad_c_n");
  }
  TORCH_CHECK_VALUE(gates.dim() == 3 && gates.size(0) == d.L && gates.size(1) == d.M && gates.size(2) == 4 * d.H &&
                        gates.is_contiguous(),
                    "stfast.lstm_backward: gates must be contiguous (", d.L, ", ", d.M, ", ", 4 * d.H, "), got ",
                    gates.sizes());
  for (const auto* w : {&cells, &hiddens}) {
    TORCH_CHECK_VALUE(w->dim() == 3 && w->size(0) == d.L && w->size(1) == d.M && w->size(2) == d.H &&
                          w->is_contiguous(),
                      "stfast.lstm_backward: cells / hiddens must be contiguous (", d.L, ", ", d.M, ", ", d.H,
                      "), got ", w->sizes());
    TORCH_CHECK(w->device() == input.device(), "stfast.lstm_backward: saved tensors on ", w->device());
  }
  check_same(input, gates, "gates");
  check_same(input, hiddens, "hiddens");
  TORCH_CHECK(cells.scalar_type() == at::toOpMathType(input.scalar_type()),
              "stfast.lstm_backward: cells must have the accumulation dtype ", at::toOpMathType(input.scalar_type()));
}

// Index arrays of one call, on the input's device (int64):
//   perm (N): work row -> input row;  sorted (B): rank -> sequence;  end_rows (B): sequence -> its last
//   work row;  prev_rows (N − B): work row of step t ≥ 1 -> the same sequence's row at step t − 1.
// batch_sizes / step_off stay on the host: they size the per-step GEMMs.
struct Plan {
  std::vector<int64_t> batch_sizes, step_off;
  at::Tensor perm, sorted, end_rows, prev_rows;
};

inline Plan make_plan(const Dims& d, const at::Tensor& lengths, const at::Device& device) {
  Plan p;
  const auto len_c = lengths.contiguous();
  const int64_t* len = len_c.const_data_ptr<int64_t>();
  std::vector<int64_t> sorted(d.B), rank(d.B), csr_off(d.B + 1, 0);
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int64_t a, int64_t b) { return len[a] > len[b]; });
  for (int64_t r = 0; r < d.B; ++r) rank[sorted[r]] = r;
  for (int64_t b = 0; b < d.B; ++b) csr_off[b + 1] = csr_off[b] + len[b];
  p.batch_sizes.assign(d.T, 0);
  for (int64_t r = 0; r < d.B; ++r) p.batch_sizes[len[sorted[r]] - 1] += 1;  // count of lengths == t + 1 ...
  for (int64_t t = d.T - 2; t >= 0; --t) p.batch_sizes[t] += p.batch_sizes[t + 1];  // ... -> count of > t
  p.step_off.assign(d.T + 1, 0);
  for (int64_t t = 0; t < d.T; ++t) p.step_off[t + 1] = p.step_off[t] + p.batch_sizes[t];
  // One host buffer for all four index arrays: a single (pinned, asynchronous) copy to a GPU.
  const int64_t n_prev = std::max<int64_t>(d.N - d.B, 0);
  const int64_t total = d.N + 2 * d.B + n_prev;
  auto host = at::empty({total}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* perm = host.data_ptr<int64_t>();
  int64_t* srt = perm + d.N;
  int64_t* end = srt + d.B;
  int64_t* prev = end + d.B;
  for (int64_t t = 0; t < d.T; ++t) {
    for (int64_t r = 0; r < p.batch_sizes[t]; ++r) {
      const int64_t b = sorted[r];
      int64_t row;
      if (d.layout == kPackedCsr) row = csr_off[b] + t;
      else if (d.layout == kPaddedBatchFirst) row = b * d.Tp + t;
      else if (d.layout == kPaddedTimeFirst) row = t * d.B + b;
      else row = p.step_off[t] + r;  // kPackedTimeMajor: lengths already sorted, the work order itself
      perm[p.step_off[t] + r] = row;
      if (t > 0) prev[p.step_off[t] - d.B + r] = p.step_off[t - 1] + r;
    }
  }
  for (int64_t r = 0; r < d.B; ++r) srt[r] = sorted[r];
  for (int64_t b = 0; b < d.B; ++b) end[b] = p.step_off[len[b] - 1] + rank[b];
  auto dev = device.is_cpu() ? host : host.to(device, /*non_blocking=*/true);
  p.perm = dev.narrow(0, 0, d.N);
  p.sorted = dev.narrow(0, d.N, d.B);
  p.end_rows = dev.narrow(0, d.N + d.B, d.B);
  p.prev_rows = dev.narrow(0, d.N + 2 * d.B, n_prev);
  return p;
}

// Splitting a layer's time loop over threads (CPU): the ranks [0, B) cut into contiguous ranges, each run
// through all its steps by one thread with single-threaded GEMMs. Why: a step's recurrent product is small
// (≤ B × H × 4H) and a library splitting each one over 2 threads gains little, while the ranges need no
// synchronization at all (a rank's rows at step t depend only on its own rows at t − 1). The cut balances a
// cost of kStepCost rows per step alive (a GEMM and a pointwise call) plus one per row, and depends only on
// the lengths and the thread count: a run is bitwise repeatable at one thread count.
constexpr int64_t kStepCost = 8;
constexpr int64_t kMinRanksPerPart = 16;  // below this the per-thread GEMMs get too thin to pay

// Rank bounds (parts + 1 values, 0 .. B) of at most `parts` ranges of ranks, from the plan's batch sizes.
inline std::vector<int64_t> split_ranks(const Plan& p, int64_t B, int64_t parts) {
  parts = std::max<int64_t>(1, std::min(parts, B / kMinRanksPerPart));
  if (parts == 1) return {0, B};
  std::vector<int64_t> len(B, 0);  // len[r]: steps of rank r (batch_sizes[t] > r exactly for t < len[r])
  for (const int64_t bs : p.batch_sizes) len[bs - 1] += 1;
  for (int64_t r = B - 2; r >= 0; --r) len[r] += len[r + 1];
  std::vector<int64_t> rows(B + 1, 0);  // prefix sums of len
  for (int64_t r = 0; r < B; ++r) rows[r + 1] = rows[r] + len[r];
  auto cost = [&](int64_t r0, int64_t r1) { return kStepCost * len[r0] + rows[r1] - rows[r0]; };
  // Greedy ranges of cost ≤ limit (optimal for a cost that grows as a range extends); the least limit that
  // needs no more than `parts` of them, by bisection.
  auto cut = [&](int64_t limit, std::vector<int64_t>* bounds) {
    int64_t n = 0;
    for (int64_t r0 = 0; r0 < B; ++n) {
      int64_t r1 = r0 + 1;
      while (r1 < B && cost(r0, r1 + 1) <= limit) ++r1;
      if (bounds != nullptr) bounds->push_back(r0);
      r0 = r1;
    }
    return n;
  };
  int64_t lo = 0, hi = cost(0, B);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (cut(mid, nullptr) <= parts) hi = mid;
    else lo = mid + 1;
  }
  std::vector<int64_t> bounds;
  cut(lo, &bounds);
  bounds.push_back(B);
  return bounds;
}

// Threads a time loop may be split over: Backend::step_threads() where the backend has it (CPU), else 1.
template <class Backend>
int64_t step_threads() {
  if constexpr (requires { Backend::step_threads(); }) return Backend::step_threads();
  else return 1;
}

// Runs f(part) for part = 0 .. parts − 1: concurrently through Backend::parallel_parts where the backend
// has it (CPU), else one after another.
template <class Backend, class F>
void for_each_part(int64_t parts, const F& f) {
  if constexpr (requires { Backend::parallel_parts(parts, f); }) {
    if (parts > 1) return Backend::parallel_parts(parts, f);
  }
  for (int64_t i = 0; i < parts; ++i) f(i);
}

// A weight that many products of one call share (W_hhᵀ / W_hh over a layer's time steps), prepared once for
// products with an `out` output where the backend can (CPU: packed for the micro-kernel when that is the chosen
// library, csrc/common/gemm.h); elsewhere the tensor itself. Backend::mm / add_recurrent_grad take either.
template <class Backend>
auto prepare_weight(const at::Tensor& w, at::ScalarType out) {
  if constexpr (requires { Backend::prepare(w, out); }) return Backend::prepare(w, out);
  else return w;
}

// The forward's recurrent weight W_hhᵀ, prepared once per layer: for the backend's tile-fused step where it
// has one (Backend::prepare_fused / fuses / fused_forward_step: CPU, with the micro-kernel) and `fuse`; else
// as prepare_weight. recurrent_fused: whether the prepared weight runs the fused step.
template <class Backend>
auto prepare_recurrent(const at::Tensor& w_t, at::ScalarType out, bool fuse) {
  if constexpr (requires { Backend::prepare_fused(w_t, out); }) {
    if (fuse) return Backend::prepare_fused(w_t, out);
  }
  return prepare_weight<Backend>(w_t, out);
}

template <class Backend, class W>
bool recurrent_fused(const W& w) {
  if constexpr (requires { Backend::fuses(w); }) return Backend::fuses(w);
  else return false;
}

inline at::Tensor weight(at::TensorList w, const Dims& d, int64_t layer, int64_t j) {
  return w[layer * d.per_layer() + j];
}

// out[i] = src[idx[i]] for the rows of a (R, C) tensor; out may have a wider dtype (A) than src (T).
inline void gather_rows(at::Tensor out, const at::Tensor& src, const at::Tensor& idx) {
  if (out.scalar_type() == src.scalar_type()) at::index_select_out(out, src, 0, idx);
  else out.copy_(src.index_select(0, idx));
}

// Input rows in work order (N, I).
template <class Backend>
at::Tensor gather_input(const at::Tensor& input, const Dims& d, const Plan& p) {
  at::Tensor x = Backend::empty({d.N, d.I}, input.options());
  at::index_select_out(x, input.reshape({d.M, d.I}), 0, p.perm);
  return x;
}

// Work rows (N, C) back into the input's layout with C columns (zero where padded), in `rows`' dtype.
template <class Backend>
at::Tensor scatter_rows(const at::Tensor& rows, const at::Tensor& input, const Dims& d, const Plan& p) {
  const int64_t C = rows.size(1);
  at::Tensor out = Backend::empty({d.M, C}, rows.options());
  if (d.padded) out.zero_();
  out.index_copy_(0, p.perm, rows);
  auto sizes = input.sizes().vec();
  sizes.back() = C;
  return out.view(sizes);
}

// out (=, or += with accumulate) a · b in out's dtype, for ATen's CPU GEMMs (the CPU backend and the CUDA
// emulator's): float16/bfloat16 operands with a float out are widened first. Their products are exact in
// float, so this is a GEMM with float accumulation (ATen's CPU mm has no out_dtype); the weight widening
// costs ~1/rows of the GEMM.
inline void mm_widened(at::Tensor out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  const auto st = out.scalar_type();
  const at::Tensor a2 = a.scalar_type() == st ? a : a.to(st), b2 = b.scalar_type() == st ? b : b.to(st);
  if (accumulate) out.addmm_(a2, b2);
  else at::mm_out(out, a2, b2);
}

// out (R, C) = a (R, K) · b (K, C), in blocks of Backend::kGemmRowBlock rows (Backend::mm: out may be the
// accumulation dtype A while a and b are T). Why blocks: on the CPU, MKL's single-thread path for tall,
// narrow products (R ~ 20,000, C 128) ran at 60 % of the rate it reaches on blocks of 1,024 rows
// (measured: 42 vs 68 GFLOP/s).
template <class Backend>
void mm_rows(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  const int64_t R = a.size(0);
  for (int64_t r0 = 0, n = 0; r0 < R; r0 += n) {
    n = std::min(Backend::kGemmRowBlock, R - r0);
    Backend::mm(out.narrow(0, r0, n), a.narrow(0, r0, n), b, /*accumulate=*/false);
  }
}

// out (Ka, C) = aᵀ · b for a (R, Ka), b (R, C): the sum over R in blocks of Backend::kGemmRowBlock rows,
// accumulated in out in a fixed order (deterministic). A weight gradient's output is narrow (C = I or H columns
// against Ka = 4H rows), so it is computed as its transpose bᵀ · a (C, Ka) and copied into out. Why: the
// libraries run a product with 4H output columns faster than one with I columns, and no slower than one with
// H (Zen 3, 1 thread, 4,560 rows × 512: MKL 59 vs 44 GFLOP/s at C 61, 73 vs 74 at C 128, a tie; the
// micro-kernel 53 vs 31 and 59 vs 56).
template <class Backend>
void mm_tn(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  if (b.size(1) < a.size(1)) {
    at::Tensor out_t = Backend::empty({b.size(1), a.size(1)}, out.options());
    mm_tn<Backend>(out_t, b, a);  // wider than tall now: no further swap
    out.copy_(out_t.t());
    return;
  }
  const int64_t R = a.size(0);
  if (R == 0) out.zero_();
  for (int64_t r0 = 0, n = 0; r0 < R; r0 += n) {
    n = std::min(Backend::kGemmRowBlock, R - r0);
    Backend::mm(out, a.narrow(0, r0, n).t(), b.narrow(0, r0, n), /*accumulate=*/r0 > 0);
  }
}

// Backend (csrc/lstm/lstm_cpu.cpp, lstm_cuda.cu):
//   forward_step<T, A>(T* gates, const A* pre, const A* rec, const A* bias, const A* c_prev, A* c, T* h, bs, H):
//     over bs consecutive work rows, pre-activation = pre + rec + bias (rec == nullptr: none; bias 4H), the
//     activations written to gates (which may alias pre when T == A), c and h;
//   backward_step<T, A>(const T* gates, const A* c, const A* c_prev, const A* dh, A* dc, T* dgates, bs, H);
//   (c_prev == nullptr: zero initial cell);
//   mm(out, a, b, accumulate): out (= or +=) a · b with accumulation in out's dtype (A, or T == A);
//   mm(out, a, w, accumulate) and add_recurrent_grad(at::Tensor out, const at::Tensor& dG, w_hh): out (A) +=
//     dG · W_hh, with w / w_hh as prepare_weight<Backend> returns them;
//   empty(sizes, options): an uninitialized contiguous workspace; kGemmRowBlock: see mm_rows.
template <typename T, typename A, class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    const Dims& d, const Plan& p, const at::Tensor& input, at::TensorList weights, const std::optional<at::Tensor>& h0,
    const std::optional<at::Tensor>& c0) {
  // Why: a direct call of the op with grad mode on (or a double backward) must not record the inner ATen
  // calls; the out= variants used here refuse inputs that require grad.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  constexpr bool kMixed = !std::is_same_v<T, A>;
  const auto opt = input.options();
  const at::TensorOptions acc_opt = opt.dtype(c10::CppTypeToScalarType<A>::value);
  const int64_t H = d.H, G4 = 4 * d.H;
  at::Tensor gates = Backend::empty({d.L, d.M, G4}, opt);
  at::Tensor cells = Backend::empty({d.L, d.M, H}, acc_opt);
  at::Tensor hiddens = Backend::empty({d.L, d.M, H}, opt);
  at::Tensor h_n = at::empty({d.L, d.B, H}, opt);
  at::Tensor c_n = at::empty({d.L, d.B, H}, opt);
  if (d.M > d.N) {  // padded input: rows past N are never used; zero them so saved tensors are defined
    gates.narrow(1, d.N, d.M - d.N).zero_();
    cells.narrow(1, d.N, d.M - d.N).zero_();
    hiddens.narrow(1, d.N, d.M - d.N).zero_();
  }
  // Pre-activations in A. T == A: the gates buffer itself, overwritten in place by the activations.
  // float16/bfloat16: one (N, 4H) float buffer for x·W_ihᵀ (shared by the layers) and one (B, 4H) for a
  // step's h·W_hhᵀ, summed with the bias in the pointwise step: one rounding, to the stored activation.
  const at::Tensor pre_mixed = kMixed ? Backend::empty({d.N, G4}, acc_opt) : at::Tensor();
  const at::Tensor rec = kMixed ? Backend::empty({d.B, G4}, acc_opt) : at::Tensor();
  at::Tensor h_wide;  // (N, H) in A: h as stored, widened by the pointwise step, where the step product runs in A
  const std::vector<int64_t> bounds = split_ranks(p, d.B, step_threads<Backend>());
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  at::Tensor x = gather_input<Backend>(input, d, p);
  for (int64_t k = 0; k < d.L; ++k) {
    at::Tensor G = gates.select(0, k).narrow(0, 0, d.N);
    at::Tensor C = cells.select(0, k).narrow(0, 0, d.N);
    at::Tensor Hs = hiddens.select(0, k).narrow(0, 0, d.N);
    const at::Tensor P = kMixed ? pre_mixed : G;
    const auto w_ih = weight(weights, d, k, 0);
    const auto w_rec = prepare_recurrent<Backend>(weight(weights, d, k, 1).t(), P.scalar_type(), /*fuse=*/true);
    const bool fused = recurrent_fused<Backend>(w_rec);
    bool wide = false;
    if constexpr (requires { Backend::template widens<T>(w_rec); }) wide = kMixed && Backend::template widens<T>(w_rec);
    if (wide && !h_wide.defined()) h_wide = Backend::empty({d.N, H}, acc_opt);
    mm_rows<Backend>(P, x, w_ih.t());
    // b_ih + b_hh in A, added in the pointwise step (not by the GEMM: that would copy it into all N rows first).
    const at::Tensor bias = d.has_bias ? (weight(weights, d, k, 2).to(acc_opt.dtype()) +
                                          weight(weights, d, k, 3).to(acc_opt.dtype())).contiguous()
                                       : at::zeros({G4}, acc_opt);
    at::Tensor h0s, c0s;
    if (h0.has_value()) h0s = h0->select(0, k).index_select(0, p.sorted);
    if (c0.has_value()) c0s = c0->select(0, k).index_select(0, p.sorted).to(acc_opt.dtype()).contiguous();
    T* g = G.data_ptr<T>();
    const A* pre = P.const_data_ptr<A>();
    A* c = C.data_ptr<A>();
    T* h = Hs.data_ptr<T>();
    // The ranks [r0, r1) of one part (split_ranks) through all their steps: at step t their rows are
    // step_off[t] + r0 .. + bs, their previous ones step_off[t − 1] + r0 .. + bs.
    for_each_part<Backend>(parts, [&](int64_t part) {
      const int64_t r0 = bounds[part], r1 = bounds[part + 1];
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t bs = std::min(p.batch_sizes[t], r1) - r0, so = p.step_off[t] + r0;
        if (bs <= 0) break;  // batch sizes never grow
        const at::Tensor h_prev = t > 0 ? Hs.narrow(0, p.step_off[t - 1] + r0, bs)
                                        : (h0s.defined() ? h0s.narrow(0, r0, bs) : h0s);  // undefined: zero h0
        const A* c_prev = t > 0 ? c + (p.step_off[t - 1] + r0) * H
                                : (c0s.defined() ? c0s.const_data_ptr<A>() + r0 * H : nullptr);
        const A* r = nullptr;
        if constexpr (requires { Backend::template fused_forward_step<T, A>(w_rec, g, 0, g, pre, pre, pre, c, g, 0, 0); }) {
          if (fused && h_prev.defined()) {  // the product and the cell in one pass (pre: A, see above)
            Backend::template fused_forward_step<T, A>(w_rec, h_prev.template const_data_ptr<T>(), h_prev.stride(0),
                                                       g + so * G4, pre + so * G4, bias.const_data_ptr<A>(), c_prev,
                                                       c + so * H, h + so * H, bs, H);
            continue;
          }
        }
        if (h_prev.defined()) {
          if (kMixed) {
            Backend::mm(rec.narrow(0, r0, bs), wide && t > 0 ? h_wide.narrow(0, p.step_off[t - 1] + r0, bs) : h_prev,
                        w_rec, /*accumulate=*/false);
            r = rec.const_data_ptr<A>() + r0 * G4;
          } else {
            Backend::mm(P.narrow(0, so, bs), h_prev, w_rec, /*accumulate=*/true);
          }
        }
        if constexpr (requires { Backend::template widens<T>(w_rec); }) {
          if (wide) {
            Backend::template forward_step<T, A>(g + so * G4, pre + so * G4, r, bias.const_data_ptr<A>(), c_prev,
                                                 c + so * H, h + so * H, bs, H, h_wide.data_ptr<A>() + so * H);
            continue;
          }
        }
        Backend::template forward_step<T, A>(g + so * G4, pre + so * G4, r, bias.const_data_ptr<A>(), c_prev,
                                             c + so * H, h + so * H, bs, H);
      }
    });
    h_n.select(0, k).copy_(Hs.index_select(0, p.end_rows));
    c_n.select(0, k).copy_(C.index_select(0, p.end_rows));
    x = Hs;
  }
  auto output = scatter_rows<Backend>(x, input, d, p);
  return {output, h_n, c_n, gates, cells, hiddens};
}

// input_grad false: the input's gradient is not computed (a 0-element grad_input is returned), which saves
// layer 0's input-gradient GEMM when the input does not require grad.
template <typename T, typename A, class Backend>
std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> backward(
    const Dims& d, const Plan& p, const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input, at::TensorList weights,
    const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0, const at::Tensor& gates,
    const at::Tensor& cells, const at::Tensor& hiddens, bool input_grad) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;  // as in forward
  constexpr bool kMixed = !std::is_same_v<T, A>;
  const auto opt = input.options();
  const auto acc_dtype = c10::CppTypeToScalarType<A>::value;
  const auto acc_opt = opt.dtype(acc_dtype);
  const int64_t H = d.H, G4 = 4 * d.H;
  std::vector<at::Tensor> grad_w(weights.size());
  at::Tensor grad_h0 = at::empty({d.L, d.B, H}, opt);
  at::Tensor grad_c0 = at::empty({d.L, d.B, H}, opt);
  // dh (A) of the top layer's outputs in work order; for lower layers, the input gradient of the layer above
  // (two buffers, swapped per layer). One pre-activation gradient buffer (T: a GEMM operand) serves every layer.
  at::Tensor dH = Backend::empty({d.N, H}, acc_opt);
  gather_rows(dH, grad_output.reshape({d.M, H}), p.perm);
  at::Tensor dH_below = d.L > 1 ? Backend::empty({d.N, H}, acc_opt) : at::Tensor();
  at::Tensor dG = Backend::empty({d.N, G4}, opt);
  at::Tensor dg_wide;  // (B, 4H) in A: a step's dG as stored, widened by the pointwise step (Backend::widens)
  at::Tensor grad_x;
  const std::vector<int64_t> bounds = split_ranks(p, d.B, step_threads<Backend>());  // as in forward
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  for (int64_t k = d.L - 1; k >= 0; --k) {
    const at::Tensor G = gates.select(0, k).narrow(0, 0, d.N);
    const at::Tensor C = cells.select(0, k).narrow(0, 0, d.N);
    const at::Tensor Hs = hiddens.select(0, k).narrow(0, 0, d.N);
    const auto w_ih = weight(weights, d, k, 0);
    const auto w_hh = prepare_weight<Backend>(weight(weights, d, k, 1), acc_dtype);
    if (grad_h_n.has_value()) dH.index_add_(0, p.end_rows, grad_h_n->select(0, k).to(acc_dtype));  // distinct rows
    at::Tensor dc = grad_c_n.has_value() ? grad_c_n->select(0, k).index_select(0, p.sorted).to(acc_dtype).contiguous()
                                         : at::zeros({d.B, H}, acc_opt);
    at::Tensor c0s, h0s;
    if (c0.has_value()) c0s = c0->select(0, k).index_select(0, p.sorted).to(acc_dtype).contiguous();
    if (h0.has_value()) h0s = h0->select(0, k).index_select(0, p.sorted);
    const T* g = G.const_data_ptr<T>();
    const A* c = C.const_data_ptr<A>();
    const A* dh = dH.const_data_ptr<A>();
    T* dg = dG.data_ptr<T>();
    A* dcp = dc.data_ptr<A>();
    bool wide = false;
    if constexpr (requires { Backend::template widens<T>(w_hh); }) wide = kMixed && Backend::template widens<T>(w_hh);
    if (wide && !dg_wide.defined()) dg_wide = Backend::empty({d.B, G4}, acc_opt);
    for_each_part<Backend>(parts, [&](int64_t part) {  // as in forward: a part's ranks, their own rows only
      const int64_t r0 = bounds[part], r1 = bounds[part + 1];
      for (int64_t t = d.T - 1; t >= 0; --t) {
        const int64_t bs = std::min(p.batch_sizes[t], r1) - r0, so = p.step_off[t] + r0;
        if (bs <= 0) continue;  // these ranks' sequences end before t
        const A* c_prev = t > 0 ? c + (p.step_off[t - 1] + r0) * H
                                : (c0s.defined() ? c0s.const_data_ptr<A>() + r0 * H : nullptr);
        if constexpr (requires { Backend::template fused_backward_step<T, A>(w_hh, g, c, c, c, dcp, dg, dcp, 0, 0); }) {
          if (t > 0 && Backend::template fuses_backward<T>(w_hh)) {  // dG and its dG·W_hh tile by tile
            Backend::template fused_backward_step<T, A>(w_hh, g + so * G4, c + so * H, c_prev, dh + so * H,
                                                        dcp + r0 * H, dg + so * G4,
                                                        dH.data_ptr<A>() + (p.step_off[t - 1] + r0) * H, bs, H);
            continue;
          }
        }
        if constexpr (requires { Backend::template widens<T>(w_hh); }) {
          if (wide && t > 0) {  // dG widened by the step itself: the product runs in A without a copy
            Backend::template backward_step<T, A>(g + so * G4, c + so * H, c_prev, dh + so * H, dcp + r0 * H,
                                                  dg + so * G4, bs, H, dg_wide.data_ptr<A>() + r0 * G4);
            Backend::add_recurrent_grad(dH.narrow(0, p.step_off[t - 1] + r0, bs), dg_wide.narrow(0, r0, bs), w_hh);
            continue;
          }
        }
        Backend::template backward_step<T, A>(g + so * G4, c + so * H, c_prev, dh + so * H, dcp + r0 * H,
                                              dg + so * G4, bs, H);
        if (t > 0) {
          Backend::add_recurrent_grad(dH.narrow(0, p.step_off[t - 1] + r0, bs), dG.narrow(0, so, bs), w_hh);
        }
      }
    });
    if (d.B > 0) {
      at::Tensor gh0 = at::zeros({d.B, H}, acc_opt);
      Backend::add_recurrent_grad(gh0, dG.narrow(0, 0, d.B), w_hh);
      grad_h0.select(0, k).index_copy_(0, p.sorted, gh0.to(opt.dtype()));
      grad_c0.select(0, k).index_copy_(0, p.sorted, dc.to(opt.dtype()));
    } else {
      grad_h0.select(0, k).zero_();
      grad_c0.select(0, k).zero_();
    }
    // Weight gradients: accumulated in A over all rows, rounded to T once (.to is a no-op when T == A).
    const at::Tensor x = k == 0 ? gather_input<Backend>(input, d, p) : hiddens.select(0, k - 1).narrow(0, 0, d.N);
    at::Tensor gw_ih = at::empty({G4, x.size(1)}, acc_opt);
    mm_tn<Backend>(gw_ih, dG, x);
    grad_w[k * d.per_layer()] = gw_ih.to(opt.dtype());
    // h_{t−1} of every row past step 0; T == A: gathered into dH's buffer (this layer's dh is spent).
    at::Tensor h_prev = kMixed ? Backend::empty({d.N - d.B, H}, opt) : dH.narrow(0, 0, d.N - d.B);
    at::index_select_out(h_prev, Hs, 0, p.prev_rows);
    at::Tensor gw_hh = at::empty({G4, H}, acc_opt);
    mm_tn<Backend>(gw_hh, dG.narrow(0, d.B, d.N - d.B), h_prev);
    if (h0s.defined()) Backend::mm(gw_hh, dG.narrow(0, 0, d.B).t(), h0s, /*accumulate=*/true);
    grad_w[k * d.per_layer() + 1] = gw_hh.to(opt.dtype());
    if (d.has_bias) {
      at::Tensor gb;
      if constexpr (requires { Backend::column_sums(dG, acc_dtype); }) gb = Backend::column_sums(dG, acc_dtype);
      else gb = at::sum(dG, {0}, false, acc_dtype);
      gb = gb.to(opt.dtype());
      grad_w[k * 4 + 2] = gb;
      grad_w[k * 4 + 3] = gb.clone();
    }
    if (k > 0) {
      mm_rows<Backend>(dH_below, dG, w_ih);
      std::swap(dH, dH_below);
    } else if (input_grad) {
      // I columns widened to a multiple of 16 with zero weights, the product's output then narrowed. Why: a
      // product with an odd output width ran 1.4–1.6× slower than one 3 columns wider (Zen 3, 1 thread, MKL,
      // 4,560 × 512 × 61: 51 vs 70 GFLOP/s; the micro-kernel 50 vs 81); DeepTTE's layer 0 takes I = 61.
      const int64_t I16 = (d.I + 15) / 16 * 16;
      at::Tensor w = w_ih;
      if (I16 != d.I) {
        w = at::zeros({G4, I16}, w_ih.options());
        w.narrow(1, 0, d.I).copy_(w_ih);
      }
      grad_x = Backend::empty({d.N, I16}, acc_opt);
      mm_rows<Backend>(grad_x, dG, w);
      grad_x = grad_x.narrow(1, 0, d.I);
    }
  }
  at::Tensor grad_input =
      input_grad ? scatter_rows<Backend>(grad_x.to(opt.dtype()), input, d, p) : at::empty({0}, opt);
  return {grad_input, grad_w, grad_h0, grad_c0};
}

// The op entry points both backends register (TORCH_LIBRARY_IMPL in lstm_cpu.cpp, lstm_cuda.cu): every check
// first (host data only), then the device guard, the plan and the dtype dispatch.
template <class Backend>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> run_forward(
    const at::Tensor& input, const at::Tensor& lengths, at::TensorList weights, const std::optional<at::Tensor>& h0,
    const std::optional<at::Tensor>& c0, int64_t num_layers, int64_t layout) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  const c10::OptionalDeviceGuard guard(input.device());
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "stfast.lstm_forward", [&] {
    out = forward<scalar_t, at::opmath_type<scalar_t>, Backend>(d, p, input, weights, h0, c0);
  });
  return out;
}

template <class Backend>
std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> run_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n, const at::Tensor& input, const at::Tensor& lengths,
    at::TensorList weights, const std::optional<at::Tensor>& h0, const std::optional<at::Tensor>& c0,
    const at::Tensor& gates, const at::Tensor& cells, const at::Tensor& hiddens, int64_t num_layers,
    int64_t layout, bool input_grad) {
  const Dims d = check_args(input, lengths, weights, h0, c0, num_layers, layout);
  check_saved(d, input, grad_output, grad_h_n, grad_c_n, gates, cells, hiddens);
  const c10::OptionalDeviceGuard guard(input.device());
  const Plan p = make_plan(d, lengths, input.device());
  std::tuple<at::Tensor, std::vector<at::Tensor>, at::Tensor, at::Tensor> out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "stfast.lstm_backward", [&] {
    out = backward<scalar_t, at::opmath_type<scalar_t>, Backend>(d, p, grad_output, grad_h_n, grad_c_n, input,
                                                                 weights, h0, c0, gates, cells, hiddens, input_grad);
  });
  return out;
}

}  // namespace lstm
}  // namespace stfast
