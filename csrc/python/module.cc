// triton_dist._C: the Python face of the C++ core. Thin: argument conversion, the GIL, and
// DLPack hand-over of symmetric memory to torch. Every tdist::Error becomes a RuntimeError with
// the core's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "tdist/bootstrap.h"
#include "tdist/cuda_driver.h"
#include "tdist/device_sharing.h"
#include "tdist/error.h"
#include "tdist/runtime.h"
#include "tdist/signal_names.h"
#include "tdist/signal_pad.h"
#include "tdist/stream_ops.h"
#include "tdist/stream_schedule.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_kernel_launcher(nb::module_& m);  // kernel_launcher_bindings.cc

namespace {

using TorchBytes = nb::ndarray<nb::pytorch, std::uint8_t, nb::ndim<1>, nb::device::cuda>;

int current_device() {
  CUdevice device = 0;
  tdist::check_cuda(tdist::CudaDriver::get().ctx_get_device(&device), -1, "current_device",
                    "cuCtxGetDevice (is a CUDA context current? call torch.cuda.set_device)");
  return static_cast<int>(device);
}

// A 1-D uint8 CUDA tensor over `data` that keeps `block` alive until torch drops it.
TorchBytes byte_tensor(void* data, std::size_t bytes, std::shared_ptr<tdist::SymmetricBlock> block) {
  auto* keep = new std::shared_ptr<tdist::SymmetricBlock>(std::move(block));
  nb::capsule owner(keep, [](void* p) noexcept {
    delete static_cast<std::shared_ptr<tdist::SymmetricBlock>*>(p);
  });
  std::size_t shape[1] = {bytes};
  return TorchBytes(data, 1, shape, owner, nullptr, nb::dtype<std::uint8_t>(),
                    nb::device::cuda::value, current_device());
}

std::vector<std::string> to_strings(const std::vector<nb::bytes>& blobs) {
  std::vector<std::string> out;
  out.reserve(blobs.size());
  for (const auto& b : blobs) out.emplace_back(b.c_str(), b.size());
  return out;
}

std::vector<nb::bytes> to_bytes(const std::vector<std::string>& blobs) {
  std::vector<nb::bytes> out;
  out.reserve(blobs.size());
  for (const auto& b : blobs) out.emplace_back(b.data(), b.size());
  return out;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() =
      "triton_dist C++ core: bootstrap, symmetric heap, signal pads, stream memory ops and schedules, "
      "kernel launchers";
  // The ops cache their contexts (signal pads, stream schedules) until finalize(), and a process
  // may exit without finalize(): those objects are alive when the interpreter frees this module
  // by design, so nanobind's leak report at exit would only be noise.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tdist::TimeoutError& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const tdist::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  nb::class_<tdist::TcpBootstrap>(m, "TcpBootstrap",
                                  "TCP rendezvous for processes without torch.distributed.")
      .def_static(
          "create_root",
          [](int world_size, const std::string& bind_address, int port, int timeout_ms) {
            return tdist::TcpBootstrap::create_root(world_size, bind_address, port,
                                                    {std::chrono::milliseconds(timeout_ms)});
          },
          "world_size"_a, "bind_address"_a = "0.0.0.0", "port"_a = 0, "timeout_ms"_a = 120000,
          "Rank 0: listen now; hand unique_id to the other ranks.")
      .def_static(
          "connect",
          [](int rank, int world_size, const std::string& unique_id, int timeout_ms) {
            return tdist::TcpBootstrap::connect(rank, world_size, unique_id,
                                                {std::chrono::milliseconds(timeout_ms)});
          },
          "rank"_a, "world_size"_a, "unique_id"_a, "timeout_ms"_a = 120000,
          "Ranks 1..world_size-1: connect to rank 0's unique_id.")
      .def_prop_ro("rank", &tdist::TcpBootstrap::rank)
      .def_prop_ro("world_size", &tdist::TcpBootstrap::world_size)
      .def_prop_ro("unique_id", &tdist::TcpBootstrap::unique_id)
      .def(
          "allgather",
          [](tdist::TcpBootstrap& self, nb::bytes mine) {
            std::string blob(mine.c_str(), mine.size());
            std::vector<std::string> all;
            {
              nb::gil_scoped_release release;
              all = self.allgather(blob);
            }
            return to_bytes(all);
          },
          "mine"_a)
      .def(
          "barrier",
          [](tdist::TcpBootstrap& self) {
            nb::gil_scoped_release release;
            self.barrier();
          });

