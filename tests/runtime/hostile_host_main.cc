// A sandbox host that breaks the protocol on purpose, as one taken over by a tool (through a V8
// bug) could: process_pool_test.cc starts it in place of the real host to check that the daemon's
// side survives it and trusts it no further than the calls it has in flight there.
//
//   hostile_host --sandbox-host SCENARIO      (the socket is fd 3, as for the real host)
//
// It answers the hello's ping and every later ping, and answers each call as SCENARIO says:
//   not-json            a line that is not JSON
//   wrong-type          a result whose id is a string
//   unknown-type        a message of a type that does not exist
//   too-deep            a result nested far deeper than any message may be
//   stray-results       a result for a call that does not exist, then the call's result twice
//   borrowed-call       requests naming a call that is not in flight (an operation, subtasks),
//                       then the call's result
//   forged-invocation   subtasks for the call with an invocation of its own making; the call's
//                       result carries the daemon's reply
//   quick-flood         one quick request held, then 1099 started and aborted at once: counts
//                       the daemon's "busy" refusals
//   operation-flood     100 operations for the call at once; the call's result counts the ones
//                       the daemon refused
//   sandbox-flood       reports of retained sandboxes that do not exist, thousands at a time
//   silent              nothing: calls and their cancels go unanswered (pings still are)
//   chatty              as silent, but it sends a message (a stray pong) every 200 ms, as a
//                       host busy with a backlog of large calls sends their results
//   result-keeps-op     an operation for the call, then the call's result without its abort
//   too-many-values     a result of 4 million zeros (8 MB)
//   too-long            a result of a 200 MiB string
//   output-flood        3 MiB on its stderr without a newline, then the call's result
//   noisy-output        on its stderr: a line with terminal escapes, 1000 lines at once, a line
//                       of 10,000 bytes, a second later one more line; then the call's result
#include <unistd.h>
#include <boost/json.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <thread>

namespace json = boost::json;

