// Batch-aware refinement of a sample/row placement (HET-GMP's published algorithm, reimplemented)
// plus the greedy completion of a partial placement (used after a METIS start on a sampled graph).
//
// Determinism: items are visited in fixed-size blocks. Inside a block the gain of every move is
// computed in parallel against the state at the block's start (each item's gain is a serial sum
// over its own edges), then the moves are applied one after another in index order, with the
// balance terms re-evaluated on the current counts. The result therefore depends on the seed and
// the input only -- not on the thread count or the scheduling.
#include <algorithm>
#include <numeric>

#include "native.h"
#include "partition_common.h"

namespace hetgmp {
namespace {

// Items per block: small enough that few moves see stale counts (small graphs get at least
// ~256 blocks per pass), large enough to amortise a parallel region. A function of the item
// count only, never of the thread count.
// Blocks below this size run on one thread: a parallel region costs more than it saves there.
constexpr int64_t kParallelMin = 1024;
constexpr int64_t kPrefetch = 4;           // samples ahead whose count rows we prefetch
constexpr int32_t kUnplaced = -2;          // marks a newly placed sample in apply_moves

inline int64_t block_size(int64_t items) {
  return std::max<int64_t>(16, std::min<int64_t>(4096, items / 256));
}
using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

class Refiner {
 public:
  Refiner(const py::array& sparse, const I32& data_partition, const I32& embed_partition,
          int nparts, int64_t num_rows, int64_t batch, const F64& topo, double theta,
          double balance, int threads, const py::object& offsets)
      : ids_(id_matrix(sparse, offsets)), p_(nparts), r_(num_rows), batch_(batch), theta_(theta),
        threads_(resolve_threads(threads)) {
    if (p_ < 1) throw py::value_error("nparts must be >= 1");
    if (ids_.n < p_) throw py::value_error("fewer samples than parts");
    if (topo.ndim() != 2 || topo.shape(0) != p_ || topo.shape(1) != p_)
      throw py::value_error("topology matrix must be [nparts, nparts]");
    check_ids(ids_, r_, threads_);
    topo_.assign(topo.data(), topo.data() + p_ * p_);
    data_ = py::array_t<int32_t>(ids_.n);
    embed_ = py::array_t<int32_t>(r_);
    std::copy_n(checked_vec(data_partition, ids_.n, "data_partition"), ids_.n,
                data_.mutable_data());
    std::copy_n(checked_vec(embed_partition, r_, "embed_partition"), r_, embed_.mutable_data());
    for (int64_t s = 0; s < ids_.n; ++s)
      if (data_.data()[s] < -1 || data_.data()[s] >= p_)
        throw py::value_error("data_partition holds an invalid worker");
    for (int64_t r = 0; r < r_; ++r)
      if (embed_.data()[r] < -1 || embed_.data()[r] >= p_)
        throw py::value_error("embed_partition holds an invalid worker");
    m_ = std::max<int64_t>(1, ids_.n / p_);
    // HET-GMP's units: expected batches per epoch that touch a row, (m/b) * P(touch per step).
    soft_ = soft_table(m_, batch_, static_cast<double>(m_) / static_cast<double>(batch_));
    counts_ = py::array_t<int32_t>({r_, static_cast<int64_t>(p_)});
    int32_t* c = counts_.mutable_data();
    std::fill(c, c + r_ * p_, 0);
    deg_.assign(r_, 0);
    cnt_data_.assign(p_, 0);
    cnt_embed_.assign(p_, 0);
    const int32_t* dp = data_.data();
    {
      py::gil_scoped_release nogil;
      int32_t* dg = deg_.data();
      // Integer atomics: the counts come out the same whatever the thread interleaving.
#pragma omp parallel for schedule(static) num_threads(threads_)
      for (int64_t s = 0; s < ids_.n; ++s)
        for (int64_t j = ids_.begin(s); j < ids_.end(s); ++j) {
          const int64_t row = ids_.get(j);
#pragma omp atomic
          dg[row]++;
          if (dp[s] >= 0) {
#pragma omp atomic
            c[row * p_ + dp[s]]++;
          }
        }
    }
    for (int64_t s = 0; s < ids_.n; ++s)
      if (dp[s] >= 0) cnt_data_[dp[s]]++;
    used_rows_ = 0;
    for (int64_t r = 0; r < r_; ++r)
      if (deg_[r] > 0) {
        used_rows_++;
        if (embed_.data()[r] >= 0) cnt_embed_[embed_.data()[r]]++;
      }
    // Balance weights as HET-GMP sets them: 100 units of cost per part's worth of imbalance.
    alpha_ = -balance * 100.0 / static_cast<double>(m_);
    beta_ = -balance * 100.0 / std::max(1.0, static_cast<double>(used_rows_) / p_);
  }

