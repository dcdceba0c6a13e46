// Greedy picks inside the decode graph: a llama.cpp backend sampler (llama.h's
// "backend sampling", EXPERIMENTAL in the pin) whose only output is the token id.
//
// Why: on a GPU the engine otherwise copies every sequence's n_vocab logits to the host and
// scans them there (128,256 floats = 512 KB per sequence and token for Llama 3's vocabulary):
// at 64 sequences, 32 MB copied and scanned per step while the device waits. llama.cpp's
// own greedy backend sampler picks on the device but still hands the logits row back (its
// `llama_sampler_data::logits` stays set, so llama_decode copies it, ARCHITECTURE.md §4.7);
// this one clears it, so only 4 bytes per sequence come back.
#pragma once

#include "llama.h"

namespace polyllama {

// A sampler chain (what llama_set_sampler takes) of one stage: the argmax of the row, with
// `banned` (>= 0: the end-of-sequence token of ignore_eos) set to -inf first. The chain is
// owned by the caller (llama_sampler_free), and can be attached once: llama.cpp's chain
// refuses a second backend_init.
llama_sampler * device_greedy_chain(llama_token banned);

}  // namespace polyllama