namespace {

constexpr int kFd = 3;

bool writeAll(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(kFd, bytes.data(), bytes.size());
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

bool send(const json::object& message) { return writeAll(json::serialize(message) + "\n"); }

class Lines {
 public:
  // The next line, or false at end of stream.
  bool next(std::string& line) {
    for (;;) {
      if (auto end = buffer_.find('\n'); end != std::string::npos) {
        line = buffer_.substr(0, end);
        buffer_.erase(0, end + 1);
        return true;
      }
      char chunk[65536];
      const ssize_t n = ::read(kFd, chunk, sizeof chunk);
      if (n <= 0) return false;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

 private:
  std::string buffer_;
};

json::object outcome(const std::string& revision, json::value value) {
  return json::object{
      {"revision", revision},
      {"logs", ""},
      {"usage",
       json::object{{"wallMs", 1}, {"cpuMs", 0}, {"heapPeakBytes", 0}, {"freshSandbox", false}}},
      {"value", std::move(value)}};
}

json::object result(std::uint64_t id, const std::string& revision, json::value value) {
  return json::object{
      {"t", "result"}, {"id", id}, {"outcome", outcome(revision, std::move(value))}};
}

// Waits for the opComplete of operation `op`, answering pings meanwhile; `others` counts the
// opCompletes of other operations that came first.
json::object awaitCompletion(Lines& lines, std::uint64_t op, int* others = nullptr) {
  std::string line;
  while (lines.next(line)) {
    auto message = json::parse(line).as_object();
    const auto type = message.at("t").as_string();
    if (type == "ping") {
      send(json::object{{"t", "pong"}, {"seq", message.at("seq")}});
    } else if (type == "opComplete") {
      if (message.at("op").to_number<std::uint64_t>() == op) return message;
      if (others != nullptr) ++*others;
    }
  }
  std::_Exit(0);
}

// Reads until `want` operations were refused with `code` (answering pings meanwhile); how many.
int awaitRefusals(Lines& lines, std::string_view code, int want) {
  int refused = 0;
  std::string line;
  while (refused < want && lines.next(line)) {
    auto message = json::parse(line).as_object();
    const auto type = message.at("t").as_string();
    if (type == "ping") {
      send(json::object{{"t", "pong"}, {"seq", message.at("seq")}});
    } else if (type == "opComplete" && message.contains("error") &&
               message.at("error").at("code") == json::value(json::string(code))) {
      ++refused;
    }
  }
  return refused;
}

void answer(const std::string& scenario, Lines& lines, const json::object& call) {
  const auto id = call.at("id").to_number<std::uint64_t>();
  const std::string revision(call.at("revision").as_string());
  if (scenario == "not-json") {
    writeAll("this is not JSON\n");
  } else if (scenario == "wrong-type") {
    send(json::object{{"t", "result"}, {"id", "one"}, {"outcome", outcome(revision, 1)}});
  } else if (scenario == "unknown-type") {
    send(json::object{{"t", "surprise"}, {"id", id}});
  } else if (scenario == "too-deep") {
    std::string deep = R"({"t":"result","id":)" + std::to_string(id) + R"(,"outcome":)";
    deep += std::string(100000, '[') + std::string(100000, ']') + "}\n";
    writeAll(deep);
  } else if (scenario == "too-many-values" || scenario == "too-long") {
    // A well-formed result whose value the daemon would take but for its bounds on what one
    // message from a host may hold.
    std::string text = json::serialize(result(id, revision, "VALUE"));
    const auto at = text.find("\"VALUE\"");
    writeAll(text.substr(0, at));
    if (scenario == "too-many-values") {
      std::string many = "[0";
      for (int i = 1; i < 4000000; ++i) many += ",0";
      writeAll(many + "]");
    } else {
      writeAll("\"");
      const std::string chunk(1 << 20, 'x');
      for (int i = 0; i < 200 && writeAll(chunk); ++i) {
      }
      writeAll("\"");
    }
    writeAll(text.substr(at + 7) + "\n");
  } else if (scenario == "idle-overflow") {
    // A row the daemon would subtract from its clock, overflowing it.
    auto message = result(id, revision, 1);
    message["own"] = json::object{{"calls", 1},
                                  {"heapBytes", 1},
                                  {"idleMs", std::numeric_limits<std::int64_t>::max()},
                                  {"busy", false}};
    send(message);
  } else if (scenario == "stray-results") {
    send(result(id + 1000, revision, "not yours"));
    send(result(id, revision, "first"));
    send(result(id, revision, "second"));
  } else if (scenario == "borrowed-call") {
    send(json::object{{"t", "opStart"},
                      {"op", 1},
                      {"call", id + 1000},
                      {"kind", "fetch"},
                      {"request", json::object{{"url", "https://example.com/"}}},
                      {"invocation", json::object{}}});
    send(json::object{{"t", "opStart"},
                      {"op", 2},
                      {"call", id + 1000},
                      {"kind", "createSubtasks"},
                      {"request", json::object{{"drafts", json::array{}}}},
                      {"invocation", json::object{}}});
    // One of its own call's, answered after whatever the daemon made of the two before it.
    send(json::object{{"t", "opStart"},
                      {"op", 3},
                      {"call", id},
                      {"kind", "createSubtasks"},
                      {"request", json::object{{"drafts", json::array{}}}},
                      {"invocation", json::object{}}});
    int others = 0;
    awaitCompletion(lines, 3, &others);
    send(result(id, revision, others));
  } else if (scenario == "operation-flood") {
    constexpr int kOps = 100;
    for (int op = 1; op <= kOps; ++op) {
      send(json::object{{"t", "opStart"},
                        {"op", op},
                        {"call", id},
                        {"kind", "storage"},
                        {"request", json::object{{"op", "get"}, {"key", "k"}}},
                        {"invocation", json::object{}}});
    }
    // The refusals come back at once; the operations the daemon took stay outstanding.
    const int refused = awaitRefusals(lines, "too-many-operations", kOps - 64);
    for (int op = 1; op <= kOps; ++op) send(json::object{{"t", "opAbort"}, {"op", op}});
    send(result(id, revision, refused));
  } else if (scenario == "sandbox-flood") {
    for (int batch = 0; batch < 100; ++batch) {
      json::array rows;
      for (int i = 0; i < 1000; ++i) {
        const std::string fake = "sha256:fake-" + std::to_string(batch) + "-" + std::to_string(i);
        rows.push_back(json::object{{"revision", fake},
                                    {"name", "fake"},
                                    {"calls", 1},
                                    {"heapBytes", 1},
                                    {"idleMs", 0},
                                    {"busy", false}});
      }
      if (!send(json::object{{"t", "sandboxes"}, {"updated", rows}, {"removed", json::array{}}})) {
        return;  // the daemon has had enough
      }
    }
    send(result(id, revision, "still here"));
  } else if (scenario == "quick-flood") {
    // The first quick request stays with the daemon (the test holds its lineage read); 1099
    // more are started and aborted at once, which frees the call's operation slots but not the
    // daemon's queue.
    auto start = [&](int op) {
      send(json::object{{"t", "opStart"},
                        {"op", op},
                        {"call", id},
                        {"kind", "resolveInvocation"},
                        {"request", json::object{{"name", "other"}}},
                        {"invocation", json::object{}}});
    };
    start(1);
    for (int op = 2; op <= 1100; ++op) {
      start(op);
      send(json::object{{"t", "opAbort"}, {"op", op}});
    }
    send(result(id, revision, awaitRefusals(lines, "busy", 1100 - 1024)));
  } else if (scenario == "result-keeps-op") {
    send(json::object{{"t", "opStart"},
                      {"op", 1},
                      {"call", id},
                      {"kind", "storage"},
                      {"request", json::object{{"op", "get"}, {"key", "k"}}},
                      {"invocation", json::object{}}});
    send(result(id, revision, "done"));
  } else if (scenario == "output-flood") {
    const std::string chunk(64 * 1024, 'x');
    for (int i = 0; i < 48; ++i) (void)!::write(STDERR_FILENO, chunk.data(), chunk.size());
    send(result(id, revision, "done"));
  } else if (scenario == "noisy-output") {
    std::string out = "W \x1b[31mred\x07 and \x7f\n";
    for (int i = 0; i < 1000; ++i) out += "W flood " + std::to_string(i) + "\n";
    out += "E " + std::string(10000, 'x') + "\n";
    (void)!::write(STDERR_FILENO, out.data(), out.size());
    ::usleep(1100 * 1000);  // past the daemon's one-second window
    const std::string after = "I after the flood\n";
    (void)!::write(STDERR_FILENO, after.data(), after.size());
    send(result(id, revision, "done"));
  } else if (scenario == "forged-invocation") {
    send(json::object{{"t", "opStart"},
                      {"op", 3},
                      {"call", id},
                      {"kind", "createSubtasks"},
                      {"request", json::object{{"drafts", json::array{}}}},
                      {"invocation", json::object{{"taskId", "forged"}}}});
    auto reply = awaitCompletion(lines, 3);
    send(result(id, revision, reply.contains("ok") ? reply.at("ok") : reply.at("error")));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || std::string_view(argv[1]) != "--sandbox-host") {
    std::fprintf(stderr, "hostile_host: --sandbox-host SCENARIO, started by the tests\n");
    return 2;
  }
  std::signal(SIGPIPE, SIG_IGN);
  const std::string scenario = argv[2];
  if (scenario == "chatty") {
    std::thread([] {
      while (send(json::object{{"t", "pong"}, {"seq", 999999}})) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }).detach();
  }
  Lines lines;
  std::string line;
  while (lines.next(line)) {
    json::object message;
    try {
      message = json::parse(line).as_object();
    } catch (const std::exception&) {
      return 3;
    }
    const auto type = message.at("t").as_string();
    if (type == "ping") {
      if (!send(json::object{{"t", "pong"}, {"seq", message.at("seq")}})) return 0;
    } else if (type == "call") {
      answer(scenario, lines, message);
    }
  }
  return 0;
}
