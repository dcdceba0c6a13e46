// See chat_reply.h.
#include "chat_reply.h"
#include "guard.h"

#include "chat.h"
#include "json-schema-to-grammar.h"
#include "json.h"

namespace polyllama {

bool chat_parse_reply(int format, const std::string & generation_prompt, const std::string & parser,
                      const std::string & text, bool partial, std::string & message_json, std::string & err) {
    return guarded(err, [&] {
        common_chat_parser_params params;
        params.format            = (common_chat_format) format;
        params.generation_prompt = generation_prompt;
        if (!parser.empty()) {
            params.parser.load(parser);
        }
        common_chat_msg msg = common_chat_parse(text, partial, params);
        message_json = msg.to_json_oaicompat().dump();
    });
}

bool json_schema_to_gbnf(const std::string & schema_json, std::string & grammar, std::string & err) {
    return guarded(err, [&] { grammar = json_schema_to_grammar(common_json::parse(schema_json)); });
}

}  // namespace polyllama
