// triton_dist._C.KernelLauncher: the eager launch path's one call per kernel. Arguments arrive as
// Python objects (ints, floats, bools, None, anything with data_ptr(), such as a torch tensor, or a
// host TensorDescriptor) and are classified here as Triton would, so that the Python side passes
// them through untouched. KernelLauncher.bind() gives its bound form (BoundLaunch): every argument
// but a call's tensors classified once, what a LaunchPlan launches again and again.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>

#include "tdist/error.h"
#include "tdist/kernel_launcher.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// More runtime arguments than any kernel of the library takes; a launcher refuses more.
constexpr std::size_t kMaxArguments = 64;

// A call's block of classified arguments, reused between calls (making a block of kMaxArguments
// values each call cost 0.2 of the 1.1 µs a six-argument launch() took: stand-in tensors, zero-sized
// grid, on the CPU machine). Classifying a tensor runs Python (data_ptr(), and a subclass's own
// code), which may hand the GIL to another thread that launches the same variant: that call gets a
// copy of the block instead. The launch itself runs no Python, so it never interleaves.
struct ReusedBlock {
  std::vector<tdist::ParamValue> values;
  bool in_use = false;
};

// The block for one call: the reused one, or a copy while another call holds it.
class BlockLease {
 public:
  explicit BlockLease(ReusedBlock& block) : block_(block), held_(!block.in_use) {
    if (held_)
      block_.in_use = true;
    else
      copy_ = block_.values;
  }
  ~BlockLease() {
    if (held_) block_.in_use = false;
  }
  BlockLease(const BlockLease&) = delete;
  BlockLease& operator=(const BlockLease&) = delete;
  std::vector<tdist::ParamValue>& values() { return held_ ? block_.values : copy_; }

 private:
  ReusedBlock& block_;
  bool held_;
  std::vector<tdist::ParamValue> copy_;
};

// The core launcher plus, per argument, the dtype a tensor must have (None for non-pointers;
// a tensor descriptor's base) and a tensor descriptor's block shape: Triton's variant is per
// element type and block, which the core never sees.
struct PyKernelLauncher {
  tdist::KernelLauncher core;
  std::vector<nb::object> dtypes;
  std::vector<nb::object> blocks;  // None, or a descriptor argument's block shape (a list)
  ReusedBlock call{std::vector<tdist::ParamValue>(dtypes.size())};  // a call's arguments
};

// Whether two sequences of ints (a list and a tuple alike) hold the same values.
bool same_ints(nb::handle a, nb::handle b) {
  const std::size_t n = nb::len(a);
  if (nb::len(b) != n) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (nb::cast<std::int64_t>(a[i]) != nb::cast<std::int64_t>(b[i])) return false;
  return true;
}