  // Move every sample to the worker with the best score; returns the number of moves.
  int64_t refine_data() {
    py::gil_scoped_release nogil;
    int32_t* dp = data_.mutable_data();
    const int32_t* ep = embed_.data();
    const int32_t* c = counts_.data();
    auto gain = [&](int64_t s, double* sc) {
      const int32_t old = dp[s];
      for (int64_t j = ids_.begin(s); j < ids_.end(s); ++j) {
        const int64_t row = ids_.get(j);
        const int32_t o = ep[row];
        for (int k = 0; k < p_; ++k) {
          const int64_t cnt = c[row * p_ + k] - (k == old ? 1 : 0);
          sc[k] -= (soft_at(soft_, cnt + 1) - soft_at(soft_, cnt)) * topo_[k * p_ + o];
        }
      }
    };
    auto move = [&](int64_t s, const double* sc) -> int32_t {
      const int32_t old = dp[s];
      int best = 0;
      double best_score = -1e300;
      for (int k = 0; k < p_; ++k) {
        const double v = sc[k] + alpha_ * static_cast<double>(cnt_data_[k] - (k == old));
        if (v > best_score) best_score = v, best = k;
      }
      if (best == old) return -1;
      cnt_data_[old]--;
      cnt_data_[best]++;
      dp[s] = best;
      return old;
    };
    return sweep_samples(gain, move);
  }

  // Move every used row to the owner with the best score; returns the number of moves.
  int64_t refine_embed() {
    py::gil_scoped_release nogil;
    int32_t* ep = embed_.mutable_data();
    const int32_t* c = counts_.data();
    const double norm = static_cast<double>(batch_) * p_ / static_cast<double>(ids_.n);
    std::vector<double> weight = serve_weight(norm);
    const int64_t blk = block_size(r_);
    std::vector<double> buf(blk * p_);
    int64_t moves = 0;
    for (int64_t b0 = 0; b0 < r_; b0 += blk) {
      const int64_t b1 = std::min(r_, b0 + blk);
#pragma omp parallel for schedule(static) num_threads(threads_) if (b1 - b0 >= kParallelMin)
      for (int64_t r = b0; r < b1; ++r) {
        double* sc = &buf[(r - b0) * p_];
        std::fill(sc, sc + p_, 0.0);
        if (deg_[r] == 0) continue;
        for (int j = 0; j < p_; ++j) {
          const double sj = soft_at(soft_, c[r * p_ + j]);
          if (sj == 0.0) continue;
          for (int k = 0; k < p_; ++k) sc[k] -= topo_[j * p_ + k] * sj;
        }
      }
      for (int64_t r = b0; r < b1; ++r) {
        if (deg_[r] == 0) continue;
        const double* sc = &buf[(r - b0) * p_];
        const int32_t old = ep[r];
        const double sdeg = soft_at(soft_, deg_[r]);
        int best = 0;
        double best_score = -1e300;
        for (int k = 0; k < p_; ++k) {
          const double v = sc[k] + beta_ * static_cast<double>(cnt_embed_[k] - (k == old)) -
                           theta_ * weight[k] * sdeg;
          if (v > best_score) best_score = v, best = k;
        }
        if (best != old) {
          cnt_embed_[old]--;
          cnt_embed_[best]++;
          ep[r] = best;
          for (int j = 0; j < p_; ++j) {
            const double sj = soft_at(soft_, c[r * p_ + j]) * norm;
            if (j != best) weight[best] += sj;
            if (j != old) weight[old] -= sj;
          }
          ++moves;
        }
      }
    }
    return moves;
  }

