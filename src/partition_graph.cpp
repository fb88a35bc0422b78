// The sample <-> row graph: reverse CSR, per-worker usage counts, the expected-fetch matrix and
// mirror ranking. Every result is independent of the thread count (integer atomics only, float
// sums over fixed-size chunks added in chunk order).
#include <algorithm>
#include <numeric>

#include "native.h"
#include "partition_common.h"

namespace hetgmp {
namespace {

// Row -> samples CSR (the sample -> rows direction is the [N, F] id matrix itself, whose
// offsets are s * F). 64-bit offsets: the Criteo Kaggle shape has 1.19 billion edges.
py::tuple row_csr(const py::array& sparse, int64_t num_rows, int threads, const py::object& offsets) {
  const IdMatrix ids = id_matrix(sparse, offsets);
  threads = resolve_threads(threads);
  check_ids(ids, num_rows, threads);
  py::array_t<int64_t> indptr(num_rows + 1);
  py::array_t<int64_t> samples(ids.edges);
  int64_t* ptr = indptr.mutable_data();
  int64_t* out = samples.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::fill(ptr, ptr + num_rows + 1, 0);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < ids.n; ++s)
      for (int64_t j = ids.begin(s); j < ids.end(s); ++j) {
#pragma omp atomic
        ptr[ids.get(j) + 1]++;
      }
    for (int64_t r = 0; r < num_rows; ++r) ptr[r + 1] += ptr[r];
    // Sequential fill in sample order: each row's samples come out ascending, deterministically.
    std::vector<int64_t> pos(ptr, ptr + num_rows);
    for (int64_t s = 0; s < ids.n; ++s)
      for (int64_t j = ids.begin(s); j < ids.end(s); ++j) out[pos[ids.get(j)]++] = s;
  }
  return py::make_tuple(indptr, samples);
}

py::array_t<int32_t> usage_counts(const py::array& sparse,
                                  const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& data_partition,
                                  int nparts, int64_t num_rows, int threads,
                                  const py::object& offsets) {
  const IdMatrix ids = id_matrix(sparse, offsets);
  threads = resolve_threads(threads);
  const int32_t* dp = checked_vec(data_partition, ids.n, "data_partition");
  if (nparts < 1) throw py::value_error("nparts must be >= 1");
  check_ids(ids, num_rows, threads);
  for (int64_t s = 0; s < ids.n; ++s)
    if (dp[s] < 0 || dp[s] >= nparts)
      throw py::value_error("data_partition[" + std::to_string(s) + "] = " +
                            std::to_string(dp[s]) + " is not a worker in [0, " +
                            std::to_string(nparts) + ")");
  py::array_t<int32_t> counts({num_rows, static_cast<int64_t>(nparts)});
  int32_t* c = counts.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::fill(c, c + num_rows * nparts, 0);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t s = 0; s < ids.n; ++s)
      for (int64_t j = ids.begin(s); j < ids.end(s); ++j) {
#pragma omp atomic
        c[ids.get(j) * nparts + dp[s]]++;
      }
  }
  return counts;
}

void check_counts(const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& counts,
                  int64_t num_rows) {
  if (counts.ndim() != 2 || counts.shape(0) != num_rows)
    throw py::value_error("counts must be [num_rows, nparts] and match embed_partition");
}

py::array_t<double> fetch_matrix(
    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& counts,
    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& embed_partition,
    int64_t m, int64_t batch, int threads) {
  const int64_t num_rows = embed_partition.shape(0);
  check_counts(counts, num_rows);
  const int64_t p = counts.shape(1);
  const int32_t* c = counts.data();
  const int32_t* ep = embed_partition.data();
  for (int64_t r = 0; r < num_rows; ++r)
    if (ep[r] < 0 || ep[r] >= p) throw py::value_error("embed_partition holds an invalid worker");
  threads = resolve_threads(threads);
  const std::vector<double> soft = soft_table(m, batch);
  const int64_t nchunks = (num_rows + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(nchunks * p * p), 0.0);
  {
    py::gil_scoped_release nogil;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      double* acc = &partial[ch * p * p];
      const int64_t end = std::min(num_rows, (ch + 1) * kChunk);
      for (int64_t r = ch * kChunk; r < end; ++r)
        for (int64_t i = 0; i < p; ++i)
          if (c[r * p + i]) acc[i * p + ep[r]] += soft_at(soft, c[r * p + i]);
    }
  }
  py::array_t<double> out({p, p});
  double* o = out.mutable_data();
  std::fill(o, o + p * p, 0.0);
  for (int64_t ch = 0; ch < nchunks; ++ch)
    for (int64_t k = 0; k < p * p; ++k) o[k] += partial[ch * p * p + k];
  return out;
}

