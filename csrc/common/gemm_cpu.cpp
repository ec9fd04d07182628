// CPU GEMM routing (see gemm.h): the libraries, the run-time probe, and the ops that expose the decision
// (torch.ops.stfast.gemm_library / gemm_rates / gemm_select / gemm_reset) and a routed product
// (torch.ops.stfast.gemm_mm) to Python.
#include "gemm.h"

#include "ukernel.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// Exported by libtorch_cpu (TORCH_API) but its header (ATen/native/mkldnn/Matmul.h) is not in the wheel:
// result = beta · result + alpha · mat1 · mat2 through oneDNN's matmul primitive (torch's bfloat16 mm path).
namespace at {
namespace native {
void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2, const Tensor& result, float beta, float alpha);
}  // namespace native
}  // namespace at

namespace stfast {
namespace gemm {
namespace {

void run(Library lib, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate);

// Whether torch's oneDNN matmul runs on this CPU for these operands: asked of the library itself, once per
// dtype (it refuses e.g. float16 without AVX512-FP16 / AVX-NE-CONVERT, and any dtype in a build without it).
bool onednn_runs(at::ScalarType operands) {
  static std::mutex m;
  static std::map<int, bool> known;
  const std::lock_guard<std::mutex> lock(m);
  const auto it = known.find(static_cast<int>(operands));
  if (it != known.end()) return it->second;
  bool ok = true;
  try {
    const at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(operands));
    run(kOneDnn, at::empty({2, 2}, a.options()), a, a, false);
  } catch (const std::exception&) {  // c10::Error, and dnnl::error where oneDNN throws its own
    ok = false;
  }
  known[static_cast<int>(operands)] = ok;
  return ok;
}

// One bf16 contract on every CPU: a float32 output of 16-bit operands is their float32 sum, rounded once. torch's
// oneDNN matmul has only 16-bit outputs for 16-bit operands (a float32 output would be that result rounded to 16
// bits, then widened: two roundings), so it takes 16-bit operands only with their own dtype as output, where the
// one rounding to 16 bits is the documented policy.
bool onednn_takes(at::ScalarType operands, at::ScalarType out) {
  const bool pair = operands == out && (operands == at::kFloat || operands == at::kBFloat16 || operands == at::kHalf);
  return pair && at::globalContext().userEnabledMkldnn() && onednn_runs(operands);  // torch.backends.mkldnn honoured
}

// The micro-kernel's pairs: its float32 output, or the operands' own dtype (the float32 tile rounded once).
bool brgemm_takes(at::ScalarType operands, at::ScalarType out) {
  return (out == at::kFloat || out == operands) && brgemm::takes(operands, at::kFloat);
}

void run(Library lib, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (lib == kOneDnn) {
    // not an ATen call: named for the profiler, so a profile counts these products as GEMMs
    RECORD_FUNCTION("stfast::onednn_matmul", std::vector<c10::IValue>());
    TORCH_CHECK(out.scalar_type() == a.scalar_type(), "stfast.gemm: oneDNN runs only same-dtype products");
    at::native::mkldnn_matmul(a, b, out, accumulate ? 1.0f : 0.0f, 1.0f);
    return;
  }
  if (lib == kBrgemm) return brgemm::mm(out, a, b, accumulate);
  const auto st = out.scalar_type();
  if (a.scalar_type() == at::kDouble && st != at::kDouble) {
    // float64 operands keep float64 sums (gemm.h), rounded once to the output's dtype
    const at::Tensor wide = at::mm(a, b);
    if (accumulate) const_cast<at::Tensor&>(out).add_(wide);
    else const_cast<at::Tensor&>(out).copy_(wide);
    return;
  }
  const at::Tensor a2 = a.scalar_type() == st ? a : a.to(st), b2 = b.scalar_type() == st ? b : b.to(st);
  if (accumulate) out.addmm_(a2, b2);
  else at::mm_out(const_cast<at::Tensor&>(out), a2, b2);
}

struct Choice {
  Library lib;
  int threads;  // at::get_num_threads() when chosen: another count re-probes
  bool mkldnn;  // torch.backends.mkldnn.enabled when chosen: a change re-probes (it changes what takes 16 bits)
  ukernel::Impl kernel;  // the micro-kernel seam when chosen: a switch re-probes
};

bool mkldnn_enabled() { return at::globalContext().userEnabledMkldnn(); }

std::mutex& choices_mutex() {
  static std::mutex m;
  return m;
}
using Key = std::tuple<int, int, int>;  // (operands, out, use)
Key key(at::ScalarType operands, at::ScalarType out, Use use) {
  return {static_cast<int>(operands), static_cast<int>(out), static_cast<int>(use)};
}
std::map<Key, Choice>& choices() {
  static std::map<Key, Choice> c;
  return c;
}

std::optional<Library> read_forced() {
  const char* env = std::getenv("STFAST_GEMM");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string s(env);
  if (s == "aten") return kAten;
  if (s == "onednn") return kOneDnn;
  if (s == "brgemm") return kBrgemm;
  TORCH_CHECK_VALUE(false, "STFAST_GEMM must be 'aten', 'onednn' or 'brgemm', got '", s, "'");
}

// STFAST_GEMM, read once (a getenv per GEMM showed in profiles).
std::optional<Library> forced() {
  static const std::optional<Library> f = read_forced();
  return f;
}

// Deterministic operands (the probe must not draw from torch's global generator: training seeds it).
at::Tensor probe_operand(int64_t rows, int64_t cols, at::ScalarType st) {
  return at::arange(rows * cols, at::TensorOptions().dtype(at::kFloat)).mul_(0.37f).sin_().view({rows, cols}).to(st);
}

}  // namespace

const char* library_name(Library lib) { return lib == kOneDnn ? "onednn" : lib == kBrgemm ? "brgemm" : "aten"; }

bool takes(Library lib, at::ScalarType operands, at::ScalarType out) {
  if (lib == kOneDnn) return onednn_takes(operands, out);
  if (lib == kBrgemm) return brgemm_takes(operands, out);
  return true;
}

namespace {

// b prepared for products in `lib` (see prepare).
Weight prepare_with(const at::Tensor& b, Library lib, int64_t groups = 1, int64_t unit = 0) {
  TORCH_CHECK(groups >= 1 && unit >= 0 && b.dim() == 2 && b.size(1) % groups == 0 &&
                  (groups == 1 || (groups * unit) % brgemm::kBlockN == 0),
              "stfast.gemm.prepare: ", groups, " groups of ", unit, " units in b ", b.sizes());
  Weight w{b, lib, {}, 1, 0};
  if (lib != kBrgemm || b.size(0) == 0 || (b.scalar_type() != at::kFloat && b.size(0) % 2 != 0)) return w;
  if (groups == 1) {
    w.packed = brgemm::PackedB(b);
    return w;
  }
  const int64_t U = b.size(1) / groups;
  std::vector<int64_t> cols;
  cols.reserve(static_cast<size_t>(b.size(1)));
  for (int64_t j0 = 0; j0 < U; j0 += unit) {
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t j = j0; j < std::min(U, j0 + unit); ++j) cols.push_back(g * U + j);
    }
  }
  w.packed = brgemm::PackedB(b.index_select(1, at::tensor(cols, at::TensorOptions().dtype(at::kLong))));
  w.groups = groups;
  w.unit = unit;
  return w;
}

