// Partitioners of the load-balancing data-parallel slicer (pure C++; no torch).
//
// A global batch of B trips (lengths l_i >= 0, in points) is split into W shards, one per rank. A
// shard S is predicted to take
//     t(S) = a + b·n + c·Σ_{i∈S} l_i + d·n·L_max + e·L_max      (n = |S|, L_max = max_{i∈S} l_i)
// seconds of forward + backward (t(∅) = 0). Σlen pays for the geo-conv and projections, n·L_max for
// work on the padded [n, L_max] batch (attention pooling, local estimator), L_max for the packed
// LSTM's sequential steps (a fixed cost per step). All coefficients are >= 0, so adding a trip never
// makes a shard cheaper. The partitioners minimise the maximum shard time (the step time).
//
// Every function is deterministic (ties are broken by trip index, then shard index) and uses no
// randomness, so every rank computes the identical partition without communication. When B >= W
// every shard receives at least one trip. An assignment is a vector of B shard ids in [0, W).
#pragma once

#include <cstdint>
#include <vector>

namespace stfast {
namespace slicer {

struct CostModel {
  double a = 0.0, b = 0.0, c = 1.0, d = 0.0, e = 0.0;

  // Predicted seconds of a shard with n trips, Σlen = sum, max length lmax.
  double operator()(int64_t n, double sum, double lmax) const {
    return n == 0 ? 0.0 : a + b * double(n) + c * sum + d * double(n) * lmax + e * lmax;
  }
};

using Assignment = std::vector<int32_t>;

// Largest world size: shard ids are int32 and every partitioner keeps O(W) state per call, so a W
// beyond any cluster (2^20 ranks) is an error rather than gigabytes of allocation.
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
// Largest predicted time of a shard: with every shard's time <= this (all of it finite, far from
// overflow), sums and differences of times never become inf or NaN inside the partitioners.
constexpr double kMaxShardCost = 1e300;
// Karmarkar–Karp keeps up to B/2 tuples of W subset sums (24·W bytes each): B·W is capped at 2^24
// (<= 200 MB); balanced() skips it above the cap.
constexpr int64_t kMaxKarmarkarKarpCells = int64_t{1} << 24;

// Throws std::invalid_argument unless 1 <= W <= kMaxWorldSize, every length is finite and >= 0, every
// coefficient is finite and >= 0, and all trips in one shard would be predicted to take at most
// kMaxShardCost (so every shard's time is finite).
void check_inputs(const std::vector<double>& lengths, int64_t world_size, const CostModel& model);

// Predicted time of each of the W shards of `assignment` under `model`.
std::vector<double> shard_costs(const std::vector<double>& lengths, const Assignment& assignment,
                                int64_t world_size, const CostModel& model);

// LPT greedy (Graham 1969): trips longest first, each to the shard whose predicted time after
// adding it is smallest under the full model (an empty shard first on ties). With model
// (0, 0, 1, 0, 0) this is the classic LPT on Σlen. O(B log B + B log W).
Assignment lpt(const std::vector<double>& lengths, int64_t world_size, const CostModel& model);

// Karmarkar–Karp largest differencing, multiway (Karmarkar & Karp 1982; Korf 2009 "multi-way number
// partitioning"): every trip starts as a W-tuple of subset sums; the two tuples with the largest
// spread (max − min) are merged, largest subset of one with smallest of the other, until one tuple
// remains. Additive: `weights` are per-trip costs. O(B·W) for merges with a single trip (the trip
// joins the smallest subset), O(W log W) for the others. Throws std::invalid_argument when
// B·W > kMaxKarmarkarKarpCells (its memory is O(B·W)).
Assignment karmarkar_karp(const std::vector<double>& weights, int64_t world_size);

// Sorted-strided: trips sorted by length (ties: index) and dealt round-robin, trip k to shard k mod W.
// Equal counts, similar length mixes; the length-aware baseline.
Assignment sorted_strided(const std::vector<double>& lengths, int64_t world_size);

// Sorted contiguous split: trips sorted by length, cut into W contiguous runs minimising the maximum
// predicted time under the full model (exact up to a relative 1e-12 by bisection on the bottleneck
// with a greedy feasibility test; a run's time grows with its end). Runs of similar lengths keep
// n·L_max close to Σlen, so this is the partition for models dominated by the padded term.
Assignment contiguous(const std::vector<double>& lengths, int64_t world_size, const CostModel& model);

// Local search under the full, non-additive model: repeatedly take the slowest shard and apply a
// single move (one of its trips to a faster shard) or swap (one of its trips for a shorter trip of a
// faster shard) that lowers the larger of the two shards' times below the slowest time (by at least
// 10 ppm): the best such change over the target shards scanned fastest first, up to 8 shards past
// the first one that admits a change (all of them when none does). Stop when no shard admits a
// change or after max_iters accepted changes. Never empties a shard. Returns the refined assignment.
Assignment refine(const std::vector<double>& lengths, Assignment assignment, int64_t world_size,
                  const CostModel& model, int64_t max_iters);

// The balanced slicer: LPT under the full model, Karmarkar–Karp on the per-trip weights
// b + c·l + d·l (when B <= 8·W and B·W <= kMaxKarmarkarKarpCells), the contiguous split and sorted-strided; each whose predicted maximum is within 5 % of the best of
// them is refined by local search, and the refined one with the smallest maximum wins (ties: that
// order).
Assignment balanced(const std::vector<double>& lengths, int64_t world_size, const CostModel& model,
                    int64_t max_iters);

}  // namespace slicer
}  // namespace stfast
