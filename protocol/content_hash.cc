#include "protocol/content_hash.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>

namespace toolhost::protocol {

namespace {

constexpr char kBase64UrlAlphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

// 32 bytes are 256 bits: 42 full sextets and 4 bits in the last character.
constexpr std::size_t kDigestBytes = 32;
constexpr std::size_t kEncodedDigestChars = 43;

// Value of a base64url character, or -1.
int base64UrlValue(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

std::array<unsigned char, kDigestBytes> sha256(std::string_view domainTag,
                                               std::string_view canonical) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  std::array<unsigned char, kDigestBytes> digest{};
  unsigned int length = 0;
  const char separator = '\0';
  // SHA-256 only fails on allocation failure or a broken OpenSSL install: a bug, not an outcome.
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(context.get(), domainTag.data(), domainTag.size()) != 1 ||
      EVP_DigestUpdate(context.get(), &separator, 1) != 1 ||
      EVP_DigestUpdate(context.get(), canonical.data(), canonical.size()) != 1 ||
      EVP_DigestFinal_ex(context.get(), digest.data(), &length) != 1 || length != kDigestBytes) {
    throw std::runtime_error("OpenSSL SHA-256 failed");
  }
  return digest;
}

}  // namespace

std::string base64UrlEncode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() * 4 + 2) / 3);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t group = (std::uint32_t{data[i]} << 16) | (std::uint32_t{data[i + 1]} << 8) |
                                std::uint32_t{data[i + 2]};
    out.push_back(kBase64UrlAlphabet[(group >> 18) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[(group >> 12) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[(group >> 6) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[group & 0x3F]);
  }
  const std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    const std::uint32_t group = std::uint32_t{data[i]} << 16;
    out.push_back(kBase64UrlAlphabet[(group >> 18) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[(group >> 12) & 0x3F]);
  } else if (rest == 2) {
    const std::uint32_t group = (std::uint32_t{data[i]} << 16) | (std::uint32_t{data[i + 1]} << 8);
    out.push_back(kBase64UrlAlphabet[(group >> 18) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[(group >> 12) & 0x3F]);
    out.push_back(kBase64UrlAlphabet[(group >> 6) & 0x3F]);
  }
  return out;
}

std::string contentHashOfCanonical(std::string_view domainTag, std::string_view canonical) {
  const auto digest = sha256(domainTag, canonical);
  std::string hash(kHashPrefix);
  hash += base64UrlEncode(
      std::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
  return hash;
}

boost::system::result<std::string, CanonicalJsonError> contentHash(
    std::string_view domainTag, const boost::json::value& value) {
  auto canonical = canonicalJson(value);
  if (!canonical) return canonical.error();
  return {boost::system::in_place_value, contentHashOfCanonical(domainTag, *canonical)};
}

bool isContentHash(std::string_view text) {
  if (text.size() != kHashPrefix.size() + kEncodedDigestChars || !text.starts_with(kHashPrefix)) {
    return false;
  }
  const std::string_view encoded = text.substr(kHashPrefix.size());
  for (char c : encoded) {
    if (base64UrlValue(c) < 0) return false;
  }
  // The last character carries the digest's final 4 bits; its 2 low bits are padding and must be
  // zero, or two spellings would name the same digest.
  return (base64UrlValue(encoded.back()) & 0x3) == 0;
}

std::string keyedDigest(std::string_view key, std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest.data(),
           &length) == nullptr) {
    throw std::runtime_error("HMAC-SHA-256 failed");
  }
  return base64UrlEncode(std::string_view(reinterpret_cast<const char*>(digest.data()), length));
}

std::string randomBytes(std::size_t count) {
  std::string out(count, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(count)) != 1) {
    throw std::runtime_error("the system's random number generator gave no bytes");
  }
  return out;
}

}  // namespace toolhost::protocol
