// Text documents -> train (and val) token files, the work behind `dstrain prepare-data`.
//
// Every document becomes Tokenizer::encode_document(text): for gpt2 and bytes [eot, tokens of the
// document...], the end-of-text token BEFORE each document, as llm.c's dev/data scripts do, so a
// sequence never starts mid-way without a marker; for a Hugging Face tokenizer [bos?, tokens..., eos].
//
// Val split: with N documents and val_fraction f > 0, the LAST k = round(f·N) documents go to val,
// with k clamped to 1..N-1 (val gets at least one document, train keeps at least one); this needs
// N >= 2. Whole documents only: no document is cut between the files. With f = 0 everything is train.
#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace dstrain {

struct PrepareResult {
  std::size_t train_documents = 0;
  std::size_t val_documents = 0;
  std::size_t train_tokens = 0;  // including the document markers (eot, or bos/eos)
  std::size_t val_tokens = 0;
};

// Reads each input file (raw bytes, one document per file) and writes the token files. Throws Error
// naming the value and the fix for a missing/unreadable input, val_fraction outside [0, 1), no
// documents, val_fraction > 0 without out_val (or with fewer than 2 documents), out_val with
// val_fraction 0. Token files are uint16 (version 1) for vocabularies up to 65536 ids, uint32
// (version 2) above (token_width_for_vocab).
PrepareResult prepare_token_files(const std::vector<std::filesystem::path>& inputs, const Tokenizer& tokenizer,
                                  const std::filesystem::path& out_train, std::optional<std::filesystem::path> out_val, double val_fraction);

// The same for documents already in memory (e.g. the Brown corpus after brown_to_text).
PrepareResult prepare_token_files_from_texts(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                             const std::filesystem::path& out_train, std::optional<std::filesystem::path> out_val,
                                             double val_fraction);

// How many of `documents` documents the val split takes (the rule above). Throws Error for
// val_fraction outside [0, 1), or val_fraction > 0 with fewer than 2 documents.
std::size_t val_document_count(std::size_t documents, double val_fraction);

}  // namespace dstrain
