// Persistent CPU threads for a context (libcommon's common_threadpools). Without an
// attached threadpool, ggml-cpu makes and joins a new set of threads for every
// llama_decode: on 2 cores that cost SmolLM2 about 9% of its generation speed against
// llama-bench, which attaches persistent pools as llama.cpp's own tools do.
#pragma once

#include "llama.h"

#include <string>

namespace polyllama {

// n_threads serve single tokens, n_threads_batch prompts; they poll as llama.cpp's default
// does. The pools must be freed after the context (llama_free). NULL, with err, on failure.
struct threadpools;
threadpools * threadpools_attach(llama_context * ctx, int n_threads, int n_threads_batch,
                                 std::string & err) noexcept;
void threadpools_free(threadpools * tp) noexcept;

}  // namespace polyllama
