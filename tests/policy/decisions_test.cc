// Decisions, the audit log and the approval broker, in process: scopes, revocation, reset and
// persistence across a reopen; audit append, trim and tail order; the manifest ceiling; and every
// path through authorize() (not requested, no approver, answers of each scope, timeout,
// cancellation, shared prompts, the last approver leaving), driven on an io_context.
#include "policy/decisions.h"
#include "policy/approvals.h"
#include "policy/audit.h"
#include "store/store.h"
#include "tests/support/catch_result.h"
#include "tests/support/temp_dir.h"

#include <unistd.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/json/parse.hpp>
#include <catch2/catch.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>


namespace asio = boost::asio;
namespace json = boost::json;
using namespace toolhost::policy;
using namespace std::chrono_literals;
using toolhost::store::Store;
using toolhost::store::StorePtr;

namespace {

const std::string kRevA = "sha256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const std::string kRevB = "sha256:BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

using toolhost::testing::TempDir;

StorePtr openStore(const std::filesystem::path& stateDir) {
  toolhost::store::Options options;
  options.stateDir = stateDir;
  options.tables = DecisionStore::tables();
  auto store = Store::open(options);
  if (!store) FAIL("open failed: " << store.error().message);
  return std::move(*store);
}

DecisionKey fetchKey(const std::string& revision = kRevA,
                     const std::string& origin = "https://api.example",
                     AccessClass access = AccessClass::read) {
  return DecisionKey{revision, "fetch", origin, access};
}

template <class T>
T valueOf(boost::system::result<T> result) {
  if (!result) FAIL("unexpected error: " << result.error().message());
  return std::move(*result);
}

struct Notice {
  std::string method;
  json::object params;
};

// A store, a decision store, an audit log and a broker, with an io_context to run authorize().
struct World {
  explicit World(std::size_t auditMax = 1000)
      : store(openStore(dir.state())),
        decisions(*store),
        audit(*store, auditMax),
        broker(decisions, audit) {}

  // Adds an approver whose notices are recorded in `inbox`; `answer` (if set) is posted to the
  // io_context for each prompt, so it runs once authorize() is waiting.
  void addApprover(ApproverId id, std::vector<Notice>& inbox,
                   std::function<void(const json::object& prompt)> answer = {}) {
    broker.addApprover(id, "approver " + std::to_string(id),
                       [this, &inbox, answer](std::string_view method, json::object params) {
                         inbox.push_back(Notice{std::string(method), params});
                         if (answer && method == "policy.prompt") {
                           asio::post(io, [answer, params] { answer(params); });
                         }
                       });
  }

  Decision authorize(AuthorizationRequest request, std::chrono::milliseconds timeout = 5s) {
    std::optional<Decision> out;
    asio::co_spawn(io, broker.authorize(std::move(request), timeout),
                   [&](std::exception_ptr error, Decision decision) {
                     if (error) std::rethrow_exception(error);
                     out = std::move(decision);
                   });
    io.run();
    io.restart();
    REQUIRE(out.has_value());
    return *out;
  }

  std::vector<AuditEntry> auditTail() { return valueOf(audit.tail(100)); }

  TempDir dir;
  StorePtr store;
  DecisionStore decisions;
  AuditLog audit;
  ApprovalBroker broker;
  asio::io_context io;
};

AuthorizationRequest requestFor(DecisionKey key, bool requested = true) {
  AuthorizationRequest request;
  request.key = std::move(key);
  request.toolName = "weather-lookup";
  request.manifestRequests = requested;
  return request;
}

std::string promptIdOf(const json::object& prompt) {
  return std::string(prompt.at("promptId").as_string());
}

}  // namespace