// ATen widens 16-bit operands for a float32 output (run): a prepared weight that ATen runs is widened once here,
// not in every step's product (bfloat16 on the Zen 3 EPYC: W_hh's widening was 3 % of a training step).
Weight widened_once(Weight w, at::ScalarType out) {
  if (w.lib != kOneDnn && !w.packed.defined() && out == at::kFloat && w.b.scalar_type() != at::kFloat) {
    w.b = w.b.to(out);
  }
  return w;
}

}  // namespace

Weight prepare(const at::Tensor& b, at::ScalarType out, int64_t groups, int64_t unit) {
  return widened_once(prepare_with(b, library_for(b.scalar_type(), out, kStep), groups, unit), out);
}

void mm(const at::Tensor& out, const at::Tensor& a, const Weight& w, bool accumulate) {
  TORCH_CHECK(w.groups == 1, "stfast.gemm.mm: a Weight packed with interleaved groups serves only its fused step");
  if (out.numel() == 0) return;
  if (w.packed.defined() && a.scalar_type() == w.packed.dtype()) return brgemm::mm_packed(out, a, w.packed, accumulate);
  if (a.size(1) == 0) {
    if (!accumulate) const_cast<at::Tensor&>(out).zero_();
    return;
  }
  run(w.lib == kBrgemm ? kAten : w.lib, out, a, w.b, accumulate);  // kBrgemm unpacked: a depth it cannot take
}

