#include "runtime/base64.h"

#include <array>

namespace toolhost::runtime {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> makeDecodeTable() {
  std::array<std::int8_t, 256> table{};
  for (auto& entry : table) entry = -1;
  for (int i = 0; i < 64; ++i)
    table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<std::int8_t>(i);
  return table;
}
constexpr auto kDecode = makeDecodeTable();

}  // namespace

int base64Sextet(char c) { return kDecode[static_cast<unsigned char>(c)]; }

std::string base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  const auto byte = [&](std::size_t at) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at]));
  };
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t triple = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    out += kAlphabet[triple >> 18 & 63];
    out += kAlphabet[triple >> 12 & 63];
    out += kAlphabet[triple >> 6 & 63];
    out += kAlphabet[triple & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    const std::uint32_t triple = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0);
    out += kAlphabet[triple >> 18 & 63];
    out += kAlphabet[triple >> 12 & 63];
    out += rest == 2 ? kAlphabet[triple >> 6 & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::size_t> base64DecodedSize(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  std::size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  return text.size() / 4 * 3 - padding;
}

bool base64Decode(std::string_view text, std::uint8_t* out) {
  if (text.size() % 4 != 0) return false;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    std::uint32_t quad = 0;
    int padding = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if (c == '=' && last && k >= 2) {
        ++padding;
        quad <<= 6;
        continue;
      }
      const std::int8_t value = kDecode[c];
      if (value < 0 || padding > 0) return false;  // not base64, or data after padding
      quad = quad << 6 | static_cast<std::uint32_t>(value);
    }
    *out++ = static_cast<std::uint8_t>(quad >> 16);
    if (padding < 2) *out++ = static_cast<std::uint8_t>(quad >> 8);
    if (padding < 1) *out++ = static_cast<std::uint8_t>(quad);
  }
  return true;
}

}  // namespace toolhost::runtime
