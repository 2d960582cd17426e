// A library kernel compiled ahead of time, run from a C++ program without Python.
//
// `python -m triton_dist.tools.prebuild --out DIR --world N NAME` compiles a Triton kernel of the
// library for sm_90 (no GPU needed) and writes DIR/NAME.cubin, DIR/NAME.ptx and DIR/NAME.manifest:
// a line-based description of the launch (symbol, threads, shared memory, the constexprs it was
// built for, and one rule per runtime argument, derived as the eager launch path derives them;
// python/triton_dist/tools/prebuild.py gives the format). A PrebuiltKernel loads the three, sets
// the module up as the Python runtime sets up the modules Triton loads (NVSHMEM's device state,
// the wait-timeout report), and launches through the same KernelLauncher. The manifest is what
// keeps the C++ caller honest: a value that breaks its parameter's rule is an error naming the
// parameter, never a launch of a variant compiled for other arguments.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tdist/kernel_launcher.h"

namespace tdist {

// The manifest's format version (`tdist-prebuilt 1`); prebuild.py's MANIFEST_VERSION.
inline constexpr int kPrebuiltManifestVersion = 1;

// What a prebuilt kernel's manifest says (file notes).
struct PrebuiltManifest {
  std::string symbol;                             // the kernel's entry point in the cubin
  KernelLaunchShape shape;                        // threads, dynamic shared bytes, cooperative, PDL
  std::vector<std::string> param_names;           // runtime arguments, in the kernel's order
  std::vector<std::string> param_types;           // Triton's type of each ("*fp32", "i32", "constexpr")
  std::vector<ParamRule> rules;                   // what each argument is checked against
  std::map<std::string, std::string> constexprs;  // the constexpr parameters it was compiled with

  // The constexpr `key` as an integer (WORLD, BLOCK, ...): what the caller sizes its buffers and
  // grid by. Throws, naming `kernel` and `rank`, when it is absent or not an integer.
  std::int64_t constexpr_int(const std::string& key, const std::string& kernel, int rank) const;
};

// Parses a manifest's text; `kernel` (the variant's name) and `rank` appear in errors, which
// name the line at fault and the fix (writing the files again with the prebuild tool).
PrebuiltManifest parse_prebuilt_manifest(const std::string& text, const std::string& kernel, int rank);

// Arguments for PrebuiltKernel::launch, of the kinds the manifest's types name.
ParamValue pointer_arg(const void* address);  // "*fp32", "*u64", ...: a device address
ParamValue i32_arg(std::int32_t value);       // "i32"
ParamValue i64_arg(std::int64_t value);       // "i64"
ParamValue f32_arg(float value);              // "fp32"
ParamValue none_arg();                        // an absent optional pointer folded in as None

// Why `value` does not fit `rule` (KernelLauncher::pack's checks, in words; `type` is the
// parameter's Triton type), or "" when it fits: what PrebuiltKernel::launch's errors say.
std::string argument_misfit(const ParamRule& rule, const std::string& type, const ParamValue& value);

// A prebuilt kernel loaded into the CUDA context current on this thread, unloaded with it.
class PrebuiltKernel {
 public:
  // Loads `dir`/`name`.{manifest,cubin,ptx} and sets the module up with the runtime, which must
  // be initialised (Runtime::init); destroy the kernel before Runtime::finalize().
  PrebuiltKernel(const std::string& dir, const std::string& name);
  ~PrebuiltKernel();
  PrebuiltKernel(const PrebuiltKernel&) = delete;
  PrebuiltKernel& operator=(const PrebuiltKernel&) = delete;

  // What the manifest says (constexprs, parameters).
  const PrebuiltManifest& manifest() const { return manifest_; }
  // The variant's name, as errors give it.
  const std::string& name() const { return name_; }

  // Launches `grid` programs on `stream` with `args`, one per runtime argument in the kernel's
  // order. Throws, naming the argument and its rule, when one does not fit the compiled variant.
  void launch(const std::array<unsigned, 3>& grid, CUstream stream, std::initializer_list<ParamValue> args);

 private:
  // Hands the module back to the runtime, then unloads it.
  struct ModuleUnloader {
    void operator()(CUmod_st* module) const noexcept;
  };

  std::string name_;
  int rank_;
  PrebuiltManifest manifest_;
  std::unique_ptr<CUmod_st, ModuleUnloader> module_;
  std::unique_ptr<KernelLauncher> launcher_;
};

}  // namespace tdist
