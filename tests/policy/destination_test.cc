// Destination rules: a table of URLs with their verdicts (every encoding of every blocked range,
// internal names, schemes, userinfo, ports, malformed input), the address rules on their own as
// DNS answers meet them, operator-opened ranges, CIDR parsing, address formatting and access
// classes.
#include "policy/destination.h"
#include "policy/access_class.h"

#include <catch2/catch.hpp>

#include <string>
#include <string_view>
#include <vector>

using namespace std::string_view_literals;
using boost::asio::ip::make_address;
using toolhost::policy::AccessClass;
using toolhost::policy::accessClassOf;
using toolhost::policy::AddressRules;
using toolhost::policy::AddressStatus;
using toolhost::policy::Cidr;
using toolhost::policy::DestinationErrc;
using toolhost::policy::errorCode;
using toolhost::policy::formatAddress;
using toolhost::policy::normalizeMethod;
using toolhost::policy::parseCidr;
using toolhost::policy::parseDestination;
using toolhost::policy::tryFindBlockedName;

namespace {

// `expected` is the error code, or the canonical origin when the URL is allowed; `path` (when
// given) is the expected request target.
struct UrlCase {
  std::string_view url;
  std::string_view expected;
  std::string_view path = {};
};

constexpr std::string_view kInvalid = "invalid-url";
constexpr std::string_view kScheme = "scheme-not-allowed";
constexpr std::string_view kCredentials = "credentials-in-url";
constexpr std::string_view kBlocked = "destination-blocked";

const std::vector<UrlCase> kUrlCases = {
    // --- Allowed: names, with the canonical origin and request target.
    {"https://example.com", "https://example.com", "/"},
    {"https://example.com/", "https://example.com", "/"},
    {"https://EXAMPLE.com./Path", "https://example.com", "/Path"},
    {"HTTPS://example.com/", "https://example.com"},
    {"hTtPs://Example.COM:443/", "https://example.com"},
    {"https://example.com:8443/x", "https://example.com:8443", "/x"},
    {"https://example.com:1/", "https://example.com:1"},
    {"https://example.com:65535/", "https://example.com:65535"},
    {"https://example.com:/", "https://example.com"},
    {"https://example.com:0443/", "https://example.com"},
    {"https://example.com:000000000000000000443/", "https://example.com"},
    {"https://example.com?q=1", "https://example.com", "/?q=1"},
    {"https://example.com/a/b?c=d&e=f#frag", "https://example.com", "/a/b?c=d&e=f"},
    {"https://example.com/#only-fragment", "https://example.com", "/"},
    {"https://example.com/%7Euser?x=%41%2f", "https://example.com", "/%7Euser?x=%41%2f"},
    {"https://example.com/a b?q=x y", "https://example.com", "/a%20b?q=x%20y"},
    // Dot segments resolved as browsers resolve them, "%2e" included; never in the query.
    {"https://example.com/a/../echo", "https://example.com", "/echo"},
    {"https://example.com/echo/%2e%2E/x?p=../q", "https://example.com", "/x?p=../q"},
    {"https://example.com/a/./b/.", "https://example.com", "/a/b/"},
    {"https://example.com/a/..", "https://example.com", "/"},
    {"https://example.com/../../etc", "https://example.com", "/etc"},
    {"https://example.com/a/.%2e/", "https://example.com", "/"},
    {"https://example.com/a/.../b..", "https://example.com", "/a/.../b.."},
    {"https://example.com//a/../b", "https://example.com", "//b"},
    {"https://example.com/\"<>`{}|^", "https://example.com", "/%22%3C%3E%60%7B%7D%7C%5E"},
    {"https://example.com/caf\xc3\xa9?\xc3\xa9", "https://example.com", "/caf%C3%A9?%C3%A9"},
    {"https://example.com/100%?a=%zz", "https://example.com", "/100%25?a=%25zz"},
    {"https://example.com/?a=b?c=d\\e", "https://example.com", "/?a=b?c=d%5Ce"},
    {"https://example.com/@user:1/", "https://example.com", "/@user:1/"},
    {"https://10.example.com/", "https://10.example.com"},
    {"https://fdic.gov/", "https://fdic.gov"},
    {"https://0x10.example/", "https://0x10.example"},
    {"https://127.0.0.1.nip.io/", "https://127.0.0.1.nip.io", "/"},
    {"https://8.8.8.8.example.com/r", "https://8.8.8.8.example.com", "/r"},  // boostorg/url#770
    {"https://1.2.3.256.com/", "https://1.2.3.256.com"},
    {"https://localhost.example.com/", "https://localhost.example.com"},
    {"https://metadata.example.com/", "https://metadata.example.com"},
    {"https://internal.example.com/", "https://internal.example.com"},
    {"https://mylocal/", "https://mylocal"},
    {"https://xn--nxasmq6b.com/", "https://xn--nxasmq6b.com"},
    {"https://XN--NXASMQ6B.COM/", "https://xn--nxasmq6b.com"},
    {"https://my_host.example.com/", "https://my_host.example.com"},
    {"https://%65xample.com/", "https://example.com"},
    {"https://example.com%2E/", "https://example.com"},
    {"https://a-b.c-d.example/", "https://a-b.c-d.example"},
    // --- Allowed: public IPv4 in every encoding, and neighbours of blocked ranges.
    {"https://8.8.8.8/", "https://8.8.8.8"},
    {"https://134744072/", "https://8.8.8.8"},
    {"https://0x8080808/", "https://8.8.8.8"},
    {"https://0x8.0x8.0x8.0x8/", "https://8.8.8.8"},
    {"https://010.010.010.010/", "https://8.8.8.8"},
    {"https://8.8.2056/", "https://8.8.8.8"},
    {"https://8.526344/", "https://8.8.8.8"},
    {"https://%38.8.8.8/", "https://8.8.8.8"},
    {"https://1.1.1.1./", "https://1.1.1.1"},
    {"https://8.8.8.8:8443/", "https://8.8.8.8:8443"},
    {"https://11.0.0.0/", "https://11.0.0.0"},
    {"https://9.255.255.255/", "https://9.255.255.255"},
    {"https://1.0.0.0/", "https://1.0.0.0"},
    {"https://100.63.255.255/", "https://100.63.255.255"},
    {"https://100.128.0.0/", "https://100.128.0.0"},
    {"https://126.255.255.255/", "https://126.255.255.255"},
    {"https://128.0.0.0/", "https://128.0.0.0"},
    {"https://169.253.255.255/", "https://169.253.255.255"},
    {"https://169.255.0.0/", "https://169.255.0.0"},
    {"https://172.15.255.255/", "https://172.15.255.255"},
    {"https://172.32.0.0/", "https://172.32.0.0"},
    {"https://192.0.1.255/", "https://192.0.1.255"},
    {"https://192.31.196.1/", "https://192.31.196.1"},
    {"https://192.167.255.255/", "https://192.167.255.255"},
    {"https://192.169.0.0/", "https://192.169.0.0"},
    {"https://198.17.255.255/", "https://198.17.255.255"},
    {"https://198.20.0.0/", "https://198.20.0.0"},
    {"https://223.255.255.255/", "https://223.255.255.255"},
    // --- Allowed: public IPv6, canonical (RFC 5952 compression, lowercase, no dotted tail).
    {"https://[2606:4700:4700::1111]/", "https://[2606:4700:4700::1111]"},
    {"https://[2606:4700:4700:0:0:0:0:1111]/", "https://[2606:4700:4700::1111]"},
    {"https://[2001:4860:4860::8888]:8443/", "https://[2001:4860:4860::8888]:8443"},
    {"https://[2A00:1450:4001:0811:0000:0000:0000:200E]/", "https://[2a00:1450:4001:811::200e]"},
    {"https://[2001:db9::1]/", "https://[2001:db9::1]"},
    {"https://[2001:200::1]/", "https://[2001:200::1]"},
    {"https://[3fff:1000::1]/", "https://[3fff:1000::1]"},
    {"https://[2606:4700::1]:443/", "https://[2606:4700::1]"},
    // Embedding forms of a public IPv4 are judged by it (Teredo excepted, below).
    {"https://[::ffff:8.8.8.8]/", "https://[::ffff:808:808]"},
    {"https://[::ffff:808:808]/", "https://[::ffff:808:808]"},
    {"https://[::8.8.8.8]/", "https://[::808:808]"},
    {"https://[64:ff9b::8.8.8.8]/", "https://[64:ff9b::808:808]"},
    {"https://[2002:808:808::1]/", "https://[2002:808:808::1]"},

    // --- Loopback 127.0.0.0/8, every way to write it.
    {"https://127.0.0.1/", kBlocked},
    {"https://127.1/", kBlocked},
    {"https://127.0.1/", kBlocked},
    {"https://2130706433/", kBlocked},
    {"https://0x7f000001/", kBlocked},
    {"https://0X7F000001/", kBlocked},
    {"https://017700000001/", kBlocked},
    {"https://0x7f.1/", kBlocked},
    {"https://0x7F.0.0.1/", kBlocked},
    {"https://0X7F.0X0.0X0.0X1/", kBlocked},
    {"https://0177.0.0.1/", kBlocked},
    {"https://0177.0.0.01/", kBlocked},
    {"https://127.000.000.001/", kBlocked},
    {"https://127.0.0.0x1/", kBlocked},
    {"https://0x7f.0.1/", kBlocked},
    {"https://127.0.0.1./", kBlocked},
    {"https://127.0.0.1:8443/", kBlocked},
    {"https://%31%32%37.0.0.1/", kBlocked},
    {"https://127%2E0%2E0%2E1/", kBlocked},
    {"https://%30x7f.1/", kBlocked},
    {"https://127.255.255.254/", kBlocked},
    {"https://0x7f.0xffffff/", kBlocked},
    {"https://[::1]/", kBlocked},
    {"https://[0:0:0:0:0:0:0:1]/", kBlocked},
    {"https://[0000:0000:0000:0000:0000:0000:0000:0001]:8443/", kBlocked},
    {"https://[::ffff:127.0.0.1]/", kBlocked},
    {"https://[::ffff:7f00:1]/", kBlocked},
    {"https://[0000:0000:0000:0000:0000:FFFF:7F00:0001]/", kBlocked},
    {"https://[::127.0.0.1]/", kBlocked},
    {"https://[::7f00:1]/", kBlocked},
    {"https://[64:ff9b::127.0.0.1]/", kBlocked},
    {"https://[64:ff9b::7f00:1]/", kBlocked},
    {"https://[2002:7f00:1::]/", kBlocked},
    {"https://[2002:7f00:1:1234::1]/", kBlocked},
    {"https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", kBlocked},
    // --- This network 0.0.0.0/8 (Linux connects 0.0.0.0 to the local host) and ::.
    {"https://0.0.0.0/", kBlocked},
    {"https://0/", kBlocked},
    {"https://0x0/", kBlocked},
    {"https://0x/", kBlocked},
    {"https://00/", kBlocked},
    {"https://0.0/", kBlocked},
    {"https://0.1.2.3/", kBlocked},
    {"https://[::]/", kBlocked},
    {"https://[0:0:0:0:0:0:0:0]/", kBlocked},
    {"https://[::ffff:0.0.0.0]/", kBlocked},
    {"https://[::2]/", kBlocked},
    // --- Private 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16.
    {"https://10.0.0.1/", kBlocked},
    {"https://10.1/", kBlocked},
    {"https://167772161/", kBlocked},
    {"https://0xa000001/", kBlocked},
    {"https://012.0.0.1/", kBlocked},
    {"https://10.255.255.255/", kBlocked},
    {"https://[::ffff:10.0.0.1]/", kBlocked},
    {"https://[::ffff:a00:1]/", kBlocked},
    {"https://[::10.0.0.1]/", kBlocked},
    {"https://[64:ff9b::a00:1]/", kBlocked},
    {"https://[2002:a00:1::]/", kBlocked},
    {"https://172.16.0.1/", kBlocked},
    {"https://172.31.255.255/", kBlocked},
    {"https://0xac.0x10.0.1/", kBlocked},
    {"https://2886729729/", kBlocked},
    {"https://[::ffff:172.16.0.1]/", kBlocked},
    {"https://192.168.0.1/", kBlocked},
    {"https://192.168.1.1./", kBlocked},
    {"https://0xc0a80101/", kBlocked},
    {"https://3232235777/", kBlocked},
    {"https://0300.0250.1.1/", kBlocked},
    {"https://192.168.257/", kBlocked},
    {"https://192.11010305/", kBlocked},
    {"https://[::ffff:192.168.1.1]/", kBlocked},
    {"https://[::ffff:c0a8:101]/", kBlocked},
    {"https://[2002:c0a8:101::1]/", kBlocked},
    {"https://[64:ff9b::c0a8:101]/", kBlocked},
    {"https://[2001:0:4136:e378:8000:63bf:3f57:fefe]/", kBlocked},
    // --- Link-local 169.254.0.0/16 and cloud metadata addresses.
    {"https://169.254.169.254/", kBlocked},
    {"https://169.254.169.254:80/", kBlocked},
    {"https://0xa9fea9fe/", kBlocked},
    {"https://2852039166/", kBlocked},
    {"https://0251.0376.0251.0376/", kBlocked},
    {"https://169.254.43518/", kBlocked},
    {"https://0xa9.0xfe.0xa9.0xfe/", kBlocked},
    {"https://[::ffff:169.254.169.254]/", kBlocked},
    {"https://[::ffff:a9fe:a9fe]/", kBlocked},
    {"https://[64:ff9b::a9fe:a9fe]/", kBlocked},
    {"https://[2002:a9fe:a9fe::]/", kBlocked},
    {"https://[fd00:ec2::254]/", kBlocked},
    {"https://100.100.100.200/", kBlocked},
    // --- Shared (CGNAT), IETF, documentation, benchmarking, relay, multicast, reserved, broadcast.
    {"https://100.64.0.1/", kBlocked},
    {"https://100.127.255.255/", kBlocked},
    {"https://192.0.0.1/", kBlocked},
    {"https://192.0.0.170/", kBlocked},
    {"https://192.0.2.1/", kBlocked},
    {"https://192.88.99.1/", kBlocked},
    {"https://198.18.0.1/", kBlocked},
    {"https://198.19.255.255/", kBlocked},
    {"https://198.51.100.7/", kBlocked},
    {"https://203.0.113.5/", kBlocked},
    {"https://224.0.0.1/", kBlocked},
    {"https://239.255.255.250/", kBlocked},
    {"https://0xe0000001/", kBlocked},
    {"https://240.0.0.1/", kBlocked},
    {"https://254.255.255.255/", kBlocked},
    {"https://255.255.255.255/", kBlocked},
    {"https://4294967295/", kBlocked},
    {"https://0xffffffff/", kBlocked},
    {"https://0377.0377.0377.0377/", kBlocked},
    {"https://[::ffff:255.255.255.255]/", kBlocked},
    {"https://[::ffff:224.0.0.1]/", kBlocked},
    // --- IPv6 special-purpose ranges.
    {"https://[fc00::1]/", kBlocked},
    {"https://[fd12:3456:789a::1]/", kBlocked},
    {"https://[fe80::1]/", kBlocked},
    {"https://[FE80::1]/", kBlocked},
    {"https://[febf:ffff::1]/", kBlocked},
    {"https://[fec0::1]/", kBlocked},
    {"https://[ff02::1]/", kBlocked},
    {"https://[ff05::1:3]/", kBlocked},
    {"https://[2001:db8::1]/", kBlocked},
    {"https://[2001:db8:ffff::1]/", kBlocked},
    {"https://[3fff::1]/", kBlocked},
    {"https://[3fff:fff:ffff::1]/", kBlocked},
    {"https://[5f00::1]/", kBlocked},
    {"https://[100::1]/", kBlocked},
    {"https://[64:ff9b:1::1]/", kBlocked},
    {"https://[2001::1]/", kBlocked},
    {"https://[2001:2::1]/", kBlocked},
    {"https://[2001:1ff:ffff::1]/", kBlocked},
    {"https://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/", kBlocked},  // Teredo of public 8.8.8.8
    {"https://[1::1]/", kBlocked},
    {"https://[4000::1]/", kBlocked},
    {"https://[::ffff:0:a00:1]/", kBlocked},
    // --- Internal and metadata names, after lowercasing and trailing-dot removal.
    {"https://localhost/", kBlocked},
    {"https://LOCALHOST/", kBlocked},
    {"https://localhost./", kBlocked},
    {"https://LocalHost:8443/", kBlocked},
    {"https://foo.localhost/", kBlocked},
    {"https://a.b.localhost./", kBlocked},
    {"https://%6c%6f%63%61%6c%68%6f%73%74/", kBlocked},
    {"https://localhost%2E/", kBlocked},
    {"https://ip6-localhost/", kBlocked},
    {"https://localhost.localdomain/", kBlocked},
    {"https://metadata.google.internal/", kBlocked},
    {"https://METADATA.GOOGLE.INTERNAL./", kBlocked},
    {"https://metadata/", kBlocked},
    {"https://metadata.goog/", kBlocked},
    {"https://instance-data/", kBlocked},
    {"https://instance-data.ec2.internal/", kBlocked},
    {"https://metadata.tencentyun.com/", kBlocked},
    {"https://metadata.platformequinix.com/", kBlocked},
    {"https://kubernetes.default.svc/", kBlocked},
    {"https://kubernetes.default.svc.cluster.local/", kBlocked},
    {"https://service.internal/", kBlocked},
    {"https://internal/", kBlocked},
    {"https://printer.local/", kBlocked},
    {"https://router.home.arpa/", kBlocked},

    // --- Schemes: only https.
    {"http://example.com/", kScheme},
    {"HTTP://example.com/", kScheme},
    {"http://127.0.0.1/", kScheme},
    {"http://user:pass@example.com/", kScheme},
    {"ftp://example.com/", kScheme},
    {"file:///etc/passwd", kScheme},
    {"data:text/plain,hi", kScheme},
    {"data:text/html,<script>alert(1)</script>", kScheme},
    {"javascript:alert(1)", kScheme},
    {"ws://example.com/", kScheme},
    {"wss://example.com/", kScheme},
    {"gopher://127.0.0.1:25/", kScheme},
    {"blob:https://example.com/uuid", kScheme},
    {"about:blank", kScheme},
    {"httpss://example.com/", kScheme},
    {"https+x://example.com/", kScheme},
    {"mailto:someone@example.com", kScheme},
    // --- Userinfo, even empty.
    {"https://user:pass@example.com/", kCredentials},
    {"https://user@example.com/", kCredentials},
    {"https://@example.com/", kCredentials},
    {"https://:@example.com/", kCredentials},
    {"https://user:@example.com/", kCredentials},
    {"https://:pass@example.com/", kCredentials},
    {"https://example.com@evil.example/", kCredentials},
    {"https://user%40x@example.com/", kCredentials},
    {"https://a@b@example.com/", kCredentials},
    {"https://user@127.0.0.1/", kCredentials},
    {"https://user@[::1]/", kCredentials},
    // --- Ports.
    {"https://example.com:0/", kInvalid},
    {"https://example.com:00/", kInvalid},
    {"https://example.com:65536/", kInvalid},
    {"https://example.com:99999999999999999999/", kInvalid},
    {"https://example.com:abc/", kInvalid},
    {"https://example.com:-1/", kInvalid},
    {"https://example.com:80:80/", kInvalid},
    {"https://example.com:443x/", kInvalid},
    {"https://[::1]:0/", kInvalid},
    // --- Malformed.
    {"", kInvalid},
    {"https", kInvalid},
    {"https:", kInvalid},
    {"https://", kInvalid},
    {"https:///path", kInvalid},
    {"https:////example.com/", kInvalid},
    {"https://:443/", kInvalid},
    {"https://?q", kInvalid},
    {"https:example.com", kInvalid},
    {"https:/example.com", kInvalid},
    {"//example.com/", kInvalid},
    {"example.com", kInvalid},
    {"/path", kInvalid},
    {"1https://example.com/", kInvalid},
    {" https://example.com/", kInvalid},
    {"https://example.com/ ", kInvalid},
    {"https://example.com/\t", kInvalid},
    {"https://exa mple.com/", kInvalid},
    {"https:// example.com/", kInvalid},
    {"https://example.com /", kInvalid},
    {"https://exa\nmple.com/", kInvalid},
    {"https://example.com\r\n/", kInvalid},
    {"https://example.com\0/"sv, kInvalid},
    {"https://example.com/\x7f", kInvalid},
    {"https://exa<mple.com/", kInvalid},
    {"https://exa*mple.com/", kInvalid},
    {"https://exa!mple.com/", kInvalid},
    {"https://example.com\\@evil.example/", kInvalid},
    {"https://example.com\\path", kInvalid},
    {"https://example.com/a\\b", kInvalid},
    {"https://[::1/", kInvalid},
    {"https://::1]/", kInvalid},
    {"https://::1/", kInvalid},
    {"https://[::1]]/", kInvalid},
    {"https://[[::1]/", kInvalid},
    {"https://[fe80::1%25eth0]/", kInvalid},
    {"https://[fe80::1%eth0]/", kInvalid},
    {"https://[v1.abc]/", kInvalid},
    {"https://[::1.2.3]/", kInvalid},
    {"https://[::ffff:127.0.0.01]/", kInvalid},
    {"https://[::ffff:0x7f.1]/", kInvalid},
    {"https://[:::1]/", kInvalid},
    {"https://[1:2:3:4:5:6:7:8:9]/", kInvalid},
    {"https://[127.0.0.1]/", kInvalid},
    {"https://[::.]/", kInvalid},  // boostorg/url#993
    {"https://[.]/", kInvalid},
    {"https://[]/", kInvalid},
    {"https://[::1]x/", kInvalid},
    {"https://1.2.3.4.5/", kInvalid},
    {"https://1.2.3.256/", kInvalid},
    {"https://256.0.0.1/", kInvalid},
    {"https://4294967296/", kInvalid},
    {"https://0x100000000/", kInvalid},
    {"https://127.0.0.1.5/", kInvalid},
    {"https://09.0.0.1/", kInvalid},
    {"https://1.08/", kInvalid},
    {"https://0x7g.1/", kInvalid},
    {"https://example.123/", kInvalid},
    {"https://example.0x1/", kInvalid},
    {"https://example.1./", kInvalid},
    {"https://a..b/", kInvalid},
    {"https://./", kInvalid},
    {"https://../", kInvalid},
    {"https://.example.com/", kInvalid},
    {"https://example.com../", kInvalid},
    {"https://ex%ample.com/", kInvalid},
    {"https://exa%20mple.com/", kInvalid},
    {"https://exa%00mple.com/", kInvalid},
    {"https://ex%2fample.com/", kInvalid},
    {"https://ex%40ample.com/", kInvalid},
    {"https://exa%3Ample.com/", kInvalid},
    {"https://%C3%A9xample.com/", kInvalid},
    {"https://\xc3\xa9xample.com/", kInvalid},
    {"https://\xef\xbc\x91\xef\xbc\x92\xef\xbc\x97.0.0.1/", kInvalid},  // fullwidth "127"
    {"https://127\xe3\x80\x82"
     "0.0.1/",
     kInvalid},  // ideographic full stop
};

}  // namespace

