// CPU GEMM routing (see gemm.h): the libraries, the run-time probe, and the ops that expose the decision
// (torch.ops.stfast.gemm_library / gemm_rates / gemm_select / gemm_reset) and a routed product
// (torch.ops.stfast.gemm_mm) to Python.
#include "gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

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
  } catch (const c10::Error&) {
    ok = false;
  }
  known[static_cast<int>(operands)] = ok;
  return ok;
}

bool onednn_takes(at::ScalarType operands, at::ScalarType out) {
  const bool pair = operands == at::kFloat ? out == at::kFloat
                    : operands == at::kBFloat16 || operands == at::kHalf ? out == operands || out == at::kFloat
                                                                        : false;
  return pair && onednn_runs(operands);
}

void run(Library lib, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, bool accumulate) {
  if (lib == kOneDnn) {
    // not an ATen call: named for the profiler, so a profile counts these products as GEMMs
    RECORD_FUNCTION("stfast::onednn_matmul", std::vector<c10::IValue>());
    if (out.scalar_type() == a.scalar_type()) {
      at::native::mkldnn_matmul(a, b, out, accumulate ? 1.0f : 0.0f, 1.0f);
    } else {
      // torch's oneDNN matmul takes no float32 output for 16-bit operands: accumulated in float32 inside
      // oneDNN, rounded once to the operands' dtype, then widened (callers that can keep the result in 16
      // bits skip this pass: lstm_driver.h's mixed_gemm_in_storage).
      at::Tensor tmp = at::empty(out.sizes(), out.options().dtype(a.scalar_type()));
      at::native::mkldnn_matmul(a, b, tmp, 0.0f, 1.0f);
      if (accumulate) const_cast<at::Tensor&>(out).add_(tmp);
      else const_cast<at::Tensor&>(out).copy_(tmp);
    }
    return;
  }
  const auto st = out.scalar_type();
  const at::Tensor a2 = a.scalar_type() == st ? a : a.to(st), b2 = b.scalar_type() == st ? b : b.to(st);
  if (accumulate) out.addmm_(a2, b2);
  else at::mm_out(const_cast<at::Tensor&>(out), a2, b2);
}

struct Choice {
  Library lib;
  int threads;  // at::get_num_threads() when chosen: another count re-probes
};

std::mutex& choices_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::pair<int, int>, Choice>& choices() {
  static std::map<std::pair<int, int>, Choice> c;
  return c;
}

std::optional<Library> read_forced() {
  const char* env = std::getenv("STFAST_GEMM");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string s(env);
  if (s == "aten") return kAten;
  if (s == "onednn") return kOneDnn;
  TORCH_CHECK_VALUE(false, "STFAST_GEMM must be 'aten' or 'onednn', got '", s, "'");
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

const char* library_name(Library lib) { return lib == kOneDnn ? "onednn" : "aten"; }

Library choose(const std::array<double, kNumLibraries>& rates) {
  Library best = kAten;
  for (int l = 1; l < kNumLibraries; ++l) {
    if (rates[l] > kMargin * rates[best]) best = static_cast<Library>(l);
  }
  return best;
}

std::array<double, kNumLibraries> probe_rates(at::ScalarType operands, at::ScalarType out) {
  // The fused LSTM's shapes at H 128: a recurrent step (alive batch × H × 4H) and a block of the input
  // projection / backward (1,024 rows); b is a transposed weight, as W_hhᵀ there. The libraries take turns
  // (5 rounds, the best of each kept) so that a burst of load on a shared machine hits them alike.
  static constexpr std::array<std::array<int64_t, 3>, 2> kShapes{{{64, 128, 512}, {1024, 128, 512}}};
  constexpr double kMinSeconds = 0.003;
  constexpr int kRounds = 5;
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  std::array<bool, kNumLibraries> runs{};
  for (int l = 0; l < kNumLibraries; ++l) runs[l] = l == kAten || onednn_takes(operands, out);
  std::array<double, kNumLibraries> seconds{};
  double flops = 0.0;
  for (const auto& s : kShapes) {
    const at::Tensor a = probe_operand(s[0], s[1], operands), w = probe_operand(s[2], s[1], operands);
    const at::Tensor c = at::empty({s[0], s[2]}, at::TensorOptions().dtype(out));
    std::array<double, kNumLibraries> best;
    best.fill(1e30);
    for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up (primitive creation, page faults)
      for (int l = 0; l < kNumLibraries; ++l) {
        if (!runs[l]) continue;
        try {
          int64_t n = 0;
          const auto t0 = std::chrono::steady_clock::now();
          double dt = 0.0;
          do {
            run(static_cast<Library>(l), c, a, w.t(), false);
            ++n;
            dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          } while (round >= 0 && dt < kMinSeconds);
          if (round >= 0) best[l] = std::min(best[l], dt / static_cast<double>(n));
        } catch (const c10::Error&) {
          runs[l] = false;  // this torch build's library refuses the pair: rate 0, never chosen
        }
      }
    }
    flops += 2.0 * static_cast<double>(s[0] * s[1] * s[2]);
    for (int l = 0; l < kNumLibraries; ++l) seconds[l] += best[l];
  }
  std::array<double, kNumLibraries> rates{};
  for (int l = 0; l < kNumLibraries; ++l) rates[l] = runs[l] ? flops / seconds[l] * 1e-9 : 0.0;
  return rates;
}

