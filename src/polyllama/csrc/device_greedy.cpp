// See device_greedy.h.
#include "device_greedy.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <limits>

namespace polyllama {

namespace {

struct device_greedy {
    llama_token banned;
};

// The graph of one row: [fill + set (the banned entry to -inf)] + argmax.
ggml_tensor * pick(ggml_context * ctx, ggml_tensor * row, llama_token banned) {
    ggml_tensor * logits = ggml_reshape_1d(ctx, row, ggml_nelements(row));
    if (banned >= 0 && banned < logits->ne[0]) {
        ggml_tensor * ninf = ggml_fill(ctx, ggml_view_1d(ctx, logits, 1, 0), -INFINITY);
        logits = ggml_set_1d(ctx, logits, ninf, static_cast<size_t>(banned) * ggml_element_size(logits));
    }
    ggml_tensor * token = ggml_argmax(ctx, logits);
    ggml_set_name(token, "polyllama_greedy");
    return token;
}

const char * dg_name(const llama_sampler *) {
    return "polyllama-device-greedy";
}

// On the host (llama.cpp calls this only when the stage did not go to the device; the
// engine never does): the same pick over the candidates, first on ties.
void dg_apply(llama_sampler * smpl, llama_token_data_array * cur) {
    const auto * st = static_cast<const device_greedy *>(smpl->ctx);
    int64_t best = -1;
    for (size_t i = 0; i < cur->size; i++) {
        if (cur->data[i].id == st->banned) {
            continue;
        }
        if (best < 0 || cur->data[i].logit > cur->data[best].logit) {
            best = static_cast<int64_t>(i);
        }
    }
    cur->selected = best;
}

void dg_free(llama_sampler * smpl) {
    delete static_cast<device_greedy *>(smpl->ctx);
}

// Every op of the row's graph must run where the logits are; llama.cpp probes its own
// samplers the same way (llama_sampler_backend_support).
bool dg_backend_init(llama_sampler * smpl, ggml_backend_buffer_type_t buft, uint32_t) {
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr) {
        return true;   // host memory: the CPU backend has every op
    }
    const auto * st = static_cast<const device_greedy *>(smpl->ctx);
    ggml_init_params ip = {16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, /*no_alloc=*/true};
    ggml_context * ctx = ggml_init(ip);
    if (ctx == nullptr) {
        return false;
    }
    ggml_tensor * row = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1024);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, pick(ctx, row, st->banned >= 0 ? 7 : -1));
    bool ok = true;
    for (int i = 0; i < ggml_graph_n_nodes(gf) && ok; i++) {
        ggml_tensor * op = ggml_graph_node(gf, i);
        ok = op->op == GGML_OP_RESHAPE || op->op == GGML_OP_VIEW || ggml_backend_dev_supports_op(dev, op);
    }
    ggml_free(ctx);
    return ok;
}

void dg_backend_apply(llama_sampler * smpl, ggml_context * ctx, ggml_cgraph * gf, llama_sampler_data * data) {
    const auto * st = static_cast<const device_greedy *>(smpl->ctx);
    GGML_UNUSED(gf);   // llama.cpp adds data->sampled to the graph (build_sampling)
    data->sampled = pick(ctx, data->logits, st->banned);
    data->logits = nullptr;   // nothing of the row goes back to the host: the point of this sampler
}

llama_sampler_i g_iface = {
    /* .name              = */ dg_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ dg_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ nullptr,
    /* .free              = */ dg_free,
    /* .backend_init      = */ dg_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ dg_backend_apply,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

}  // namespace

llama_sampler * device_greedy_chain(llama_token banned) {
    llama_sampler_chain_params cp = llama_sampler_chain_default_params();
    cp.no_perf = true;
    llama_sampler * chain = llama_sampler_chain_init(cp);
    llama_sampler_chain_add(chain, llama_sampler_init(&g_iface, new device_greedy{banned}));
    return chain;
}

}  // namespace polyllama
