#include "native.h"

#include <chrono>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace hetgmp {

void register_info(pybind11::module_& m) {
  m.def("openmp_max_threads", []() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
  }, "Number of OpenMP threads the native loops would use by default.");
  // --straggle RANK:FACTOR:spin: busy for `seconds` with the GIL released, as a slow native
  // step (torch's CPU and CUDA work) is; a Python busy loop would hold the GIL and starve the
  // rank's other threads (the async row service), which a real slow step does not.
  m.def("spin_for", [](double seconds) {
    pybind11::gil_scoped_release release;
    const auto stop = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    volatile unsigned long burn = 0;
    while (std::chrono::steady_clock::now() < stop) {
      for (int i = 0; i < 256; ++i) burn = burn + i;
    }
  }, pybind11::arg("seconds"), "Keep this core busy for `seconds` without holding the GIL.");
  m.attr("built_with_openmp") =
#ifdef _OPENMP
      true;
#else
      false;
#endif
}

}  // namespace hetgmp

PYBIND11_MODULE(_native, m) {
  m.doc() = "hetgmp native hot loops (partition refinement, graph building, string hashing)";
  hetgmp::register_info(m);
  hetgmp::register_partition_graph(m);
  hetgmp::register_partition_refine(m);
  hetgmp::register_string_hash(m);
}
