// Shared declarations for the hetgmp._native extension.
// Each source file registers its functions on the module through one hook declared here,
// so module.cpp stays a list of hooks and the hot loops live in files named after what they do.
#pragma once
#include <pybind11/pybind11.h>

namespace hetgmp {
void register_info(pybind11::module_& m);
void register_partition_graph(pybind11::module_& m);   // partition_graph.cpp
void register_partition_refine(pybind11::module_& m);  // partition_refine.cpp
void register_string_hash(pybind11::module_& m);       // string_hash.cpp
}  // namespace hetgmp
