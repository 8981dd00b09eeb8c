#include "policy/destination.h"

#include <boost/throw_exception.hpp>
#include <boost/url/ipv4_address.hpp>
#include <boost/url/ipv6_address.hpp>
#include <boost/url/parse.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <stdexcept>
#include <utility>
#include <vector>

namespace toolhost::policy {

namespace ip = boost::asio::ip;

namespace {

// ---------------------------------------------------------------------------------------------
// Special-purpose addresses.
//
// IPv4: IANA "IPv4 Special-Purpose Address Registry" (RFC 6890 and its updates) plus multicast.
// Everything here is refused. A few entries the registry marks globally reachable (192.0.0.9 and
// 192.0.0.10 inside 192.0.0.0/24, the 192.88.99.0/24 relay anycast) are refused with their block
// anyway: no tool has a reason to fetch from them. The registry's other globally reachable entries
// (AS112 192.31.196.0/24 and 192.175.48.0/24, AMT 192.52.193.0/24) are ordinary destinations.

struct V4Range {
  std::uint32_t network;
  unsigned length;
  std::string_view kind;
};

constexpr std::uint32_t v4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return (a << 24) | (b << 16) | (c << 8) | d;
}

// First match wins, so broadcast is named before 240.0.0.0/4 contains it.
constexpr std::array<V4Range, 16> kV4Ranges{{
    // RFC 919, RFC 8190: limited broadcast.
    {v4(255, 255, 255, 255), 32, "broadcast"},
    // RFC 791: "this network". Linux connects 0.0.0.0 to the local host.
    {v4(0, 0, 0, 0), 8, "this network"},
    // RFC 1918: private-use.
    {v4(10, 0, 0, 0), 8, "private"},
    // RFC 6598: shared address space (carrier-grade NAT); Alibaba Cloud's metadata server is
    // 100.100.100.200.
    {v4(100, 64, 0, 0), 10, "shared (CGNAT)"},
    // RFC 1122: loopback.
    {v4(127, 0, 0, 0), 8, "loopback"},
    // RFC 3927: link-local; the metadata servers of AWS, Google Cloud, Azure, Oracle,
    // DigitalOcean, OpenStack... answer at 169.254.169.254.
    {v4(169, 254, 0, 0), 16, "link-local (cloud metadata)"},
    // RFC 1918: private-use.
    {v4(172, 16, 0, 0), 12, "private"},
    // RFC 6890: IETF protocol assignments (DS-Lite, NAT64 discovery, PCP and TURN anycast...).
    {v4(192, 0, 0, 0), 24, "IETF protocol assignments"},
    // RFC 5737: TEST-NET-1.
    {v4(192, 0, 2, 0), 24, "documentation (TEST-NET-1)"},
    // RFC 7526: deprecated 6to4 relay anycast; reaches whichever relay is nearest.
    {v4(192, 88, 99, 0), 24, "6to4 relay anycast"},
    // RFC 1918: private-use.
    {v4(192, 168, 0, 0), 16, "private"},
    // RFC 2544: benchmarking, never routed on the Internet; used on internal networks.
    {v4(198, 18, 0, 0), 15, "benchmarking"},
    // RFC 5737: TEST-NET-2.
    {v4(198, 51, 100, 0), 24, "documentation (TEST-NET-2)"},
    // RFC 5737: TEST-NET-3.
    {v4(203, 0, 113, 0), 24, "documentation (TEST-NET-3)"},
    // RFC 5771: multicast; not a unicast destination.
    {v4(224, 0, 0, 0), 4, "multicast"},
    // RFC 1112: reserved for future use (class E).
    {v4(240, 0, 0, 0), 4, "reserved"},
}};

bool inV4Range(std::uint32_t address, std::uint32_t network, unsigned length) {
  if (length == 0) return true;
  if (length > 32) return false;
  const std::uint32_t mask = length == 32 ? 0xffffffffU : ~(0xffffffffU >> length);
  return (address & mask) == network;
}

std::string formatV4(std::uint32_t address) {
  return std::to_string(address >> 24) + '.' + std::to_string((address >> 16) & 0xff) + '.' +
         std::to_string((address >> 8) & 0xff) + '.' + std::to_string(address & 0xff);
}

// "loopback 127.0.0.0/8" for a blocked IPv4 address; nullopt for a public one.
std::optional<std::string> findV4Range(std::uint32_t address) {
  for (const V4Range& range : kV4Ranges) {
    if (inV4Range(address, range.network, range.length)) {
      return std::string(range.kind) + ' ' + formatV4(range.network) + '/' +
             std::to_string(range.length);
    }
  }
  return std::nullopt;
}

// IPv6: IANA "IPv6 Special-Purpose Address Registry" (RFC 6890 and its updates) plus multicast,
// site-local, and everything outside global unicast 2000::/3 (IANA "IPv6 Address Space": the
// rest is reserved by the IETF). Forms that embed an IPv4 address are judged by that address.

enum class Embedding {
  none,
  mapped,      // ::ffff:a.b.c.d, the last 32 bits
  compatible,  // ::a.b.c.d, the last 32 bits
  nat64,       // 64:ff9b::a.b.c.d (RFC 6052 /96 prefix), the last 32 bits
  sixToFour,   // 2002:AABB:CCDD::/48, bits 16-47
  teredo,      // 2001:0:server:flags:port:client, the client is the last 32 bits XOR 1s
};

using V6Bytes = std::array<unsigned char, 16>;

struct V6Range {
  std::array<std::uint16_t, 8> network;
  unsigned length;
  std::string_view name;  // "kind prefix", as shown
  Embedding embedding = Embedding::none;
};

// First match wins: ::/128 and ::1/128 before the ::/96 IPv4-compatible block that contains them,
// Teredo before 2001::/23.
const std::array<V6Range, 18> kV6Ranges{{
    // RFC 4291: unspecified; like 0.0.0.0, connecting to it reaches the local host.
    {{0, 0, 0, 0, 0, 0, 0, 0}, 128, "unspecified ::/128"},
    // RFC 4291: loopback.
    {{0, 0, 0, 0, 0, 0, 0, 1}, 128, "loopback ::1/128"},
    // RFC 4291: IPv4-mapped; a dual-stack socket sends these to the IPv4 address itself.
    {{0, 0, 0, 0, 0, 0xffff, 0, 0}, 96, "IPv4-mapped IPv6", Embedding::mapped},
    // RFC 4291 2.5.5.1: IPv4-compatible (deprecated); judged by the IPv4 inside, since a host
    // with a configured automatic tunnel would deliver it there.
    {{0, 0, 0, 0, 0, 0, 0, 0}, 96, "IPv4-compatible IPv6", Embedding::compatible},
    // RFC 6052: NAT64 well-known prefix; the translator connects to the IPv4 inside.
    {{0x64, 0xff9b, 0, 0, 0, 0, 0, 0}, 96, "NAT64 IPv6 (64:ff9b::/96)", Embedding::nat64},
    // RFC 8215: local-use NAT64; a local translation domain whose IPv4 may sit anywhere in it.
    {{0x64, 0xff9b, 1, 0, 0, 0, 0, 0}, 48, "local-use NAT64 64:ff9b:1::/48"},
    // RFC 6666: discard-only.
    {{0x100, 0, 0, 0, 0, 0, 0, 0}, 64, "discard-only 100::/64"},
    // RFC 4380: Teredo; relays deliver to the client IPv4 inside. Refused whatever it embeds (the
    // embedded client only sharpens the message): Teredo is obsolete and part of 2001::/23.
    {{0x2001, 0, 0, 0, 0, 0, 0, 0}, 32, "Teredo IPv6 (2001::/32)", Embedding::teredo},
    // RFC 2928, RFC 6890: IETF protocol assignments (benchmarking 2001:2::/48, AMT, AS112,
    // ORCHIDv2...). Refused as a whole, the few globally reachable anycast entries included:
    // simple and safe.
    {{0x2001, 0, 0, 0, 0, 0, 0, 0}, 23, "IETF protocol assignments 2001::/23"},
    // RFC 3849: documentation.
    {{0x2001, 0xdb8, 0, 0, 0, 0, 0, 0}, 32, "documentation 2001:db8::/32"},
    // RFC 3056: 6to4; the relay delivers to the IPv4 router in bits 16-47. Judged by it: a 6to4
    // address of a public IPv4 is an ordinary destination.
    {{0x2002, 0, 0, 0, 0, 0, 0, 0}, 16, "6to4 IPv6 (2002::/16)", Embedding::sixToFour},
    // RFC 9637: documentation.
    {{0x3fff, 0, 0, 0, 0, 0, 0, 0}, 20, "documentation 3fff::/20"},
    // RFC 9602: SRv6 segment identifiers, internal to an SR domain.
    {{0x5f00, 0, 0, 0, 0, 0, 0, 0}, 16, "SRv6 SIDs 5f00::/16"},
    // RFC 4193: unique local (the private ranges of IPv6; AWS's IPv6 metadata is fd00:ec2::254).
    {{0xfc00, 0, 0, 0, 0, 0, 0, 0}, 7, "unique local fc00::/7"},
    // RFC 4291: link-local unicast.
    {{0xfe80, 0, 0, 0, 0, 0, 0, 0}, 10, "link-local fe80::/10"},
    // RFC 3879: site-local (deprecated, still routed inside some sites).
    {{0xfec0, 0, 0, 0, 0, 0, 0, 0}, 10, "site-local fec0::/10"},
    // RFC 4291: multicast.
    {{0xff00, 0, 0, 0, 0, 0, 0, 0}, 8, "multicast ff00::/8"},
    // IANA IPv6 Address Space: only 2000::/3 is allocated for global unicast; the rest (apart
    // from the blocks above) is reserved by the IETF. Checked last as "outside 2000::/3".
    {{0x2000, 0, 0, 0, 0, 0, 0, 0}, 3, ""},
}};

V6Bytes v6Bytes(const std::array<std::uint16_t, 8>& groups) {
  V6Bytes bytes{};
  for (std::size_t i = 0; i < 8; ++i) {
    bytes[2 * i] = static_cast<unsigned char>(groups[i] >> 8);
    bytes[2 * i + 1] = static_cast<unsigned char>(groups[i] & 0xff);
  }
  return bytes;
}

bool inPrefix(const V6Bytes& address, const V6Bytes& network, unsigned length) {
  for (unsigned bit = 0; bit < length; bit += 8) {
    const std::size_t i = bit / 8;
    const unsigned bits = length - bit >= 8 ? 8 : length - bit;
    const auto mask = static_cast<unsigned char>(0xff << (8 - bits));
    if ((address[i] & mask) != (network[i] & mask)) return false;
  }
  return true;
}

std::uint32_t v4At(const V6Bytes& bytes, std::size_t offset) {
  return (std::uint32_t{bytes[offset]} << 24) | (std::uint32_t{bytes[offset + 1]} << 16) |
         (std::uint32_t{bytes[offset + 2]} << 8) | std::uint32_t{bytes[offset + 3]};
}

std::string formatV6(const V6Bytes& bytes) {
  std::array<std::uint16_t, 8> groups{};
  for (std::size_t i = 0; i < 8; ++i) {
    groups[i] = static_cast<std::uint16_t>((bytes[2 * i] << 8) | bytes[2 * i + 1]);
  }
  // The first longest run of two or more zero groups becomes "::" (RFC 5952 4.2).
  std::size_t bestStart = 8;
  std::size_t bestLength = 1;
  for (std::size_t i = 0; i < 8;) {
    if (groups[i] != 0) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < 8 && groups[end] == 0) ++end;
    if (end - i > bestLength) {
      bestStart = i;
      bestLength = end - i;
    }
    i = end;
  }
  static constexpr std::string_view kHex = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < 8; ++i) {
    if (i == bestStart) {
      out += i == 0 ? "::" : ":";
      i += bestLength - 1;
      continue;
    }
    std::string group;
    for (std::uint16_t value = groups[i]; value != 0 || group.empty(); value >>= 4) {
      group.insert(group.begin(), kHex[value & 0xf]);
    }
    out += group;
    if (i != 7) out += ':';
  }
  return out;
}