Library choose(const std::array<double, kNumLibraries>& rates, Use use) {
  const double margin = use == kStep ? kStepMargin : kMargin;
  Library best = kAten;
  for (int l = 1; l < kNumLibraries; ++l) {
    if (rates[l] > margin * rates[best]) best = static_cast<Library>(l);
  }
  return best;
}

namespace {

// The fused LSTM's products at H 128 (csrc/lstm/lstm_driver.h), per use. kBulk: a block of the input projection
// (1,024 rows · W_ihᵀ) and a weight gradient's block (dGᵀ · x over 1,024 rows). kStep: the recurrent products of
// a forward step (h · W_hhᵀ, 128 × 512) and of a backward step (dG · W_hh, 512 × 128) for 16, 32 and 64 alive
// rows (a part of a split time loop holds B / threads of them), the weight prepared once.
const std::vector<Shape>& probe_shapes(Use use) {
  static const std::vector<Shape> bulk{{1024, 128, 512, false}, {512, 1024, 128, true}};
  static const std::vector<Shape> step{{16, 128, 512, false}, {32, 128, 512, false}, {64, 128, 512, false},
                                       {16, 512, 128, false}, {32, 512, 128, false}, {64, 512, 128, false}};
  return use == kStep ? step : bulk;
}

}  // namespace

