#include "runtime/module_specifier.h"

#include <vector>

namespace toolhost::runtime {

std::optional<std::string> resolveModuleSpecifier(std::string_view importer,
                                                  std::string_view specifier) {
  if (specifier.empty() || specifier.size() > 1024) return std::nullopt;
  if (specifier.find(':') != std::string_view::npos ||
      specifier.find('\\') != std::string_view::npos ||
      specifier.find('\0') != std::string_view::npos) {
    return std::nullopt;
  }
  std::vector<std::string_view> parts;
  const bool relative = specifier.starts_with("./") || specifier.starts_with("../");
  if (relative) {
    // The importer's folder: everything before its last '/'.
    auto slash = importer.rfind('/');
    std::string_view folder = slash == std::string_view::npos ? "" : importer.substr(0, slash);
    while (!folder.empty()) {
      auto next = folder.find('/');
      parts.push_back(folder.substr(0, next));
      if (next == std::string_view::npos) break;
      folder.remove_prefix(next + 1);
    }
  } else if (specifier.starts_with('/')) {
    specifier.remove_prefix(1);
  }
  while (true) {
    auto next = specifier.find('/');
    std::string_view part = specifier.substr(0, next);
    if (part.empty()) return std::nullopt;
    if (part == "..") {
      if (parts.empty()) return std::nullopt;
      parts.pop_back();
    } else if (part != ".") {
      parts.push_back(part);
    }
    if (next == std::string_view::npos) break;
    specifier.remove_prefix(next + 1);
  }
  if (parts.empty()) return std::nullopt;
  std::string out;
  for (auto part : parts) {
    if (!out.empty()) out += '/';
    out += part;
  }
  return out;
}

}  // namespace toolhost::runtime
