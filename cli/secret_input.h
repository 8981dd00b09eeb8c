// toolhostctl secrets set: reads a secret's value without it ever being an argument (which `ps`
// and shell histories would show). One thread.
#pragma once

#include <cstddef>
#include <string>

namespace toolhost::cli {

// The most toolhostctl reads; the daemon applies its own limit ([secrets] max_value_bytes).
inline constexpr std::size_t kMaxSecretInputBytes = std::size_t{1} << 20;

// All of stdin when it is not a terminal (one trailing newline, or CRLF, removed); else one line
// typed after `prompt` (written to stderr) with echo off, the terminal restored on return and on
// SIGINT, SIGTERM, SIGHUP, SIGQUIT and Ctrl-Z. On failure, false with the reason in `error`.
bool readSecretValue(const std::string& prompt, std::string& value, std::string& error);

// Overwrites the bytes of `text` (the compiler may not drop it) and empties it.
void wipeString(std::string& text);

}  // namespace toolhost::cli
