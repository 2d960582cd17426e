#include "tdist/prebuilt_kernel.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

#include "tdist/cuda_driver.h"
#include "tdist/error.h"
#include "tdist/module_ptx.h"
#include "tdist/runtime.h"

namespace tdist {
namespace {

std::string op_of(const std::string& kernel) { return "prebuilt kernel " + kernel; }

// What every manifest error ends with: the files come from the tool, so the fix is running it.
std::string rebuild_hint(const std::string& kernel) {
  return "; write the files again with python -m triton_dist.tools.prebuild --out <dir> --world <ranks> " + kernel;
}

std::vector<std::string> split_words(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

template <typename Int>
bool parse_int(const std::string& text, Int& value) {
  const char* last = text.data() + text.size();
  auto [end, error] = std::from_chars(text.data(), last, value);
  return error == std::errc() && end == last;
}

// Reads a whole file; throws naming the file and the fix when it cannot.
std::string read_file(const std::string& path, const std::string& kernel, int rank) {
  std::ifstream file(path, std::ios::binary);
  TDIST_CHECK(file.good(), rank, op_of(kernel), "cannot read " << path << rebuild_hint(kernel));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// How pack() sees a value, for the message when it does not fit.
const char* kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::kPointer: return "a pointer";
    case ParamKind::kInt1: return "an i1";
    case ParamKind::kInt8: return "an i8";
    case ParamKind::kInt16: return "an i16";
    case ParamKind::kInt32: return "an i32";
    case ParamKind::kInt64: return "an i64";
    case ParamKind::kUInt8: return "a u8";
    case ParamKind::kUInt16: return "a u16";
    case ParamKind::kUInt32: return "a u32";
    case ParamKind::kUInt64: return "a u64";
    case ParamKind::kFloat32: return "an fp32";
    case ParamKind::kFloat64: return "an fp64";
    case ParamKind::kConstant: return "a constant";
    case ParamKind::kTensorMap: return "a tensor descriptor";
  }
  return "an unknown kind";
}

}  // namespace

std::int64_t PrebuiltManifest::constexpr_int(const std::string& key, const std::string& kernel, int rank) const {
  auto found = constexprs.find(key);
  TDIST_CHECK(found != constexprs.end(), rank, op_of(kernel),
              "the manifest has no constexpr " << key << "; is this the kernel you meant?");
  std::int64_t value = 0;
  TDIST_CHECK(parse_int(found->second, value), rank, op_of(kernel),
              "constexpr " << key << " is '" << found->second << "', not an integer");
  return value;
}

PrebuiltManifest parse_prebuilt_manifest(const std::string& text, const std::string& kernel, int rank) {
  const std::string op = op_of(kernel);
  PrebuiltManifest m;
  std::map<std::string, std::string> singles;  // key -> value of the one-per-manifest entries
  std::int64_t declared_params = -1;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::vector<std::string> words = split_words(line);
    if (words.empty() || words[0][0] == '#') continue;
    const std::string& key = words[0];
    if (key == "param") {
      TDIST_CHECK(words.size() == 4, rank, op,
                  "manifest line " << number << ": 'param' takes a name, a type and D, - or a constant, got '" << line
                                   << "'" << rebuild_hint(kernel));
      ParamRule rule;
      try {
        rule.kind = param_kind_of(words[2]);
      } catch (const Error&) {
        TDIST_FAIL(rank, op, "manifest line " << number << ": parameter " << words[1] << " has type '" << words[2]
                                              << "', which the C++ launcher does not pass (pointers, integers, fp32, "
                                                 "fp64 and folded constants); this kernel cannot be prebuilt");
      }
      const std::string& spec = words[3];
      if (rule.kind == ParamKind::kConstant) {
        rule.constant_is_none = spec == "none";
        TDIST_CHECK(rule.constant_is_none || parse_int(spec, rule.constant), rank, op,
                    "manifest line " << number << ": folded parameter " << words[1] << " has value '" << spec
                                     << "', neither an integer nor none" << rebuild_hint(kernel));
      } else {
        TDIST_CHECK(spec == "D" || spec == "-", rank, op,
                    "manifest line " << number << ": parameter " << words[1] << " is marked '" << spec
                                     << "', neither D (divisible by 16) nor -" << rebuild_hint(kernel));
        rule.divisible_by_16 = spec == "D";
      }
      m.param_names.push_back(words[1]);
      m.param_types.push_back(words[2]);
      m.rules.push_back(rule);
      continue;
    }
    if (key == "constexpr") {
      TDIST_CHECK(words.size() == 3, rank, op,
                  "manifest line " << number << ": 'constexpr' takes a name and a value" << rebuild_hint(kernel));
      TDIST_CHECK(m.constexprs.emplace(words[1], words[2]).second, rank, op,
                  "manifest line " << number << ": constexpr " << words[1] << " is given twice"
                                   << rebuild_hint(kernel));
      continue;
    }
    static const char* const kSingles[] = {"tdist-prebuilt", "symbol", "threads", "shared", "cooperative", "pdl",
                                           "params"};
    bool known = false;
    for (const char* single : kSingles) known = known || key == single;
    TDIST_CHECK(known, rank, op,
                "manifest line " << number << ": unknown entry '" << key << "'" << rebuild_hint(kernel));
    TDIST_CHECK(words.size() == 2 && singles.count(key) == 0, rank, op,
                "manifest line " << number << ": '" << key << "' must appear once, with one value"
                                 << rebuild_hint(kernel));
    singles[key] = words[1];
  }