// The special-purpose range a blocked IPv6 address is in, described; nullopt for a public one.
std::optional<std::string> findV6Range(const V6Bytes& address) {
  for (const V6Range& range : kV6Ranges) {
    const bool inside = inPrefix(address, v6Bytes(range.network), range.length);
    if (range.name.empty()) {  // the global unicast check, last
      if (inside) return std::nullopt;
      return "reserved " + formatV6(address) + " (outside global unicast 2000::/3)";
    }
    if (!inside) continue;
    switch (range.embedding) {
      case Embedding::none:
        return std::string(range.name);
      case Embedding::mapped:
      case Embedding::compatible:
      case Embedding::nat64: {
        const std::uint32_t inner = v4At(address, 12);
        auto innerRange = findV4Range(inner);
        if (!innerRange) return std::nullopt;
        return std::string(range.name) + " of " + formatV4(inner) + " (" + *innerRange + ')';
      }
      case Embedding::sixToFour: {
        const std::uint32_t inner = v4At(address, 2);
        auto innerRange = findV4Range(inner);
        if (!innerRange) return std::nullopt;
        return std::string(range.name) + " of " + formatV4(inner) + " (" + *innerRange + ')';
      }
      case Embedding::teredo: {
        const std::uint32_t client = v4At(address, 12) ^ 0xffffffffU;
        auto innerRange = findV4Range(client);
        if (!innerRange) return std::string(range.name);
        return std::string(range.name) + " of client " + formatV4(client) + " (" + *innerRange +
               ')';
      }
    }
  }
  return std::nullopt;  // not reached: the last entry always answers
}