TEST_CASE("decisions: session and always scopes, revoke, reset, list", "[policy][decisions]") {
  TempDir dir;
  auto store = openStore(dir.state());
  DecisionStore decisions(*store);
  auto key = fetchKey();
  CHECK_FALSE(valueOf(decisions.tryFind(key)).has_value());

  auto stored = valueOf(decisions.set(key, Verdict::allow, Scope::session, "approver uid 1"));
  CHECK(stored.scope == Scope::session);
  auto found = valueOf(decisions.tryFind(key));
  REQUIRE(found);
  CHECK(found->verdict == Verdict::allow);
  CHECK(found->scope == Scope::session);
  CHECK(found->decidedBy == "approver uid 1");
  CHECK(found->decidedAt.size() == 24);  // 2024-05-01T12:00:00.123Z
  // Other access class, other revision, other origin: undecided.
  CHECK_FALSE(
      valueOf(decisions.tryFind(fetchKey(kRevA, "https://api.example", AccessClass::write))));
  CHECK_FALSE(valueOf(decisions.tryFind(fetchKey(kRevB))));
  CHECK_FALSE(valueOf(decisions.tryFind(fetchKey(kRevA, "https://api.example:8443"))));

  // An always decision replaces the session one.
  valueOf(decisions.set(key, Verdict::deny, Scope::always, "admin"));
  found = valueOf(decisions.tryFind(key));
  REQUIRE(found);
  CHECK(found->verdict == Verdict::deny);
  CHECK(found->scope == Scope::always);
  // A later session decision shadows it for this run.
  valueOf(decisions.set(key, Verdict::allow, Scope::session, "admin"));
  CHECK(valueOf(decisions.tryFind(key))->scope == Scope::session);
  CHECK(valueOf(decisions.list(std::nullopt)).size() == 1);

  // Revoking removes both.
  CHECK(valueOf(decisions.revoke(key)) == true);
  CHECK_FALSE(valueOf(decisions.tryFind(key)).has_value());
  CHECK(valueOf(decisions.revoke(key)) == false);

  // Reset of one revision leaves the others.
  valueOf(decisions.set(fetchKey(kRevA), Verdict::allow, Scope::always, "x"));
  valueOf(decisions.set(fetchKey(kRevA, "https://b.example"), Verdict::deny, Scope::session, "x"));
  valueOf(decisions.set(fetchKey(kRevB), Verdict::allow, Scope::always, "x"));
  valueOf(decisions.set(DecisionKey{kRevB, "popup", "custom-html", AccessClass::read},
                        Verdict::allow, Scope::session, "x"));
  CHECK(valueOf(decisions.list(kRevA)).size() == 2);
  CHECK(valueOf(decisions.list(std::nullopt)).size() == 4);
  CHECK(valueOf(decisions.reset(kRevA)) == 2);
  CHECK(valueOf(decisions.list(kRevA)).empty());
  auto rest = valueOf(decisions.list(std::nullopt));
  REQUIRE(rest.size() == 2);
  CHECK(rest[0].key.toolRevision == kRevB);
  CHECK(valueOf(decisions.reset(std::nullopt)) == 2);
  CHECK(valueOf(decisions.list(std::nullopt)).empty());

  CHECK_THROWS_AS(decisions.set(key, Verdict::allow, Scope::once, "x"), std::invalid_argument);
}

TEST_CASE("decisions: always survives a reopen, session does not", "[policy][decisions]") {
  TempDir dir;
  std::string longTarget = "https://" + std::string(600, 'a') + ".example";
  {
    auto store = openStore(dir.state());
    DecisionStore decisions(*store);
    valueOf(decisions.set(fetchKey(), Verdict::allow, Scope::always, "approver uid 1"));
    valueOf(decisions.set(fetchKey(kRevA, "https://api.example", AccessClass::write), Verdict::deny,
                          Scope::always, "approver uid 1"));
    valueOf(decisions.set(fetchKey(kRevB), Verdict::allow, Scope::session, "approver uid 1"));
    // A target too long for an LMDB key is keyed by its hash and still found.
    valueOf(decisions.set(DecisionKey{kRevA, "invoke", longTarget, AccessClass::write},
                          Verdict::allow, Scope::always, "admin"));
  }
  auto store = openStore(dir.state());
  DecisionStore decisions(*store);
  auto read = valueOf(decisions.tryFind(fetchKey()));
  REQUIRE(read);
  CHECK(read->verdict == Verdict::allow);
  CHECK(read->scope == Scope::always);
  CHECK(read->decidedBy == "approver uid 1");
  auto write =
      valueOf(decisions.tryFind(fetchKey(kRevA, "https://api.example", AccessClass::write)));
  REQUIRE(write);
  CHECK(write->verdict == Verdict::deny);
  CHECK_FALSE(valueOf(decisions.tryFind(fetchKey(kRevB))).has_value());
  auto invoke =
      valueOf(decisions.tryFind(DecisionKey{kRevA, "invoke", longTarget, AccessClass::write}));
  REQUIRE(invoke);
  auto all = valueOf(decisions.list(std::nullopt));
  REQUIRE(all.size() == 3);
  bool sawLong = false;
  for (const auto& entry : all) sawLong = sawLong || entry.key.target == longTarget;
  CHECK(sawLong);
}