  for (const char* required : {"tdist-prebuilt", "symbol", "threads", "shared", "cooperative", "pdl", "params"}) {
    TDIST_CHECK(singles.count(required) == 1, rank, op,
                "the manifest has no '" << required << "' line" << rebuild_hint(kernel));
  }
  int version = 0;
  TDIST_CHECK(parse_int(singles["tdist-prebuilt"], version) && version == kPrebuiltManifestVersion, rank, op,
              "the manifest is format '" << singles["tdist-prebuilt"] << "', this libtdist reads format "
                                         << kPrebuiltManifestVersion << rebuild_hint(kernel));
  m.symbol = singles["symbol"];
  auto number_of = [&](const char* key, unsigned& value) {
    TDIST_CHECK(parse_int(singles[key], value), rank, op,
                "the manifest's '" << key << "' is '" << singles[key] << "', not a count" << rebuild_hint(kernel));
  };
  auto flag_of = [&](const char* key, bool& value) {
    TDIST_CHECK(singles[key] == "0" || singles[key] == "1", rank, op,
                "the manifest's '" << key << "' is '" << singles[key] << "', not 0 or 1" << rebuild_hint(kernel));
    value = singles[key] == "1";
  };
  number_of("threads", m.shape.block_threads);
  number_of("shared", m.shape.shared_bytes);
  flag_of("cooperative", m.shape.cooperative);
  flag_of("pdl", m.shape.programmatic_serialization);
  TDIST_CHECK(parse_int(singles["params"], declared_params) && declared_params >= 0, rank, op,
              "the manifest's 'params' is '" << singles["params"] << "', not a count" << rebuild_hint(kernel));
  TDIST_CHECK(static_cast<std::size_t>(declared_params) == m.rules.size(), rank, op,
              "the manifest declares " << declared_params << " parameters but lists " << m.rules.size()
                                       << " (a truncated or hand-edited file?)" << rebuild_hint(kernel));
  return m;
}

std::string argument_misfit(const ParamRule& rule, const std::string& type, const ParamValue& v) {
  Message why;
  switch (argument_fit(rule, v)) {
    case ArgumentFit::kFits:
      break;
    case ArgumentFit::kOtherConstant:
      if (rule.constant_is_none) {
        why << "the kernel was compiled with None here: pass none_arg()";
      } else {
        why << "the kernel was compiled with the constant " << rule.constant << " here: pass exactly that";
      }
      break;
    case ArgumentFit::kNoneGiven:
      why << "None given where the kernel takes " << type;
      break;
    case ArgumentFit::kOtherKind:
      why << kind_name(v.kind) << " given where the kernel takes " << type;
      break;
    case ArgumentFit::kNotDivisibleBy16:
      why << v.integer << " is not a multiple of 16, which the kernel was compiled to assume"
          << (rule.kind == ParamKind::kPointer ? " (pass a 16-byte aligned address)" : "");
      break;
    case ArgumentFit::kOtherRank:
      why << "a tensor descriptor of rank " << v.rank << " given where the kernel takes rank " << rule.tensor_map.rank;
      break;
  }
  return why.str();
}