  // Give every unplaced sample (-1) the worker owning most of its rows (rows its co-users
  // already sit with count half), never filling a worker beyond ceil(N / P).
  int64_t assign_data() {
    py::gil_scoped_release nogil;
    const int64_t cap = (ids_.n + p_ - 1) / p_;
    int32_t* dp = data_.mutable_data();
    const int32_t* ep = embed_.data();
    const int32_t* c = counts_.data();
    auto votes = [&](int64_t s, double* v) {
      if (dp[s] >= 0) return;
      for (int64_t j = ids_.begin(s); j < ids_.end(s); ++j) {
        const int64_t row = ids_.get(j);
        if (ep[row] >= 0) v[ep[row]] += 1.0;
        for (int k = 0; k < p_; ++k) v[k] += c[row * p_ + k] > 0 ? 0.5 : 0.0;
      }
    };
    auto place = [&](int64_t s, const double* v) -> int32_t {
      if (dp[s] >= 0) return -1;
      const int best = pick(v, cnt_data_, cap);
      dp[s] = best;
      cnt_data_[best]++;
      return kUnplaced;
    };
    return sweep_samples(votes, place);
  }

  // Give every unowned row (-1) the worker whose samples use it most, never beyond
  // ceil(used rows / P) used rows per worker; rows nobody uses go round-robin by id.
  int64_t assign_embed() {
    py::gil_scoped_release nogil;
    int32_t* ep = embed_.mutable_data();
    const int32_t* c = counts_.data();
    const int64_t cap = (used_rows_ + p_ - 1) / p_;
    std::vector<double> v(p_);
    int64_t placed = 0;
    for (int64_t r = 0; r < r_; ++r) {
      if (ep[r] >= 0) continue;
      ++placed;
      if (deg_[r] == 0) {
        ep[r] = static_cast<int32_t>(r % p_);
        continue;
      }
      for (int k = 0; k < p_; ++k) v[k] = c[r * p_ + k];
      const int best = pick(v.data(), cnt_embed_, cap);
      ep[r] = best;
      cnt_embed_[best]++;
    }
    return placed;
  }

  py::array_t<int32_t> data_partition() const { return data_; }
  py::array_t<int32_t> embed_partition() const { return embed_; }
  py::array_t<int32_t> counts() const { return counts_; }
  int64_t samples_per_part() const { return m_; }

 private:
  // Highest vote among workers below their cap; ties to the emptier, then the lower worker.
  int pick(const double* v, const std::vector<int64_t>& load, int64_t cap) const {
    int best = -1;
    for (int k = 0; k < p_; ++k) {
      if (load[k] >= cap) continue;
      if (best < 0 || v[k] > v[best] || (v[k] == v[best] && load[k] < load[best])) best = k;
    }
    if (best < 0)  // every worker full (cannot happen with cap = ceil): take the emptiest
      best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    return best;
  }

  // The block loop shared by refine_data and assign_data, kept in one place so that both
  // passes follow the same deterministic schedule (see the top of the file). Samples go in
  // blocks of block_size(n); in a block, score(s, sc) adds sample s's per-worker terms to
  // sc[0, P) (zeroed here) in parallel, reading only the counts of the block's start; then
  // decide(s, sc), in index order, settles s and returns its previous worker for apply_moves
  // (-1 = unchanged, kUnplaced = newly placed). Returns the number of samples changed.
  template <typename Score, typename Decide>
  int64_t sweep_samples(Score score, Decide decide) {
    const int64_t n = ids_.n;
    const int32_t* dp = data_.data();
    int32_t* c = counts_.mutable_data();
    const int64_t blk = block_size(n);
    std::vector<double> buf(blk * p_);
    std::vector<int32_t> from(blk);
    int64_t changed = 0;
    for (int64_t b0 = 0; b0 < n; b0 += blk) {
      const int64_t b1 = std::min(n, b0 + blk);
#pragma omp parallel for schedule(static) num_threads(threads_) if (b1 - b0 >= kParallelMin)
      for (int64_t s = b0; s < b1; ++s) {
        double* sc = &buf[(s - b0) * p_];
        std::fill(sc, sc + p_, 0.0);
        prefetch_rows(s + kPrefetch, b1, c);
        score(s, sc);
      }
      for (int64_t s = b0; s < b1; ++s) {
        from[s - b0] = decide(s, &buf[(s - b0) * p_]);
        if (from[s - b0] != -1) ++changed;
      }
      // The block's scores were computed before any of its decisions, so applying the count
      // updates after all of them (in parallel, integer atomics) gives the same state as
      // applying them one by one.
      apply_moves(b0, b1, from.data(), dp, c);
    }
    return changed;
  }