TEST_CASE("audit: a target URL is kept without its query", "[policy][audit]") {
  TempDir dir;
  auto store = openStore(dir.state());
  AuditLog audit(*store, 5);
  AuditEntry entry;
  entry.kind = "request";
  entry.toolRevision = kRevA;
  entry.toolName = "t";
  entry.action = "invoke";
  entry.target = "https://api.example/rpc?api_key=TOPSECRET#frag";
  entry.verdict = "allow";
  audit.append(entry);
  entry.target = "unix:/run/svc.sock";
  audit.append(entry);
  auto tail = valueOf(audit.tail(10));
  REQUIRE(tail.size() == 2);
  CHECK(tail[0].target == "https://api.example/rpc?...");
  CHECK(tail[1].target == "unix:/run/svc.sock");
}

TEST_CASE("audit: append numbers entries, trims the oldest, tails newest last", "[policy][audit]") {
  TempDir dir;
  {
    auto store = openStore(dir.state());
    AuditLog audit(*store, 5);
    for (int i = 1; i <= 8; ++i) {
      AuditEntry entry;
      entry.kind = "request";
      entry.toolRevision = i % 2 == 0 ? kRevA : kRevB;
      entry.toolName = "t";
      entry.action = "fetch";
      entry.target = "https://api.example";
      entry.access = AccessClass::read;
      entry.verdict = "allow";
      entry.reason = "request " + std::to_string(i);
      entry.status = 200;
      entry.bytes = 10u * static_cast<unsigned>(i);
      entry.durationMs = i;
      audit.append(entry);
    }
    auto tail = valueOf(audit.tail(100));
    REQUIRE(tail.size() == 5);  // trimmed to the newest 5
    CHECK(tail.front().sequence == 4);
    CHECK(tail.back().sequence == 8);
    CHECK(tail.back().reason == "request 8");
    CHECK(tail.back().status == 200);
    CHECK(tail.back().bytes == 80u);
    CHECK(tail.back().durationMs == 8);
    CHECK(tail.back().access == AccessClass::read);
    CHECK_FALSE(tail.back().time.empty());

    auto lastTwo = valueOf(audit.tail(2));
    REQUIRE(lastTwo.size() == 2);
    CHECK(lastTwo[0].sequence == 7);
    CHECK(lastTwo[1].sequence == 8);
    auto onlyA = valueOf(audit.tail(100, AuditFilter{kRevA}));
    REQUIRE(onlyA.size() == 3);  // 4, 6, 8
    CHECK(onlyA[0].sequence == 4);
    CHECK(onlyA[2].sequence == 8);
    CHECK(valueOf(audit.tail(0)).empty());

    auto json = toJson(tail.back());
    CHECK(json.at("verdict") == "allow");
    CHECK(json.at("bytes") == 80);
    CHECK_FALSE(json.contains("scope"));
  }
  // Numbering continues after a reopen.
  auto store = openStore(dir.state());
  AuditLog audit(*store, 5);
  AuditEntry entry;
  entry.kind = "denial";
  entry.verdict = "deny";
  audit.append(entry);
  auto after = valueOf(audit.tail(100));
  REQUIRE(after.size() == 5);
  CHECK(after.back().sequence == 9);
  CHECK(after.back().kind == "denial");
}

