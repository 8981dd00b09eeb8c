#include "daemon/log_budget.h"

#include <algorithm>
#include <utility>

namespace toolhost::daemon {

LogBudget::LogBudget(double perSecond, double burst)
    : perSecond_(perSecond), burst_(burst), tokens_(burst), refilled_(Clock::now()) {}

bool LogBudget::allow(std::string& note) { return allow(note, Clock::now()); }

bool LogBudget::allow(std::string& note, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  if (now > refilled_) {
    const double seconds = std::chrono::duration<double>(now - refilled_).count();
    tokens_ = std::min(burst_, tokens_ + seconds * perSecond_);
    refilled_ = now;
  }
  if (tokens_ < 1) {
    ++withheld_;
    return false;
  }
  tokens_ -= 1;
  note.clear();
  if (withheld_ > 0) {
    note = " (" + std::to_string(withheld_) + " similar line(s) before this one were not logged)";
    withheld_ = 0;
  }
  return true;
}

std::uint64_t LogBudget::takeWithheld() {
  std::lock_guard lock(mutex_);
  return std::exchange(withheld_, 0);
}

namespace {
LogBudget& everyClient() {
  static LogBudget budget(50, 500);
  return budget;
}
}  // namespace

bool allowClientLine(LogBudget& connection, std::string& note) {
  std::string shared;
  if (!connection.allow(note) || !everyClient().allow(shared)) return false;
  if (note.empty()) note = shared;
  return true;
}

bool allowClientLine(std::string& note) { return everyClient().allow(note); }

std::string logText(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  std::size_t cut = max;
  // Back to the first byte of a UTF-8 sequence (continuation bytes are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...(" + std::to_string(text.size()) + " bytes)";
}

}  // namespace toolhost::daemon