std::array<double, kNumLibraries> rates_at(at::ScalarType operands, at::ScalarType out, Use use,
                                           const std::vector<Shape>& shapes) {
  // One pass runs every shape once; passes repeat for ≥ 3 ms, and the libraries take turns within each of 7
  // rounds, so that load on a shared machine hits them alike. ATen's rate is its median round; each other
  // library's is ATen's times the median of the per-round ratios (ATen's time / its own): paired, so a busy
  // neighbour that slows a round slows both sides of its ratio (best-of-5 times, kept per library, flipped the
  // bfloat16 step choice in 2 of 5 processes beside one busy thread on a Zen 4 EPYC: issue 60). b is a transposed
  // weight, as W_ihᵀ / W_hhᵀ in the kernels.
  constexpr double kMinSeconds = 0.003;
  constexpr int kRounds = 7;
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, kNumLibraries> runs{};
  for (int l = 0; l < kNumLibraries; ++l) runs[l] = takes(static_cast<Library>(l), operands, out);
  struct Operands {
    at::Tensor a, w, c;
    std::array<Weight, kNumLibraries> wt;
  };
  std::vector<Operands> ops;
  double flops = 0.0;
  for (const auto& s : shapes) {
    TORCH_CHECK_VALUE(s.M >= 0 && s.K >= 0 && s.N >= 0, "stfast.gemm: negative shape ", s.M, "x", s.K, "x", s.N);
    Operands o;
    o.a = s.a_transposed ? probe_operand(s.K, s.M, operands).t() : probe_operand(s.M, s.K, operands);
    o.w = probe_operand(s.N, s.K, operands).t();
    o.c = at::empty({s.M, s.N}, at::TensorOptions().dtype(out));
    // kStep: each library's weight laid out once, outside the timing, as the kernels prepare W_hhᵀ once per layer
    // and call; kBulk: laid out by each product (mm packs b per call for the micro-kernel)
    for (int l = 0; l < kNumLibraries; ++l) {
      if (!runs[l]) continue;
      try {
        o.wt[l] = use == kStep ? widened_once(prepare_with(o.w, static_cast<Library>(l)), out)
                               : Weight{o.w, static_cast<Library>(l), {}, 1, 0};
      } catch (const std::exception&) {  // c10::Error, dnnl::error: the library does not take the pair
        runs[l] = false;
      }
    }
    ops.push_back(std::move(o));
    flops += 2.0 * static_cast<double>(s.M * s.K * s.N);
  }
  // kStep: every intra-op thread runs the pass at once on its own outputs, each product on its own thread, as
  // the fused LSTM's split time loop runs its parts (lstm_driver.h); the slowest thread's pass counts.
  const int64_t tasks = use == kStep ? std::max(1, at::get_num_threads()) : 1;
  std::vector<std::vector<at::Tensor>> outs(static_cast<size_t>(tasks));
  for (auto& per_task : outs) {
    for (const auto& o : ops) per_task.push_back(at::empty_like(o.c));
  }
  std::array<std::vector<double>, kNumLibraries> times;
  for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up (primitive creation, page faults)
    for (int l = 0; l < kNumLibraries; ++l) {
      if (!runs[l]) continue;
      std::vector<double> pass(static_cast<size_t>(tasks), 0.0);
      auto time_passes = [&](int64_t task) {
        int64_t n = 0;
        const auto t0 = std::chrono::steady_clock::now();
        double dt = 0.0;
        do {
          for (size_t i = 0; i < ops.size(); ++i) {
            const auto& o = ops[i];
            if (use == kStep) mm(outs[task][i], o.a, o.wt[l], false);
            else run(static_cast<Library>(l), o.c, o.a, o.w, false);
          }
          ++n;
          dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        } while (round >= 0 && dt < kMinSeconds);
        pass[task] = dt / static_cast<double>(n);
      };
      try {
        if (tasks == 1) {
          time_passes(0);
        } else {
          at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
            for (int64_t task = b; task < e; ++task) time_passes(task);
          });
        }
        if (round >= 0) times[l].push_back(*std::max_element(pass.begin(), pass.end()));
      } catch (const std::exception&) {
        runs[l] = false;  // this torch build's library refuses the pair (c10::Error, dnnl::error): rate 0
      }
    }
  }
  flops *= static_cast<double>(tasks);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::array<double, kNumLibraries> rates{};
  const bool aten_ran = runs[kAten] && static_cast<int>(times[kAten].size()) == kRounds;
  if (flops <= 0 || !aten_ran) return rates;
  rates[kAten] = flops / median(times[kAten]) * 1e-9;
  for (int l = 1; l < kNumLibraries; ++l) {
    if (!runs[l] || static_cast<int>(times[l].size()) != kRounds) continue;
    std::vector<double> ratio(kRounds);
    for (int r = 0; r < kRounds; ++r) ratio[r] = times[kAten][r] / times[l][r];
    rates[l] = rates[kAten] * median(ratio);
  }
  return rates;
}

std::array<double, kNumLibraries> probe_rates(at::ScalarType operands, at::ScalarType out, Use use) {
  return rates_at(operands, out, use, probe_shapes(use));
}

Library select(at::ScalarType operands, at::ScalarType out, const std::array<double, kNumLibraries>& rates, Use use) {
  std::array<double, kNumLibraries> usable = rates;  // a library that does not take the pair is never chosen
  for (int l = 1; l < kNumLibraries; ++l) {
    if (!takes(static_cast<Library>(l), operands, out)) usable[l] = 0.0;
  }
  const Library lib = choose(usable, use);
  const std::lock_guard<std::mutex> lock(choices_mutex());
  choices()[key(operands, out, use)] = Choice{lib, at::get_num_threads(), mkldnn_enabled(), ukernel::impl()};
  return lib;
}