struct Candidate {
  double gain;
  int32_t count;
  int64_t row;
};

// Per worker: the rows it uses but does not own, by descending topology-weighted fetches saved
// per step; ties by larger use count, then lower row id (a total order: sort is deterministic).
py::tuple rank_mirrors(
    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& counts,
    const py::array_t<int32_t, py::array::c_style | py::array::forcecast>& embed_partition,
    const py::array_t<double, py::array::c_style | py::array::forcecast>& topo, int64_t m,
    int64_t batch, int64_t limit, int threads) {
  const int64_t num_rows = embed_partition.shape(0);
  check_counts(counts, num_rows);
  const int64_t p = counts.shape(1);
  if (topo.ndim() != 2 || topo.shape(0) != p || topo.shape(1) != p)
    throw py::value_error("topology matrix must be [nparts, nparts]");
  const int32_t* c = counts.data();
  const int32_t* ep = embed_partition.data();
  const double* t = topo.data();
  const std::vector<double> soft = soft_table(m, batch);
  (void)threads;
  py::list out_ids, out_gain;
  std::vector<Candidate> cand;
  for (int64_t w = 0; w < p; ++w) {
    // Workers one after another with one buffer: O(rows) memory, not O(parts x rows).
    {
      py::gil_scoped_release nogil;
      cand.clear();
      for (int64_t r = 0; r < num_rows; ++r) {
        const int32_t k = c[r * p + w];
        if (k > 0 && ep[r] != w) cand.push_back({t[w * p + ep[r]] * soft_at(soft, k), k, r});
      }
      auto better = [](const Candidate& a, const Candidate& b) {
        if (a.gain != b.gain) return a.gain > b.gain;
        if (a.count != b.count) return a.count > b.count;
        return a.row < b.row;
      };
      const int64_t keep = std::min<int64_t>(limit < 0 ? INT64_MAX : limit, cand.size());
      if (keep < static_cast<int64_t>(cand.size()))
        std::nth_element(cand.begin(), cand.begin() + keep, cand.end(), better);
      std::sort(cand.begin(), cand.begin() + keep, better);
      cand.resize(keep);
    }
    py::array_t<int64_t> ids(static_cast<int64_t>(cand.size()));
    py::array_t<double> gain(static_cast<int64_t>(cand.size()));
    int64_t* ip = ids.mutable_data();
    double* gp = gain.mutable_data();
    for (size_t k = 0; k < cand.size(); ++k) {
      ip[k] = cand[k].row;
      gp[k] = soft_at(soft, cand[k].count);
    }
    out_ids.append(ids);
    out_gain.append(gain);
  }
  return py::make_tuple(out_ids, out_gain);
}

}  // namespace

void register_partition_graph(py::module_& m) {
  m.def("row_csr", &row_csr, py::arg("sparse"), py::arg("num_rows"), py::arg("threads") = 0,
        py::arg("offsets") = py::none(),
        "Row -> samples CSR of an [N, F] id matrix (or ragged ids + offsets): (indptr int64 [R+1], samples int64 [E]).");
  m.def("usage_counts", &usage_counts, py::arg("sparse"), py::arg("data_partition"),
        py::arg("nparts"), py::arg("num_rows"), py::arg("threads") = 0,
        py::arg("offsets") = py::none(),
        "counts[r, p]: how many of worker p's samples use row r (int32 [R, P]).");
  m.def("fetch_matrix", &fetch_matrix, py::arg("counts"), py::arg("embed_partition"),
        py::arg("m"), py::arg("batch_size"), py::arg("threads") = 0,
        "F[i, j]: expected rows per step worker i reads from owner j.");
  m.def("rank_mirrors", &rank_mirrors, py::arg("counts"), py::arg("embed_partition"),
        py::arg("topo"), py::arg("m"), py::arg("batch_size"), py::arg("limit"),
        py::arg("threads") = 0,
        "Per worker: non-owned used rows by descending mirror priority, and saved fetches.");
}

}  // namespace hetgmp