TEST_CASE("audit: appends from many threads are written in batches and tail reads its own",
          "[policy][audit]") {
  TempDir dir;
  auto store = openStore(dir.state());
  constexpr std::size_t kThreads = 4;
  constexpr std::size_t kEach = 300;
  {
    AuditLog audit(*store, 100000);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&audit, t] {
        for (std::size_t i = 0; i < kEach; ++i) {
          AuditEntry entry;
          entry.kind = "request";
          entry.toolName = "t" + std::to_string(t);
          entry.reason = std::to_string(i);
          audit.append(std::move(entry));
        }
      });
    }
    for (auto& thread : threads) thread.join();
    // No flush: tail() waits for what was appended before it.
    auto all = valueOf(audit.tail(100000));
    REQUIRE(all.size() == kThreads * kEach);
    std::vector<std::size_t> next(kThreads, 0);
    for (std::size_t i = 0; i < all.size(); ++i) {
      CHECK(all[i].sequence == i + 1);  // numbered without gaps, in the order written
      const auto t = static_cast<std::size_t>(all[i].toolName.back() - '0');
      CHECK(all[i].reason == std::to_string(next[t]++));  // each thread's entries in its order
    }
    AuditEntry last;
    last.kind = "change";
    audit.append(last);
  }
  // The destructor wrote what was still queued.
  AuditLog reopened(*store, 100000);
  auto newest = valueOf(reopened.tail(1));
  REQUIRE(newest.size() == 1);
  CHECK(newest[0].kind == "change");
  CHECK(newest[0].sequence == kThreads * kEach + 1);
}

TEST_CASE("audit: a full store loses the batch it cannot write and tail still answers",
          "[policy][audit]") {
  TempDir dir;
  toolhost::store::Options options;
  options.stateDir = dir.state();
  options.tables = DecisionStore::tables();
  options.mapSizeMb = 1;
  auto opened = Store::open(options);
  REQUIRE(opened);
  StorePtr store = std::move(*opened);
  AuditLog audit(*store, 100000);
  auto entry = [](std::size_t i, std::size_t reasonBytes) {
    AuditEntry made;
    made.kind = "request";
    made.reason = std::to_string(i) + std::string(reasonBytes, 'x');
    return made;
  };
  for (std::size_t i = 0; i < 10; ++i) audit.append(entry(i, 10));
  REQUIRE(valueOf(audit.tail(100)).size() == 10);
  // Far more than the map holds: the batches that do not fit are lost (and logged).
  for (std::size_t i = 10; i < 210; ++i) audit.append(entry(i, 20000));
  auto kept = valueOf(audit.tail(1000));  // answers: a failed batch counts as done
  REQUIRE(kept.size() >= 10);
  CHECK(kept.size() < 210);
  for (std::size_t i = 0; i < 10; ++i) {
    CHECK(kept[i].sequence == i + 1);
    CHECK(kept[i].reason == std::to_string(i) + std::string(10, 'x'));
  }
}

TEST_CASE("manifest ceiling: fetch origin and class, popup target, invoke endpoint",
          "[policy][decisions]") {
  auto manifest = json::parse(R"({
    "name": "t", "execution": {"class": "sandboxed-code"},
    "capabilities": {"fetch": [{"origin": "https://api.example", "access": ["read"]},
                               {"origin": "https://w.example:8443", "access": ["read", "write"]}],
                     "popup": ["custom-html", "https://login.example"]}})")
                      .as_object();
  CHECK(manifestRequests(manifest, fetchKey()));
  CHECK_FALSE(
      manifestRequests(manifest, fetchKey(kRevA, "https://api.example", AccessClass::write)));
  CHECK_FALSE(manifestRequests(manifest, fetchKey(kRevA, "https://api.example:443")));
  CHECK_FALSE(manifestRequests(manifest, fetchKey(kRevA, "https://other.example")));
  CHECK(manifestRequests(manifest, fetchKey(kRevA, "https://w.example:8443", AccessClass::write)));
  CHECK(manifestRequests(manifest, DecisionKey{kRevA, "popup", "custom-html", AccessClass::read}));
  CHECK(manifestRequests(manifest,
                         DecisionKey{kRevA, "popup", "https://login.example", AccessClass::write}));
  CHECK_FALSE(manifestRequests(
      manifest, DecisionKey{kRevA, "popup", "https://api.example", AccessClass::read}));
  CHECK_FALSE(manifestRequests(
      manifest, DecisionKey{kRevA, "invoke", "https://api.example", AccessClass::write}));
  CHECK_FALSE(manifestRequests(
      manifest, DecisionKey{kRevA, "delete", "https://api.example", AccessClass::read}));

  auto external = json::parse(R"({"name": "x", "execution": {"class": "external-service",
                                   "endpoint": "https://svc.example/rpc"}})")
                      .as_object();
  CHECK(manifestRequests(
      external, DecisionKey{kRevA, "invoke", "https://svc.example/rpc", AccessClass::write}));
  CHECK_FALSE(manifestRequests(
      external, DecisionKey{kRevA, "invoke", "https://svc.example/other", AccessClass::write}));
  CHECK_FALSE(manifestRequests(external, fetchKey()));
}