TEST_CASE("the URL table has its verdicts", "[destination]") {
  REQUIRE(kUrlCases.size() >= 150);
  const AddressRules rules;
  for (const UrlCase& c : kUrlCases) {
    INFO("url: " << c.url);
    auto result = parseDestination(c.url, rules);
    if (c.expected.starts_with("https://")) {
      if (!result)
        INFO("error: " << errorCode(result.error().code) << ": " << result.error().message);
      REQUIRE(result.has_value());
      CHECK(result->origin == std::string(c.expected));
      CHECK(result->scheme == "https");
      CHECK(result->origin == "https://" + result->host +
                                  (result->port == 443 ? "" : ":" + std::to_string(result->port)));
      if (!c.path.empty()) CHECK(result->pathAndQuery == c.path);
      CHECK_FALSE(result->privateRange.has_value());
    } else {
      if (result) INFO("origin: " << result->origin);
      REQUIRE_FALSE(result.has_value());
      INFO("message: " << result.error().message);
      CHECK(errorCode(result.error().code) == c.expected);
      CHECK_FALSE(result.error().message.empty());
    }
  }
}

TEST_CASE("host names have DNS's length limits", "[destination]") {
  const AddressRules rules;
  const std::string label63(63, 'a');
  CHECK(parseDestination("https://" + label63 + ".com/", rules).has_value());
  auto tooLong = parseDestination("https://" + label63 + "a.com/", rules);
  REQUIRE_FALSE(tooLong.has_value());
  CHECK(tooLong.error().code == DestinationErrc::invalidUrl);

  std::string name253;
  while (name253.size() < 250) name253 += label63.substr(0, 49) + '.';
  name253 += std::string(253 - name253.size(), 'b');
  REQUIRE(name253.size() == 253);
  CHECK(parseDestination("https://" + name253 + "/", rules).has_value());
  CHECK(parseDestination("https://" + name253 + "./", rules).has_value());
  CHECK_FALSE(parseDestination("https://" + name253 + "b/", rules).has_value());
}