  m.def(
      "init",
      [](int rank, int world_size, std::function<std::vector<nb::bytes>(nb::bytes)> allgather,
         std::size_t heap_bytes, int local_world_size, const std::string& nvshmem_library_dir,
         bool keep_nvshmem) {
        auto bootstrap = std::make_unique<tdist::CallbackBootstrap>(
            rank, world_size, [allgather](const std::string& mine) {
              nb::gil_scoped_acquire gil;
              return to_strings(allgather(nb::bytes(mine.data(), mine.size())));
            });
        tdist::RuntimeOptions options;
        options.heap_bytes = heap_bytes;
        options.local_world_size = local_world_size;
        options.nvshmem_library_dir = nvshmem_library_dir;
        options.keep_nvshmem = keep_nvshmem;
        tdist::Runtime::init(std::move(bootstrap), options);
      },
      "rank"_a, "world_size"_a, "allgather"_a, "heap_bytes"_a, "local_world_size"_a,
      "nvshmem_library_dir"_a, "keep_nvshmem"_a = false,
      "Collective: bring up the runtime over an allgather callback (a torch ProcessGroup).");
  m.def(
      "mps_state",
      [](int device, int rank) {
        switch (tdist::mps_state(device, rank)) {
          case tdist::MpsState::kOn: return "on";
          case tdist::MpsState::kOff: return "off";
          default: return "unknown";
        }
      },
      "device"_a, "rank"_a,
      "'on' when CUDA MPS shares `device` among processes, 'off' when not, 'unknown' on drivers too old to say.");
  m.def("initialized", &tdist::Runtime::initialized);
  m.def("finalize", &tdist::Runtime::finalize);
  m.def("rank", [] { return tdist::Runtime::get().rank(); });
  m.def("world_size", [] { return tdist::Runtime::get().world_size(); });
  m.def("local_rank", [] { return tdist::Runtime::get().local_world().local_rank; });
  m.def("local_world_size", [] { return tdist::Runtime::get().local_world().local_world_size; });
  m.def("node", [] { return tdist::Runtime::get().local_world().node; });
  m.def("num_nodes", [] { return tdist::Runtime::get().local_world().num_nodes; });
  m.def("barrier", [] { tdist::Runtime::get().barrier(); });
  m.def("backend_name", [] { return tdist::Runtime::get().backend().name(); });

