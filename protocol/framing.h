// NDJSON framing: splits a byte stream into lines without ever holding more than one line's limit
// (plus one read) in memory. One framer per connection; not thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace toolhost::protocol {

class LineFramer {
 public:
  explicit LineFramer(std::size_t maxLineBytes) : maxLineBytes_(maxLineBytes) {}

  // Space to receive into, then how much of it was filled.
  std::span<char> prepare(std::size_t bytes);
  void commit(std::size_t bytes);
  void append(std::string_view bytes);

  enum class Status {
    line,      // `line` holds the next message, without its "\n" (and a trailing "\r")
    needMore,  // no complete line yet
    tooLong    // the current line exceeds the limit; the stream cannot be resynchronized
  };
  // Blank lines are skipped. The view stays valid until the next call to any member.
  Status next(std::string_view& line);
  // As next(), but a line returned stays: next() returns it again, unless skip() drops it first.
  Status peek(std::string_view& line);
  void skip();  // drops the line the last peek() returned

  std::size_t maxLineBytes() const { return maxLineBytes_; }
  std::size_t buffered() const { return end_ - start_; }
  // The buffer's size: at most 128 KiB once next() or peek() said needMore with little buffered.
  std::size_t capacity() const { return capacity_; }

 private:
  void compact();

  std::size_t maxLineBytes_;
  // Bytes received are [0, end_) of buffer_ (capacity_ long). It is never zero-filled: a read
  // of 64 KiB into a std::string grown by resize() would clear 64 KiB first, on every read.
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_ = 0;
  std::size_t end_ = 0;
  std::size_t start_ = 0;    // first byte not yet returned
  std::size_t scanned_ = 0;  // bytes after start_ already known to hold no newline
  std::size_t peekedEnd_ = 0;  // where start_ goes on skip()
};

}  // namespace toolhost::protocol