// The address of `h`, a tensor of `dtype` (by identity): its data_ptr(); false for anything else,
// an error raised by either included (cleared: the caller then takes Triton's path, which raises it).
// The attribute names are interned once: a lookup by C string makes a Python string each time, on
// the path every eager launch takes.
bool tensor_address(nb::handle h, const nb::object& dtype, std::int64_t& address) {
  static PyObject* const dtype_name = PyUnicode_InternFromString("dtype");
  static PyObject* const data_ptr_name = PyUnicode_InternFromString("data_ptr");
  PyObject* own = PyObject_GetAttr(h.ptr(), dtype_name);
  if (own == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool same = own == dtype.ptr();
  Py_DECREF(own);
  if (!same) return false;
  PyObject* ptr = PyObject_CallMethodNoArgs(h.ptr(), data_ptr_name);
  if (ptr == nullptr) {
    PyErr_Clear();
    return false;
  }
  const unsigned long long bits = PyLong_AsUnsignedLongLong(ptr);
  Py_DECREF(ptr);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  address = static_cast<std::int64_t>(bits);
  return true;
}

// A descriptor of `shape` and `strides` (ints, outermost first; strides in elements) over the
// memory at `address` into `v`; false for a rank TMA does not take.
bool fill_tensor_map(nb::handle shape, nb::handle strides, std::int64_t address, bool nan_padding,
                     tdist::ParamValue& v) {
  const std::size_t rank = nb::len(shape);
  if (rank == 0 || rank > tdist::kMaxTensorMapRank || nb::len(strides) != rank) return false;
  v.type = tdist::ParamValue::Type::kValue;
  v.kind = tdist::ParamKind::kTensorMap;
  v.rank = static_cast<unsigned>(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    v.shape[d] = nb::cast<std::int64_t>(shape[d]);
    v.strides[d] = nb::cast<std::int64_t>(strides[d]);
  }
  v.nan_padding = nan_padding;
  v.integer = address;
  return true;
}

// `tensor` in the place of a descriptor of the variant's block (LaunchPlan's TMA slots): the
// descriptor TensorDescriptor.from_tensor(tensor, block) would make, read straight from the tensor
// (making that Python object cost 3 µs a call), with the checks its constructor makes: a 16-byte
// aligned base (argument_fit), positive sizes, a contiguous last dimension and 16-byte strides.
bool classify_tensor_operand(nb::handle tensor, const nb::object& dtype, tdist::ParamValue& v) {
  std::int64_t address = 0;
  if (!tensor_address(tensor, dtype, address)) return false;
  if (!fill_tensor_map(tensor.attr("shape"), tensor.attr("stride")(), address, false, v)) return false;
  const std::int64_t element_bytes = nb::cast<std::int64_t>(dtype.attr("itemsize"));
  for (unsigned d = 0; d < v.rank; ++d)
    if (v.shape[d] <= 0 || (d + 1 < v.rank && (v.strides[d] * element_bytes) % 16 != 0)) return false;
  return v.strides[v.rank - 1] == 1;
}

// A host TensorDescriptor (triton.tools.tensor_descriptor: base, shape, strides, block_shape,
// padding) of the variant's block shape and base dtype, or a (tensor, block_shape) pair
// (classify_tensor_operand), into `v`; false for anything else.
bool classify_descriptor(nb::handle h, const nb::object& dtype, const nb::object& block, tdist::ParamValue& v) {
  if (PyTuple_Check(h.ptr()) && PyTuple_GET_SIZE(h.ptr()) == 2)  // (tensor, block_shape)
    return same_ints(PyTuple_GET_ITEM(h.ptr(), 1), block) &&
           classify_tensor_operand(PyTuple_GET_ITEM(h.ptr(), 0), dtype, v);
  if (!nb::hasattr(h, "block_shape") || !nb::hasattr(h, "base")) return false;
  if (!same_ints(h.attr("block_shape"), block)) return false;
  std::int64_t address = 0;
  if (!tensor_address(h.attr("base"), dtype, address)) return false;
  return fill_tensor_map(h.attr("shape"), h.attr("strides"), address,
                         nb::cast<std::string>(h.attr("padding")) == "nan", v);
}

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
  if (!dtype.is_valid() || dtype.is_none() || !tensor_address(h, dtype, v.integer)) return false;
  v.kind = ParamKind::kPointer;
  return true;
}

// Argument `i` of `launcher`'s variant as a call gives it (classify, or classify_descriptor where
// the variant takes a descriptor).
bool classify_argument(const PyKernelLauncher& launcher, std::size_t i, nb::handle h, tdist::ParamValue& v) {
  return launcher.blocks[i].is_none() ? classify(h, launcher.dtypes[i], v)
                                      : classify_descriptor(h, launcher.dtypes[i], launcher.blocks[i], v);
}

// Where a call's tensor goes: runtime argument `at` takes the call's tensor `index`, as a pointer
// or, where the variant takes a descriptor, as the tensor in its place (classify_tensor_operand).
struct TensorSlot {
  std::size_t at;
  std::size_t index;
};

// A launcher with its grid and every runtime argument but a call's tensors classified once: a
// call classifies `arity` tensors, not every argument (a LaunchPlan's context buffers, counts and
// ranks, a tensor's classification being two Python attribute lookups and a call). The fixed
// arguments stay referenced (`fixed`): the addresses classified from them must stay theirs.
struct PyBoundLaunch {
  nb::object launcher_ref;  // keeps `launcher` alive
  PyKernelLauncher* launcher;
  unsigned grid[3];
  // Every argument: the fixed ones classified once, the slots' entries overwritten by each call
  // (a ReusedBlock, as PyKernelLauncher::call).
  ReusedBlock values;
  std::vector<TensorSlot> slots;
  std::size_t arity;
  nb::object fixed;

