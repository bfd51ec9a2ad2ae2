#!/usr/bin/python3
"""Checks a file dstrain's TorchSaveWriter wrote (formats/torch_save.h) against torch itself, for
tests/unit/formats/test_torch_save.cpp:

  torch_save_check.py FILE.pt EXPECTED.json REF_DIR
  torch_save_check.py --zip64 FILE.pt      (test_torch_save_zip64.cpp's file past 4 GiB)

1. torch.load(FILE) gives exactly the values EXPECTED.json describes: the Python types (dict, list,
   tuple, int, float, str, bytes, None, bool), tensors' dtypes, shapes, strides, storage offsets and
   values (fp16 / bf16 ones also equal to torch's own rounding of their fp32 sources), tensors the
   writer gave one storage sharing one storage in torch (same data_ptr), and DeepSpeed's objects (the
   stand-in classes of tests/integration/deepspeed_checkpoint_fixture.py, under DeepSpeed's names).
2. The zip is torch's: every CRC right (zipfile.testzip), every entry's data 64-byte aligned, and
   torch.save of the loaded object (REF_DIR/<same file name>) has the same entries in the same order
   (but byteorder, which torch 1.13 does not write), the same storage bytes, and per entry the same
   zip flags, method, versions, times and attributes.
Prints what differs and exits 1; exits 0 when everything matches.
"""
import json
import os
import struct
import sys
import zipfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'integration'))
import deepspeed_checkpoint_fixture  # noqa: E402,F401  (registers deepspeed.* stand-in classes)

DTYPES = {'F32': torch.float32, 'F16': torch.float16, 'BF16': torch.bfloat16, 'F64': torch.float64, 'I64': torch.int64,
          'I32': torch.int32, 'I16': torch.int16, 'I8': torch.int8, 'U8': torch.uint8, 'BOOL': torch.bool}
errors = []
storages = {}  # writer storage id -> data_ptr in torch
tensors = []


def check(cond, where, what):
    if not cond:
        errors.append('%s: %s' % (where or '<root>', what))
    return cond