TEST_CASE("authorize: not requested is denied without a prompt, no approver denies at once",
          "[policy][approvals]") {
  World world;
  auto denied = world.authorize(requestFor(fetchKey(), false));
  CHECK(denied.verdict == Verdict::deny);
  CHECK(denied.source == DecisionSource::notRequested);
  CHECK_THAT(denied.reason, Catch::StartsWith("not-authorized: "));
  CHECK(denied.promptDuration == 0ms);

  auto nobody = world.authorize(requestFor(fetchKey()));
  CHECK(nobody.verdict == Verdict::deny);
  CHECK(nobody.source == DecisionSource::noApprover);
  CHECK_THAT(nobody.reason, Catch::Contains("toolhostctl approve"));

  // An approver hears nothing about a request the manifest does not make.
  std::vector<Notice> inbox;
  world.addApprover(1, inbox);
  CHECK(world.authorize(requestFor(fetchKey(), false)).source == DecisionSource::notRequested);
  CHECK(inbox.empty());

  auto audit = world.auditTail();
  REQUIRE(audit.size() == 3);
  CHECK(audit[0].kind == "denial");
  CHECK(audit[0].verdict == "deny");
  CHECK_THAT(audit[0].reason, Catch::StartsWith("not-authorized"));
  CHECK(audit[1].reason == nobody.reason);
}

TEST_CASE("authorize: answers of each scope", "[policy][approvals]") {
  World world;
  std::vector<Notice> inbox;
  Verdict verdict = Verdict::allow;
  Scope scope = Scope::once;
  world.addApprover(1, inbox, [&](const json::object& prompt) {
    auto decided = world.broker.decide(1, promptIdOf(prompt), verdict, scope);
    REQUIRE(decided);
    CHECK(decided->requests == 1);
  });

  // allow once: allowed, nothing stored, the next request asks again.
  auto once = world.authorize(requestFor(fetchKey()));
  CHECK(once.verdict == Verdict::allow);
  CHECK(once.scope == Scope::once);
  CHECK(once.source == DecisionSource::prompt);
  REQUIRE(inbox.size() == 1);
  const auto& prompt = inbox[0].params;
  CHECK(inbox[0].method == "policy.prompt");
  CHECK(prompt.at("tool").at("name") == "weather-lookup");
  CHECK(prompt.at("tool").at("revision") == json::value(kRevA));
  CHECK(prompt.at("action") == "fetch");
  CHECK(prompt.at("target") == "https://api.example");
  CHECK(prompt.at("access") == "read");
  CHECK(prompt.at("private") == false);
  CHECK(prompt.contains("expiresAt"));
  CHECK_FALSE(valueOf(world.decisions.tryFind(fetchKey())).has_value());
  CHECK(world.authorize(requestFor(fetchKey())).source == DecisionSource::prompt);
  CHECK(inbox.size() == 2);

  // deny once.
  verdict = Verdict::deny;
  auto deniedOnce = world.authorize(requestFor(fetchKey()));
  CHECK(deniedOnce.verdict == Verdict::deny);
  CHECK(deniedOnce.source == DecisionSource::prompt);
  CHECK(inbox.size() == 3);

  // allow for the session: stored in memory, no prompt next time.
  verdict = Verdict::allow;
  scope = Scope::session;
  CHECK(world.authorize(requestFor(fetchKey())).scope == Scope::session);
  CHECK(inbox.size() == 4);
  auto again = world.authorize(requestFor(fetchKey()));
  CHECK(again.verdict == Verdict::allow);
  CHECK(again.source == DecisionSource::stored);
  CHECK(again.scope == Scope::session);
  CHECK(inbox.size() == 4);

  // deny always, for the write class: stored, no prompt next time.
  verdict = Verdict::deny;
  scope = Scope::always;
  auto writeKey = fetchKey(kRevA, "https://api.example", AccessClass::write);
  CHECK(world.authorize(requestFor(writeKey)).verdict == Verdict::deny);
  CHECK(inbox.size() == 5);
  auto storedDeny = world.authorize(requestFor(writeKey));
  CHECK(storedDeny.verdict == Verdict::deny);
  CHECK(storedDeny.source == DecisionSource::stored);
  CHECK(storedDeny.scope == Scope::always);
  CHECK(inbox.size() == 5);

  // A private destination is shown as such.
  auto privateRequest = requestFor(fetchKey(kRevB, "https://10.0.0.1"));
  privateRequest.privateRange = "private 10.0.0.0/8";
  scope = Scope::once;
  world.authorize(privateRequest);
  CHECK(inbox.back().params.at("private") == true);
  CHECK(inbox.back().params.at("privateRange") == "private 10.0.0.0/8");

  // Every answer is audited as a decision; the stored allow is not (the request is, later).
  std::size_t decisions = 0;
  for (const auto& entry : world.auditTail()) decisions += entry.kind == "decision" ? 1 : 0;
  CHECK(decisions == 6);
}