Library library_for(at::ScalarType operands, at::ScalarType out, Use use) {
  if (const auto f = forced(); f.has_value()) return takes(*f, operands, out) ? *f : kAten;
  if (!takes(kOneDnn, operands, out) && !takes(kBrgemm, operands, out)) return kAten;
  const int threads = at::get_num_threads();
  const bool nested = at::in_parallel_region();
  {
    const std::lock_guard<std::mutex> lock(choices_mutex());
    const auto it = choices().find(key(operands, out, use));
    // Inside a parallel region (the fused LSTM's split time loop) the caller's choice holds, whatever thread
    // count the region reports: a probe there would time one thread's share and race its siblings.
    if (it != choices().end() && (nested || (it->second.threads == threads && it->second.mkldnn == mkldnn_enabled() &&
                                             it->second.kernel == ukernel::impl()))) {
      return it->second.lib;
    }
  }
  if (nested) return kAten;  // never probed outside: no timing from inside a region
  // outside the lock: the probe runs GEMMs. Hysteresis: a measurement within 8 % of the margin is repeated (twice
  // at most) and the rates averaged; then a library must beat ATen by the margin and 8 % more, so that a ratio near
  // the margin does not flip the choice, and with it float32 bits, on noise.
  std::array<double, kNumLibraries> rates = probe_rates(operands, out, use);
  const double margin = use == kStep ? kStepMargin : kMargin;
  auto near_margin = [&] {
    for (int l = 0; l < kNumLibraries; ++l) {
      for (int m = l + 1; m < kNumLibraries; ++m) {
        if (rates[l] <= 0 || rates[m] <= 0) continue;
        const double r = std::max(rates[l], rates[m]) / std::min(rates[l], rates[m]) / margin;
        if (r > 1.0 / 1.08 && r < 1.08) return true;
      }
    }
    return false;
  };
  for (int extra = 1; extra <= 2 && near_margin(); ++extra) {
    const auto again = probe_rates(operands, out, use);
    for (int l = 0; l < kNumLibraries; ++l) rates[l] = (rates[l] * extra + again[l]) / (extra + 1);
  }
  // Still within 8 % of the margin after three measurements: a library that is not clearly faster than ATen is
  // not taken (a true ratio near the margin would otherwise flip the choice, and float32 bits, from process to
  // process; on the Zen 3 EPYC the float32 step sits at 1.1-1.25x with the LSTM itself a tie either way).
  for (int l = 1; l < kNumLibraries; ++l) {
    if (rates[l] > 0 && rates[kAten] > 0 && rates[l] < margin * 1.08 * rates[kAten]) rates[l] = 0.0;
  }
  return select(operands, out, rates, use);
}

void reset() {
  const std::lock_guard<std::mutex> lock(choices_mutex());
  choices().clear();
}

void mm(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (out.numel() == 0) return;
  if (a.size(1) == 0) {  // empty sum; oneDNN refuses zero-sized dims
    if (!accumulate) const_cast<at::Tensor&>(out).zero_();
    return;
  }
  run(library_for(a.scalar_type(), out.scalar_type()), out, a, b, accumulate);
}

namespace {

std::array<double, kNumLibraries> to_rates(at::ArrayRef<double> r) {
  TORCH_CHECK_VALUE(r.size() == kNumLibraries, "stfast.gemm_select: rates must hold ", int(kNumLibraries),
                    " values (aten, onednn, brgemm), got ", r.size());
  std::array<double, kNumLibraries> rates{};
  for (int l = 0; l < kNumLibraries; ++l) {
    TORCH_CHECK_VALUE(r[l] >= 0.0, "stfast.gemm_select: rates must be >= 0 GFLOP/s, got ", r[l]);
    rates[l] = r[l];
  }
  return rates;
}

Use to_use(int64_t use) {
  TORCH_CHECK_VALUE(use == kBulk || use == kStep, "stfast.gemm: use must be 0 (bulk) or 1 (step), got ", use);
  return static_cast<Use>(use);
}

// a (R, K) · b (K, C) -> (R, C) in out_dtype (default: a's dtype), through gemm::mm (CPU).
at::Tensor gemm_mm_cpu(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "stfast.gemm_mm: a (R, K) and b (K, C) "
                    "needed, got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "stfast.gemm_mm: a is ", a.scalar_type(), " but b ", b.scalar_type());
  const auto out_st = out_dtype.value_or(a.scalar_type());
  TORCH_CHECK(out_st == a.scalar_type() || out_st == at::kFloat, "stfast.gemm_mm: out_dtype must be the operands' "
              "dtype or float32, got ", out_st);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options().dtype(out_st));
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  mm(out, a, b, false);
  return out;
}

