// Shared helpers of the partitioner's native loops: array access and the soft-count table.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__)
#define HETGMP_HIDDEN __attribute__((visibility("hidden")))
#else
#define HETGMP_HIDDEN
#endif

namespace hetgmp {
namespace py = pybind11;

// Work is cut into chunks of a fixed size, never "one per thread", so that every float
// reduction is summed in the same order whatever the thread count (byte-identical plans).
constexpr int64_t kChunk = 1 << 16;

inline int resolve_threads(int threads) {
#ifdef _OPENMP
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

// Expected fetches per step of a row used by k of a worker's m samples, batch b:
// table[k] = 1 - (1 - k/m)^b for k < m, 1 beyond (a row used by every sample is fetched
// every step). `scale` multiplies every entry (HET-GMP's refinement works in units of
// batches per epoch, m/b).
inline std::vector<double> soft_table(int64_t m, int64_t b, double scale = 1.0) {
  if (m < 1 || b < 1) throw std::invalid_argument("samples per part and batch size must be >= 1");
  std::vector<double> t(static_cast<size_t>(m) + 1);
  for (int64_t k = 0; k <= m; ++k)
    t[k] = scale * (1.0 - std::pow(1.0 - static_cast<double>(k) / static_cast<double>(m),
                                   static_cast<double>(b)));
  return t;
}

inline double soft_at(const std::vector<double>& t, int64_t k) {
  const int64_t last = static_cast<int64_t>(t.size()) - 1;
  return t[k < last ? k : last];
}

// A read-only view of the sample -> rows edges, int32 or int64, C-contiguous: either the
// [N, F] sample-id matrix (sample s's edges are s*F .. s*F+F) or, with multi-hot fields, a
// ragged list (1-D ids plus int64 offsets [N + 1]: sample s's edges are ptr[s] .. ptr[s+1];
// a repeated id is a repeated edge, i.e. its weight). Hidden visibility like pybind11's own
// types (its py::array member is): no -Wattributes warning.
struct HETGMP_HIDDEN IdMatrix {
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
  const int64_t* ptr = nullptr;  // ragged offsets, or null for the dense matrix
  int64_t n = 0, f = 0, edges = 0;
  py::array keep, keep_ptr;  // hold the buffers (a numpy memmap works) alive
  inline int64_t begin(int64_t s) const { return ptr ? ptr[s] : s * f; }
  inline int64_t end(int64_t s) const { return ptr ? ptr[s + 1] : (s + 1) * f; }
  inline int64_t get(int64_t e) const { return i32 ? static_cast<int64_t>(i32[e]) : i64[e]; }
  // The sample that edge e belongs to (for error messages only).
  inline int64_t sample_of(int64_t e) const {
    if (!ptr) return e / f;
    return static_cast<int64_t>(std::upper_bound(ptr, ptr + n + 1, e) - ptr) - 1;
  }
};

inline IdMatrix id_matrix(const py::array& a, const py::object& offsets = py::none()) {
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument("sample ids must be C-contiguous");
  IdMatrix m;
  m.keep = a;
  if (offsets.is_none()) {
    if (a.ndim() != 2)
      throw std::invalid_argument("sample ids must be a 2-D [samples, fields] array");
    m.n = a.shape(0);
    m.f = a.shape(1);
    m.edges = m.n * m.f;
  } else {
    using P = py::array_t<int64_t, py::array::c_style>;
    if (a.ndim() != 1) throw std::invalid_argument("ragged sample ids must be 1-D");
    if (!P::check_(offsets)) throw std::invalid_argument("offsets must be a C-contiguous int64 array");
    P p = py::reinterpret_borrow<P>(offsets);
    if (p.ndim() != 1 || p.shape(0) < 1)
      throw std::invalid_argument("offsets must be 1-D [samples + 1]");
    m.keep_ptr = p;
    m.ptr = p.data();
    m.n = p.shape(0) - 1;
    m.edges = a.shape(0);
    if (m.ptr[0] != 0 || m.ptr[m.n] != m.edges)
      throw std::invalid_argument("offsets must run from 0 to the number of ids");
    for (int64_t s = 0; s < m.n; ++s)
      if (m.ptr[s + 1] < m.ptr[s])
        throw std::invalid_argument("offsets decrease after sample " + std::to_string(s));
  }
  if (a.dtype().is(py::dtype::of<int32_t>()))
    m.i32 = static_cast<const int32_t*>(a.data());
  else if (a.dtype().is(py::dtype::of<int64_t>()))
    m.i64 = static_cast<const int64_t*>(a.data());
  else
    throw std::invalid_argument("sample ids must be int32 or int64");
  return m;
}

// Raise ValueError naming the first sample whose id falls outside [0, num_rows).
inline void check_ids(const IdMatrix& ids, int64_t num_rows, int threads) {
  int64_t bad = ids.edges;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(min : bad)
  for (int64_t e = 0; e < ids.edges; ++e) {
    const int64_t v = ids.get(e);
    if (v < 0 || v >= num_rows) bad = e < bad ? e : bad;
  }
  if (bad < ids.edges) {
    const int64_t s = ids.sample_of(bad);
    throw py::value_error("sample " + std::to_string(s) + (ids.ptr ? ", id number " : ", field ") +
                          std::to_string(bad - ids.begin(s)) + ": id " +
                          std::to_string(ids.get(bad)) + " is outside [0, " +
                          std::to_string(num_rows) + ")");
  }
}

template <typename T>
inline const T* checked_vec(const py::array_t<T, py::array::c_style | py::array::forcecast>& a,
                            int64_t n, const char* what) {
  if (a.ndim() != 1 || a.shape(0) != n)
    throw py::value_error(std::string(what) + " must have length " + std::to_string(n));
  return a.data();
}

}  // namespace hetgmp
