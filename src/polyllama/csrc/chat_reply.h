// What a chat reply must look like (a rendered template's prompt, grammar and stops; GBNF
// for a JSON schema) and what a finished or partial reply says (libcommon's common/chat.h
// and common/json-schema-to-grammar.h), for Python, which cannot call that C++ directly.
#pragma once

#include <string>
#include <vector>

namespace polyllama {

struct chat_result {
    std::string              prompt;             // the formatted prompt
    std::string              grammar;            // GBNF for tools / json_schema, may be empty
    bool                     grammar_lazy = false;
    std::vector<std::string> grammar_trigger_patterns;  // regex patterns for a lazy grammar
    std::vector<std::string> additional_stops;
    std::vector<std::string> preserved_tokens;
    int                      format = 0;         // common_chat_format, for parsing the reply
    std::string              generation_prompt;
    std::string              parser;             // serialized PEG parser for the reply
};

// Parses a reply (content, reasoning, tool calls) into OpenAI-style JSON; partial: the
// reply is still being generated (an unfinished tool call is left open, not an error).
bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text, bool partial,
                      std::string & message_json, std::string & err);

bool json_schema_to_gbnf(const std::string & schema_json, std::string & grammar, std::string & err);

}  // namespace polyllama
