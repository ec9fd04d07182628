#include "prep/resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace stfast {
namespace prep {

namespace {
constexpr double kRad = 3.141592653589793 / 180.0;  // numpy's deg2rad factor (NPY_PI / 180)
}

void resample_keep(const double* lng_deg, const double* lat_deg, int64_t n, const int64_t* starts,
                   const int64_t* ends, int64_t n_trips, double s_km, uint8_t* keep) {
  // d >= s_km  <=>  a >= sin²(s_km / 2R) (asin and sqrt are increasing on [0, 1]). The cheap test on a decides
  // all but the points within rounding of the threshold, where d itself is computed as the formula writes it.
  const double h = std::sin(std::min(s_km / (2.0 * kEarthRadiusKm), 1.5707963267948966));
  const double a_lo = h * h * (1.0 - 1e-9), a_hi = h * h * (1.0 + 1e-9);
  std::vector<double> lam, phi, cphi;
  for (int64_t t = 0; t < n_trips; ++t) {
    const int64_t s = starts[t], e = ends[t];
    if (e <= s) continue;
    const int64_t len = e - s;
    keep[s] = keep[e - 1] = 1;
    if (len <= 2) continue;
    lam.resize(size_t(len));
    phi.resize(size_t(len));
    cphi.resize(size_t(len));
    for (int64_t i = 0; i < len; ++i) {
      lam[size_t(i)] = lng_deg[s + i] * kRad;
      phi[size_t(i)] = lat_deg[s + i] * kRad;
      cphi[size_t(i)] = std::cos(phi[size_t(i)]);
    }
    int64_t k = 0;  // the last kept point, relative to s
    while (true) {
      int64_t hit = -1;
      for (int64_t i = k + 1; i < len; ++i) {
        const double sp = std::sin((phi[size_t(i)] - phi[size_t(k)]) / 2.0);
        const double sl = std::sin((lam[size_t(i)] - lam[size_t(k)]) / 2.0);
        const double a = sp * sp + cphi[size_t(k)] * cphi[size_t(i)] * sl * sl;
        if (a < a_lo) continue;
        if (a <= a_hi && 2.0 * kEarthRadiusKm * std::asin(std::sqrt(std::clamp(a, 0.0, 1.0))) < s_km) continue;
        hit = i;
        break;
      }
      if (hit < 0) break;
      keep[s + hit] = 1;
      if (hit >= len - 2) break;
      k = hit;
    }
  }
}

}  // namespace prep
}  // namespace stfast
