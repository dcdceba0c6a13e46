// llama.cpp and ggml log through one callback. Ours keeps the recent warning and error
// lines, so that a failed load can say why, and echoes lines at or above a threshold to
// stderr: by default llama.cpp's chatter would drown a Python program's own output.
#pragma once

#include <string>

namespace polyllama {

void        log_install();
void        log_set_stderr_level(int min_level);  // ggml_log_level; >= 5 prints nothing
std::string log_recent_problems();                // warnings and errors since log_clear()
std::string log_recent_errors();                  // the errors alone (a failure's reason)
void        log_clear();

}  // namespace polyllama