TEST_CASE("a blocked destination names the range, including the IPv4 inside IPv6",
          "[destination]") {
  const AddressRules rules;
  const std::vector<std::pair<std::string_view, std::string_view>> cases = {
      {"https://127.1/", "loopback 127.0.0.0/8"},
      {"https://0/", "this network 0.0.0.0/8"},
      {"https://10.0.0.1/", "private 10.0.0.0/8"},
      {"https://172.20.0.1/", "private 172.16.0.0/12"},
      {"https://192.168.1.1/", "private 192.168.0.0/16"},
      {"https://100.100.100.200/", "shared (CGNAT) 100.64.0.0/10"},
      {"https://169.254.169.254/", "link-local (cloud metadata) 169.254.0.0/16"},
      {"https://192.0.0.8/", "IETF protocol assignments 192.0.0.0/24"},
      {"https://192.0.2.1/", "documentation (TEST-NET-1) 192.0.2.0/24"},
      {"https://192.88.99.1/", "6to4 relay anycast 192.88.99.0/24"},
      {"https://198.18.0.1/", "benchmarking 198.18.0.0/15"},
      {"https://198.51.100.1/", "documentation (TEST-NET-2) 198.51.100.0/24"},
      {"https://203.0.113.1/", "documentation (TEST-NET-3) 203.0.113.0/24"},
      {"https://224.0.0.251/", "multicast 224.0.0.0/4"},
      {"https://240.0.0.1/", "reserved 240.0.0.0/4"},
      {"https://255.255.255.255/", "broadcast 255.255.255.255/32"},
      {"https://[::]/", "unspecified ::/128"},
      {"https://[::1]/", "loopback ::1/128"},
      {"https://[::ffff:10.0.0.1]/", "IPv4-mapped IPv6 of 10.0.0.1 (private 10.0.0.0/8)"},
      {"https://[::127.0.0.1]/", "IPv4-compatible IPv6 of 127.0.0.1 (loopback 127.0.0.0/8)"},
      {"https://[64:ff9b::a9fe:a9fe]/",
       "NAT64 IPv6 (64:ff9b::/96) of 169.254.169.254 (link-local (cloud metadata) 169.254.0.0/16)"},
      {"https://[2002:c0a8:101::]/",
       "6to4 IPv6 (2002::/16) of 192.168.1.1 (private 192.168.0.0/16)"},
      {"https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",
       "Teredo IPv6 (2001::/32) of client 127.0.0.1 (loopback 127.0.0.0/8)"},
      {"https://[2001:0:4136:e378:8000:63bf:f7f7:f7f7]/", "Teredo IPv6 (2001::/32)"},
      {"https://[2001:2::1]/", "IETF protocol assignments 2001::/23"},
      {"https://[2001:db8::1]/", "documentation 2001:db8::/32"},
      {"https://[3fff::1]/", "documentation 3fff::/20"},
      {"https://[5f00::1]/", "SRv6 SIDs 5f00::/16"},
      {"https://[100::1]/", "discard-only 100::/64"},
      {"https://[64:ff9b:1::1]/", "local-use NAT64 64:ff9b:1::/48"},
      {"https://[fd00:ec2::254]/", "unique local fc00::/7"},
      {"https://[fe80::1]/", "link-local fe80::/10"},
      {"https://[fec0::1]/", "site-local fec0::/10"},
      {"https://[ff02::1]/", "multicast ff00::/8"},
      {"https://[4000::1]/", "reserved 4000::1 (outside global unicast 2000::/3)"},
      {"https://localhost/", "a loopback name (localhost, *.localhost; RFC 6761)"},
      {"https://metadata.google.internal/", "a cloud metadata name (Google Cloud)"},
      {"https://printer.local/", "a multicast DNS name (*.local; RFC 6762)"},
      {"https://nas.home.arpa/", "a home network name (*.home.arpa; RFC 8375)"},
  };
  for (const auto& [url, range] : cases) {
    INFO(url);
    auto result = parseDestination(url, rules);
    REQUIRE_FALSE(result.has_value());
    CHECK(result.error().code == DestinationErrc::destinationBlocked);
    CHECK_THAT(result.error().message, Catch::Contains(std::string(range)));
    CHECK_THAT(result.error().message, Catch::Contains("public"));
  }
}

