// Minimum-spacing resampling of GPS trajectories (pure C++; no torch): the sequential scan of
// stfast.data.preprocess step 5, one pass per trip instead of numpy rounds over all trips.
//
// Rule (per trip, points [start, end)): the first and the last point are kept; after a kept point k,
// the next kept point is the first i > k whose great-circle distance from k is >= s_km; the scan stops
// once a kept point is one of the last two (the last point is kept anyway). Distance: haversine,
//     d = 2 R asin(sqrt(sin²(Δφ/2) + cos φk cos φi sin²(Δλ/2))),  R = 6371 km,
// the formula of stfast.data.geo.haversine_km.
#pragma once

#include <cstdint>

namespace stfast {
namespace prep {

constexpr double kEarthRadiusKm = 6371.0;

// Sets keep[i] = 1 for every kept point of the trips [starts[t], ends[t]); keep[0, n) must come zeroed (the
// bindings do it). Requires 0 <= starts[t] <= ends[t] <= n (checked by the bindings) and s_km > 0.
void resample_keep(const double* lng_deg, const double* lat_deg, int64_t n, const int64_t* starts,
                   const int64_t* ends, int64_t n_trips, double s_km, uint8_t* keep);

}  // namespace prep
}  // namespace stfast