  // Count updates of one block's decisions: from[i] = previous worker of sample b0 + i,
  // -1 = not moved, kUnplaced = newly placed (nothing to subtract).
  void apply_moves(int64_t b0, int64_t b1, const int32_t* from, const int32_t* dp, int32_t* c) {
#pragma omp parallel for schedule(static) num_threads(threads_) if (b1 - b0 >= kParallelMin)
    for (int64_t s = b0; s < b1; ++s) {
      const int32_t old = from[s - b0];
      if (old == -1) continue;
      for (int64_t j = ids_.begin(s); j < ids_.end(s); ++j) {
        const int64_t row = ids_.get(j);
#pragma omp atomic
        c[row * p_ + dp[s]]++;
        if (old != kUnplaced) {
#pragma omp atomic
          c[row * p_ + old]--;
        }
      }
    }
  }

  // The count rows of a sample a few iterations ahead: the loops are bound by cache misses
  // on the [rows x parts] counts, and these loads are independent of the current work.
  inline void prefetch_rows(int64_t s, int64_t end, const int32_t* c) const {
    if (s >= end) return;
    for (int64_t j = ids_.begin(s); j < ids_.end(s); ++j) __builtin_prefetch(&c[ids_.get(j) * p_]);
  }

  // Fetches per step every owner serves (HET-GMP's owner-load term), summed chunk by chunk.
  std::vector<double> serve_weight(double norm) const {
    const int32_t* ep = embed_.data();
    const int32_t* c = counts_.data();
    const int64_t nchunks = (r_ + kChunk - 1) / kChunk;
    std::vector<double> partial(nchunks * p_, 0.0);
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      const int64_t end = std::min(r_, (ch + 1) * kChunk);
      for (int64_t r = ch * kChunk; r < end; ++r)
        for (int i = 0; i < p_; ++i)
          if (i != ep[r]) partial[ch * p_ + ep[r]] += soft_at(soft_, c[r * p_ + i]);
    }
    std::vector<double> w(p_, 0.0);
    for (int64_t ch = 0; ch < nchunks; ++ch)
      for (int k = 0; k < p_; ++k) w[k] += partial[ch * p_ + k];
    for (int k = 0; k < p_; ++k) w[k] *= norm;
    return w;
  }

  IdMatrix ids_;
  int p_;
  int64_t r_, batch_, m_ = 1, used_rows_ = 0;
  double theta_, alpha_ = 0, beta_ = 0;
  int threads_;
  std::vector<double> topo_, soft_;
  py::array_t<int32_t> data_, embed_, counts_;
  std::vector<int32_t> deg_;
  std::vector<int64_t> cnt_data_, cnt_embed_;
};

}  // namespace

void register_partition_refine(py::module_& m) {
  py::class_<Refiner>(m, "Refiner",
                      "Refinement state: placement, per-(row, worker) use counts, balance terms.")
      .def(py::init<const py::array&, const I32&, const I32&, int, int64_t, int64_t, const F64&,
                    double, double, int, const py::object&>(),
           py::arg("sparse"), py::arg("data_partition"), py::arg("embed_partition"),
           py::arg("nparts"), py::arg("num_rows"), py::arg("batch_size"), py::arg("topo"),
           py::arg("theta") = 0.01, py::arg("balance") = 1.0, py::arg("threads") = 0,
           py::arg("offsets") = py::none())
      .def("refine_data", &Refiner::refine_data, "One pass of sample moves; returns moves.")
      .def("refine_embed", &Refiner::refine_embed, "One pass of row moves; returns moves.")
      .def("assign_data", &Refiner::assign_data, "Place samples marked -1; returns count.")
      .def("assign_embed", &Refiner::assign_embed, "Place rows marked -1; returns count.")
      .def("data_partition", &Refiner::data_partition, "Current sample placement (a live view).")
      .def("embed_partition", &Refiner::embed_partition, "Current row owners (a live view).")
      .def("counts", &Refiner::counts, "counts[r, p] of the current placement (a live view).")
      .def_property_readonly("samples_per_part", &Refiner::samples_per_part);
}

}  // namespace hetgmp
