// stfast._slicer: Python bindings of the slicer's partitioners (pybind11; no torch, no GIL held while
// partitioning). Lengths come in as float64 arrays [B]; assignments go out as int32 arrays [B] of
// shard ids. Bad arguments raise ValueError (std::invalid_argument).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <limits>
#include <stdexcept>
#include <string>

#include "slicer/partition.h"

namespace py = pybind11;
using stfast::slicer::Assignment;
using stfast::slicer::CostModel;

namespace {

using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

std::vector<double> vec(const F64& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  return std::vector<double>(a.data(), a.data() + a.shape(0));
}

CostModel model_of(const py::tuple& coef) {
  if (coef.size() != 5) throw std::invalid_argument("model must be 5 coefficients (a, b, c, d, e), got " +
                                                    std::to_string(coef.size()));
  return CostModel{coef[0].cast<double>(), coef[1].cast<double>(), coef[2].cast<double>(), coef[3].cast<double>(),
                   coef[4].cast<double>()};
}

py::array_t<int32_t> out(const Assignment& a) {
  py::array_t<int32_t> r(py::ssize_t(a.size()));
  std::copy(a.begin(), a.end(), r.mutable_data());
  return r;
}

// Validates, releases the GIL, runs fn(lengths, W, model).
template <class Fn>
py::array_t<int32_t> run(const F64& lengths, int64_t world_size, const py::tuple& model, Fn fn) {
  std::vector<double> l = vec(lengths, "lengths");
  const CostModel m = model_of(model);
  stfast::slicer::check_inputs(l, world_size, m);
  Assignment a;
  {
    py::gil_scoped_release nogil;
    a = fn(l, world_size, m);
  }
  return out(a);
}

// Shard ids arrive as any integer array and are range-checked before narrowing to int32: a float id (1.9) or
// one past int32 (2^32 + 1) must be refused, not truncated or wrapped into a valid shard.
Assignment assignment_of(const py::array& raw, size_t n) {
  const char kind = raw.dtype().kind();
  if (kind != 'i' && kind != 'u') {
    throw std::invalid_argument(std::string("assignment must hold integer shard ids, got dtype kind '") + kind + "'");
  }
  const I64 a = I64::ensure(raw);
  if (!a || a.ndim() != 1 || size_t(a.shape(0)) != n) {
    throw std::invalid_argument("assignment must be 1-D with one shard id per trip (" + std::to_string(n) + ")");
  }
  Assignment r(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = a.data()[i];
    // uint64 ids past int64 come through as negative values: refused here too
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("assignment[" + std::to_string(i) + "] = " + std::to_string(v) +
                                  " is not a shard id");
    }
    r[i] = int32_t(v);
  }
  return r;
}

}  // namespace

PYBIND11_MODULE(_slicer, mod) {
  mod.doc() = "stfast slicer partitioners (see csrc/slicer/partition.h)";
  mod.attr("MAX_WORLD_SIZE") = stfast::slicer::kMaxWorldSize;
  mod.attr("MAX_KARMARKAR_KARP_CELLS") = stfast::slicer::kMaxKarmarkarKarpCells;
  mod.def("lpt", [](const F64& l, int64_t w, const py::tuple& m) {
    return run(l, w, m, [](auto& l, int64_t w, auto& m) { return stfast::slicer::lpt(l, w, m); });
  }, py::arg("lengths"), py::arg("world_size"), py::arg("model"));
  mod.def("karmarkar_karp", [](const F64& weights, int64_t w) {
    return run(weights, w, py::make_tuple(0.0, 0.0, 1.0, 0.0, 0.0),
               [](auto& l, int64_t w, auto&) { return stfast::slicer::karmarkar_karp(l, w); });
  }, py::arg("weights"), py::arg("world_size"));
  mod.def("sorted_strided", [](const F64& l, int64_t w) {
    return run(l, w, py::make_tuple(0.0, 0.0, 1.0, 0.0, 0.0),
               [](auto& l, int64_t w, auto&) { return stfast::slicer::sorted_strided(l, w); });
  }, py::arg("lengths"), py::arg("world_size"));
  mod.def("contiguous", [](const F64& l, int64_t w, const py::tuple& m) {
    return run(l, w, m, [](auto& l, int64_t w, auto& m) { return stfast::slicer::contiguous(l, w, m); });
  }, py::arg("lengths"), py::arg("world_size"), py::arg("model"));
  mod.def("balanced", [](const F64& l, int64_t w, const py::tuple& m, int64_t max_iters) {
    return run(l, w, m, [max_iters](auto& l, int64_t w, auto& m) { return stfast::slicer::balanced(l, w, m, max_iters); });
  }, py::arg("lengths"), py::arg("world_size"), py::arg("model"), py::arg("max_iters"));
  mod.def("refine", [](const F64& l, const py::array& asg, int64_t w, const py::tuple& m, int64_t max_iters) {
    std::vector<double> lv = vec(l, "lengths");
    Assignment a = assignment_of(asg, lv.size());
    const CostModel cm = model_of(m);
    stfast::slicer::check_inputs(lv, w, cm);
    stfast::slicer::shard_costs(lv, a, w, cm);  // validates the shard ids
    {
      py::gil_scoped_release nogil;
      a = stfast::slicer::refine(lv, std::move(a), w, cm, max_iters);
    }
    return out(a);
  }, py::arg("lengths"), py::arg("assignment"), py::arg("world_size"), py::arg("model"), py::arg("max_iters"));
  mod.def("shard_costs", [](const F64& l, const py::array& asg, int64_t w, const py::tuple& m) {
    std::vector<double> lv = vec(l, "lengths");
    const CostModel cm = model_of(m);
    stfast::slicer::check_inputs(lv, w, cm);
    const std::vector<double> t = stfast::slicer::shard_costs(lv, assignment_of(asg, lv.size()), w, cm);
    py::array_t<double> r(py::ssize_t(t.size()));
    std::copy(t.begin(), t.end(), r.mutable_data());
    return r;
  }, py::arg("lengths"), py::arg("assignment"), py::arg("world_size"), py::arg("model"));
}
