// Content hashes: "sha256:" + base64url (no padding, 43 characters) of SHA-256 over a domain
// tag, one NUL byte, and the RFC 8785 canonical JSON of the value. Pure functions; any thread.
#pragma once

#include <boost/json/value.hpp>
#include <boost/system/result.hpp>

#include "protocol/json_text.h"

#include <cstddef>
#include <string>
#include <string_view>

namespace toolhost::protocol {

namespace domain {
inline constexpr std::string_view kToolManifest = "toolhost.tool-manifest.v1";
inline constexpr std::string_view kToolSettings = "toolhost.tool-settings.v1";
inline constexpr std::string_view kTask = "toolhost.task.v1";
}  // namespace domain

inline constexpr std::string_view kHashPrefix = "sha256:";

boost::system::result<std::string, CanonicalJsonError> contentHash(std::string_view domainTag,
                                                                   const boost::json::value& value);

// Hash of already-canonical bytes (the caller vouches they are canonical JSON).
std::string contentHashOfCanonical(std::string_view domainTag, std::string_view canonical);

// True for "sha256:" followed by exactly 43 base64url characters that decode to 32 bytes.
bool isContentHash(std::string_view text);

// base64url without padding, for any bytes.
std::string base64UrlEncode(std::string_view bytes);

// base64url (no padding) of HMAC-SHA-256 of `bytes` under `key`.
std::string keyedDigest(std::string_view key, std::string_view bytes);

// `count` bytes from OpenSSL's CSPRNG; std::runtime_error when it has none to give.
std::string randomBytes(std::size_t count);

}  // namespace toolhost::protocol