TEST_CASE("authorize: a prompt nobody answers is denied at the timeout", "[policy][approvals]") {
  World world;
  std::vector<Notice> inbox;
  world.addApprover(1, inbox);
  auto decision = world.authorize(requestFor(fetchKey()), 50ms);
  CHECK(decision.verdict == Verdict::deny);
  CHECK(decision.source == DecisionSource::timeout);
  CHECK(decision.promptDuration >= 50ms);
  CHECK_THAT(decision.reason, Catch::Contains("no answer within 50 ms"));
  REQUIRE(inbox.size() == 2);
  CHECK(inbox[1].method == "policy.resolved");
  CHECK(inbox[1].params.at("promptId") == inbox[0].params.at("promptId"));
  CHECK(inbox[1].params.at("resolution") == "timeout");
  // A late answer finds nothing.
  auto late = world.broker.decide(1, promptIdOf(inbox[0].params), Verdict::allow, Scope::always);
  REQUIRE_FALSE(late);
  CHECK(late.error().code == DecideErrc::notFound);
  CHECK_FALSE(valueOf(world.decisions.tryFind(fetchKey())).has_value());
  CHECK(world.auditTail().back().kind == "denial");
}

TEST_CASE("authorize: concurrent identical requests share a prompt, others see it resolved",
          "[policy][approvals]") {
  World world;
  std::vector<Notice> first, second;
  world.addApprover(1, first);
  world.addApprover(2, second);
  std::vector<Decision> decisions;
  for (int i = 0; i < 2; ++i) {
    asio::co_spawn(world.io, world.broker.authorize(requestFor(fetchKey()), 5s),
                   [&](std::exception_ptr, Decision decision) { decisions.push_back(decision); });
  }
  world.io.poll();
  REQUIRE(first.size() == 1);
  REQUIRE(second.size() == 1);
  CHECK(world.broker.pendingPrompts().size() == 1);
  // Someone who is not an approver cannot answer.
  auto stranger = world.broker.decide(9, promptIdOf(first[0].params), Verdict::allow, Scope::once);
  REQUIRE_FALSE(stranger);
  CHECK(stranger.error().code == DecideErrc::notSubscribed);
  auto decided = world.broker.decide(2, promptIdOf(second[0].params), Verdict::allow, Scope::once);
  REQUIRE(decided);
  CHECK(decided->requests == 2);
  world.io.run();
  world.io.restart();
  REQUIRE(decisions.size() == 2);
  CHECK(decisions[0].verdict == Verdict::allow);
  CHECK(decisions[1].verdict == Verdict::allow);
  // The other approver is told; the one who answered is not.
  REQUIRE(first.size() == 2);
  CHECK(first[1].method == "policy.resolved");
  CHECK(first[1].params.at("resolution") == "decided");
  CHECK(first[1].params.at("verdict") == "allow");
  CHECK(second.size() == 1);
  CHECK(world.broker.pendingPrompts().empty());
}