std::optional<std::string> findRange(const ip::address& address) {
  if (address.is_v4()) return findV4Range(address.to_v4().to_uint());
  return findV6Range(address.to_v6().to_bytes());
}

// ---------------------------------------------------------------------------------------------
// Names.

struct BlockedName {
  std::string_view name;
  std::string_view why;
};

// Exact names, compared after lowercasing and trailing-dot removal.
constexpr std::array<BlockedName, 14> kBlockedNames{{
    // Debian's /etc/hosts aliases of ::1.
    {"ip6-localhost", "a loopback name"},
    {"ip6-loopback", "a loopback name"},
    // Google Cloud's metadata server (169.254.169.254); "metadata" through the search domain.
    {"metadata.google.internal", "a cloud metadata name (Google Cloud)"},
    {"metadata.goog", "a cloud metadata name (Google Cloud)"},
    {"metadata", "a cloud metadata name (Google Cloud)"},
    // AWS EC2's instance metadata service.
    {"instance-data", "a cloud metadata name (AWS)"},
    {"instance-data.ec2.internal", "a cloud metadata name (AWS)"},
    // Tencent Cloud's metadata service.
    {"metadata.tencentyun.com", "a cloud metadata name (Tencent Cloud)"},
    // Equinix Metal's metadata service answers on public addresses, so only its name can be
    // refused before the DNS answers are.
    {"metadata.platformequinix.com", "a cloud metadata name (Equinix Metal)"},
    {"metadata.packet.net", "a cloud metadata name (Equinix Metal)"},
    // The Kubernetes API server as pods reach it (kubernetes.default.svc.cluster.local is caught
    // by *.local).
    {"kubernetes", "the in-cluster Kubernetes API name"},
    {"kubernetes.default", "the in-cluster Kubernetes API name"},
    {"kubernetes.default.svc", "the in-cluster Kubernetes API name"},
    // Many /etc/hosts files map it to 127.0.0.1 (also caught by *.localdomain below).
    {"localhost.localdomain", "a loopback name"},
}};

