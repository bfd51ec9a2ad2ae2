// GPT-2's bytes_to_unicode(): the alphabet in which byte-level BPE vocabularies (GPT-2's
// encoder.json, and the "ByteLevel" tokenizer.json files of Llama 3, Qwen, SmolLM) spell bytes.
// The printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 onwards, in byte
// order.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dstrain {

// The bytes a vocabulary string spells (one byte per character), or nullopt if `token` is not UTF-8
// or holds a character outside the alphabet.
std::optional<std::string> byte_level_to_bytes(std::string_view token);

}  // namespace dstrain