  m.def(
      "allocate",
      [](std::size_t bytes, const std::string& what) {
        auto block = tdist::Runtime::get().heap().allocate(bytes, what);
        void* data = block->local();
        return byte_tensor(data, bytes, std::move(block));
      },
      "bytes"_a, "what"_a, "Collective: a uint8 CUDA tensor of `bytes` on the symmetric heap.");
  m.def(
      "peer_bytes",
      [](std::uintptr_t ptr, std::size_t bytes, int pe, const std::string& op) {
        auto& heap = tdist::Runtime::get().heap();
        const void* local = reinterpret_cast<const void*>(ptr);
        auto block = heap.block_containing(local, bytes, op);
        void* remote = heap.peer_address(local, pe);
        return byte_tensor(remote, bytes, std::move(block));
      },
      "ptr"_a, "bytes"_a, "pe"_a, "op"_a,
      "The `bytes` at local symmetric address `ptr`, as peer `pe` holds them (same node only).");
  m.def(
      "peer_address",
      [](std::uintptr_t ptr, int pe) {
        return reinterpret_cast<std::uintptr_t>(
            tdist::Runtime::get().heap().peer_address(reinterpret_cast<const void*>(ptr), pe));
      },
      "ptr"_a, "pe"_a);
  m.def(
      "check_symmetric",
      [](std::uintptr_t ptr, std::size_t bytes, const std::string& op) {
        tdist::Runtime::get().heap().block_containing(reinterpret_cast<const void*>(ptr), bytes,
                                                      op);
      },
      "ptr"_a, "bytes"_a, "op"_a, "Raise unless [ptr, ptr+bytes) is inside one live symmetric tensor.");
  m.def("heap_base", [] {
    return reinterpret_cast<std::uintptr_t>(tdist::Runtime::get().heap().base());
  });
  m.def("heap_stats", [] {
    auto s = tdist::Runtime::get().heap().stats();
    nb::dict d;
    d["capacity"] = s.capacity;
    d["bytes_in_use"] = s.bytes_in_use;
    d["live_allocations"] = s.live_allocations;
    d["pending_releases"] = s.pending_releases;
    return d;
  });
  m.def(
      "initialize_module",
      [](std::uintptr_t module, const std::string& ptx_path) {
        if (!tdist::Runtime::initialized()) return false;
        return tdist::Runtime::get().initialize_module(reinterpret_cast<CUmodule>(module),
                                                       tdist::ModulePtx::from_file(ptx_path));
      },
      "module"_a, "ptx_path"_a = "",
      "Set up a loaded CUmodule: the backend's device state and the wait-timeout report's address, "
      "where the module uses them (its PTX at ptx_path says which globals it has; \"\": look them up).");
  m.def(
      "barrier_all_on_stream",
      [](std::uintptr_t stream) {
        tdist::Runtime::get().backend().barrier_all_on_stream(reinterpret_cast<CUstream>(stream));
      },
      "stream"_a);

  m.def(
      "stream_write_value64",
      [](std::uintptr_t stream, std::uintptr_t address, std::uint64_t value) {
        tdist::stream_write_value64(reinterpret_cast<CUstream>(stream),
                                    reinterpret_cast<std::uint64_t*>(address), value);
      },
      "stream"_a, "address"_a, "value"_a);
  m.def(
      "stream_wait_value64",
      [](std::uintptr_t stream, std::uintptr_t address, std::uint64_t value, bool equal) {
        tdist::stream_wait_value64(reinterpret_cast<CUstream>(stream),
                                   reinterpret_cast<const std::uint64_t*>(address), value,
                                   equal ? tdist::StreamWait::kEqual : tdist::StreamWait::kAtLeast);
      },
      "stream"_a, "address"_a, "value"_a, "equal"_a = false);
  m.def(
      "stream_copy_2d",
      [](std::uintptr_t stream, std::uintptr_t dst, std::size_t dst_pitch, std::uintptr_t src,
         std::size_t src_pitch, std::size_t width_bytes, std::size_t height) {
        tdist::stream_copy_2d(reinterpret_cast<CUstream>(stream), reinterpret_cast<void*>(dst),
                              dst_pitch, reinterpret_cast<const void*>(src), src_pitch, width_bytes,
                              height);
      },
      "stream"_a, "dst"_a, "dst_pitch"_a, "src"_a, "src_pitch"_a, "width_bytes"_a, "height"_a);