// Suffixes: the name itself and every name under it.
constexpr std::array<BlockedName, 5> kBlockedSuffixes{{
    {"localhost", "a loopback name (localhost, *.localhost; RFC 6761)"},
    {"localdomain", "a local name (*.localdomain, the /etc/hosts default domain)"},
    {"local", "a multicast DNS name (*.local; RFC 6762)"},
    {"internal", "an internal name (*.internal, reserved for private use)"},
    {"home.arpa", "a home network name (*.home.arpa; RFC 8375)"},
}};

// ---------------------------------------------------------------------------------------------
// WHATWG host parsing (https://url.spec.whatwg.org/#host-parsing), for a special scheme.

// The IPv4 number parser: decimal, 0x hex, 0-prefixed octal. Saturates far above 2^32 so huge
// inputs cannot wrap into small numbers.
std::optional<std::uint64_t> parseIpv4Number(std::string_view text) {
  if (text.empty()) return std::nullopt;
  unsigned radix = 10;
  if (text.size() >= 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    radix = 16;
    text.remove_prefix(2);
  } else if (text.size() >= 2 && text[0] == '0') {
    radix = 8;
    text.remove_prefix(1);
  }
  constexpr std::uint64_t kTooBig = std::uint64_t{1} << 33;
  std::uint64_t value = 0;
  for (char c : text) {
    unsigned digit = 16;
    if (c >= '0' && c <= '9') digit = static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') digit = static_cast<unsigned>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') digit = static_cast<unsigned>(c - 'A' + 10);
    if (digit >= radix) return std::nullopt;
    value = std::min(value * radix + digit, kTooBig);
  }
  return value;
}

std::vector<std::string_view> splitDots(std::string_view text) {
  std::vector<std::string_view> parts;
  for (;;) {
    const std::size_t dot = text.find('.');
    parts.push_back(text.substr(0, dot));
    if (dot == std::string_view::npos) return parts;
    text.remove_prefix(dot + 1);
  }
}

// "Ends in a number": the last label (ignoring one trailing dot) is all digits or 0x-hex. Such a
// host is an IPv4 address or nothing.
bool endsInNumber(std::string_view host) {
  auto parts = splitDots(host);
  if (parts.back().empty()) {
    if (parts.size() == 1) return false;
    parts.pop_back();
  }
  const std::string_view last = parts.back();
  if (!last.empty() && last.find_first_not_of("0123456789") == std::string_view::npos) return true;
  return parseIpv4Number(last).has_value();
}

// The IPv4 parser: 1-4 parts, each at most 255 but the last, which fills the remaining bytes
// ("127.1", "0x7f000001").
std::optional<std::uint32_t> parseIpv4(std::string_view host) {
  auto parts = splitDots(host);
  if (parts.back().empty() && parts.size() > 1) parts.pop_back();
  if (parts.size() > 4) return std::nullopt;
  std::vector<std::uint64_t> numbers;
  for (std::string_view part : parts) {
    auto number = parseIpv4Number(part);
    if (!number) return std::nullopt;
    numbers.push_back(*number);
  }
  for (std::size_t i = 0; i + 1 < numbers.size(); ++i) {
    if (numbers[i] > 255) return std::nullopt;
  }
  const std::size_t leading = numbers.size() - 1;
  if (numbers.back() >= (std::uint64_t{1} << (8 * (4 - leading)))) return std::nullopt;
  std::uint64_t address = numbers.back();
  for (std::size_t i = 0; i < leading; ++i) address += numbers[i] << (8 * (3 - i));
  return static_cast<std::uint32_t>(address);
}

// ---------------------------------------------------------------------------------------------
// Messages.

