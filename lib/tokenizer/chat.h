// Chat templates: a conversation as the text a chat model was trained on. A GGUF file carries
// its template as Jinja (tokenizer.chat_template); specula recognises the families common
// models use by their markers and writes what those templates write, without a Jinja engine
// (docs/DESIGN.md "Chat" lists the families and what of each template is followed).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace specula {

struct ChatMessage {
    std::string_view role;  // "system", "user", "assistant", or what the template knows
    std::string_view content;
};

class ChatTemplate {
  public:
    // `source`: a Jinja chat template, or a family's name ("llama3", "chatml", "gemma",
    // "mistral-v3-tekken", "phi3"). One of no known family is Unsupported.
    static Status from(std::string_view source, ChatTemplate* out);

    // The template's text for the conversation, BOS included where the template writes it
    // (tokenize it parsing special tokens and adding none, as Hugging Face's apply_chat_template
    // is used). `bos` and `eos` are the texts of the model's BOS and EOS tokens. A conversation
    // the template refuses (roles that do not alternate where it requires them to) is
    // InvalidArgument.
    Status apply(std::span<const ChatMessage> messages, bool add_generation_prompt,
                 std::string_view bos, std::string_view eos, std::string* out) const;

  private:
    enum class Family { kLlama3, kChatml, kGemma, kMistralTekken, kPhi3 };
    Status apply_llama3(std::span<const ChatMessage> messages, bool add_generation_prompt,
                        std::string_view bos, std::string* out) const;
    Status apply_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                        std::string* out) const;

    Family family_ = Family::kChatml;
    // Llama 3.1 / 3.2: a system block with the knowledge cut-off and a date, always written.
    bool date_header_ = false;
    bool date_today_ = false;  // the date is today's (strftime_now), else date_
    std::string date_;
    bool always_generation_prompt_ = false;  // Llama 3's first template never tests the flag
    std::string default_system_;             // Qwen2.5's system message when none is given
    bool qwen_roles_ = false;  // tool results in <tool_response>, roles it does not know dropped
    bool reasoning_ = false;   // Qwen3: the <think> part of replies before the last query dropped
};

}  // namespace specula
