// Destination rules of the mediated fetch, checked before any prompt and any I/O: the URL parsed
// the way browsers parse it, https: only, no credentials, and hosts judged against the IANA
// special-purpose address registries and a list of internal names. The same AddressRules judge
// every DNS answer later, so a name cannot lead where a literal may not.
// Pure functions and immutable values: any thread may call them concurrently.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/assert/source_location.hpp>
#include <boost/system/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolhost::policy {

// A range of IPv4 or IPv6 addresses, e.g. 10.1.2.0/24 or fd00:ec2::/32. Host bits are zero.
class Cidr {
 public:
  // `network` must have no bits set past `prefixLength`; parseCidr() checks that for user input.
  Cidr(boost::asio::ip::address network, unsigned prefixLength);

  const boost::asio::ip::address& network() const { return network_; }
  unsigned prefixLength() const { return prefixLength_; }
  // Whether `address` is in the range. Families never mix: 10.0.0.0/8 does not contain
  // ::ffff:10.0.0.1 (AddressRules treats IPv4-mapped addresses as IPv4 before asking).
  bool contains(const boost::asio::ip::address& address) const;
  // "10.1.2.0/24", "fd00:ec2::/32".
  std::string toString() const;

  friend bool operator==(const Cidr&, const Cidr&) = default;

 private:
  boost::asio::ip::address network_;
  unsigned prefixLength_;
};

struct CidrError {
  std::string message;  // names the text and what is wrong with it, e.g. host bits past the prefix
};
[[noreturn]] void throw_exception_from_error(const CidrError& e, const boost::source_location& loc);

// Parses an operator's range: "10.1.2.0/24", "fd00::/8"; a bare address means /32 or /128. IPv4
// must be a dotted quad (no shorthand), IPv6 has no zone id, and bits past the prefix must be
// zero ("10.1.2.5/24" is refused, naming 10.1.2.0/24), so a typo cannot open more than written.
boost::system::result<Cidr, CidrError> parseCidr(std::string_view text);

enum class AddressStatus {
  allowed,         // a public address
  allowedPrivate,  // in a blocked range, but inside one the operator opened: still needs
                   // authorization, and prompts show it as private
  blocked,         // in a special-purpose range nobody opened
};

struct AddressVerdict {
  AddressStatus status = AddressStatus::allowed;
  // The special-purpose range the address is in, for messages and prompts: "loopback 127.0.0.0/8",
  // "IPv4-mapped IPv6 of 10.0.0.1 (private 10.0.0.0/8)". Empty when allowed.
  std::string range;
  // allowedPrivate: the operator's range ([fetch] allow_private) that opened it.
  std::optional<Cidr> openedBy;

  bool permitted() const { return status != AddressStatus::blocked; }
};

// Judges addresses against the IANA IPv4 and IPv6 special-purpose registries (see destination.cc
// for every range and why), with the operator's opened ranges ([fetch] allow_private) applied on
// top. Any range may be opened, loopback included: the operator lists it explicitly (tests open
// 127.0.0.1 for their local HTTPS server).
class AddressRules {
 public:
  explicit AddressRules(std::vector<Cidr> allowPrivate = {});

  // For literal hosts and for every DNS answer alike. An IPv4-mapped IPv6 address is the same
  // destination as its IPv4 address and is opened by the same ranges; the IPv4 inside the other
  // embedding forms (IPv4-compatible, NAT64, 6to4, Teredo) is judged, but opening it takes the
  // IPv6 range itself.
  AddressVerdict check(const boost::asio::ip::address& address) const;

  const std::vector<Cidr>& allowPrivate() const { return allowPrivate_; }

 private:
  std::vector<Cidr> allowPrivate_;
};

// Why a canonical host name (lowercase, no trailing dot) is blocked, e.g. "loopback name
// localhost", or nullopt for an ordinary name. Only whole labels count: "10.example.com" and
// "localhost.example.com" are ordinary names.
std::optional<std::string> tryFindBlockedName(std::string_view canonicalHost);

// An address the way URLs spell it (WHATWG serializer): IPv4 dotted quad; IPv6 lowercase hex,
// the longest run of two or more zero groups compressed (RFC 5952), no dotted tail, no brackets.
std::string formatAddress(const boost::asio::ip::address& address);

enum class DestinationErrc {
  invalidUrl,          // "invalid-url": not a URL, or a host or port no browser would accept
  schemeNotAllowed,    // "scheme-not-allowed": anything but https:
  credentialsInUrl,    // "credentials-in-url": a userinfo part, even an empty one
  destinationBlocked,  // "destination-blocked": a special-purpose address or an internal name
};

// The code a tool sees in its Error: "invalid-url", "scheme-not-allowed", ...
std::string_view errorCode(DestinationErrc code);

struct DestinationError {
  DestinationErrc code;
  std::string message;  // says what is wrong and what to do instead
  // What is wrong, without any of the URL as given (which may carry a password or a query):
  // for messages that outlive the request, such as the daemon's log.
  std::string reason;
};
[[noreturn]] void throw_exception_from_error(const DestinationError& e,
                                             const boost::source_location& loc);

struct Destination {
  std::string scheme = "https";  // always https
  // Canonical: a name in lowercase ASCII (punycode as given) without a trailing dot; an IPv4
  // dotted quad; an IPv6 address in brackets as formatAddress() writes it.
  std::string host;
  std::uint16_t port = 443;
  std::string origin;        // "https://host" or "https://host:port"; 443 is never written
  std::string pathAndQuery;  // the request target: "/" at least, percent-encoding as given
  // Set when the host is an IP literal: connect to exactly this, no DNS.
  std::optional<boost::asio::ip::address> literal;
  // Set when the literal is in a blocked range the operator opened: prompts show it as private.
  std::optional<AddressVerdict> privateRange;
};

// Checks 1-3 of the mediated fetch: parses `url` as browsers do for https: (percent-decoded,
// lowercased host; IPv4 in decimal, hex, octal and shortened forms; IPv6 with embedded IPv4;
// trailing dot), then refuses other schemes, credentials, bad ports, internal names, and literal
// addresses `rules` block. Names pass here; their DNS answers go through rules.check() later.
// Stricter than browsers where they repair input: control characters, backslashes, a missing
// "//", non-ASCII host names (give the xn-- form) and host names outside letters, digits, '-',
// '_' and '.' are invalid-url. Spaces and other characters browsers percent-encode in the path
// and query are percent-encoded; the fragment is dropped.
boost::system::result<Destination, DestinationError> parseDestination(std::string_view url,
                                                                      const AddressRules& rules);

// Whether `text` is an origin exactly as parseDestination() writes Destination::origin, the form
// manifests, decisions and secret grants must name for a fetch ever to match them: nullopt when
// it is, else why not (with the form to write instead when there is one), never quoting `text`.
// Literal addresses of every range pass, since the operator may open any ([fetch] allow_private);
// names that are always blocked (localhost, ...) and hosts written in another form (https://127.1,
// https://A.example, a trailing dot, an explicit :443) do not.
std::optional<std::string> whyNotCanonicalOrigin(std::string_view text);

}  // namespace toolhost::policy