TEST_CASE("a blocked literal is named in canonical form", "[destination]") {
  auto result = parseDestination("https://0x7f.1/", AddressRules{});
  REQUIRE_FALSE(result.has_value());
  CHECK_THAT(result.error().message, Catch::StartsWith("127.0.0.1 is in loopback 127.0.0.0/8"));
  result = parseDestination("https://[0:0:0:0:0:FFFF:7F00:1]/", AddressRules{});
  REQUIRE_FALSE(result.has_value());
  CHECK_THAT(result.error().message, Catch::StartsWith("[::ffff:7f00:1] is in IPv4-mapped"));
}

TEST_CASE("error messages say what to do", "[destination]") {
  const AddressRules rules;
  auto scheme = parseDestination("http://example.com/", rules);
  REQUIRE_FALSE(scheme.has_value());
  CHECK_THAT(scheme.error().message, Catch::Contains("only https: URLs can be fetched"));
  CHECK_THAT(scheme.error().message, Catch::Contains("\"http:\""));

  auto credentials = parseDestination("https://user:secret@example.com/", rules);
  REQUIRE_FALSE(credentials.has_value());
  CHECK_THAT(credentials.error().message, Catch::Contains("Remove it"));

  auto port = parseDestination("https://example.com:65536/", rules);
  REQUIRE_FALSE(port.has_value());
  CHECK_THAT(port.error().message, Catch::Contains("from 1 to 65535"));

  auto zone = parseDestination("https://[fe80::1%25eth0]/", rules);
  REQUIRE_FALSE(zone.has_value());
  CHECK_THAT(zone.error().message, Catch::Contains("zone ids"));

  auto unbalanced = parseDestination("https://[::1/", rules);
  REQUIRE_FALSE(unbalanced.has_value());
  CHECK_THAT(unbalanced.error().message, Catch::Contains("unbalanced"));

  auto nonAscii = parseDestination("https://%C3%A9xample.com/", rules);
  REQUIRE_FALSE(nonAscii.has_value());
  CHECK_THAT(nonAscii.error().message, Catch::Contains("punycode"));

  auto notIpv4 = parseDestination("https://1.2.3.4.5/", rules);
  REQUIRE_FALSE(notIpv4.has_value());
  CHECK_THAT(notIpv4.error().message, Catch::Contains("ends in a number"));

  // Addresses can be opened by the operator, names cannot: only the first says so.
  auto address = parseDestination("https://10.0.0.1/", rules);
  REQUIRE_FALSE(address.has_value());
  CHECK_THAT(address.error().message, Catch::Contains("allow_private"));
  auto name = parseDestination("https://localhost/", rules);
  REQUIRE_FALSE(name.has_value());
  CHECK_THAT(name.error().message, !Catch::Contains("allow_private"));
  CHECK_THAT(name.error().message, Catch::Contains("Use a public https: URL"));

  // Control characters are echoed escaped, never raw.
  auto control = parseDestination("https://exa\nmple.com/", rules);
  REQUIRE_FALSE(control.has_value());
  CHECK_THAT(control.error().message, Catch::Contains("\\x0a"));
  CHECK(control.error().message.find('\n') == std::string::npos);
}

