#include "policy/access_class.h"

#include <array>

namespace toolhost::policy {

namespace {

bool equalsIgnoringAsciiCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

std::string_view accessClassName(AccessClass access) {
  return access == AccessClass::read ? "read" : "write";
}

std::string normalizeMethod(std::string_view method) {
  // Not PATCH: the Fetch standard leaves it alone, so fetch(url, {method: "patch"}) sends "patch".
  // It is write either way.
  static constexpr std::array<std::string_view, 6> kNormalized = {"DELETE",  "GET",  "HEAD",
                                                                  "OPTIONS", "POST", "PUT"};
  for (std::string_view standard : kNormalized) {
    if (equalsIgnoringAsciiCase(method, standard)) return std::string(standard);
  }
  return std::string(method);
}

AccessClass accessClassOf(std::string_view method) {
  const std::string normalized = normalizeMethod(method);
  if (normalized == "GET" || normalized == "HEAD" || normalized == "OPTIONS") {
    return AccessClass::read;
  }
  return AccessClass::write;
}

}  // namespace toolhost::policy