// Input echoed in a message: printable ASCII as is, other bytes as \xNN, long input cut short.
std::string quoted(std::string_view text) {
  constexpr std::size_t kMax = 200;
  static constexpr std::string_view kHex = "0123456789abcdef";
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size() && i < kMax; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '"' && byte != '\\') {
      out += static_cast<char>(byte);
    } else {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  if (text.size() > kMax) out += "...";
  out += '"';
  return out;
}

DestinationError invalidUrl(std::string_view url, std::string_view why) {
  return {DestinationErrc::invalidUrl,
          quoted(url) + " is not a valid URL: " + std::string(why) +
              ". Pass an absolute URL such as https://example.com/path.",
          std::string(why)};
}

DestinationError blocked(std::string_view host, std::string_view why, bool address) {
  std::string reason = std::string(host) + " is " + std::string(why);
  std::string message = reason + ": fetch reaches only public hosts. Use a public https: URL";
  // Only addresses can be opened; a name is refused whatever it resolves to.
  message += address ? " (an operator can open private address ranges with [fetch] "
                       "allow_private)."
                     : ".";
  return {DestinationErrc::destinationBlocked, std::move(message),
          reason + (address ? "" : ", which fetch never reaches")};
}

// ---------------------------------------------------------------------------------------------
// The rest of the URL.

bool isAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool isAsciiDigit(char c) { return c >= '0' && c <= '9'; }
bool isHexDigit(char c) {
  return isAsciiDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
char asciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// RFC 3986 pchar without '%', plus '/' (and '?' in a query).
bool allowedInPathOrQuery(char c, bool query) {
  if (isAsciiAlpha(c) || isAsciiDigit(c)) return true;
  if (std::string_view("-._~!$&'()*+,;=:@/").find(c) != std::string_view::npos) return true;
  return query && c == '?';
}

// Percent-encodes what browsers would (space, '"', '<', '>', '`', '{', '}', non-ASCII...) and the
// few characters they send raw but RFC 3986 forbids ('|', '^', '[', ']', '\' in a query), so the
// request target is always valid; a '%' that starts no escape becomes %25. Existing escapes stay.
// A path's "." and ".." segments resolved as browsers resolve them (also written "%2e", in any
// case): "/a/../b" is sent as "/b", so that a server acts on the path the approver was shown.
std::string removeDotSegments(std::string_view path) {
  auto isDots = [](std::string_view segment, int count) {
    int seen = 0;
    while (!segment.empty()) {
      if (segment.front() == '.') {
        segment.remove_prefix(1);
      } else if (segment.size() >= 3 && segment[0] == '%' && segment[1] == '2' &&
                 (segment[2] == 'e' || segment[2] == 'E')) {
        segment.remove_prefix(3);
      } else {
        return false;
      }
      ++seen;
    }
    return seen == count;
  };
  std::vector<std::string_view> kept;
  std::string_view rest = path.substr(1);  // after the leading '/'
  for (;;) {
    const std::size_t slash = rest.find('/');
    const bool last = slash == std::string_view::npos;
    const std::string_view segment = rest.substr(0, slash);
    if (isDots(segment, 2)) {
      if (!kept.empty()) kept.pop_back();
      if (last) kept.emplace_back();
    } else if (isDots(segment, 1)) {
      if (last) kept.emplace_back();
    } else {
      kept.push_back(segment);
    }
    if (last) break;
    rest.remove_prefix(slash + 1);
  }
  std::string out;
  for (const auto segment : kept) {
    out += '/';
    out += segment;
  }
  return out.empty() ? "/" : out;
}

std::string percentEncodeLikeBrowsers(std::string_view text, bool query) {
  static constexpr std::string_view kHex = "0123456789ABCDEF";
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%' && i + 2 < text.size() && isHexDigit(text[i + 1]) && isHexDigit(text[i + 2])) {
      out += c;
    } else if (c != '%' && allowedInPathOrQuery(c, query)) {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  return out;
}

// `address` with every bit past the first `length` cleared.
ip::address withoutHostBits(const ip::address& address, unsigned length) {
  if (address.is_v4()) {
    const std::uint32_t mask =
        length == 0 ? 0 : (length >= 32 ? 0xffffffffU : ~(0xffffffffU >> length));
    return ip::address_v4(address.to_v4().to_uint() & mask);
  }
  V6Bytes bytes = address.to_v6().to_bytes();
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const unsigned firstBit = static_cast<unsigned>(i) * 8;
    if (length >= firstBit + 8) continue;
    const unsigned keep = length > firstBit ? length - firstBit : 0;
    bytes[i] &= static_cast<unsigned char>(0xff << (8 - keep));
  }
  return ip::address_v6(bytes);
}

using DestinationResult = boost::system::result<Destination, DestinationError>;