TEST_CASE("error codes are the ones tools see", "[destination]") {
  CHECK(errorCode(DestinationErrc::invalidUrl) == "invalid-url");
  CHECK(errorCode(DestinationErrc::schemeNotAllowed) == "scheme-not-allowed");
  CHECK(errorCode(DestinationErrc::credentialsInUrl) == "credentials-in-url");
  CHECK(errorCode(DestinationErrc::destinationBlocked) == "destination-blocked");
  // value() on a failed result throws, naming the code.
  auto result = parseDestination("http://example.com/", AddressRules{});
  CHECK_THROWS_WITH(result.value(), Catch::StartsWith("scheme-not-allowed: "));
}

TEST_CASE("a literal destination carries the address to connect to", "[destination]") {
  const AddressRules rules;
  auto v4 = parseDestination("https://0x8.0x8.0x8.0x8:8443/dns?x=1", rules);
  REQUIRE(v4.has_value());
  CHECK(v4->host == "8.8.8.8");
  CHECK(v4->port == 8443);
  CHECK(v4->origin == "https://8.8.8.8:8443");
  CHECK(v4->pathAndQuery == "/dns?x=1");
  REQUIRE(v4->literal.has_value());
  CHECK(*v4->literal == make_address("8.8.8.8"));

  auto v6 = parseDestination("https://[2606:4700:4700:0:0:0:0:1111]/", rules);
  REQUIRE(v6.has_value());
  CHECK(v6->host == "[2606:4700:4700::1111]");
  CHECK(v6->port == 443);
  REQUIRE(v6->literal.has_value());
  CHECK(*v6->literal == make_address("2606:4700:4700::1111"));

  auto name = parseDestination("https://Example.COM./", rules);
  REQUIRE(name.has_value());
  CHECK(name->host == "example.com");
  CHECK_FALSE(name->literal.has_value());
}

