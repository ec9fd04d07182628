// stfast._prep: Python bindings of the preprocessing scans (pybind11; no torch, no GIL held while scanning).
// Bad arguments raise ValueError (std::invalid_argument) before any buffer is touched.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "prep/resample.h"

namespace py = pybind11;

namespace {

using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

void check_1d(const py::array& a, const char* name) {
  if (a.ndim() != 1) throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
}

py::array_t<bool> resample_keep(const F64& lng, const F64& lat, const I64& starts, const I64& ends, double s_km) {
  check_1d(lng, "lng");
  check_1d(lat, "lat");
  check_1d(starts, "starts");
  check_1d(ends, "ends");
  const int64_t n = lng.shape(0), n_trips = starts.shape(0);
  if (lat.shape(0) != n) {
    throw std::invalid_argument("lat has " + std::to_string(lat.shape(0)) + " points but lng has " + std::to_string(n));
  }
  if (ends.shape(0) != n_trips) {
    throw std::invalid_argument("ends has " + std::to_string(ends.shape(0)) + " trips but starts has " +
                                std::to_string(n_trips));
  }
  if (!(s_km > 0.0) || !std::isfinite(s_km)) {
    throw std::invalid_argument("s_km must be a finite distance > 0 km, got " + std::to_string(s_km));
  }
  const int64_t* s = starts.data();
  const int64_t* e = ends.data();
  for (int64_t t = 0; t < n_trips; ++t) {
    if (s[t] < 0 || s[t] > e[t] || e[t] > n) {
      throw std::invalid_argument("trip " + std::to_string(t) + " spans [" + std::to_string(s[t]) + ", " +
                                  std::to_string(e[t]) + "), not within [0, " + std::to_string(n) + ")");
    }
  }
  py::array_t<bool> keep{py::ssize_t(n)};
  auto* k = reinterpret_cast<uint8_t*>(keep.mutable_data());
  {
    py::gil_scoped_release nogil;
    std::fill(k, k + n, uint8_t(0));
    stfast::prep::resample_keep(lng.data(), lat.data(), n, s, e, n_trips, s_km, k);
  }
  return keep;
}

}  // namespace

PYBIND11_MODULE(_prep, mod) {
  mod.doc() = "stfast's preprocessing scans (csrc/prep/): resample_keep";
  mod.def("resample_keep", &resample_keep, py::arg("lng"), py::arg("lat"), py::arg("starts"), py::arg("ends"),
          py::arg("s_km"),
          "[n] bool keep mask of minimum-spacing resampling: per trip [starts[t], ends[t]) of the [n] float64 "
          "degree arrays, its first and last point and each first point >= s_km (haversine) from the last kept "
          "(csrc/prep/resample.h). Raises ValueError on arrays that are not 1-D, of unequal lengths, trips "
          "outside [0, n), or s_km not finite > 0.");
}