TEST_CASE(
    "authorize: a request the prompt does not show gets its own and once releases only its own",
    "[policy][approvals]") {
  World world;
  std::vector<Notice> inbox;
  world.addApprover(1, inbox);
  auto withDetail = [](std::string detail) {
    auto request = requestFor(fetchKey(kRevA, "https://api.example", AccessClass::write));
    request.detail = std::move(detail);
    return request;
  };
  std::map<std::string, Decision> decisions;  // by detail and the order asked
  int asked = 0;
  for (const char* detail : {"POST /comments", "DELETE /account", "POST /comments"}) {
    asio::co_spawn(world.io, world.broker.authorize(withDetail(detail), 5s),
                   [&decisions, key = std::string(detail) + " #" + std::to_string(++asked)](
                       std::exception_ptr, Decision decision) { decisions[key] = decision; });
  }
  world.io.poll();
  // Two prompts: the second POST joined the first, the DELETE has its own.
  REQUIRE(inbox.size() == 2);
  CHECK(inbox[0].params.at("detail") == "POST /comments");
  CHECK(inbox[1].params.at("detail") == "DELETE /account");
  CHECK(world.broker.pendingPrompts().size() == 2);
  // Allowing the POST once releases the two POSTs, not the DELETE.
  auto once = world.broker.decide(1, promptIdOf(inbox[0].params), Verdict::allow, Scope::once);
  REQUIRE(once);
  CHECK(once->requests == 2);
  world.io.poll();
  CHECK(decisions.size() == 2);
  for (const auto& [key, decision] : decisions) {
    CHECK(key.starts_with("POST /comments"));
    CHECK(decision.verdict == Verdict::allow);
  }
  REQUIRE(world.broker.pendingPrompts().size() == 1);
  CHECK(world.broker.pendingPrompts()[0].at("detail") == "DELETE /account");

  // A session answer settles every pending prompt of the key: the DELETE, and a PUT asked now.
  asio::co_spawn(world.io, world.broker.authorize(withDetail("PUT /profile"), 5s),
                 [&](std::exception_ptr, Decision decision) { decisions["PUT"] = decision; });
  world.io.poll();
  REQUIRE(inbox.size() == 3);
  auto session = world.broker.decide(1, promptIdOf(inbox[1].params), Verdict::deny, Scope::session);
  REQUIRE(session);
  CHECK(session->requests == 2);
  world.io.run();
  world.io.restart();
  REQUIRE(decisions.size() == 4);
  for (const auto& [key, decision] : decisions) {
    if (key.starts_with("POST")) continue;
    CHECK(decision.verdict == Verdict::deny);
    CHECK(decision.scope == Scope::session);
  }
  CHECK(world.broker.pendingPrompts().empty());
  // The approver is told of the prompt it did not answer.
  REQUIRE(inbox.size() == 4);
  CHECK(inbox[3].method == "policy.resolved");
  CHECK(inbox[3].params.at("promptId") == inbox[2].params.at("promptId"));
  CHECK(inbox[3].params.at("scope") == "session");
}

TEST_CASE("authorize: requests whose cut-short detail matches but whole path differs ask apart",
          "[policy][approvals]") {
  World world;
  std::vector<Notice> inbox;
  world.addApprover(1, inbox);
  for (const char* path : {"/a/long/path/one", "/a/long/path/two", "/a/long/path/one"}) {
    auto request = requestFor(fetchKey(kRevA, "https://api.example", AccessClass::write));
    request.detail = "POST /a/long/...";
    request.sameAs = std::string("POST ") + path;
    asio::co_spawn(world.io, world.broker.authorize(std::move(request), 5s),
                   [](std::exception_ptr, Decision) {});
  }
  world.io.poll();
  CHECK(inbox.size() == 2);
  CHECK(world.broker.pendingPrompts().size() == 2);
  world.broker.removeApprover(1);
  world.io.run();
}