TEST_CASE("AddressRules judge DNS answers on their own", "[destination][address]") {
  const AddressRules rules;
  const std::vector<std::pair<std::string_view, bool>> answers = {
      {"93.184.216.34", true},
      {"8.8.8.8", true},
      {"2606:4700:4700::1111", true},
      {"::ffff:93.184.216.34", true},
      {"2002:808:808::", true},
      {"64:ff9b::808:808", true},
      {"127.0.0.1", false},
      {"127.53.53.53", false},
      {"0.0.0.0", false},
      {"10.0.0.5", false},
      {"172.17.0.1", false},
      {"192.168.178.1", false},
      {"169.254.169.254", false},
      {"169.254.170.2", false},  // ECS task metadata
      {"100.100.100.200", false},
      {"224.0.0.251", false},
      {"255.255.255.255", false},
      {"::", false},
      {"::1", false},
      {"::ffff:127.0.0.1", false},
      {"::ffff:169.254.169.254", false},
      {"::127.0.0.1", false},
      {"64:ff9b::7f00:1", false},
      {"2002:7f00:1::", false},
      {"2001:0:4136:e378:8000:63bf:80ff:fffe", false},
      {"fd00:ec2::254", false},
      {"fe80::1", false},
      {"fec0::1", false},
      {"ff02::fb", false},
      {"2001:db8::1", false},
  };
  for (const auto& [text, allowed] : answers) {
    INFO(text);
    const auto verdict = rules.check(make_address(std::string(text)));
    CHECK(verdict.permitted() == allowed);
    CHECK(verdict.status == (allowed ? AddressStatus::allowed : AddressStatus::blocked));
    CHECK(verdict.range.empty() == allowed);
    CHECK_FALSE(verdict.openedBy.has_value());
  }
  CHECK(rules.check(make_address("::ffff:10.0.0.1")).range ==
        "IPv4-mapped IPv6 of 10.0.0.1 (private 10.0.0.0/8)");
  CHECK(rules.check(make_address("127.0.0.1")).range == "loopback 127.0.0.0/8");
}