// Percent-decodes a host, refusing a '%' that starts no escape (WHATWG would keep it and then
// fail on it as a forbidden domain code point).
std::optional<std::string> percentDecode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size() || !isHexDigit(text[i + 1]) || !isHexDigit(text[i + 2])) {
      return std::nullopt;
    }
    auto hexValue = [](char c) { return isAsciiDigit(c) ? c - '0' : asciiLower(c) - 'a' + 10; };
    out += static_cast<char>(hexValue(text[i + 1]) * 16 + hexValue(text[i + 2]));
    i += 2;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Cidr::Cidr(ip::address network, unsigned prefixLength)
    : network_(std::move(network)), prefixLength_(prefixLength) {
  if (prefixLength_ > (network_.is_v4() ? 32U : 128U)) {
    throw std::invalid_argument("Cidr: prefix longer than the address");
  }
  if (withoutHostBits(network_, prefixLength_) != network_) {
    throw std::invalid_argument("Cidr: bits set past the prefix");
  }
}

bool Cidr::contains(const ip::address& address) const {
  if (address.is_v4() != network_.is_v4()) return false;
  if (address.is_v4()) {
    return inV4Range(address.to_v4().to_uint(), network_.to_v4().to_uint(), prefixLength_);
  }
  return inPrefix(address.to_v6().to_bytes(), network_.to_v6().to_bytes(), prefixLength_);
}

std::string Cidr::toString() const {
  return formatAddress(network_) + '/' + std::to_string(prefixLength_);
}

void throw_exception_from_error(const CidrError& e, const boost::source_location& loc) {
  boost::throw_exception(std::invalid_argument(e.message), loc);
}

boost::system::result<Cidr, CidrError> parseCidr(std::string_view text) {
  auto fail = [&](std::string_view why) {
    return CidrError{quoted(text) + " is not an address range: " + std::string(why) +
                     ". Write a range such as 10.1.2.0/24 or fd00:1::/64."};
  };
  const std::size_t slash = text.find('/');
  const std::string_view addressText = text.substr(0, slash);
  ip::address network;
  if (addressText.find(':') != std::string_view::npos) {
    auto parsed = boost::urls::parse_ipv6_address(addressText);
    if (!parsed) return fail("the IPv6 address is malformed (zone ids are not allowed)");
    network = ip::address_v6(parsed->to_bytes());
  } else {
    auto parsed = boost::urls::parse_ipv4_address(addressText);
    if (!parsed) {
      return fail("the IPv4 address must be four decimal numbers 0-255 without leading zeros");
    }
    network = ip::address_v4(parsed->to_uint());
  }
  const unsigned maxLength = network.is_v4() ? 32 : 128;
  unsigned length = maxLength;
  if (slash != std::string_view::npos) {
    const std::string_view lengthText = text.substr(slash + 1);
    if (lengthText.empty() || lengthText.size() > 3 ||
        lengthText.find_first_not_of("0123456789") != std::string_view::npos) {
      return fail("the prefix length after '/' must be a number");
    }
    length = 0;
    for (char c : lengthText) length = length * 10 + static_cast<unsigned>(c - '0');
    if (length > maxLength) {
      return fail("the prefix length must be at most " + std::to_string(maxLength));
    }
  }
  const ip::address masked = withoutHostBits(network, length);
  if (masked != network) {
    return fail("bits are set past the /" + std::to_string(length) +
                " prefix; that range is written " + Cidr(masked, length).toString());
  }
  return Cidr(network, length);
}

AddressRules::AddressRules(std::vector<Cidr> allowPrivate)
    : allowPrivate_(std::move(allowPrivate)) {}

AddressVerdict AddressRules::check(const ip::address& address) const {
  auto range = findRange(address);
  if (!range) return {};
  // ::ffff:10.1.2.3 is the same destination as 10.1.2.3, so 10.1.2.0/24 opens both.
  ip::address asV4 = address;
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    asV4 = ip::make_address_v4(ip::v4_mapped, address.to_v6());
  }
  for (const Cidr& opened : allowPrivate_) {
    if (opened.contains(address) || opened.contains(asV4)) {
      return {AddressStatus::allowedPrivate, std::move(*range), opened};
    }
  }
  return {AddressStatus::blocked, std::move(*range), std::nullopt};
}

std::optional<std::string> tryFindBlockedName(std::string_view canonicalHost) {
  for (const BlockedName& blockedName : kBlockedNames) {
    if (canonicalHost == blockedName.name) return std::string(blockedName.why);
  }
  for (const BlockedName& suffix : kBlockedSuffixes) {
    if (canonicalHost == suffix.name ||
        (canonicalHost.size() > suffix.name.size() && canonicalHost.ends_with(suffix.name) &&
         canonicalHost[canonicalHost.size() - suffix.name.size() - 1] == '.')) {
      return std::string(suffix.why);
    }
  }
  return std::nullopt;
}

std::string formatAddress(const ip::address& address) {
  if (address.is_v4()) return formatV4(address.to_v4().to_uint());
  return formatV6(address.to_v6().to_bytes());
}

