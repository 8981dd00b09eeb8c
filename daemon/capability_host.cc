#include "daemon/capability_host.h"

#include "daemon/secrets_host.h"
#include "protocol/json_text.h"
#include "registry/manifest.h"

#include <spdlog/spdlog.h>
#include <boost/algorithm/string/predicate.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/system/system_error.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url.hpp>

#include <cctype>
#include <chrono>
#include <exception>
#include <functional>

namespace toolhost::daemon {
namespace asio = boost::asio;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using runtime::HostOperation;
using runtime::HostOpFailure;

namespace {

// The most HTML a custom-html popup may carry; it travels to the host in one JSON-RPC line.
constexpr std::size_t kMaxPopupHtmlBytes = std::size_t{1} << 20;

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

std::string actionWords(const policy::DecisionKey& key) {
  return key.action + " " + key.target + " (" + std::string(policy::accessClassName(key.access)) +
         ")";
}

// Why a request was not authorized, in words a tool author can act on.
HostOpFailure notAuthorized(const policy::Decision& decision, const policy::DecisionKey& key,
                            const std::string& toolName, bool agentDefined) {
  using policy::DecisionSource;
  switch (decision.source) {
    case DecisionSource::notRequested:
      if (key.action == policy::kActionPopup) {
        return {"not-authorized",
                registry::notRequestedWords(toolName, agentDefined, "the popup " + key.target,
                                            "add \"" + key.target + "\" to capabilities.popup")};
      }
      return {"not-authorized", registry::notRequestedWords(
                                    toolName, agentDefined, actionWords(key),
                                    "add {\"origin\": \"" + key.target + "\", \"access\": [\"" +
                                        std::string(policy::accessClassName(key.access)) +
                                        "\"]} to capabilities.fetch")};
    case DecisionSource::noApprover:
      return {"not-authorized", actionWords(key) +
                                    " needs approval and no approver is connected; ask the user "
                                    "to run toolhostctl approve, or an admin to decide ahead "
                                    "with policy.set"};
    case DecisionSource::timeout:
      return {"not-authorized", actionWords(key) + " was not approved: " + decision.reason +
                                    "; ask the user to answer the prompt, then try again"};
    default:
      return {"not-authorized", actionWords(key) + " was denied: " + decision.reason};
  }
}

HostOpFailure cancelledFailure() {
  return {"cancelled", "the call ended before the operation finished; it was aborted"};
}

// Runs `work` on a strand of its own; the call's end (onAbort) emits terminal cancellation on
// that strand (a cancellation_signal is not thread-safe). An exception escaping `work` is a bug:
// logged, and the operation fails.
void spawnOperation(const asio::any_io_executor& executor, asio::awaitable<void> work,
                    std::shared_ptr<HostOperation> operation, std::string what,
                    std::function<void()> onAbortOnStrand = {}) {
  auto strand = asio::make_strand(executor);
  // Both touched on the strand only. The signal owns the coroutine's cancellation state, which
  // the coroutine touches until its very end: the handler lets it go only in a later handler on
  // the strand, and an abort after the end emits nothing.
  auto signal = std::make_shared<asio::cancellation_signal>();
  auto finished = std::make_shared<bool>(false);
  asio::co_spawn(
      strand, std::move(work),
      asio::bind_cancellation_slot(
          signal->slot(), [signal, finished, strand, operation, what](std::exception_ptr failure) {
            *finished = true;
            asio::post(strand, [signal] {});
            if (!failure) return;
            try {
              std::rethrow_exception(failure);
            } catch (const boost::system::system_error& error) {
              // The call ended while the work was between two steps (an approval that arrived as
              // the caller cancelled): the next co_await throws. A cancel, not a failure.
              if (error.code() == asio::error::operation_aborted) {
                operation->complete(cancelledFailure());
                return;
              }
              spdlog::error("{} failed: {}", what, error.what());
            } catch (const std::exception& error) {
              spdlog::error("{} failed: {}", what, error.what());
            }
            operation->complete(HostOpFailure{"internal", "the daemon failed while serving " +
                                                              what + "; its log has the details"});
          }));
  // Registered after co_spawn, so the slot's handler is in place before any emit is posted.
  operation->onAbort([strand, signal, finished, onAbortOnStrand = std::move(onAbortOnStrand)] {
    asio::post(strand, [signal, finished, onAbortOnStrand] {
      if (onAbortOnStrand) onAbortOnStrand();
      if (!*finished) signal->emit(asio::cancellation_type::terminal);
    });
  });
}

// Asks the broker, pausing the tool's wall clock while a person is likely to be asked.
// Terminal cancellation makes it a denial with source cancelled.
asio::awaitable<policy::Decision> authorize(MediationServices services,
                                            policy::AuthorizationRequest request,
                                            std::shared_ptr<HostOperation> operation,
                                            bool pauseWallClock) {
  const bool pause = pauseWallClock && mayPrompt(services, request.key, request.manifestRequests);
  if (pause) operation->pauseWallClock();
  policy::Decision decision;
  try {
    decision = co_await services.approvals.authorize(std::move(request),
                                                     services.configs.current()->promptTimeout);
  } catch (const boost::system::system_error&) {
    decision = policy::Decision{};
    decision.source = policy::DecisionSource::cancelled;
    decision.reason = "cancelled";
  }
  if (pause) operation->resumeWallClock();
  co_return decision;
}

// ---------------------------------------------------------------------------------------------
// fetch

// The runtime builds the request; a shape it should never send is refused with these words.
HostOpFailure malformed(std::string_view what) {
  return {"internal", "the runtime passed a malformed fetch request (" + std::string(what) + ")"};
}

// What a redirect's next request takes from the tool once startFetch has returned.
struct FetchCaller {
  std::string name;
  std::string revision;
  bool agentDefined = false;
  json::object manifest;  // only its capabilities.fetch: what manifestRequests() reads
};

// What fetch does with a redirect (the request's "redirect", as in the Fetch standard; without
// one, "manual").
enum class RedirectMode { follow, manual, error };

// As browsers: at most 20 redirects for one fetch.
constexpr unsigned kMaxRedirects = 20;

struct FetchJob {
  MediationServices services;
  std::shared_ptr<const FetchCaller> caller;
  policy::DecisionKey key;
  bool requested = false;
  std::optional<std::string> privateRange;
  policy::HttpRequest request;  // secrets as placeholders until the request is sent
  std::string url;  // origin + path and query, as fetched: the reply's url
  RedirectMode redirect = RedirectMode::manual;
  unsigned redirects = 0;  // followed to get here
  std::shared_ptr<HostOperation> operation;
};

json::value replyOf(policy::HttpResponse& response, const std::string& url, bool redirected) {
  json::array headers;
  headers.reserve(response.headers.size());
  for (auto& [name, value] : response.headers) headers.push_back(json::array{name, value});
  return json::object{{"status", response.status},
                      {"statusText", response.statusText},
                      {"url", url},
                      {"redirected", redirected},
                      {"headers", std::move(headers)},
                      {"bodyBase64", base64Encode(response.body)}};
}

// The parts of a request before its URL is checked: the tool's, or a redirect's next hop.
struct FetchInput {
  std::string_view url;
  std::string method = "GET";  // as the tool wrote it
  std::vector<std::pair<std::string, std::string>> headers;
  const json::string* bodyBase64 = nullptr;  // the tool's body, not decoded yet
  std::string body;                          // a redirect's (307, 308), when no bodyBase64
};

// Checks 1-4, the header and body checks and the secret placeholders of one request, each
// refusal audited: the job that authorizes and sends it, or why it may not be sent. A
// redirect's next request passes every check a tool's request does.
boost::system::result<FetchJob, HostOpFailure> prepareFetch(
    MediationServices& mediation, std::shared_ptr<const FetchCaller> caller, FetchInput input,
    std::shared_ptr<HostOperation> operation) {
  const FetchCaller& tool = *caller;
  // Checks 1-3: the URL as browsers parse it, https only, no credentials, no blocked literal.
  auto destination = policy::parseDestination(input.url, mediation.http.rules());
  if (!destination) {
    const std::string code(policy::errorCode(destination.error().code));
    std::string message = std::move(destination.error().message);
    if (destination.error().code == policy::DestinationErrc::credentialsInUrl) {
      // The parser quotes the authority, which holds the credentials: never hand them back.
      message =
          "URLs must not carry a user name or password (the part before '@'). Remove it; fetch "
          "sends no credentials taken from URLs.";
    }
    auditRefusal(mediation.audit, tool.revision, tool.name, policy::kActionFetch, "", std::nullopt,
                 code);
    return HostOpFailure{code, std::move(message)};
  }

  // Check 4: the access class of the method.
  policy::HttpRequest http;
  http.method = policy::normalizeMethod(input.method);
  http.destination = std::move(*destination);
  http.headers = std::move(input.headers);
  const policy::AccessClass access = policy::accessClassOf(http.method);
  const std::string origin = http.destination.origin;

  const policy::FetchLimits limits = fetchLimits(*mediation.configs.current());
  if (input.bodyBase64 != nullptr) {
    // Refuse an oversized body before decoding it.
    if (input.bodyBase64->size() / 4 * 3 > limits.maxRequestBodyBytes + 2) {
      auditRefusal(mediation.audit, tool.revision, tool.name, policy::kActionFetch, origin, access,
                   "request-too-large");
      return HostOpFailure{"request-too-large", "The request body is larger than the limit of " +
                                                    std::to_string(limits.maxRequestBodyBytes) +
                                                    " bytes."};
    }
    auto decoded = base64Decode(*input.bodyBase64);
    if (!decoded) return malformed("bodyBase64 is not base64");
    http.body = std::move(*decoded);
  } else {
    http.body = std::move(input.body);
  }
  // Headers, method and body are checked before anyone is asked: a request that could never be
  // sent must not cost a person a prompt.
  if (auto checked = policy::checkRequest(http, limits); !checked) {
    const std::string code(policy::errorCode(checked.error().code));
    auditRefusal(mediation.audit, tool.revision, tool.name, policy::kActionFetch, origin, access,
                 code);
    return HostOpFailure{code, std::move(checked.error().message)};
  }
  // Secret placeholders: refused in the URL, toward ungranted origins, in disallowed bodies.
  if (auto refused = checkSecrets(mediation, tool.name, tool.revision, input.url, http)) {
    auditRefusal(mediation.audit, tool.revision, tool.name, policy::kActionFetch, origin, access,
                 refused->code);
    return std::move(*refused);
  }

  FetchJob job{
      mediation,
      caller,
      policy::DecisionKey{tool.revision, std::string(policy::kActionFetch), origin, access},
      false,
      privateRangeText(http.destination),
      std::move(http),
      "",
      RedirectMode::manual,
      0,
      std::move(operation)};
  job.requested = policy::manifestRequests(tool.manifest, job.key);
  job.url = origin + job.request.destination.pathAndQuery;
  return job;
}

bool isRedirect(unsigned status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// `text` with every byte RFC 3986 has no place for percent-encoded (spaces, non-ASCII, the few
// ASCII characters URLs as browsers write them keep, such as '|' or '^', and a '%' that starts
// no escape, which browsers keep too), so that boost::urls can resolve it: the server reads an
// encoded byte as the byte.
std::string uriSafe(std::string_view text) {
  static constexpr std::string_view kAllowed =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;=";
  static constexpr char kHex[] = "0123456789ABCDEF";
  auto isHex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (kAllowed.find(c) != std::string_view::npos ||
        (c == '%' && i + 2 < text.size() && isHex(text[i + 1]) && isHex(text[i + 2]))) {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
    }
  }
  return out;
}

// `reference` resolved against `base` as RFC 3986 (5.2.2) does, the fragment dropped, its
// percent-encodings left as they are (boost::urls::resolve normalizes the path, and decodes
// "%2F" there, which names another resource on many servers). Dot segments stay: the URL
// parser of every request (policy::parseDestination) removes them as browsers do.
std::string resolvedReference(const boost::urls::url_view& base,
                              const boost::urls::url_view& reference) {
  std::string out(base.scheme());
  out += ':';
  auto withQuery = [&](const boost::urls::url_view& from) {
    if (from.has_query()) {
      out += '?';
      out += from.encoded_query();
    }
  };
  if (reference.has_scheme()) {
    out = std::string(reference.scheme()) + ":";
    if (reference.has_authority()) out += "//" + std::string(reference.encoded_authority());
    out += reference.encoded_path();
    withQuery(reference);
    return out;
  }
  if (reference.has_authority()) {
    out += "//" + std::string(reference.encoded_authority());
    out += reference.encoded_path();
    withQuery(reference);
    return out;
  }
  if (base.has_authority()) out += "//" + std::string(base.encoded_authority());
  const std::string_view path = reference.encoded_path();
  if (path.empty()) {
    out += base.encoded_path();
    withQuery(reference.has_query() ? reference : base);
    return out;
  }
  if (path.front() == '/') {
    out += path;
  } else {
    const std::string_view basePath = base.encoded_path();
    if (base.has_authority() && basePath.empty()) {
      out += '/';
    } else {
      out += basePath.substr(0, basePath.rfind('/') + 1);
    }
    out += path;
  }
  withQuery(reference);
  return out;
}

// The Location of a response, if it has one.
const std::string* locationOf(const policy::HttpResponse& response) {
  for (const auto& [name, value] : response.headers) {
    if (name == "location") return &value;
  }
  return nullptr;
}

// The request a redirect leads to, as the Fetch standard's HTTP-redirect fetch makes it: the
// Location resolved against the URL fetched, without its fragment; a 303, or a 301 or 302 of a
// POST, becomes a GET without a body or the headers that describe one; toward another origin
// it goes without the Authorization header. Empty when the response has no Location (it is then
// the answer). `nextUrl` holds the URL the input points to.
boost::system::result<std::optional<FetchInput>, HostOpFailure> redirectedInput(
    const FetchJob& job, const policy::HttpResponse& response, std::string& nextUrl) {
  const std::string* location = locationOf(response);
  if (location == nullptr) return std::optional<FetchInput>{};
  // As the URL Standard reads it: without its tabs and newlines or its leading and trailing
  // controls and spaces, and a backslash before the query as a slash (https is a special scheme:
  // "/\host" is "//host").
  std::string written;
  for (const char c : *location) {
    if (c != '\t' && c != '\n' && c != '\r') written += c;
  }
  auto isControlOrSpace = [](char c) { return static_cast<unsigned char>(c) <= 0x20; };
  while (!written.empty() && isControlOrSpace(written.back())) written.pop_back();
  const auto start = std::find_if_not(written.begin(), written.end(), isControlOrSpace);
  written.erase(written.begin(), start);
  for (char& c : written) {
    if (c == '?' || c == '#') break;
    if (c == '\\') c = '/';
  }
  // "https:" without "//" after it is relative to the URL fetched, whose scheme it names.
  if (written.size() >= 6 && boost::algorithm::iequals(written.substr(0, 6), "https:") &&
      written.compare(6, 2, "//") != 0) {
    written.erase(0, 6);
  }
  const std::string locationText = uriSafe(written);
  const std::string baseText = uriSafe(job.url);
  auto reference = boost::urls::parse_uri_reference(locationText);
  auto base = boost::urls::parse_uri(baseText);
  if (!reference || !base) {
    return HostOpFailure{"redirect-failed",
                         "The response of " + job.url + " is a redirect (" +
                             std::to_string(response.status) +
                             ") whose Location is not a URL; fetch with redirect: \"manual\" "
                             "to read it."};
  }
  nextUrl = resolvedReference(*base, *reference);

  FetchInput next;
  next.url = nextUrl;
  next.method = job.request.method;
  next.headers = job.request.headers;
  next.body = job.request.body;
  const bool toGet = response.status == 303 ? next.method != "GET" && next.method != "HEAD"
                                            : (response.status == 301 || response.status == 302) &&
                                                  next.method == "POST";
  auto drop = [&](auto&& which) {
    std::erase_if(next.headers, [&](const auto& header) { return which(header.first); });
  };
  if (toGet) {
    next.method = "GET";
    next.body.clear();
    drop([](const std::string& name) {
      for (std::string_view described : {"content-encoding", "content-language", "content-location",
                                         "content-type", "content-length"}) {
        if (boost::algorithm::iequals(name, described)) return true;
      }
      return false;
    });
  }
  // A URL that does not parse fails in prepareFetch(), with the words of the first request's.
  auto destination = policy::parseDestination(nextUrl, job.services.http.rules());
  if (!destination || destination->origin != job.key.target) {
    drop([](const std::string& name) { return boost::algorithm::iequals(name, "authorization"); });
  }
  return std::optional<FetchInput>{std::move(next)};
}

// The bytes of a request's header values: what substituting secrets changes, with the body.
std::size_t headerValueBytes(const policy::HttpRequest& request) {
  std::size_t total = 0;
  for (const auto& header : request.headers) total += header.second.size();
  return total;
}

// Authorizes and sends one request, and each request its redirects lead to (job.redirect): every
// one is authorized, audited, and gets its secrets, on its own.
asio::awaitable<void> runFetch(FetchJob first) {
  std::optional<FetchJob> current(std::move(first));  // a redirect's job takes its place
  // The secret values of the requests before this one: a server that had one may send it on in
  // a Location, so they come out of everything the tool gets, the URLs included.
  std::vector<policy::SecretValue> earlier;
  for (;;) {
    FetchJob& job = *current;
    HostOperation& operation = *job.operation;
    const std::string& path = job.request.destination.pathAndQuery;
    policy::AuthorizationRequest ask;
    ask.key = job.key;
    ask.toolName = job.caller->name;
    ask.manifestRequests = job.requested;
    ask.privateRange = job.privateRange;
    // The path without the query (queries carry keys more often than paths do), cut short for
    // the prompt; a request joins a pending prompt only with the whole of it the same.
    const std::string withoutQuery = path.substr(0, path.find('?'));
    ask.detail = job.request.method + " " + withoutQuery.substr(0, 200) +
                 (withoutQuery.size() > 200 ? "..." : "") +
                 (job.redirects > 0 ? " (a redirect)" : "");
    ask.sameAs = job.request.method + " " + withoutQuery;
    auto decision = co_await authorize(job.services, std::move(ask), job.operation, true);
    if (decision.source == policy::DecisionSource::cancelled) {
      operation.complete(cancelledFailure());
      co_return;
    }
    if (!decision.allowed()) {
      auto refusal = notAuthorized(decision, job.key, job.caller->name, job.caller->agentDefined);
      if (job.redirects > 0) refusal.message += " (the request followed a redirect)";
      operation.complete(std::move(refusal));
      co_return;
    }

    RequestRecord record{job.key, job.caller->name, decision.scope, job.request.method, "", {}, {},
                         {}};
    // A redirect's next request is made from this one as the tool wrote it: with placeholders,
    // whose values go only where they are granted.
    std::optional<policy::HttpRequest> asWritten;
    if (job.redirect != RedirectMode::manual) asWritten = job.request;
    // Secrets go in now, after authorization, and come out of the response before the tool
    // sees it.
    const std::size_t placedHeaders = headerValueBytes(job.request);
    const std::size_t placedBody = job.request.body.size();
    auto secrets =
        substituteSecrets(job.services, job.caller->name, job.key.toolRevision, job.request);
    if (!secrets) {
      auditRefusal(job.services.audit, job.key.toolRevision, job.caller->name, job.key.action,
                   job.key.target, job.key.access, secrets.error().code);
      if (job.redirects > 0) secrets.error().message += " (the request followed a redirect)";
      operation.complete(std::move(secrets.error()));
      co_return;
    }
    record.secrets = secrets->names;
    for (auto& value : earlier) secrets->values.push_back(std::move(value));
    earlier.clear();
    // Every value the revision may send to this origin comes out of what it receives from
    // there, not only the ones this request carried: a value sent earlier to a server that
    // keeps it (a note, a paste) would otherwise come back whole in a later response.
    if (job.services.secrets != nullptr) {
      for (auto& value : job.services.secrets->valuesFor(
               job.key.toolRevision, job.request.destination.origin, secrets->names)) {
        secrets->values.push_back(std::move(value));
      }
    }
    auto limits = fetchLimits(*job.services.configs.current());
    // The request passed its size limits with the placeholders in it; what the values add to
    // each part is not held against that part, or a tool could learn a value's length from
    // where a request starts failing.
    const std::size_t sentHeaders = headerValueBytes(job.request);
    limits.secretHeaderBytes = sentHeaders > placedHeaders ? sentHeaders - placedHeaders : 0;
    limits.secretBodyBytes =
        job.request.body.size() > placedBody ? job.request.body.size() - placedBody : 0;
    const auto started = Clock::now();
    auto result =
        co_await job.services.http.fetch(std::move(job.request), limits, job.caller->name);
    record.duration = since(started);
    if (!result) {
      record.outcome = std::string(policy::errorCode(result.error().code));
      auditRequest(job.services.audit, record);
      std::string message = result.error().message;
      if (job.redirects > 0) message += " (the request followed a redirect)";
      redactSecrets(*secrets, message);
      operation.complete(HostOpFailure{record.outcome, std::move(message)});
      co_return;
    }
    record.outcome = "ok";
    record.status = static_cast<int>(result->status);
    record.bytes = result->body.size();
    auditRequest(job.services.audit, record);

    if (job.redirect == RedirectMode::error && isRedirect(result->status)) {
      // As the Fetch standard: a redirect status is a network error, with a Location or not.
      HostOpFailure failure{"redirect-failed", "The response of " + job.url + " is a redirect (" +
                                                   std::to_string(result->status) +
                                                   ") and the request said redirect: \"error\"."};
      redactSecrets(*secrets, failure.message);
      operation.complete(std::move(failure));
      co_return;
    }
    if (job.redirect == RedirectMode::follow && isRedirect(result->status)) {
      job.request = std::move(*asWritten);
      std::string nextUrl;
      auto next = redirectedInput(job, *result, nextUrl);
      if (!next) {
        HostOpFailure failure = next.error();
        redactSecrets(*secrets, failure.message);
        operation.complete(std::move(failure));
        co_return;
      }
      if (*next) {
        // A server that was sent a value (or keeps one) may write it into the URL it redirects
        // to: following would send it on to wherever that points, granted or not, and put it in
        // the next request's prompt, audit entry and errors. Such a redirect is not followed.
        const std::string* location = locationOf(*result);
        if (carriesSecret(*secrets, nextUrl) ||
            (location != nullptr && carriesSecret(*secrets, *location))) {
          auditRefusal(job.services.audit, job.key.toolRevision, job.caller->name,
                       policy::kActionFetch, "", std::nullopt, "redirect-failed");
          HostOpFailure failure{
              "redirect-failed",
              "The response of " + job.url + " is a redirect (" + std::to_string(result->status) +
                  ") to a URL that holds the value of a secret (one this fetch sent, or one "
                  "granted to where it went). It was not followed, so the value goes no "
                  "further; fetch with redirect: \"manual\" to read the Location, the value "
                  "redacted."};
          redactSecrets(*secrets, failure.message);
          operation.complete(std::move(failure));
          co_return;
        }
        if (job.redirects == kMaxRedirects) {
          HostOpFailure failure{"redirect-failed", "More than " + std::to_string(kMaxRedirects) +
                                                       " redirects, the last from " + job.url +
                                                       "."};
          redactSecrets(*secrets, failure.message);
          operation.complete(std::move(failure));
          co_return;
        }
        auto prepared = prepareFetch(job.services, job.caller, std::move(**next), job.operation);
        if (!prepared) {
          auto failure = std::move(prepared.error());
          failure.message += " (the request followed a redirect from " + job.url + ")";
          redactSecrets(*secrets, failure.message);
          operation.complete(std::move(failure));
          co_return;
        }
        prepared->redirect = job.redirect;
        prepared->redirects = job.redirects + 1;
        earlier = std::move(secrets->values);
        current.emplace(std::move(*prepared));
        continue;
      }
    }
    redactSecrets(*secrets, *result);
    std::string url = job.url;
    redactSecrets(*secrets, url);
    operation.complete(replyOf(*result, url, job.redirects > 0));
    co_return;
  }
}

// ---------------------------------------------------------------------------------------------
// popup

struct PopupJob {
  MediationServices services;
  PopupHosts* popups = nullptr;
  std::string toolName;
  bool agentDefined = false;
  policy::DecisionKey key;
  bool requested = false;
  json::object params;  // of popup.open, without the popupId
  std::shared_ptr<HostOperation> operation;
  // Touched only on the operation's strand.
  struct State {
    bool aborted = false;
    std::optional<std::string> popupId;
    // Runs out at [popup] timeout_ms once the popup is open; the popup's end cancels it.
    std::optional<asio::steady_timer> deadline;
  };
  std::shared_ptr<State> state;
};

asio::awaitable<void> runPopup(PopupJob job) {
  HostOperation& operation = *job.operation;
  // A person is asked from here on (the prompt, then the popup): the wall clock stops.
  operation.pauseWallClock();
  if (job.requested && job.popups->hostCount() == 0) {
    auditRefusal(job.services.audit, job.key.toolRevision, job.toolName, job.key.action,
                 job.key.target, job.key.access, "no-popup-host");
    operation.resumeWallClock();
    operation.complete(HostOpFailure{
        "no-popup-host",
        "no client has called popup.subscribe: the daemon never opens windows itself, and no "
        "popup host (such as a desktop integration) is connected to show this popup"});
    co_return;
  }
  policy::AuthorizationRequest ask;
  ask.key = job.key;
  ask.toolName = job.toolName;
  ask.manifestRequests = job.requested;
  ask.detail = job.key.target == "custom-html" ? "a popup with the tool's own HTML"
                                               : "a popup showing " + job.key.target;
  auto decision = co_await authorize(job.services, std::move(ask), job.operation, false);
  if (decision.source == policy::DecisionSource::cancelled || job.state->aborted) {
    operation.resumeWallClock();
    operation.complete(cancelledFailure());
    co_return;
  }
  if (!decision.allowed()) {
    operation.resumeWallClock();
    operation.complete(notAuthorized(decision, job.key, job.toolName, job.agentDefined));
    co_return;
  }
  RequestRecord record{job.key, job.toolName, decision.scope, "", "", {}, {}, {}};
  const auto started = Clock::now();
  const auto strand = co_await asio::this_coro::executor;
  auto done = [operation = job.operation, audit = &job.services.audit, record, started, strand,
               state = job.state](runtime::HostOpResult result) mutable {
    record.duration = since(started);
    record.outcome = result ? "answered" : result.error().code;
    auditRequest(*audit, record);
    asio::post(strand, [state] {
      if (state->deadline) state->deadline->cancel();
    });
    operation->resumeWallClock();
    operation->complete(std::move(result));
  };
  const auto timeout = job.services.configs.current()->popupTimeout;
  job.state->deadline.emplace(strand, timeout);
  auto popupId = job.popups->open(std::move(job.params), done);
  if (!popupId) {
    operation.resumeWallClock();
    operation.complete(
        HostOpFailure{"no-popup-host",
                      "no client has called popup.subscribe (the last popup host left while "
                      "the popup was being authorized); try again once a host is connected"});
    co_return;
  }
  job.state->popupId = *popupId;
  if (job.state->aborted) {
    job.popups->close(*popupId);
    co_return;
  }
  // Until the host answers, the call ends (terminal cancellation) or the time runs out.
  boost::system::error_code waited;
  co_await job.state->deadline->async_wait(asio::redirect_error(asio::use_awaitable, waited));
  if (!waited) job.popups->expire(*popupId, timeout);
}

}  // namespace

boost::system::result<json::object, runtime::HostOpFailure> DaemonCapabilityHost::resolveInvocation(
    const registry::ToolRevision&, const std::string& name, const json::object& invocation) {
  // Within a lineage, its nearest definition of the name first, as tasks.compile pins a call.
  if (const auto* task = invocation.if_contains("taskId"); task && task->is_string()) {
    auto definition = services_.tasks.definitionFor(std::string(task->get_string()), name);
    if (!definition) return runtime::HostOpFailure{"failed", definition.error().detail};
    if (*definition) return json::object{{"toolRevision", **definition}};
  }
  auto tool = services_.registry.getActive(name);
  if (!tool) {
    const bool notFound = tool.error().code == registry::RegistryErrc::notFound;
    return runtime::HostOpFailure{notFound ? "not-found" : "failed", tool.error().detail};
  }
  // Only opaque identities: no manifest, no settings values.
  json::object answer{{"toolRevision", (*tool)->revision}};
  if (auto settings = services_.registry.trySettingsRevision(name, (*tool)->revision)) {
    answer["settingsRevision"] = *settings;
  }
  return answer;
}

boost::system::result<json::array, std::string> DaemonCapabilityHost::createSubtasks(
    const registry::ToolRevision&, const json::value& drafts, const json::object& invocation) {
  if (!drafts.is_array()) return std::string("drafts must be an array of task drafts");
  std::optional<std::string> parentId;
  if (const auto* task = invocation.if_contains("taskId"); task && task->is_string()) {
    parentId = std::string(task->get_string());
  }
  auto compiled =
      services_.tasks.compile(drafts.as_array(), parentId, registry::TaskStore::DraftSource::tool);
  if (!compiled) return compiled.error().detail;
  if (const auto* key = invocation.if_contains("subtasksKey");
      key && key->is_string() && services_.subtasks != nullptr) {
    switch (services_.subtasks->add(std::string(key->get_string()), *compiled)) {
      case SubtaskLedger::Added::added:
        break;
      case SubtaskLedger::Added::tooMany:
        return "a call may make at most " + std::to_string(SubtaskLedger::kMaxPerCall) +
               " subtasks";
      case SubtaskLedger::Added::tooLarge:
        return std::string(
            "the call's subtasks would pass its output limit (outputBytes): they are part of "
            "its answer");
      case SubtaskLedger::Added::closed:
        return std::string("the call has ended");
    }
  }
  return std::move(*compiled);
}

std::string SubtaskLedger::open(std::size_t maxBytes) {
  std::lock_guard lock(mutex_);
  std::string key = "call-" + std::to_string(++next_);
  open_.emplace(key, Made{{}, 0, maxBytes});
  return key;
}

SubtaskLedger::Added SubtaskLedger::add(const std::string& key, const json::array& tasks) {
  // Measured outside the lock: the text each task takes in the answer, with its comma.
  std::size_t bytes = 0;
  for (const auto& task : tasks) bytes += protocol::writeJson(task).size() + 1;
  std::lock_guard lock(mutex_);
  auto found = open_.find(key);
  if (found == open_.end()) return Added::closed;
  Made& made = found->second;
  if (made.tasks.size() + tasks.size() > kMaxPerCall) return Added::tooMany;
  if (bytes > made.maxBytes - made.bytes) return Added::tooLarge;
  made.bytes += bytes;
  for (const auto& task : tasks) made.tasks.push_back(task);
  return Added::added;
}

json::array SubtaskLedger::close(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto found = open_.find(key);
  if (found == open_.end()) return {};
  json::array made = std::move(found->second.tasks);
  open_.erase(found);
  return made;
}

void DaemonCapabilityHost::startOperation(const registry::ToolRevision& caller,
                                          const json::object& invocation, const std::string& kind,
                                          json::value request,
                                          std::shared_ptr<HostOperation> operation) {
  try {
    if (kind == "fetch") return startFetch(caller, request, operation);
    if (kind == "popup") return startPopup(caller, request, operation);
    if (kind == "storage" && services_.storage != nullptr) {
      return services_.storage->start(caller, request, operation);
    }
    if (kind == "secret" && services_.mediation.secrets != nullptr) {
      return operation->complete(services_.mediation.secrets->placeholder(caller, request));
    }
  } catch (const std::exception& error) {
    spdlog::error("{} of {} ({}) failed to start: {}", kind, caller.name, caller.revision,
                  error.what());
    operation->complete(HostOpFailure{
        "internal", "the daemon failed to start " + kind + "; its log has the details"});
    return;
  }
  // storage and secrets come with their own issue.
  runtime::CapabilityHost::startOperation(caller, invocation, kind, std::move(request),
                                          std::move(operation));
}

void DaemonCapabilityHost::startFetch(const registry::ToolRevision& caller,
                                      const json::value& request,
                                      std::shared_ptr<HostOperation> operation) {
  const json::object* fields = request.if_object();
  if (fields == nullptr) return operation->complete(malformed("not an object"));
  const json::value* url = fields->if_contains("url");
  const json::value* method = fields->if_contains("method");
  const json::value* redirect = fields->if_contains("redirect");
  if (url == nullptr || !url->is_string()) return operation->complete(malformed("url"));
  if (method != nullptr && !method->is_string()) return operation->complete(malformed("method"));
  // No automatic redirects (ARCHITECTURE.md, Policy): a redirect is followed only when the
  // tool asks, which gives it nothing it could not do itself by fetching the Location.
  RedirectMode mode = RedirectMode::manual;
  if (redirect != nullptr) {
    if (*redirect == "follow") {
      mode = RedirectMode::follow;
    } else if (*redirect == "error") {
      mode = RedirectMode::error;
    } else if (*redirect != "manual") {
      return operation->complete(malformed("redirect"));
    }
  }
  FetchInput input;
  input.url = url->get_string();
  if (method != nullptr) input.method = method->get_string();
  if (const json::value* headers = fields->if_contains("headers")) {
    if (!headers->is_array()) return operation->complete(malformed("headers"));
    for (const auto& pair : headers->get_array()) {
      const json::array* entry = pair.if_array();
      if (entry == nullptr || entry->size() != 2 || !(*entry)[0].is_string() ||
          !(*entry)[1].is_string()) {
        return operation->complete(malformed("headers must be [name, value] pairs"));
      }
      input.headers.emplace_back(std::string((*entry)[0].get_string()),
                                 std::string((*entry)[1].get_string()));
    }
  }
  if (const json::value* body = fields->if_contains("bodyBase64")) {
    if (!body->is_string()) return operation->complete(malformed("bodyBase64"));
    input.bodyBase64 = &body->get_string();
  }

  auto tool = std::make_shared<FetchCaller>();
  tool->name = caller.name;
  tool->revision = caller.revision;
  tool->agentDefined = caller.agentDefined;
  if (const auto* capabilities = caller.manifest.if_contains("capabilities");
      capabilities != nullptr && capabilities->is_object()) {
    if (const auto* fetch = capabilities->get_object().if_contains("fetch")) {
      tool->manifest["capabilities"] = json::object{{"fetch", *fetch}};
    }
  }
  auto job = prepareFetch(services_.mediation, std::move(tool), std::move(input), operation);
  if (!job) return operation->complete(std::move(job.error()));
  job->redirect = mode;
  const std::string what = "fetch " + job->key.target + " by " + caller.name;
  spawnOperation(executor_, runFetch(std::move(*job)), operation, what);
}

void DaemonCapabilityHost::startPopup(const registry::ToolRevision& caller,
                                      const json::value& request,
                                      std::shared_ptr<HostOperation> operation) {
  MediationServices& mediation = services_.mediation;
  const json::object* fields = request.if_object();
  const json::value* kind = fields != nullptr ? fields->if_contains("kind") : nullptr;
  json::object params{{"tool", json::object{{"name", caller.name}, {"revision", caller.revision}}}};
  std::string target;
  if (kind != nullptr && *kind == "custom-html") {
    const json::value* html = fields->if_contains("html");
    if (html == nullptr || !html->is_string()) {
      return operation->complete(
          HostOpFailure{"invalid-popup", "a custom-html popup needs html: a string"});
    }
    if (html->get_string().size() > kMaxPopupHtmlBytes) {
      return operation->complete(
          HostOpFailure{"request-too-large", "the popup's html is larger than the limit of " +
                                                 std::to_string(kMaxPopupHtmlBytes) + " bytes"});
    }
    target = "custom-html";
    params["kind"] = "custom-html";
    params["html"] = *html;
  } else if (kind != nullptr && *kind == "origin") {
    const json::value* url = fields->if_contains("url");
    if (url == nullptr || !url->is_string()) {
      return operation->complete(
          HostOpFailure{"invalid-url", "an origin popup needs url: an https URL"});
    }
    auto destination = policy::parseDestination(url->get_string(), mediation.http.rules());
    if (!destination) {
      const std::string code(policy::errorCode(destination.error().code));
      auditRefusal(mediation.audit, caller.revision, caller.name, policy::kActionPopup, "",
                   policy::AccessClass::read, code);
      return operation->complete(
          HostOpFailure{code, destination.error().code == policy::DestinationErrc::credentialsInUrl
                                  ? "popup URLs must not carry a user name or password; remove them"
                                  : destination.error().message});
    }
    if (!registry::isCanonicalHttpsOrigin(destination->origin)) {
      return operation->complete(
          HostOpFailure{"invalid-url",
                        "the popup URL's origin is not an exact https origin; give an https URL "
                        "on a host name or address"});
    }
    target = destination->origin;
    params["kind"] = "origin";
    params["url"] = destination->origin + destination->pathAndQuery;
  } else {
    return operation->complete(HostOpFailure{
        "invalid-popup",
        "a popup request is {kind: \"custom-html\", html} or {kind: \"origin\", url}"});
  }

  PopupJob job{mediation,
               &services_.popups,
               caller.name,
               caller.agentDefined,
               policy::DecisionKey{caller.revision, std::string(policy::kActionPopup), target,
                                   policy::AccessClass::read},
               false,
               std::move(params),
               operation,
               std::make_shared<PopupJob::State>()};
  job.requested = policy::manifestRequests(caller.manifest, job.key);
  auto state = job.state;
  PopupHosts* popups = &services_.popups;
  spawnOperation(executor_, runPopup(std::move(job)), operation,
                 "popup " + target + " by " + caller.name, [state, popups] {
                   state->aborted = true;
                   if (state->popupId) popups->close(*state->popupId);
                 });
}

}  // namespace toolhost::daemon