Library select(at::ScalarType operands, at::ScalarType out, const std::array<double, kNumLibraries>& rates) {
  const Library lib = onednn_takes(operands, out) ? choose(rates) : kAten;
  const std::lock_guard<std::mutex> lock(choices_mutex());
  choices()[{static_cast<int>(operands), static_cast<int>(out)}] = Choice{lib, at::get_num_threads()};
  return lib;
}

Library library_for(at::ScalarType operands, at::ScalarType out) {
  if (const auto f = forced(); f.has_value()) return *f == kOneDnn && !onednn_takes(operands, out) ? kAten : *f;
  if (!onednn_takes(operands, out)) return kAten;
  const int threads = at::get_num_threads();
  const bool nested = at::in_parallel_region();
  {
    const std::lock_guard<std::mutex> lock(choices_mutex());
    const auto it = choices().find({static_cast<int>(operands), static_cast<int>(out)});
    // Inside a parallel region (the fused LSTM's split time loop) the caller's choice holds, whatever thread
    // count the region reports: a probe there would time one thread's share and race its siblings.
    if (it != choices().end() && (it->second.threads == threads || nested)) return it->second.lib;
  }
  if (nested) return kAten;  // never probed outside: no timing from inside a region
  return select(operands, out, probe_rates(operands, out));  // outside the lock: the probe runs GEMMs
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
                    " values (aten, onednn), got ", r.size());
  std::array<double, kNumLibraries> rates{};
  for (int l = 0; l < kNumLibraries; ++l) {
    TORCH_CHECK_VALUE(r[l] >= 0.0, "stfast.gemm_select: rates must be >= 0 GFLOP/s, got ", r[l]);
    rates[l] = r[l];
  }
  return rates;
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
  // The decision, for Python (stfast/ops/gemm.py): library name per (operand dtype, output dtype).
  m.def("gemm_library(ScalarType operands, ScalarType out) -> str", [](at::ScalarType a, at::ScalarType o) {
    return std::string(library_name(library_for(a, o)));
  });
  m.def("gemm_rates(ScalarType operands, ScalarType out) -> float[]", [](at::ScalarType a, at::ScalarType o) {
    const auto r = probe_rates(a, o);
    return std::vector<double>(r.begin(), r.end());
  });
  m.def("gemm_select(ScalarType operands, ScalarType out, float[] rates) -> str",
        [](at::ScalarType a, at::ScalarType o, std::vector<double> r) {
          return std::string(library_name(select(a, o, to_rates(r))));
        });
  m.def("gemm_reset() -> ()", [] { reset(); });
  m.def("gemm_mm(Tensor a, Tensor b, ScalarType? out_dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(stfast, CPU, m) { m.impl("gemm_mm", &gemm_mm_cpu); }
TORCH_LIBRARY_IMPL(stfast, CUDA, m) { m.impl("gemm_mm", &gemm_mm_cuda); }

}  // namespace gemm
}  // namespace stfast