std::string_view errorCode(DestinationErrc code) {
  switch (code) {
    case DestinationErrc::invalidUrl:
      return "invalid-url";
    case DestinationErrc::schemeNotAllowed:
      return "scheme-not-allowed";
    case DestinationErrc::credentialsInUrl:
      return "credentials-in-url";
    case DestinationErrc::destinationBlocked:
      return "destination-blocked";
  }
  return "invalid-url";
}

void throw_exception_from_error(const DestinationError& e, const boost::source_location& loc) {
  boost::throw_exception(std::invalid_argument(std::string(errorCode(e.code)) + ": " + e.message),
                         loc);
}

DestinationResult parseDestination(std::string_view url, const AddressRules& rules) {
  // Browsers strip surrounding spaces and drop tabs and newlines anywhere; refusing them keeps
  // what is checked, shown and fetched the same text.
  for (char c : url) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) return invalidUrl(url, "it contains a control character");
  }
  if (url.starts_with(' ') || url.ends_with(' ')) {
    return invalidUrl(url, "it starts or ends with a space");
  }

  // Scheme: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":".
  const std::size_t colon = url.find(':');
  const std::string_view schemeText = url.substr(0, colon);
  if (colon == std::string_view::npos || schemeText.empty() || !isAsciiAlpha(schemeText[0]) ||
      !std::all_of(schemeText.begin(), schemeText.end(), [](char c) {
        return isAsciiAlpha(c) || isAsciiDigit(c) || c == '+' || c == '-' || c == '.';
      })) {
    return invalidUrl(url, "it has no scheme (relative URLs have no base here)");
  }
  std::string scheme;
  for (char c : schemeText) scheme += asciiLower(c);
  if (scheme != "https") {
    return DestinationError{DestinationErrc::schemeNotAllowed,
                            "only https: URLs can be fetched, not " + quoted(scheme + ":") +
                                " URLs. Use an https:// URL.",
                            "only https: is allowed"};
  }

  // Authority: after "//", up to the first '/', '?', '#' (or '\', which browsers read as '/').
  std::string_view rest = url.substr(colon + 1);
  if (!rest.starts_with("//")) {
    return invalidUrl(url, "https: must be followed by \"//\" and the host");
  }
  rest.remove_prefix(2);
  const std::size_t authorityEnd = rest.find_first_of("/?#\\");
  const std::string_view authority = rest.substr(0, authorityEnd);
  std::string_view afterAuthority =
      authorityEnd == std::string_view::npos ? std::string_view() : rest.substr(authorityEnd);
  if (authority.find('@') != std::string_view::npos) {
    return DestinationError{DestinationErrc::credentialsInUrl,
                            "URLs must not carry a user name or password (the part before '@' in " +
                                quoted(authority) +
                                "). Remove it; fetch sends no credentials taken from URLs.",
                            "it carries a user name or password (a part before '@')"};
  }

  // Host and port are split here, not by Boost.URL: 1.81 reads "127.0.0.1.nip.io" as the IPv4
  // host 127.0.0.1 followed by the path ".nip.io" (boostorg/url#755, #770).
  std::string_view hostText = authority;
  std::optional<std::string_view> portText;
  if (authority.starts_with('[')) {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return invalidUrl(url, "the brackets around the IPv6 address are unbalanced");
    }
    hostText = authority.substr(1, close - 1);
    const std::string_view afterHost = authority.substr(close + 1);
    if (!afterHost.empty()) {
      if (afterHost[0] != ':') {
        return invalidUrl(url, afterHost.find(']') != std::string_view::npos
                                   ? "the brackets around the IPv6 address are unbalanced"
                                   : "only a port may follow the IPv6 address");
      }
      portText = afterHost.substr(1);
    }
  } else {
    const std::size_t portColon = authority.find(':');
    if (portColon != std::string_view::npos) {
      hostText = authority.substr(0, portColon);
      portText = authority.substr(portColon + 1);
    }
    if (hostText.find_first_of("[]") != std::string_view::npos) {
      return invalidUrl(url, "the brackets around the IPv6 address are unbalanced");
    }
  }
  if (hostText.empty()) return invalidUrl(url, "it has no host");

  Destination destination;
  if (authority.starts_with('[')) {
    if (hostText.find('%') != std::string_view::npos) {
      return invalidUrl(url, "IPv6 zone ids (\"%25eth0\") are not allowed");
    }
    if (hostText[0] == 'v' || hostText[0] == 'V') {
      return invalidUrl(url, "IPvFuture addresses ([v1.x]) are not supported");
    }
    // A '.' must follow a digit of the embedded IPv4: Boost.URL's IPv6 rule reads uninitialized
    // bytes on "[::.]" (boostorg/url#993).
    for (std::size_t i = 0; i < hostText.size(); ++i) {
      if (hostText[i] == '.' && (i == 0 || !isAsciiDigit(hostText[i - 1]))) {
        return invalidUrl(url, "the IPv6 address is malformed");
      }
    }
    auto parsed = boost::urls::parse_ipv6_address(hostText);
    if (!parsed) return invalidUrl(url, "the IPv6 address is malformed");
    destination.literal = ip::address_v6(parsed->to_bytes());
    destination.host = '[' + formatAddress(*destination.literal) + ']';
  } else {
    // WHATWG: percent-decode, map to ASCII lowercase, refuse forbidden code points, then a host
    // that ends in a number is IPv4 or nothing.
    auto decoded = percentDecode(hostText);
    if (!decoded) return invalidUrl(url, "the host has a '%' that is not a %XX escape");
    std::string host;
    for (char c : *decoded) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte >= 0x80) {
        return invalidUrl(url,
                          "non-ASCII host names must be written in their punycode form (xn--...)");
      }
      const char lower = asciiLower(c);
      if (!isAsciiAlpha(lower) && !isAsciiDigit(lower) && lower != '-' && lower != '_' &&
          lower != '.') {
        return invalidUrl(url, "the host contains " + quoted(std::string_view(&c, 1)) +
                                   "; host names have only letters, digits, '-', '_' and '.'");
      }
      host += lower;
    }
    if (endsInNumber(host)) {
      auto address = parseIpv4(host);
      if (!address) {
        return invalidUrl(
            url, "the host " + quoted(host) + " ends in a number but is not an IPv4 address");
      }
      destination.literal = ip::address_v4(*address);
      destination.host = formatV4(*address);
    } else {
      if (host.ends_with('.')) host.pop_back();
      if (host.empty()) return invalidUrl(url, "it has no host");
      if (host.size() > 253) return invalidUrl(url, "the host name is longer than 253 characters");
      for (std::string_view label : splitDots(host)) {
        if (label.empty()) return invalidUrl(url, "the host name has an empty label (\"..\")");
        if (label.size() > 63) {
          return invalidUrl(url, "a label of the host name is longer than 63 characters");
        }
      }
      destination.host = std::move(host);
    }
  }

  // An empty port (https://host:/) is the default port, as in browsers.
  if (portText && !portText->empty()) {
    if (!std::all_of(portText->begin(), portText->end(), isAsciiDigit)) {
      return invalidUrl(url, "the port must be a number from 1 to 65535");
    }
    std::uint32_t port = 0;
    for (char c : *portText) {
      port = std::min<std::uint32_t>(port * 10 + static_cast<std::uint32_t>(c - '0'), 65536);
    }
    if (port == 0 || port > 65535) {
      return invalidUrl(url, "the port must be a number from 1 to 65535");
    }
    destination.port = static_cast<std::uint16_t>(port);
  }

  // Request target: the fragment is never sent; what browsers would percent-encode is.
  afterAuthority = afterAuthority.substr(0, afterAuthority.find('#'));
  const std::size_t queryStart = afterAuthority.find('?');
  const std::string_view path = afterAuthority.substr(0, queryStart);
  if (path.find('\\') != std::string_view::npos) {
    // Browsers read '\' as '/' in https: URLs, other parsers do not: refuse the ambiguity.
    return invalidUrl(url, "it contains a backslash before the query; write '/' instead");
  }
  destination.pathAndQuery =
      path.empty() ? "/" : removeDotSegments(percentEncodeLikeBrowsers(path, false));
  if (queryStart != std::string_view::npos) {
    destination.pathAndQuery += '?';
    destination.pathAndQuery +=
        percentEncodeLikeBrowsers(afterAuthority.substr(queryStart + 1), true);
  }
  // Cannot fail after the encoding above; checked so a gap there cannot reach the wire.
  if (!boost::urls::parse_origin_form(destination.pathAndQuery)) {
    return invalidUrl(url, "the path or query is malformed");
  }

  if (!destination.literal) {
    if (auto why = tryFindBlockedName(destination.host))
      return blocked(destination.host, *why, false);
  } else {
    AddressVerdict verdict = rules.check(*destination.literal);
    if (verdict.status == AddressStatus::blocked) {
      return blocked(destination.host, "in " + verdict.range, true);
    }
    if (verdict.status == AddressStatus::allowedPrivate) {
      destination.privateRange = std::move(verdict);
    }
  }

  destination.origin = "https://" + destination.host;
  if (destination.port != 443) destination.origin += ':' + std::to_string(destination.port);
  return destination;
}

std::optional<std::string> whyNotCanonicalOrigin(std::string_view text) {
  // Every range opened: only the form is judged here, not the operator's current ranges.
  static const AddressRules everyRange({*parseCidr("0.0.0.0/0"), *parseCidr("::/0")});
  auto destination = parseDestination(text, everyRange);
  if (!destination) return destination.error().reason;
  if (destination->origin != text) {
    return "it is not written as an origin; write " + destination->origin;
  }
  return std::nullopt;
}

}  // namespace toolhost::policy
