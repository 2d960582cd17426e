// A loaded module's PTX, as far as module set-up needs it: which globals the module declares.
// Looking up a global that a module lacks fails with CUDA_ERROR_NOT_FOUND, and compute-sanitizer
// reports every such failure as an API error, so set-up asks the PTX first and looks up only the
// globals it names.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

namespace tdist {

class ModulePtx {
 public:
  // The PTX at `path` (Triton's cached copy of the module's code); unknown when `path` is empty or
  // unreadable, and then every global may be declared.
  static ModulePtx from_file(const std::string& path) {
    if (path.empty()) return ModulePtx();
    std::ifstream file(path, std::ios::binary);
    if (!file) return ModulePtx();
    std::ostringstream text;
    text << file.rdbuf();
    return ModulePtx(text.str());
  }

  // Unknown code: every global may be declared.
  ModulePtx() = default;
  explicit ModulePtx(std::string text) : text_(std::move(text)) {}

  // False only when the PTX is known and never names `global`.
  bool may_declare(std::string_view global) const {
    return !text_ || text_->find(global) != std::string::npos;
  }

 private:
  std::optional<std::string> text_;
};

}  // namespace tdist
