// Test support: a certificate authority made at run time with OpenSSL (EC P-256, SHA-256), and
// server certificates it issues for DNS names and IP addresses. For tests only: keys live in
// memory, certificates are valid from an hour ago for a day. Boost-free, daemon-free.
// A TestCa is immutable after construction; issue() may be called from any thread.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace toolhost::testing {

struct IssuedCertificate {
  std::string certificatePem;  // the leaf only; the CA is what clients trust
  std::string privateKeyPem;   // PKCS#8
};

class TestCa {
 public:
  explicit TestCa(std::string commonName = "toolhost test CA");
  ~TestCa();
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  const std::string& certificatePem() const;

  // A server certificate (serverAuth, digitalSignature) with these subject alternative names:
  // dnsNames as DNS entries, ipAddresses ("127.0.0.1", "::1") as IP entries. Throws
  // std::runtime_error if OpenSSL refuses.
  // With no names and a commonName, a certificate that names its host only in the subject's
  // common name, as certificates did before subjectAltName was required.
  IssuedCertificate issue(const std::vector<std::string>& dnsNames,
                          const std::vector<std::string>& ipAddresses,
                          const std::string& commonName = "") const;

  // Writes certificatePem() to `path` (what [fetch] extra_ca_file points at).
  void writeCertificate(const std::filesystem::path& path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace toolhost::testing