// CUDA: cuBLAS through ATen (float32 compute for float16 / bfloat16 operands, also with a float32 output).
at::Tensor gemm_mm_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto out_st = out_dtype.value_or(a.scalar_type());
  return out_st == a.scalar_type() ? at::mm(a, b) : at::mm(a, b, out_st);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(stfast, m) {
  // The decision, for Python (stfast/ops/gemm.py): library name per (operand dtype, output dtype, use).
  m.def("gemm_library(ScalarType operands, ScalarType out, int use=0) -> str",
        [](at::ScalarType a, at::ScalarType o, int64_t use) {
          return std::string(library_name(library_for(a, o, to_use(use))));
        });
  m.def("gemm_rates(ScalarType operands, ScalarType out, int use=0) -> float[]",
        [](at::ScalarType a, at::ScalarType o, int64_t use) {
          const auto r = probe_rates(a, o, to_use(use));
          return std::vector<double>(r.begin(), r.end());
        });
  // GFLOP/s of each library over given shapes (flattened (M, K, N, a_transposed) quadruples): the benchmarks'
  // rates on exactly the fused LSTM's products, prepared weights for use 1 (step) as the kernels run them.
  m.def("gemm_rates_at(ScalarType operands, ScalarType out, int use, int[] shapes) -> float[]",
        [](at::ScalarType a, at::ScalarType o, int64_t use, std::vector<int64_t> q) {
          TORCH_CHECK_VALUE(q.size() % 4 == 0, "stfast.gemm_rates_at: shapes must be (M, K, N, a_transposed) "
                            "quadruples, got ", q.size(), " values");
          std::vector<Shape> shapes;
          for (size_t i = 0; i < q.size(); i += 4) shapes.push_back({q[i], q[i + 1], q[i + 2], q[i + 3] != 0});
          const auto r = rates_at(a, o, to_use(use), shapes);
          return std::vector<double>(r.begin(), r.end());
        });
  m.def("gemm_select(ScalarType operands, ScalarType out, float[] rates, int use=0) -> str",
        [](at::ScalarType a, at::ScalarType o, std::vector<double> r, int64_t use) {
          return std::string(library_name(select(a, o, to_rates(r), to_use(use))));
        });
  m.def("gemm_takes(ScalarType operands, ScalarType out) -> str[]", [](at::ScalarType a, at::ScalarType o) {
    std::vector<std::string> names;
    for (int l = 0; l < kNumLibraries; ++l) {
      if (takes(static_cast<Library>(l), a, o)) names.emplace_back(library_name(static_cast<Library>(l)));
    }
    return names;
  });
  m.def("gemm_reset() -> ()", [] { reset(); });
  // The micro-kernel seam (ukernel.h): "torch" or "reference"; with an argument, switches it (between products)
  // and forgets every choice. Returns the implementation in effect before the call.
  m.def("gemm_micro_kernel(str? impl=None) -> str", [](std::optional<std::string> name) {
    const std::string before = ukernel::impl_name(ukernel::impl());
    if (name.has_value()) {
      ukernel::set_impl(ukernel::parse_impl(name->c_str()));
      reset();
    }
    return before;
  });
  m.def("gemm_tiles_configured() -> int", [] { return ukernel::configured_threads(); });
  m.def("gemm_mm(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(stfast, CPU, m) { m.impl("gemm_mm", &gemm_mm_cpu); }
TORCH_LIBRARY_IMPL(stfast, CUDA, m) { m.impl("gemm_mm", &gemm_mm_cuda); }

}  // namespace gemm
}  // namespace stfast
