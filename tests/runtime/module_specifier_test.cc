// Import specifiers name only the revision's own modules.
#include "runtime/module_specifier.h"

#include <catch2/catch.hpp>

using toolhost::runtime::resolveModuleSpecifier;

TEST_CASE("specifiers resolve against the importer, inside the revision", "[modules]") {
  CHECK(resolveModuleSpecifier("source.js", "./util.js") == "util.js");
  CHECK(resolveModuleSpecifier("source.js", "util.js") == "util.js");
  CHECK(resolveModuleSpecifier("source.js", "/util.js") == "util.js");
  CHECK(resolveModuleSpecifier("source.js", "./lib/a.js") == "lib/a.js");
  CHECK(resolveModuleSpecifier("lib/a.js", "./b.js") == "lib/b.js");
  CHECK(resolveModuleSpecifier("lib/a.js", "../c.js") == "c.js");
  CHECK(resolveModuleSpecifier("lib/deep/a.js", "../../c.js") == "c.js");
  CHECK(resolveModuleSpecifier("lib/a.js", "./x/../b.js") == "lib/b.js");
  CHECK(resolveModuleSpecifier("lib/a.js", "lib/b.js") == "lib/b.js");  // bare: from the root
}

TEST_CASE("specifiers outside the revision resolve to nothing", "[modules]") {
  for (const char* specifier :
       {"", "../util.js", "./../util.js", "node:fs", "https://example.com/a.js",
        "file:///etc/passwd", "data:text/javascript,1", "./", "lib//a.js", "lib/", "a\\b.js", "/",
        ".", ".."}) {
    INFO(specifier);
    CHECK(resolveModuleSpecifier("source.js", specifier) == std::nullopt);
  }
  CHECK(resolveModuleSpecifier("lib/a.js", "../../x.js") == std::nullopt);
}