def same(want, got, where):
    tag = want[0]
    if tag == 'none':
        check(got is None, where, 'expected None, got %r' % (got,))
    elif tag == 'bool':
        check(type(got) is bool and got == want[1], where, 'expected %r, got %r' % (want[1], got))
    elif tag == 'int':
        check(type(got) is int and got == int(want[1]), where, 'expected int %s, got %r' % (want[1], got))
    elif tag == 'float':
        w = float.fromhex(want[1])
        check(type(got) is float and got.hex() == w.hex(), where, 'expected float %r, got %r' % (w, got))
    elif tag == 'str':
        check(type(got) is str and got == want[1], where, 'expected %r, got %r' % (want[1], got))
    elif tag == 'bytes':
        check(type(got) is bytes and got == bytes.fromhex(want[1]), where, 'expected bytes %s, got %r' % (want[1], got))
    elif tag in ('list', 'tuple'):
        if check(type(got) is (list if tag == 'list' else tuple), where, 'expected a %s, got %s' % (tag, type(got).__name__)) and \
           check(len(got) == len(want[1]), where, 'expected %d elements, got %d' % (len(want[1]), len(got))):
            for k, (w, g) in enumerate(zip(want[1], got)):
                same(w, g, '%s.%d' % (where, k))
    elif tag == 'dict':
        if check(type(got) is dict, where, 'expected a dict, got %s' % type(got).__name__) and \
           check(len(got) == len(want[1]), where, 'expected %d keys, got %d' % (len(want[1]), len(got))):
            for (wk, wv), (gk, gv) in zip(want[1], got.items()):  # also the order
                same(wk, gk, where + '.<key>')
                same(wv, gv, '%s.%r' % (where, gk))
    elif tag == 'tensor':
        t = want[1]
        if not check(isinstance(got, torch.Tensor), where, 'expected a tensor, got %s' % type(got).__name__):
            return
        check(got.dtype == DTYPES[t['dtype']], where, 'dtype %s, expected %s' % (got.dtype, t['dtype']))
        check(list(got.shape) == t['shape'], where, 'shape %s, expected %s' % (list(got.shape), t['shape']))
        check(list(got.stride()) == t['stride'], where, 'stride %s, expected %s' % (list(got.stride()), t['stride']))
        check(got.storage_offset() == t['offset'], where, 'storage offset %d, expected %d' % (got.storage_offset(), t['offset']))
        check(not got.requires_grad, where, 'requires_grad')
        flat = got.reshape(-1)
        if t['dtype'] in ('F32', 'F16', 'BF16', 'F64'):
            vals = [float(x).hex() for x in flat.double().tolist()]
            check(vals == [float.fromhex(x).hex() for x in t['values']], where, 'values %s, expected %s' % (vals[:8], t['values'][:8]))
        else:
            check(flat.long().tolist() == [int(x) for x in t['values']], where, 'values %s, expected %s' % (flat.tolist()[:8], t['values'][:8]))
        if 'from_fp32' in t:  # torch's own rounding of the fp32 sources
            ref = torch.tensor([float.fromhex(x) for x in t['from_fp32']], dtype=torch.float32).to(got.dtype)
            check(torch.equal(ref.view(torch.int16), got.reshape(-1).contiguous().view(torch.int16)), where, 'not torch\'s rounding of the fp32 values')
        tensors.append(where)
        ptr = got.storage().data_ptr()
        if t['numel_storage'] > 0:
            if t['storage'] in storages:
                check(storages[t['storage']] == ptr, where, 'does not share the storage of its twin')
            else:
                check(ptr not in storages.values(), where, 'shares a storage it should not')
                storages[t['storage']] = ptr
    elif tag == 'object':
        name, args, state = want[1], want[2], want[3]
        module, _, qual = name.rpartition('.')
        cls = getattr(sys.modules[module], qual)
        if not args and state is None:
            check(got is cls, where, 'expected the global %s itself, got %r' % (name, got))
            return
        if not check(type(got) is cls, where, 'expected a %s, got %s' % (name, type(got))):
            return
        if args:
            check(got == cls(*[int(a[1]) for a in args]), where, 'expected %s(%s), got %r' % (name, args, got))
        if state is not None:
            same(state, got.__dict__, where + '.<state>')
    else:
        check(False, where, 'unknown tag %r' % tag)


def local_data_offsets(path):
    """Entry name -> (where its data starts, its local header's extra field)."""
    out = {}
    with open(path, 'rb') as f:
        for i in zipfile.ZipFile(path).infolist():
            f.seek(i.header_offset)
            h = f.read(30)
            nl, xl = struct.unpack('<HH', h[26:30])
            extra = f.read(nl + xl)[nl:]
            out[i.filename] = (i.header_offset + 30 + nl + xl, extra)
    return out


def check_zip_layout(path):
    z = zipfile.ZipFile(path)
    bad = z.testzip()
    check(bad is None, 'zip', 'the CRC of %s is wrong' % bad)
    for name, (data, extra) in local_data_offsets(path).items():
        check(data % 64 == 0, name, 'data at byte %d, not 64-byte aligned' % data)
        records, k = [], 0
        while k + 4 <= len(extra):
            rid, rlen = struct.unpack('<HH', extra[k:k + 4])
            records.append((rid, extra[k + 4:k + 4 + rlen]))
            k += 4 + rlen
        check(k == len(extra) and records and records[-1][0] == 0x4246 and set(records[-1][1]) <= {0x5A}, name,
              'the extra field does not end with torch\'s FB padding record: %r' % extra)
    return z


