#include "native.h"

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