TEST_CASE("operator-opened ranges are allowed but private", "[destination][allow_private]") {
  const AddressRules rules({parseCidr("10.1.2.0/24").value(), parseCidr("fd00:ec2::/32").value(),
                            parseCidr("127.0.0.1").value()});

  auto opened = rules.check(make_address("10.1.2.3"));
  CHECK(opened.status == AddressStatus::allowedPrivate);
  CHECK(opened.permitted());
  CHECK(opened.range == "private 10.0.0.0/8");
  REQUIRE(opened.openedBy.has_value());
  CHECK(opened.openedBy->toString() == "10.1.2.0/24");

  // Neighbours stay blocked.
  CHECK(rules.check(make_address("10.1.3.1")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("10.1.1.255")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("127.0.0.2")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("::1")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("fd00:ec3::1")).status == AddressStatus::blocked);

  // Loopback can be opened when listed explicitly (local test servers).
  auto loopback = rules.check(make_address("127.0.0.1"));
  CHECK(loopback.status == AddressStatus::allowedPrivate);
  CHECK(loopback.range == "loopback 127.0.0.0/8");

  // IPv6 ranges open IPv6 addresses.
  auto ula = rules.check(make_address("fd00:ec2::254"));
  CHECK(ula.status == AddressStatus::allowedPrivate);
  CHECK(ula.range == "unique local fc00::/7");

  // IPv4-mapped is the same destination, so the IPv4 range opens it...
  auto mapped = rules.check(make_address("::ffff:10.1.2.3"));
  CHECK(mapped.status == AddressStatus::allowedPrivate);
  CHECK(mapped.openedBy->toString() == "10.1.2.0/24");
  // ...but the other embeddings reach it through a translator or a tunnel: not opened.
  CHECK(rules.check(make_address("2002:a01:203::")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("64:ff9b::a01:203")).status == AddressStatus::blocked);
  CHECK(rules.check(make_address("::10.1.2.3")).status == AddressStatus::blocked);

  // Opening a public range changes nothing: public stays plain allowed.
  const AddressRules publicOpened({parseCidr("8.8.8.0/24").value()});
  CHECK(publicOpened.check(make_address("8.8.8.8")).status == AddressStatus::allowed);

  // Through URLs: allowed, marked private, in every encoding.
  for (std::string_view url : {"https://10.1.2.3:8443/x"sv, "https://0xa010203:8443/x"sv,
                               "https://10.1.515:8443/x"sv, "https://[::ffff:a01:203]:8443/x"sv}) {
    INFO(url);
    auto destination = parseDestination(url, rules);
    REQUIRE(destination.has_value());
    REQUIRE(destination->privateRange.has_value());
    CHECK(destination->privateRange->status == AddressStatus::allowedPrivate);
    CHECK(destination->privateRange->range.find("private 10.0.0.0/8") != std::string::npos);
    CHECK(destination->pathAndQuery == "/x");
  }
  auto local = parseDestination("https://127.0.0.1:4433/", rules);
  REQUIRE(local.has_value());
  CHECK(local->origin == "https://127.0.0.1:4433");
  CHECK(local->privateRange.has_value());
  auto neighbour = parseDestination("https://10.1.3.1/", rules);
  REQUIRE_FALSE(neighbour.has_value());
  CHECK(neighbour.error().code == DestinationErrc::destinationBlocked);
  // Opening addresses does not open names.
  auto name = parseDestination("https://localhost:4433/", rules);
  REQUIRE_FALSE(name.has_value());
  CHECK(name.error().code == DestinationErrc::destinationBlocked);
}