ParamValue pointer_arg(const void* address) {
  const auto bits = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(address));
  return {ParamValue::Type::kValue, ParamKind::kPointer, bits, 0.0};
}
ParamValue i32_arg(std::int32_t value) { return {ParamValue::Type::kValue, ParamKind::kInt32, value, 0.0}; }
ParamValue i64_arg(std::int64_t value) { return {ParamValue::Type::kValue, ParamKind::kInt64, value, 0.0}; }
ParamValue f32_arg(float value) { return {ParamValue::Type::kValue, ParamKind::kFloat32, 0, value}; }
ParamValue none_arg() { return {}; }

void PrebuiltKernel::ModuleUnloader::operator()(CUmod_st* module) const noexcept {
  // A destructor must not throw: a failure here can only leak the module, so it is reported.
  try {
    Runtime::release_module(module);
    const CUresult unloaded = CudaDriver::get().module_unload(module);
    if (unloaded != CUDA_SUCCESS) std::fprintf(stderr, "triton_dist: cuModuleUnload failed (CUresult %d)\n", unloaded);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "triton_dist: unloading a prebuilt kernel: %s\n", error.what());
  }
}

PrebuiltKernel::PrebuiltKernel(const std::string& dir, const std::string& name) : name_(name), rank_(-1) {
  TDIST_CHECK(Runtime::initialized(), -1, op_of(name),
              "the runtime is not initialised; call tdist::Runtime::init before loading prebuilt kernels");
  Runtime& runtime = Runtime::get();
  rank_ = runtime.rank();
  const std::string stem = dir + "/" + name;
  manifest_ = parse_prebuilt_manifest(read_file(stem + ".manifest", name, rank_), name, rank_);
  const std::string cubin = read_file(stem + ".cubin", name, rank_);
  const std::string ptx = read_file(stem + ".ptx", name, rank_);

  const CudaDriver& driver = CudaDriver::get();
  CUmodule module = nullptr;
  check_cuda(driver.module_load_data(&module, cubin.data()), rank_, op_of(name),
             "cuModuleLoadData (is a CUDA context current, and the GPU sm_90?)");
  module_.reset(module);
  runtime.initialize_module(module, ModulePtx(ptx));
  CUfunction function = nullptr;
  check_cuda(driver.module_get_function(&function, module, manifest_.symbol.c_str()), rank_, op_of(name),
             "cuModuleGetFunction (the manifest's symbol is not in the cubin: are the files from one prebuild?)");
  // Past 48 KiB a kernel's dynamic shared memory must be asked for (Triton's loader does it for
  // the modules it loads; this one is ours).
  const unsigned shared = manifest_.shape.shared_bytes;
  if (shared > 48 * 1024) {
    check_cuda(driver.func_set_attribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         static_cast<int>(shared)),
               rank_, op_of(name), "cuFuncSetAttribute (more shared memory than this GPU gives a block?)");
  }
  launcher_ = std::make_unique<KernelLauncher>(name, rank_, function, manifest_.rules, manifest_.shape);
}

PrebuiltKernel::~PrebuiltKernel() = default;

void PrebuiltKernel::launch(const std::array<unsigned, 3>& grid, CUstream stream,
                            std::initializer_list<ParamValue> args) {
  const std::size_t n = manifest_.rules.size();
  if (args.size() != n) {
    Message names;
    for (std::size_t i = 0; i < n; ++i) names << (i ? ", " : "") << manifest_.param_names[i];
    TDIST_FAIL(rank_, op_of(name_), args.size() << " arguments given, the kernel takes " << n << ": " << names.str());
  }
  if (launcher_->launch(grid.data(), stream, args.begin(), n)) return;
  const ParamValue* values = args.begin();
  for (std::size_t i = 0; i < n; ++i) {
    const std::string why = argument_misfit(manifest_.rules[i], manifest_.param_types[i], values[i]);
    TDIST_CHECK(why.empty(), rank_, op_of(name_), "argument " << i << " (" << manifest_.param_names[i] << "): " << why);
  }
  TDIST_FAIL(rank_, op_of(name_), "the arguments do not fit the compiled variant");
}

}  // namespace tdist