  nb::class_<tdist::StreamSchedule>(m, "StreamSchedule",
                                    "Stream operations recorded once, enqueued with one call.")
      .def(nb::init<>())
      .def(
          "wait_value64",
          [](tdist::StreamSchedule& self, std::uintptr_t address, std::uint64_t value, bool equal) {
            self.wait_value64(reinterpret_cast<const std::uint64_t*>(address), value,
                              equal ? tdist::StreamWait::kEqual : tdist::StreamWait::kAtLeast);
          },
          "address"_a, "value"_a, "equal"_a = false)
      .def(
          "write_value64",
          [](tdist::StreamSchedule& self, std::uintptr_t address, std::uint64_t value) {
            self.write_value64(reinterpret_cast<std::uint64_t*>(address), value);
          },
          "address"_a, "value"_a)
      .def(
          "copy",
          [](tdist::StreamSchedule& self, std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
            self.copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
          },
          "dst"_a, "src"_a, "bytes"_a)
      .def(
          "copy_2d",
          [](tdist::StreamSchedule& self, std::uintptr_t dst, std::size_t dst_pitch, std::uintptr_t src,
             std::size_t src_pitch, std::size_t width_bytes, std::size_t height) {
            self.copy_2d(reinterpret_cast<void*>(dst), dst_pitch, reinterpret_cast<const void*>(src),
                         src_pitch, width_bytes, height);
          },
          "dst"_a, "dst_pitch"_a, "src"_a, "src_pitch"_a, "width_bytes"_a, "height"_a)
      .def(
          "enqueue",
          [](const tdist::StreamSchedule& self, std::uintptr_t stream, bool as_graph) {
            self.enqueue(reinterpret_cast<CUstream>(stream), as_graph);
          },
          "stream"_a, "as_graph"_a = false)
      .def("__len__", &tdist::StreamSchedule::size)
      .def_prop_ro("driver_calls", &tdist::StreamSchedule::driver_calls)
      .def_prop_ro("launches_as_graph", &tdist::StreamSchedule::launches_as_graph)
      .def_prop_ro("graphs", &tdist::StreamSchedule::graphs)
      .def_prop_ro("graph_failure", &tdist::StreamSchedule::graph_failure);

  m.def(
      "name_signals",
      [](std::uintptr_t base, std::size_t count, std::size_t signal_bytes, std::string owner,
         const std::vector<std::tuple<std::string, std::size_t, std::size_t>>& regions) {
        std::vector<tdist::SignalRegion> named;
        for (const auto& [name, first, count_in] : regions) named.push_back({name, first, count_in});
        return tdist::SignalNames::get().add(base, count, signal_bytes, std::move(owner), std::move(named),
                                             "buffer");
      },
      "base"_a, "count"_a, "signal_bytes"_a, "owner"_a, "regions"_a,
      "Name `count` words of `signal_bytes` at `base` (a buffer that is not a SignalPad, such as an LL "
      "buffer whose words are waited on) for the wait-timeout report; returns the naming's id.");
  m.def(
      "forget_signals",
      [](std::uintptr_t base, std::uint64_t id) { tdist::SignalNames::get().remove(base, id); }, "base"_a,
      "id"_a, "Forget the names name_signals gave the range at `base`, if that naming (`id`) still holds.");
  m.def(
      "signal_name", [](std::uintptr_t address) { return tdist::SignalNames::get().name_of(address); },
      "address"_a, "What the wait-timeout report calls the signal at `address` (\"\" if nobody named it).");

  nb::class_<tdist::SignalPad>(m, "SignalPad")
      .def(
          "__init__",
          [](tdist::SignalPad* self, std::size_t num_signals, std::string owner,
             const std::vector<std::tuple<std::string, std::size_t, std::size_t>>& regions) {
            std::vector<tdist::SignalRegion> named;
            for (const auto& [name, first, count] : regions) named.push_back({name, first, count});
            new (self) tdist::SignalPad(tdist::Runtime::get().heap(), num_signals, std::move(owner), std::move(named));
          },
          "num_signals"_a, "owner"_a = "", "regions"_a = std::vector<std::tuple<std::string, std::size_t, std::size_t>>{})
      .def("bytes_tensor",
           [](tdist::SignalPad& self) {
             return byte_tensor(self.local(), self.size() * 8, self.block());
           })
      .def_prop_ro("size", &tdist::SignalPad::size)
      .def_prop_ro("epoch", &tdist::SignalPad::epoch)
      .def("next_epoch", &tdist::SignalPad::next_epoch);

  bind_kernel_launcher(m);
}
