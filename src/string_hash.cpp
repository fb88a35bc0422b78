// 64-bit FNV-1a keys of categorical strings (hetgmp.data.vocab.string_keys).
// The values lie back to back in one byte buffer (a pyarrow string array's data), addressed
// by (start, length); one hash per value, so the result does not depend on the thread count.
// Semantics match the numpy reference vocab.string_keys_numpy exactly: an empty value is
// the missing key 2**64-1, and a hash that happens to equal it is moved to 2**64-2.
#include <cstdint>
#include <string>

#include <pybind11/numpy.h>

#include "native.h"
#include "partition_common.h"

namespace hetgmp {
namespace {

constexpr uint64_t kFnvOffset = 0xCBF29CE484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001B3ULL;
constexpr uint64_t kMissingKey = ~0ULL;

using I64Vec = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
using U8Vec = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::array_t<uint64_t> fnv1a_keys(const I64Vec& starts, const I64Vec& lengths, const U8Vec& data,
                                 int threads) {
  if (starts.ndim() != 1 || lengths.ndim() != 1 || data.ndim() != 1)
    throw py::value_error("fnv1a_keys: starts, lengths and data must be 1-d arrays");
  const int64_t n = starts.shape(0);
  if (lengths.shape(0) != n)
    throw py::value_error("fnv1a_keys: starts and lengths differ in length (" +
                          std::to_string(n) + " vs " + std::to_string(lengths.shape(0)) + ")");
  const int64_t size = data.shape(0);
  const int64_t* st = starts.data();
  const int64_t* len = lengths.data();
  const uint8_t* bytes = data.data();
  // Bounds first (cheap, sequential) so the parallel loop below cannot read out of the buffer.
  for (int64_t i = 0; i < n; ++i)
    if (len[i] < 0 || (len[i] > 0 && (st[i] < 0 || st[i] > size - len[i])))
      throw py::value_error("fnv1a_keys: value " + std::to_string(i) + " (start " +
                            std::to_string(st[i]) + ", length " + std::to_string(len[i]) +
                            ") lies outside the " + std::to_string(size) + "-byte buffer");
  py::array_t<uint64_t> out(n);
  uint64_t* h = out.mutable_data();
  threads = resolve_threads(threads);
  {
    py::gil_scoped_release nogil;
#pragma omp parallel for schedule(dynamic, 4096) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) {
      if (len[i] == 0) {
        h[i] = kMissingKey;
        continue;
      }
      uint64_t x = kFnvOffset;
      const uint8_t* p = bytes + st[i];
      for (int64_t j = 0; j < len[i]; ++j) x = (x ^ p[j]) * kFnvPrime;
      h[i] = x == kMissingKey ? x - 1 : x;
    }
  }
  return out;
}

}  // namespace

void register_string_hash(py::module_& m) {
  m.def("fnv1a_keys", &fnv1a_keys, py::arg("starts"), py::arg("lengths"), py::arg("data"),
        py::arg("threads") = 0,
        "64-bit FNV-1a of data[starts[i] : starts[i] + lengths[i]] for every i; an empty value "
        "is 2**64-1 (the missing key), a hash equal to it becomes 2**64-2. threads <= 0: "
        "OpenMP's default.");
}

}  // namespace hetgmp
