// triton_dist._C.KernelLauncher: the eager launch path's one call per kernel. Arguments arrive as
// Python objects (ints, floats, bools, None, or anything with data_ptr(), such as a torch tensor)
// and are classified here as Triton would, so that the Python side passes them through untouched.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>

#include "tdist/error.h"
#include "tdist/kernel_launcher.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// More runtime arguments than any kernel of the library takes; a launcher refuses more.
constexpr std::size_t kMaxArguments = 64;

// The core launcher plus, per argument, the dtype a tensor must have (None for non-pointers):
// Triton's variant is per element type, which the core never sees.
struct PyKernelLauncher {
  tdist::KernelLauncher core;
  std::vector<nb::object> dtypes;
};

// `h` classified as Triton's specialisation would (see ParamValue); false for what no launcher
// variant takes (a tensor of another dtype, an int past 64 bits, a tensor descriptor, ...).
bool classify(nb::handle h, const nb::object& dtype, tdist::ParamValue& v) {
  using tdist::ParamKind;
  PyObject* o = h.ptr();
  if (o == Py_None) {
    v.type = tdist::ParamValue::Type::kNone;
    return true;
  }
  v.type = tdist::ParamValue::Type::kValue;
  if (PyBool_Check(o)) {
    v.kind = ParamKind::kInt1;
    v.integer = o == Py_True;
    return true;
  }
  if (PyLong_Check(o)) {
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow == 0) {
      v.integer = value;
      v.kind = value >= INT32_MIN && value <= INT32_MAX ? ParamKind::kInt32 : ParamKind::kInt64;
      return true;
    }
    if (overflow < 0) return false;
    const unsigned long long bits = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    v.kind = ParamKind::kUInt64;
    v.integer = static_cast<std::int64_t>(bits);
    return true;
  }
  if (PyFloat_Check(o)) {
    v.kind = ParamKind::kFloat32;
    v.real = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (!dtype.is_valid() || dtype.is_none() || !PyObject_HasAttrString(o, "data_ptr")) return false;
  if (!h.attr("dtype").is(dtype)) return false;
  const unsigned long long address = PyLong_AsUnsignedLongLong(h.attr("data_ptr")().ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  v.kind = ParamKind::kPointer;
  v.integer = static_cast<std::int64_t>(address);
  return true;
}

}  // namespace

void bind_kernel_launcher(nb::module_& m) {
  nb::class_<PyKernelLauncher>(
      m, "KernelLauncher",
      "A loaded Triton kernel variant launched with cuLaunchKernelEx from a parameter block laid out once "
      "(triton_dist.distributed_jit builds these from Triton's specialisation).")
      .def(
          "__init__",
          [](PyKernelLauncher* self, const std::string& name, int rank, std::uintptr_t function,
             const std::vector<std::string>& types, const std::vector<bool>& divisible_by_16,
             const std::vector<std::int64_t>& constants, const std::vector<bool>& constant_is_none,
             std::vector<nb::object> dtypes, unsigned block_threads, unsigned shared_bytes, unsigned cluster_ctas,
             bool cooperative, bool programmatic_serialization) {
            const std::size_t n = types.size();
            TDIST_CHECK(divisible_by_16.size() == n && constants.size() == n && constant_is_none.size() == n &&
                            dtypes.size() == n,
                        rank, "KernelLauncher", name << ": one type, divisibility, constant and dtype per argument");
            TDIST_CHECK(n <= kMaxArguments, rank, "KernelLauncher",
                        name << ": " << n << " runtime arguments, the launcher takes at most " << kMaxArguments);
            std::vector<tdist::ParamRule> rules(n);
            for (std::size_t i = 0; i < n; ++i)
              rules[i] = {tdist::param_kind_of(types[i]), divisible_by_16[i], constants[i], constant_is_none[i]};
            tdist::KernelLaunchShape shape{block_threads, shared_bytes, cluster_ctas, cooperative,
                                           programmatic_serialization};
            new (self) PyKernelLauncher{
                tdist::KernelLauncher(name, rank, reinterpret_cast<CUfunction>(function), std::move(rules), shape),
                std::move(dtypes)};
          },
          "name"_a, "rank"_a, "function"_a, "types"_a, "divisible_by_16"_a, "constants"_a, "constant_is_none"_a,
          "dtypes"_a, "block_threads"_a, "shared_bytes"_a, "cluster_ctas"_a, "cooperative"_a,
          "programmatic_serialization"_a)
      .def(
          "launch",
          [](PyKernelLauncher& self, unsigned grid_x, unsigned grid_y, unsigned grid_z, std::uintptr_t stream,
             nb::args args) {
            const std::size_t n = args.size();
            if (n != self.dtypes.size()) return false;
            std::array<tdist::ParamValue, kMaxArguments> values;
            for (std::size_t i = 0; i < n; ++i)
              if (!classify(args[i], self.dtypes[i], values[i])) return false;
            const unsigned grid[3] = {grid_x, grid_y, grid_z};
            return self.core.launch(grid, reinterpret_cast<CUstream>(stream), values.data(), n);
          },
          "grid_x"_a, "grid_y"_a, "grid_z"_a, "stream"_a, "args"_a,
          "Launch with these runtime arguments on `stream`; False (nothing launched) when they are not this "
          "variant's (another kind, dtype, alignment or constant), so that the caller takes Triton's path.")
      .def_prop_ro("name", [](const PyKernelLauncher& self) { return self.core.name(); })
      .def_prop_ro("arguments", [](const PyKernelLauncher& self) { return self.core.arguments(); });
}