TEST_CASE("CIDR ranges parse strictly", "[destination][cidr]") {
  const std::vector<std::pair<std::string_view, std::string_view>> valid = {
      {"10.1.2.0/24", "10.1.2.0/24"},
      {"10.0.0.0/8", "10.0.0.0/8"},
      {"127.0.0.1", "127.0.0.1/32"},
      {"0.0.0.0/0", "0.0.0.0/0"},
      {"fd00::/8", "fd00::/8"},
      {"FD00:EC2::/32", "fd00:ec2::/32"},
      {"::1", "::1/128"},
      {"::/0", "::/0"},
      {"192.168.1.128/25", "192.168.1.128/25"},
  };
  for (const auto& [text, canonical] : valid) {
    INFO(text);
    auto cidr = parseCidr(text);
    REQUIRE(cidr.has_value());
    CHECK(cidr->toString() == canonical);
  }
  const std::vector<std::string_view> invalid = {
      "",        "abc",          "10.1.2.0/",        "10.1.2.0/33",  "10.1.2.0/ 24",
      "10.1/16", "010.1.2.0/24", "0x0a.1.2.0/24",    "10.1.2.0/-1",  "10.0.0.0/8/8",
      "::/129",  "fe80::1%eth0", "fe80::%25eth0/64", "10.1.2.0/24 ", "10.1.2.0/0024",
  };
  for (std::string_view text : invalid) {
    INFO(text);
    auto cidr = parseCidr(text);
    REQUIRE_FALSE(cidr.has_value());
    CHECK_THAT(cidr.error().message, Catch::Contains("not an address range"));
  }
  auto hostBits = parseCidr("10.1.2.5/24");
  REQUIRE_FALSE(hostBits.has_value());
  CHECK_THAT(hostBits.error().message, Catch::Contains("that range is written 10.1.2.0/24."));
  auto hostBits6 = parseCidr("fd00::1/8");
  REQUIRE_FALSE(hostBits6.has_value());
  CHECK_THAT(hostBits6.error().message, Catch::Contains("that range is written fd00::/8."));
  CHECK_THROWS(parseCidr("10.1.2.5/24").value());

  CHECK_THROWS_AS(Cidr(make_address("10.1.2.5"), 24), std::invalid_argument);
  CHECK_THROWS_AS(Cidr(make_address("10.1.2.0"), 33), std::invalid_argument);
  const Cidr range(make_address("10.1.2.0"), 24);
  CHECK(range.contains(make_address("10.1.2.255")));
  CHECK_FALSE(range.contains(make_address("10.1.3.0")));
  CHECK_FALSE(range.contains(make_address("::ffff:10.1.2.1")));  // families never mix
  CHECK(Cidr(make_address("0.0.0.0"), 0).contains(make_address("255.1.2.3")));
  CHECK(Cidr(make_address("2001:db8::"), 33).contains(make_address("2001:db8:7fff::1")));
  CHECK_FALSE(Cidr(make_address("2001:db8::"), 33).contains(make_address("2001:db8:8000::1")));
}

TEST_CASE("addresses are formatted the way URLs write them", "[destination][format]") {
  const std::vector<std::pair<std::string_view, std::string_view>> cases = {
      {"2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"},     // first of two equal runs
      {"2001:0:0:1:0:0:0:1", "2001:0:0:1::1"},           // the longest run
      {"2001:db8:0:1:1:1:1:1", "2001:db8:0:1:1:1:1:1"},  // a single zero group stays
      {"0:0:0:0:0:0:0:0", "::"},
      {"0:0:0:0:0:0:0:1", "::1"},
      {"1:0:0:0:0:0:0:0", "1::"},
      {"1:0:0:0:0:0:0:2", "1::2"},
      {"::ffff:127.0.0.1", "::ffff:7f00:1"},
      {"::127.0.0.1", "::7f00:1"},
      {"2001:DB8:00AB::0001", "2001:db8:ab::1"},
      {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
      {"127.0.0.1", "127.0.0.1"},
      {"0.0.0.0", "0.0.0.0"},
  };
  for (const auto& [input, output] : cases) {
    INFO(input);
    CHECK(formatAddress(make_address(std::string(input))) == output);
  }
}

TEST_CASE("names are blocked by whole labels only", "[destination][names]") {
  for (std::string_view name :
       {"localhost"sv, "a.localhost"sv, "local"sv, "x.local"sv, "internal"sv, "corp.internal"sv,
        "home.arpa"sv, "nas.home.arpa"sv, "metadata"sv, "metadata.goog"sv, "instance-data"sv,
        "kubernetes.default.svc"sv, "localhost.localdomain"sv, "ip6-loopback"sv}) {
    INFO(name);
    CHECK(tryFindBlockedName(name).has_value());
  }
  for (std::string_view name :
       {"example.com"sv, "notlocalhost"sv, "localhost.example.com"sv, "mylocal"sv,
        "local.example"sv, "internal.example.com"sv, "xinternal"sv, "arpa"sv, "myhome.arpa"sv,
        "metadata.example"sv, "10.example.com"sv, "fdic.gov"sv, "127.0.0.1.nip.io"sv}) {
    INFO(name);
    CHECK_FALSE(tryFindBlockedName(name).has_value());
  }
}

TEST_CASE("GET, HEAD and OPTIONS read, every other method writes", "[access_class]") {
  for (std::string_view method : {"GET"sv, "HEAD"sv, "OPTIONS"sv, "get"sv, "Head"sv, "oPtIoNs"sv}) {
    INFO(method);
    CHECK(accessClassOf(method) == AccessClass::read);
  }
  for (std::string_view method :
       {"POST"sv, "PUT"sv, "DELETE"sv, "PATCH"sv, "patch"sv, "post"sv, "CONNECT"sv, "TRACE"sv,
        "PROPFIND"sv, "GETX"sv, "GE"sv, ""sv, " GET"sv, "GET "sv, "G\xc3\x89T"sv}) {
    INFO(method);
    CHECK(accessClassOf(method) == AccessClass::write);
  }
  CHECK(normalizeMethod("get") == "GET");
  CHECK(normalizeMethod("oPtIoNs") == "OPTIONS");
  CHECK(normalizeMethod("delete") == "DELETE");
  CHECK(normalizeMethod("patch") == "patch");  // as the Fetch standard: not normalized
  CHECK(normalizeMethod("PROPFIND") == "PROPFIND");
  CHECK(toolhost::policy::accessClassName(AccessClass::read) == "read");
  CHECK(toolhost::policy::accessClassName(AccessClass::write) == "write");
}
