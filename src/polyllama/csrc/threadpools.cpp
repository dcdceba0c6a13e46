// See threadpools.h.
#include "threadpools.h"
#include "guard.h"

#include "common.h"

#include <memory>

namespace polyllama {

struct threadpools {
    common_threadpools pools;
};

threadpools * threadpools_attach(llama_context * ctx, int n_threads, int n_threads_batch,
                                 std::string & err) noexcept {
    std::unique_ptr<threadpools> tp;
    // whatever throws comes before llama_attach_threadpool, so ctx never sees a freed pool
    const bool ok = guarded(err, [&] {
        common_params params;
        params.cpuparams.n_threads       = n_threads;
        params.cpuparams_batch.n_threads = n_threads_batch;
        tp = std::make_unique<threadpools>();
        tp->pools.init(ctx, params);   // attaches them to ctx (llama_attach_threadpool)
    });
    return ok ? tp.release() : nullptr;
}

void threadpools_free(threadpools * tp) noexcept {
    delete tp;
}

}  // namespace polyllama
