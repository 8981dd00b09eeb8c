#include "protocol/framing.h"

#include <algorithm>
#include <cstring>

namespace toolhost::protocol {

namespace {
// What an empty framer keeps of its buffer: two of the daemon's 64 KiB reads.
constexpr std::size_t kKeptCapacity = 128 * 1024;
}  // namespace

void LineFramer::compact() {
  if (start_ == 0) return;
  std::memmove(buffer_.get(), buffer_.get() + start_, end_ - start_);
  end_ -= start_;
  start_ = 0;
}

std::span<char> LineFramer::prepare(std::size_t bytes) {
  if (start_ > 0 && start_ >= end_ / 2) compact();
  if (capacity_ - end_ < bytes) {
    const std::size_t capacity = std::max(end_ + bytes, capacity_ * 2);
    auto grown = std::make_unique_for_overwrite<char[]>(capacity);
    if (end_ > 0) std::memcpy(grown.get(), buffer_.get(), end_);
    buffer_ = std::move(grown);
    capacity_ = capacity;
  }
  return {buffer_.get() + end_, bytes};
}

void LineFramer::commit(std::size_t bytes) { end_ += bytes; }

void LineFramer::append(std::string_view bytes) {
  auto space = prepare(bytes.size());
  std::memcpy(space.data(), bytes.data(), bytes.size());
  commit(bytes.size());
}

LineFramer::Status LineFramer::next(std::string_view& line) {
  for (;;) {
    const char* begin = buffer_.get() + start_;
    std::size_t available = end_ - start_;
    const void* found = scanned_ < available
                            ? std::memchr(begin + scanned_, '\n', available - scanned_)
                            : nullptr;
    if (found == nullptr) {
      scanned_ = available;
      // A line at the limit may end in "\r\n", its '\r' already here and its '\n' still to come.
      const bool pendingCr = available > 0 && begin[available - 1] == '\r';
      if (available > maxLineBytes_ + (pendingCr ? 1 : 0)) return Status::tooLong;
      if (available == 0) {
        end_ = 0;
        start_ = 0;
      }
      // A long line grew the buffer (doubling, up to twice the line limit): give it back once
      // it is consumed, or every connection that ever sent one keeps its size while idle. What
      // follows it (the start of the next line) moves to a buffer of the kept size.
      if (capacity_ > kKeptCapacity && available <= kKeptCapacity / 2) {
        std::unique_ptr<char[]> kept;
        if (available > 0) {
          kept = std::make_unique_for_overwrite<char[]>(kKeptCapacity);
          std::memcpy(kept.get(), begin, available);
        }
        buffer_ = std::move(kept);
        capacity_ = available > 0 ? kKeptCapacity : 0;
        start_ = 0;
        end_ = available;
      }
      return Status::needMore;
    }
    std::size_t length = static_cast<const char*>(found) - begin;
    start_ += length + 1;
    scanned_ = 0;
    if (length > 0 && begin[length - 1] == '\r') --length;
    if (length > maxLineBytes_) return Status::tooLong;
    std::string_view candidate(begin, length);
    if (candidate.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    line = candidate;
    return Status::line;
  }
}

LineFramer::Status LineFramer::peek(std::string_view& line) {
  const std::size_t start = start_;
  const Status status = next(line);
  // needMore consumed nothing (and may have reset an empty buffer); the others may have passed
  // a line, which stays for next().
  if (status != Status::needMore) {
    peekedEnd_ = start_;
    start_ = start;
    scanned_ = 0;
  }
  return status;
}

void LineFramer::skip() {
  start_ = peekedEnd_;
  scanned_ = 0;
}

}  // namespace toolhost::protocol
