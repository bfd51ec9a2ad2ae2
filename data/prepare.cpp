#include "data/prepare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "data/token_file.h"
#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {
namespace {

std::string read_document(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open input file {}: check the path (one input file is one document)", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read input file {}: check that it is a readable file", path.string());
  return std::move(ss).str();
}

// Checks the arguments that do not depend on the documents' contents, before any work is done.
std::size_t check_arguments(std::size_t documents, const Tokenizer& tokenizer, const std::optional<std::filesystem::path>& out_val,
                            double val_fraction) {
  if (documents == 0) fail("no input documents to prepare: give at least one input file");
  const std::size_t val_documents = val_document_count(documents, val_fraction);
  if (val_documents > 0 && !out_val) {
    fail("val_fraction is {} but no val output file is given: give one, or set val_fraction to 0", val_fraction);
  }
  if (val_documents == 0 && out_val) {
    fail(
        "a val output file {} is given but val_fraction is 0: set val_fraction > 0 (e.g. 0.1), or drop the val "
        "output",
        out_val->string());
  }
  (void)token_width_for_vocab(tokenizer.vocab_size());
  return val_documents;
}

// Tokenises document i of n (fetched by `document`) as Tokenizer::encode_document does, into train
// or val, then writes.
PrepareResult prepare(std::size_t documents, const std::function<std::string_view(std::size_t)>& document, const Tokenizer& tokenizer,
                      const std::filesystem::path& out_train, const std::optional<std::filesystem::path>& out_val, double val_fraction) {
  const std::size_t val_documents = check_arguments(documents, tokenizer, out_val, val_fraction);
  const std::size_t train_documents = documents - val_documents;
  std::vector<std::int32_t> train, val;
  for (std::size_t i = 0; i < documents; ++i) {
    std::vector<std::int32_t>& tokens = i < train_documents ? train : val;
    tokenizer.encode_document(document(i), tokens);
  }
  // The width follows the vocabulary, not the ids that happen to occur, so every file made with one
  // tokenizer has the same format.
  const TokenWidth width = token_width_for_vocab(tokenizer.vocab_size());
  write_token_file(out_train, train, width);
  if (out_val) write_token_file(*out_val, val, width);
  log_info("prepared {} documents with tokenizer '{}': {} train tokens ({} documents) -> {}{}", documents, tokenizer.name(), train.size(),
           train_documents, out_train.string(),
           out_val ? fmt::format(", {} val tokens ({} documents) -> {}", val.size(), val_documents, out_val->string()) : std::string());
  return {train_documents, val_documents, train.size(), val.size()};
}

}  // namespace

std::size_t val_document_count(std::size_t documents, double val_fraction) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    fail("val_fraction {} is outside [0, 1): give the share of documents for validation, e.g. 0.1, or 0 for none", val_fraction);
  }
  if (val_fraction == 0.0) return 0;
  if (documents < 2) {
    fail(
        "val_fraction {} needs at least 2 documents (val and train each get whole documents), but there are {}: "
        "give more input files, or set val_fraction to 0",
        val_fraction, documents);
  }
  const auto rounded = static_cast<std::size_t>(std::llround(val_fraction * static_cast<double>(documents)));
  return std::clamp<std::size_t>(rounded, 1, documents - 1);
}

PrepareResult prepare_token_files(const std::vector<std::filesystem::path>& inputs, const Tokenizer& tokenizer,
                                  const std::filesystem::path& out_train, std::optional<std::filesystem::path> out_val, double val_fraction) {
  // Missing inputs are reported before any tokenising, so a typo costs no time.
  for (const auto& input : inputs) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(input, error)) {
      fail("input file {} does not exist or is not a regular file: check the path", input.string());
    }
    // An empty file is a document of no text: alone it made a token file of one end-of-text token.
    if (std::filesystem::file_size(input, error) == 0 && !error) {
      fail("input file {} is empty: a document needs text; remove it from the inputs (or fill it)", input.string());
    }
  }
  std::string buffer;  // one document in memory at a time
  const auto document = [&](std::size_t i) -> std::string_view {
    buffer = read_document(inputs[i]);
    return buffer;
  };
  return prepare(inputs.size(), document, tokenizer, out_train, out_val, val_fraction);
}

PrepareResult prepare_token_files_from_texts(const std::vector<std::string>& documents, const Tokenizer& tokenizer,
                                             const std::filesystem::path& out_train, std::optional<std::filesystem::path> out_val,
                                             double val_fraction) {
  const auto document = [&](std::size_t i) -> std::string_view { return documents[i]; };
  return prepare(documents.size(), document, tokenizer, out_train, out_val, val_fraction);
}

}  // namespace dstrain
