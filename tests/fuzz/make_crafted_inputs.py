#!/usr/bin/env python3
"""Writes the crafted inputs of tests/fuzz/regressions that no fuzzer found by itself (the third
round of hardening): a torch.save zip whose pickle nests 100,000 lists or dicts (the chain of
destructors overflowed the stack), tensors whose strides make the extent wrap past 2^63 (the bounds
check passed and the read went outside the storage), tokenizer.json files whose Sequence steps nest
20,000 deep (recursion without bound), and a safetensors header holding the number 1e400 (the JSON
library's out_of_range escaped as an internal error). Then round 3's data and model-file items: a
tokenizer.json whose Split pattern backtracks past PCRE2's match limit on the fuzz target's text, a
merge entry of 1 MB, JSONL lines with a key given twice or only empty texts, and a config.json that
names no family with a Llama's keys (read as GPT-2, which then has to say so).

  /usr/bin/python3 tests/fuzz/make_crafted_inputs.py OUT_DIR   # then copy into regressions/<target>/
"""
import struct, zipfile, json, sys, os
out = sys.argv[1]
def X(s):  # BINUNICODE
    b = s.encode(); return b'X' + struct.pack('<I', len(b)) + b
def zip_pt(path, pkl, storages):
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        z.writestr('archive/data.pkl', pkl)
        for k, v in storages.items(): z.writestr('archive/data/' + k, v)
        z.writestr('archive/version', '3\n')
# 1. 200,000 nested lists: EMPTY_LIST x N, then APPEND x (N-1)
n = 100000
pkl = b'\x80\x02' + b']' * n + b'a' * (n - 1) + b'.'
zip_pt(os.path.join(out, 'nested_lists_100k.pt'), pkl, {})
# 1b. 300,000 nested dicts: EMPTY_DICT, then (key, EMPTY_DICT) ..., SETITEM back up
n = 100000
pkl = b'\x80\x02' + (b'}' + X('k')) * n + b'}' + b's' * n + b'.'
zip_pt(os.path.join(out, 'nested_dicts_100k.pt'), pkl, {})
# 2. a tensor whose stride is 2^62: the extent wraps to a small number
def tensor_pkl(stride, size):
    p = b'\x80\x02}' + X('w')
    p += b'ctorch._utils\n_rebuild_tensor_v2\n('
    p += b'(' + X('storage') + b'ctorch\nFloatStorage\n' + X('0') + X('cpu') + b'K\x04tQ'
    p += b'K\x00'                      # storage offset
    p += b'(K' + bytes([size]) + b't'    # size (size,)
    p += b'(\x8a\x08' + struct.pack('<q', stride) + b't'   # stride
    p += b'\x89'                       # requires_grad False
    p += b'ccollections\nOrderedDict\n)R'
    p += b'tR' + b's.'
    return p
zip_pt(os.path.join(out, 'stride_2_62.pt'), tensor_pkl(2**62, 4), {'0': struct.pack('<4f', 1, 2, 3, 4)})
zip_pt(os.path.join(out, 'stride_2_63_minus_1.pt'), tensor_pkl(2**63 - 1, 3), {'0': struct.pack('<4f', 1, 2, 3, 4)})
# 3. a tokenizer.json whose pre_tokenizer Sequence nests 50,000 deep
depth = 20000
pre = '{"type": "ByteLevel", "add_prefix_space": false}'
for _ in range(depth): pre = '{"type": "Sequence", "pretokenizers": [' + pre + ']}'
tok = '{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": ' + pre + '}'
open(os.path.join(out, 'pre_tokenizer_nested_20k.json'), 'w').write(tok)
norm = '{"type": "NFC"}'
for _ in range(depth): norm = '{"type": "Sequence", "normalizers": [' + norm + ']}'
open(os.path.join(out, 'normalizer_nested_20k.json'), 'w').write('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": ' + norm + '}')
# 4. a safetensors header with data_offsets [0, 1e400]
h = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1e400]}}'
h += b' ' * ((8 - len(h) % 8) % 8)
open(os.path.join(out, 'offset_1e400.safetensors'), 'wb').write(struct.pack('<Q', len(h)) + h + b'\0' * 4)
# 5. round 3: a byte-fallback BPE (as tests/unit/data/test_hf_tokenizer.cpp's tiny one) whose Split
# pattern ([\s\S]+)+(?:\x01|\x02) backtracks exponentially on every text without \x01 or \x02;
# and the same tokenizer with a merge entry of 1 MB (echoed whole into the message before).
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256): vocab["<0x%02X>" % b] = 3 + b
def tiny_tokenizer(pre_tokenizer, merges):
    return json.dumps({"version": "1.0",
        "added_tokens": [{"id": 1, "content": "<s>", "special": True}, {"id": 2, "content": "</s>", "special": True}],
        "normalizer": None, "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                  "vocab": vocab, "merges": merges}})
open(os.path.join(out, 'split_regex_backtracks.json'), 'w').write(tiny_tokenizer(
    {"type": "Split", "pattern": {"Regex": "([\\s\\S]+)+(?:\\x01|\\x02)"}, "behavior": "Isolated"}, []))
open(os.path.join(out, 'merge_entry_1mb.json'), 'w').write(tiny_tokenizer(None, ["<s>" + "x" * 1000000]))
# 6. JSONL: a key given twice (the last value was kept silently); texts all empty (a file of separators)
open(os.path.join(out, 'duplicate_key.jsonl'), 'w').write('{"text": "ok"}\n{"text": "first", "id": 1, "text": "second"}\n')
open(os.path.join(out, 'empty_texts.jsonl'), 'w').write('{"text": ""}\n{"text": ""}\n')
# 7. a Llama config.json without model_type or architectures: read as GPT-2, whose reader must say so
open(os.path.join(out, 'no_model_type_llama_keys.json'), 'w').write(json.dumps({"hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 200, "max_position_embeddings": 64}))
