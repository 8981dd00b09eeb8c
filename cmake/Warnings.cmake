# Project code builds clean under -Wall -Wextra; third-party headers are included as SYSTEM.
function(toolhost_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow=local
                                           -Werror=return-type)
endfunction()