  // Classifies the call's tensors into their slots of `block`; false when one is not this
  // variant's (the rules are checked by KernelLauncher::launch). `tensors` must hold `arity` of them.
  bool classify_tensors(nb::handle tensors, std::vector<tdist::ParamValue>& block) const {
    for (const TensorSlot& slot : slots) {
      nb::handle t(PyTuple_GET_ITEM(tensors.ptr(), static_cast<Py_ssize_t>(slot.index)));
      const bool fits = launcher->blocks[slot.at].is_none()
                            ? classify(t, launcher->dtypes[slot.at], block[slot.at])
                            : classify_tensor_operand(t, launcher->dtypes[slot.at], block[slot.at]);
      if (!fits) return false;
    }
    return true;
  }
};

// `launcher` bound to `args` (every runtime argument, the slots' entries ignored) and `slots`
// ((at, index, block) each; block: None, or the descriptor block a plan's TMA slot gives, which
// must be the variant's); None when a fixed argument is not this variant's (the plan's calls then
// take the launcher list's other variants or Triton's path).
nb::object bind_launch(nb::handle self_handle, unsigned grid_x, unsigned grid_y, unsigned grid_z, nb::sequence args,
                       nb::sequence slots, std::size_t arity) {
  PyKernelLauncher& self = nb::cast<PyKernelLauncher&>(self_handle);
  const std::size_t n = self.dtypes.size();
  if (nb::len(args) != n) return nb::none();
  std::vector<bool> is_slot(n, false);
  std::vector<TensorSlot> tensor_slots;
  for (nb::handle entry : slots) {
    const auto at = nb::cast<std::size_t>(entry[0]);
    const auto index = nb::cast<std::size_t>(entry[1]);
    nb::object block = entry[2];
    TDIST_CHECK(at < n && index < arity && !is_slot[at], self.core.rank(), "KernelLauncher.bind",
                self.core.name() << ": slot (" << at << ", " << index << ") outside " << n << " arguments and "
                                 << arity << " tensors, or given twice");
    // A descriptor slot's block must be the variant's (its whole specialisation); a plain slot
    // takes a pointer argument.
    if (block.is_none() != self.blocks[at].is_none()) return nb::none();
    if (!block.is_none() && !same_ints(block, self.blocks[at])) return nb::none();
    is_slot[at] = true;
    tensor_slots.push_back({at, index});
  }
  std::vector<tdist::ParamValue> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (is_slot[i]) continue;
    if (!classify_argument(self, i, args[i], values[i])) return nb::none();
    if (tdist::argument_fit(self.core.rule(i), values[i]) != tdist::ArgumentFit::kFits) return nb::none();
  }
  return nb::cast(PyBoundLaunch{nb::borrow(self_handle), &self, {grid_x, grid_y, grid_z}, {std::move(values)},
                                std::move(tensor_slots), arity, nb::borrow(args)});
}

}  // namespace