def zip64(path):
    z = check_zip_layout(path)
    big = [i for i in z.infolist() if i.file_size >= 2**32]
    far = [i for i in z.infolist() if i.header_offset >= 2**32]
    check(len(big) == 1 and len(far) >= 2, 'zip', 'expected one entry past 4 GiB and two after it: %s' % [(i.filename, i.file_size, i.header_offset) for i in z.infolist()])
    # The local headers' zip64 fields as miniz writes them (torch 1.13's own file past 4 GiB): the big
    # entry's (size, compressed size 0), the later entries' (own offset); their data descriptors of 24 bytes.
    offsets = local_data_offsets(path)
    infos = z.infolist()
    for k, i in enumerate(infos):
        extra = offsets[i.filename][1]
        if i.file_size >= 2**32:
            check(extra[:20] == struct.pack('<HHQQ', 1, 16, i.file_size, 0), i.filename, 'local zip64 field %s' % extra[:20].hex())
        elif i.header_offset >= 2**32:
            check(extra[:12] == struct.pack('<HHQ', 1, 8, i.header_offset), i.filename, 'local zip64 field %s' % extra[:12].hex())
        if k + 1 < len(infos) and (i.file_size >= 2**32 or i.header_offset >= 2**32):
            descriptor = infos[k + 1].header_offset - offsets[i.filename][0] - i.file_size
            check(descriptor == 24, i.filename, 'data descriptor of %d bytes, not zip64\'s 24' % descriptor)
    o = torch.load(path)
    b = o['big']
    check(b.dtype == torch.uint8 and b.shape == (2**32 + 64,), 'big', 'dtype %s shape %s' % (b.dtype, b.shape))
    check((int(b[0]), int(b[2**32]), int(b[-1])) == (1, 3, 2), 'big', 'wrong bytes')
    check(o['tail'].storage().data_ptr() == b.storage().data_ptr() and o['tail'].storage_offset() == 2**32, 'tail', 'not a view of big')
    check(o['small'].tolist() == [1.5, -2.0], 'small', 'wrong values %s' % o['small'].tolist())


def main():
    if sys.argv[1] == '--zip64':
        zip64(sys.argv[2])
        for e in errors:
            print('torch_save_check:', e)
        print('torch_save_check --zip64: %s' % ('FAILED' if errors else 'ok'))
        sys.exit(1 if errors else 0)
    path, expected, ref_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(expected) as f:
        want = json.load(f)
    obj = torch.load(path)
    same(want, obj, '')

    z = check_zip_layout(path)
    os.makedirs(ref_dir, exist_ok=True)
    ref = os.path.join(ref_dir, os.path.basename(path))
    torch.save(obj, ref)
    r = zipfile.ZipFile(ref)
    ours_names = [n for n in z.namelist() if not (n.endswith('/byteorder') and n not in r.namelist())]
    check(ours_names == r.namelist(), 'zip', 'entries %s, torch writes %s' % (z.namelist(), r.namelist()))
    archive = r.namelist()[0].split('/')[0]
    if archive + '/byteorder' in z.namelist():
        check(z.read(archive + '/byteorder') == b'little', 'byteorder', 'not "little"')
        check(z.namelist().index(archive + '/byteorder') == 1, 'byteorder', 'not right after data.pkl')
    for a, b in zip(r.infolist(), [z.getinfo(n) for n in ours_names]):
        for field in ('flag_bits', 'compress_type', 'create_version', 'extract_version', 'date_time', 'external_attr', 'internal_attr',
                      'create_system', 'file_size'):
            if a.filename.endswith('data.pkl') and field == 'file_size':
                continue  # torch's pickle memoises (BINPUT), ours does not
            check(getattr(a, field) == getattr(b, field), a.filename, '%s %r, torch writes %r' % (field, getattr(b, field), getattr(a, field)))
        if '/data/' in a.filename or a.filename.endswith('/version'):
            check(r.read(a.filename) == z.read(b.filename), a.filename, 'bytes differ from torch\'s')
    for name, (data, _) in local_data_offsets(ref).items():
        check(data % 64 == 0, 'torch ' + name, 'torch\'s own data not 64-byte aligned?')
    with open(path, 'rb') as f:
        f.seek(-200, os.SEEK_END)
        check(b'PK\x06\x06' in f.read(), 'zip', 'no zip64 end of central directory record (torch always writes one)')
    for e in errors:
        print('torch_save_check:', e)
    print('torch_save_check: %s, %d tensors in %d non-empty storages' % ('FAILED' if errors else 'ok', len(tensors), len(storages)))
    sys.exit(1 if errors else 0)


if __name__ == '__main__':
    main()
