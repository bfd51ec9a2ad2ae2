// `dstrain prepare-data`: text files -> llm.c token files (train, and val with --val-fraction).
//
//   dstrain prepare-data --tokenizer gpt2|bytes|PATH/tokenizer.json INPUT... -o OUT.bin [--val-fraction F]
//                        [--val-output VAL.bin] [--format text|brown|jsonl] [--text-key KEY] [--cache-dir DIR]
//
// Each input file is one document, written as Tokenizer::encode_document says (docs/data.md §6):
// after an end-of-text token (gpt2, bytes), or between bos and eos (a Hugging Face tokenizer.json). An INPUT that is a folder
// stands for its regular files sorted by name (not recursing); with --format brown, for its Brown
// corpus files only (ca01 ... cr09), whose POS tags are stripped (brown_to_text). With --format jsonl
// each input is a JSON Lines file and each of its lines one document, the string under --text-key
// ("text" by default); every line of every file is checked before tokenising, and a bad one is an
// error naming the file and line (data/jsonl_documents.h).
//
// Output names:
//   F = 0                      -> OUT exactly (no val file; --val-output is an error)
//   F > 0, no --val-output     -> OUT with "_train" and "_val" before its extension:
//                                 -o datasets/brown.bin writes datasets/brown_train.bin and datasets/brown_val.bin
//   F > 0, --val-output VAL    -> OUT and VAL exactly as given
// Folders above the outputs are created. The paths and token counts are printed on stdout.
// Every error (missing input, fraction outside [0, 1), unknown tokenizer or format) is a
// dstrain::Error, which main() reports with exit status 2.
#pragma once

#include <filesystem>
#include <optional>

namespace CLI {
class App;
}

namespace dstrain {

// Registers the subcommand on `app`; it runs from CLI::App::parse.
void add_prepare_data_command(CLI::App& app);

struct PrepareDataOutputs {
  std::filesystem::path train;
  std::optional<std::filesystem::path> val;
};

// The naming rule above. Throws Error for --val-output without a val fraction, or for train and val
// naming the same file.
PrepareDataOutputs prepare_data_outputs(const std::filesystem::path& output, const std::optional<std::filesystem::path>& val_output,
                                        double val_fraction);

}  // namespace dstrain
