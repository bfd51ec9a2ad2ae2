#!/usr/bin/env python3
"""Writes the seeds with repeat and nest markers (fuzz_expand.h) into tests/fuzz/corpus/: small
counts, so each runs fast, but one mutated byte of a count makes the input as deep or as large as
the crafted inputs of tests/fuzz/regressions (make_crafted_inputs.py), which the fuzzers could not
reach before the markers.

  /usr/bin/python3 tests/fuzz/make_marker_seeds.py tests/fuzz/corpus
"""
import os, struct, sys

corpus = sys.argv[1]

def count(n):
    return struct.pack('<I', n)[:3]

def repeat(n, a):
    return b'\xfe' + count(n) + bytes([len(a)]) + a

def nest(n, a, m, b):
    return b'\xfd' + count(n) + bytes([len(a)]) + a + bytes([len(m)]) + m + bytes([len(b)]) + b

def write(target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, name), 'wb') as f:
        f.write(data)

def X(s):  # pickle BINUNICODE
    b = s.encode()
    return b'X' + struct.pack('<I', len(b)) + b

# torch_state_dict, pickle mode ("PKL!"): nested lists (EMPTY_LIST^n EMPTY_LIST APPEND^n), nested
# dicts, nested tuples (TUPLE1 repeated), and one tensor whose size and stride mutations reach.
write('torch_state_dict', 'nested_lists.pkl', b'PKL!\x80\x02' + nest(3, b']', b']', b'a') + b'.')
write('torch_state_dict', 'nested_dicts.pkl', b'PKL!\x80\x02' + nest(3, b'}' + X('k'), b'}', b's') + b'.')
write('torch_state_dict', 'nested_tuples.pkl', b'PKL!\x80\x02]' + repeat(3, b'\x85') + b'.')
tensor = b'PKL!\x80\x02}' + X('w')
tensor += b'ctorch._utils\n_rebuild_tensor_v2\n('
tensor += b'(' + X('storage') + b'ctorch\nFloatStorage\n' + X('0') + X('cpu') + b'K\x10tQ'
tensor += b'K\x00'                                   # storage offset
tensor += b'(K\x02\x8a\x08' + struct.pack('<q', 4) + b't'   # size (2, 4)
tensor += b'(\x8a\x08' + struct.pack('<q', 4) + b'K\x01t'   # stride (4, 1)
tensor += b'\x89ccollections\nOrderedDict\n)RtRs.'
write('torch_state_dict', 'tensor_2x4.pkl', tensor)

# hf_tokenizer: Sequence steps nested (pre_tokenizer, normalizer, decoder).
def tokenizer(field, inner, key):
    step = b'{"type": "Sequence", "' + key + b'": ['
    return (b'{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "' + field + b'": ' +
            nest(3, step, inner, b']}') + b'}')
write('hf_tokenizer', 'nested_pre_tokenizer.json', tokenizer(b'pre_tokenizer', b'{"type": "ByteLevel", "add_prefix_space": false}', b'pretokenizers'))
write('hf_tokenizer', 'nested_normalizer.json', tokenizer(b'normalizer', b'{"type": "NFC"}', b'normalizers'))
write('hf_tokenizer', 'nested_decoder.json', tokenizer(b'decoder', b'{"type": "ByteLevel"}', b'decoders'))

# safetensors, header mode ("HDR!"): numbers at the edges of what JSON and 64 bits hold.
write('safetensors', 'header_offsets.safetensors', b'HDR!{"w": {"dtype": "F32", "shape": [2, 8], "data_offsets": [0, 64]}}')
write('safetensors', 'header_nested.safetensors', b'HDR!{"w": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}, "__metadata__": ' +
      nest(3, b'[', b'1', b']') + b'}')

# JSON-based readers: values nested deep.
write('hf_config', 'nested_value.json', b'{"model_type": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 8, "x": ' + nest(3, b'[', b'', b']') + b'}')
write('jsonl', 'nested_value.jsonl', b'{"text": "a", "meta": ' + nest(3, b'{"a": ', b'1', b'}') + b'}\n')
write('ds_config', 'nested_value.json', b'{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": ' + nest(3, b'[', b'0.9', b']') + b'}}}')
