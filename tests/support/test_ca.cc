#include "tests/support/test_ca.h"

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <fstream>
#include <stdexcept>
#include <utility>

namespace toolhost::testing {

namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct ExtensionFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using Bio = std::unique_ptr<BIO, BioFree>;
using Extension = std::unique_ptr<X509_EXTENSION, ExtensionFree>;

[[noreturn]] void fail(const std::string& what) {
  std::string detail;
  if (const unsigned long code = ERR_get_error(); code != 0) {
    char buffer[256];
    ERR_error_string_n(code, buffer, sizeof buffer);
    detail = std::string(": ") + buffer;
  }
  ERR_clear_error();
  throw std::runtime_error("test CA: " + what + detail);
}

void check(int ok, const char* what) {
  if (ok != 1) fail(what);
}

Pkey makeKey() {
  Pkey key(EVP_EC_gen("P-256"));
  if (!key) fail("cannot generate a P-256 key");
  return key;
}

void setName(X509_NAME* name, const std::string& commonName) {
  check(X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>("toolhost tests"), -1, -1,
                                   0),
        "cannot set O");
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(commonName.c_str()), -1,
                                   -1, 0),
        "cannot set CN");
}

void addExtension(X509* certificate, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, certificate, nullptr, nullptr, 0);
  Extension extension(X509V3_EXT_conf_nid(nullptr, &context, nid, value.c_str()));
  if (!extension) fail("cannot make extension " + value);
  check(X509_add_ext(certificate, extension.get(), -1), "cannot add an extension");
}

// Random 128-bit serials, so two CAs in one process never issue look-alike certificates.
void setSerial(X509* certificate) {
  unsigned char bytes[16];
  check(RAND_bytes(bytes, sizeof bytes), "cannot draw a serial");
  bytes[0] &= 0x7f;  // positive
  BIGNUM* serial = BN_bin2bn(bytes, sizeof bytes, nullptr);
  if (serial == nullptr) fail("cannot make a serial");
  const bool ok = BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(certificate)) != nullptr;
  BN_free(serial);
  if (!ok) fail("cannot set the serial");
}

Certificate makeCertificate(EVP_PKEY* subjectKey, const std::string& commonName) {
  Certificate certificate(X509_new());
  if (!certificate) fail("cannot allocate a certificate");
  check(X509_set_version(certificate.get(), 2), "cannot set the version");
  setSerial(certificate.get());
  if (X509_gmtime_adj(X509_getm_notBefore(certificate.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(certificate.get()), 24 * 3600) == nullptr) {
    fail("cannot set the validity");
  }
  setName(X509_get_subject_name(certificate.get()), commonName);
  check(X509_set_pubkey(certificate.get(), subjectKey), "cannot set the public key");
  return certificate;
}

std::string toPem(X509* certificate) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio) fail("cannot allocate a BIO");
  check(PEM_write_bio_X509(bio.get(), certificate), "cannot write a certificate");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

std::string toPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio) fail("cannot allocate a BIO");
  check(PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr),
        "cannot write a key");
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<std::size_t>(size));
}

}  // namespace

struct TestCa::Impl {
  Pkey key;
  Certificate certificate;
  std::string pem;
};

TestCa::TestCa(std::string commonName) : impl_(std::make_unique<Impl>()) {
  impl_->key = makeKey();
  impl_->certificate = makeCertificate(impl_->key.get(), commonName);
  X509* ca = impl_->certificate.get();
  check(X509_set_issuer_name(ca, X509_get_subject_name(ca)), "cannot set the issuer");
  addExtension(ca, ca, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  addExtension(ca, ca, NID_key_usage, "critical,keyCertSign,cRLSign");
  addExtension(ca, ca, NID_subject_key_identifier, "hash");
  if (X509_sign(ca, impl_->key.get(), EVP_sha256()) == 0) fail("cannot sign the CA");
  impl_->pem = toPem(ca);
}

TestCa::~TestCa() = default;

const std::string& TestCa::certificatePem() const { return impl_->pem; }

IssuedCertificate TestCa::issue(const std::vector<std::string>& dnsNames,
                                const std::vector<std::string>& ipAddresses,
                                const std::string& commonName) const {
  Pkey key = makeKey();
  const std::string subject = !commonName.empty()    ? commonName
                              : !dnsNames.empty()    ? dnsNames.front()
                              : !ipAddresses.empty() ? ipAddresses.front()
                                                     : "toolhost test server";
  Certificate leaf = makeCertificate(key.get(), subject);
  X509* ca = impl_->certificate.get();
  check(X509_set_issuer_name(leaf.get(), X509_get_subject_name(ca)), "cannot set the issuer");
  addExtension(leaf.get(), ca, NID_basic_constraints, "critical,CA:FALSE");
  addExtension(leaf.get(), ca, NID_key_usage, "critical,digitalSignature");
  addExtension(leaf.get(), ca, NID_ext_key_usage, "serverAuth");
  addExtension(leaf.get(), ca, NID_subject_key_identifier, "hash");
  addExtension(leaf.get(), ca, NID_authority_key_identifier, "keyid:always");
  std::string names;
  for (const auto& name : dnsNames) names += (names.empty() ? "DNS:" : ",DNS:") + name;
  for (const auto& address : ipAddresses) names += (names.empty() ? "IP:" : ",IP:") + address;
  if (!names.empty()) addExtension(leaf.get(), ca, NID_subject_alt_name, names);
  if (X509_sign(leaf.get(), impl_->key.get(), EVP_sha256()) == 0) fail("cannot sign a leaf");
  return {toPem(leaf.get()), toPem(key.get())};
}

void TestCa::writeCertificate(const std::filesystem::path& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << impl_->pem;
  if (!out.flush()) throw std::runtime_error("test CA: cannot write " + path.string());
}

}  // namespace toolhost::testing
