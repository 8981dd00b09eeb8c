// Standard base64 with padding (RFC 4648 section 4), as request and response bodies cross the
// boundary between the runtime and the CapabilityHost. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toolhost::runtime {

std::string base64Encode(std::string_view bytes);

// The value (0-63) of a character of the standard alphabet, or -1 for any other.
int base64Sextet(char c);

// The number of bytes `text` decodes to, or nullopt unless it is strict base64: length a
// multiple of 4, only the standard alphabet, '=' only as one or two final padding characters.
std::optional<std::size_t> base64DecodedSize(std::string_view text);

// Decodes `text` (already checked by base64DecodedSize) into exactly that many bytes at `out`.
// False, with `out` partly written, if `text` is not strict base64.
bool base64Decode(std::string_view text, std::uint8_t* out);

}  // namespace toolhost::runtime