void bind_kernel_launcher(nb::module_& m) {
  nb::class_<PyBoundLaunch>(m, "BoundLaunch",
                            "A KernelLauncher bound to a grid and every runtime argument but a call's tensors "
                            "(KernelLauncher.bind): a LaunchPlan's launch, one C++ call that classifies only the "
                            "call's tensors.")
      .def(
          "launch",
          [](PyBoundLaunch& self, std::uintptr_t stream, nb::args tensors) {
            if (tensors.size() != self.arity) return false;
            BlockLease block(self.values);
            if (!self.classify_tensors(tensors, block.values())) return false;
            return self.launcher->core.launch(self.grid, reinterpret_cast<CUstream>(stream), block.values().data(),
                                              block.values().size());
          },
          "stream"_a, "tensors"_a,
          "Launch on `stream` with the call's tensors (`arity` of them) in their slots; False (nothing "
          "launched) when they are not this variant's.")
      .def_ro("arity", &PyBoundLaunch::arity);

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
             bool cooperative, bool programmatic_serialization, nb::object tensor_maps) {
            const std::size_t n = types.size();
            TDIST_CHECK(divisible_by_16.size() == n && constants.size() == n && constant_is_none.size() == n &&
                            dtypes.size() == n && (tensor_maps.is_none() || nb::len(tensor_maps) == n),
                        rank, "KernelLauncher",
                        name << ": one type, divisibility, constant, dtype (and tensor map) per argument");
            TDIST_CHECK(n <= kMaxArguments, rank, "KernelLauncher",
                        name << ": " << n << " runtime arguments, the launcher takes at most " << kMaxArguments);
            std::vector<tdist::ParamRule> rules(n);
            std::vector<nb::object> blocks(n, nb::none());
            for (std::size_t i = 0; i < n; ++i) {
              nb::object map = tensor_maps.is_none() ? nb::none() : nb::object(tensor_maps[i]);
              if (map.is_none()) {
                rules[i] = {tdist::param_kind_of(types[i]), divisible_by_16[i], constants[i], constant_is_none[i]};
                continue;
              }
              // (block_shape, element_type, element_bytes, swizzle, box, fp4_padded): Triton's
              // tensordesc_meta entry and the descriptor's block (eager_launch.tensor_map_rule).
              rules[i].kind = tdist::ParamKind::kTensorMap;
              tdist::TensorMapRule& t = rules[i].tensor_map;
              blocks[i] = map[0];
              t.rank = static_cast<unsigned>(nb::len(blocks[i]));
              t.element_type = nb::cast<unsigned>(map[1]);
              t.element_bytes = nb::cast<unsigned>(map[2]);
              t.swizzle = nb::cast<unsigned>(map[3]);
              nb::object box = map[4];
              TDIST_CHECK(t.rank >= 1 && t.rank <= tdist::kMaxTensorMapRank && nb::len(box) == t.rank, rank,
                          "KernelLauncher", name << ": argument " << i << "'s TMA box has " << nb::len(box)
                                                 << " dimensions, its block " << t.rank);
              for (unsigned d = 0; d < t.rank; ++d) t.box[d] = nb::cast<std::uint32_t>(box[d]);
              t.fp4_padded = nb::cast<bool>(map[5]);
            }
            tdist::KernelLaunchShape shape{block_threads, shared_bytes, cluster_ctas, cooperative,
                                           programmatic_serialization};
            new (self) PyKernelLauncher{
                tdist::KernelLauncher(name, rank, reinterpret_cast<CUfunction>(function), std::move(rules), shape),
                std::move(dtypes), std::move(blocks)};
          },
          "name"_a, "rank"_a, "function"_a, "types"_a, "divisible_by_16"_a, "constants"_a, "constant_is_none"_a,
          "dtypes"_a, "block_threads"_a, "shared_bytes"_a, "cluster_ctas"_a, "cooperative"_a,
          "programmatic_serialization"_a, "tensor_maps"_a = nb::none())
      .def(
          "launch",
          [](PyKernelLauncher& self, unsigned grid_x, unsigned grid_y, unsigned grid_z, std::uintptr_t stream,
             nb::args args) {
            const std::size_t n = args.size();
            if (n != self.dtypes.size()) return false;
            BlockLease block(self.call);
            std::vector<tdist::ParamValue>& values = block.values();
            for (std::size_t i = 0; i < n; ++i) {
              if (!classify_argument(self, i, args[i], values[i])) return false;
            }
            const unsigned grid[3] = {grid_x, grid_y, grid_z};
            return self.core.launch(grid, reinterpret_cast<CUstream>(stream), values.data(), n);
          },
          "grid_x"_a, "grid_y"_a, "grid_z"_a, "stream"_a, "args"_a,
          "Launch with these runtime arguments on `stream`; False (nothing launched) when they are not this "
          "variant's (another kind, dtype, alignment or constant), so that the caller takes Triton's path.")
      .def("bind", &bind_launch, "grid_x"_a, "grid_y"_a, "grid_z"_a, "args"_a, "slots"_a, "arity"_a,
           "This variant bound to a grid and every runtime argument but the call's tensors (`args`: all of "
           "them, the slots' entries ignored; `slots`: (argument, tensor index, descriptor block or None) each); "
           "None when a fixed argument is not this variant's.")
      .def_prop_ro("name", [](const PyKernelLauncher& self) { return self.core.name(); })
      .def_prop_ro("arguments", [](const PyKernelLauncher& self) { return self.core.arguments(); })
      .def_prop_ro("kernel_parameters", [](const PyKernelLauncher& self) { return self.core.kernel_param_count(); });
}