TEST_CASE("authorize: cancellation withdraws the prompt, the last approver leaving denies",
          "[policy][approvals]") {
  World world;
  std::vector<Notice> inbox;
  world.addApprover(1, inbox);
  asio::cancellation_signal signal;
  std::optional<Decision> cancelled;
  asio::co_spawn(world.io, world.broker.authorize(requestFor(fetchKey()), 5s),
                 asio::bind_cancellation_slot(
                     signal.slot(), [&](std::exception_ptr, Decision d) { cancelled = d; }));
  world.io.poll();
  REQUIRE(inbox.size() == 1);
  signal.emit(asio::cancellation_type::terminal);
  world.io.run();
  world.io.restart();
  REQUIRE(cancelled);
  CHECK(cancelled->verdict == Verdict::deny);
  CHECK(cancelled->source == DecisionSource::cancelled);
  REQUIRE(inbox.size() == 2);
  CHECK(inbox[1].params.at("resolution") == "withdrawn");
  CHECK(world.broker.pendingPrompts().empty());

  // A pending prompt whose only approver leaves is denied at once.
  std::optional<Decision> abandoned;
  asio::co_spawn(world.io, world.broker.authorize(requestFor(fetchKey()), 5s),
                 [&](std::exception_ptr, Decision d) { abandoned = d; });
  world.io.poll();
  REQUIRE(inbox.size() == 3);
  world.broker.removeApprover(1);
  world.io.run();
  REQUIRE(abandoned);
  CHECK(abandoned->source == DecisionSource::noApprover);
  CHECK_FALSE(world.broker.isApprover(1));
  CHECK(world.broker.approverCount() == 0);
}

TEST_CASE("authorize: pending prompts are handed to a new approver", "[policy][approvals]") {
  World world;
  std::vector<Notice> first;
  world.addApprover(1, first);
  std::optional<Decision> decision;
  asio::co_spawn(world.io, world.broker.authorize(requestFor(fetchKey()), 5s),
                 [&](std::exception_ptr, Decision d) { decision = d; });
  world.io.poll();
  auto pending =
      world.broker.addApprover(2, "late approver", [](std::string_view, json::object) {});
  REQUIRE(pending.size() == 1);
  auto promptId = std::string(pending[0].at("promptId").as_string());
  REQUIRE(world.broker.decide(2, promptId, Verdict::allow, Scope::always));
  world.io.run();
  REQUIRE(decision);
  CHECK(decision->verdict == Verdict::allow);
  CHECK(decision->scope == Scope::always);
  CHECK_THAT(decision->reason, Catch::Contains("late approver"));
  auto stored = valueOf(world.decisions.tryFind(fetchKey()));
  REQUIRE(stored);
  CHECK(stored->decidedBy == "late approver");
}

TEST_CASE("audit: one tool's denials cannot push the rest out of the log", "[policy][audit]") {
  TempDir dir;
  auto store = openStore(dir.state());
  AuditLog audit(*store, 1000);
  AuditEntry change;
  change.kind = "change";
  change.toolRevision = kRevB;
  change.verdict = "revoked";
  audit.append(change);
  auto denial = [](const std::string& revision) {
    AuditEntry entry;
    entry.kind = "denial";
    entry.toolRevision = revision;
    entry.action = "fetch";
    entry.target = "https://not-requested.example";
    entry.verdict = "deny";
    entry.reason = "refused before authorization: not-requested";
    return entry;
  };
  // A tool requesting a refused origin in a loop: its burst is written, the rest left out.
  for (int i = 0; i < 5000; ++i) audit.append(denial(kRevA));
  audit.append(denial(kRevB));  // another tool's denials still get in
  auto all = valueOf(audit.tail(1000));
  std::size_t ofA = 0;
  for (const auto& entry : all) ofA += entry.toolRevision == kRevA ? 1 : 0;
  CHECK(ofA >= 100);
  CHECK(ofA <= 105);  // the burst, and what a few milliseconds refilled
  CHECK(all.front().kind == "change");
  CHECK(all.back().toolRevision == kRevB);
  // Once the bucket refills, the next denial says how many were left out.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  audit.append(denial(kRevA));
  auto last = valueOf(audit.tail(1)).back();
  CHECK(last.toolRevision == kRevA);
  CHECK_THAT(last.reason, Catch::Contains("earlier denials of this tool revision were left out"));
  // Other kinds are never left out.
  for (int i = 0; i < 300; ++i) {
    AuditEntry request = denial(kRevA);
    request.kind = "request";
    audit.append(request);
  }
  CHECK(valueOf(audit.tail(1000)).size() == all.size() + 1 + 300);
}
