#!/usr/bin/python3
"""Compares DeepSpeed checkpoint folders object by object: every file of one folder torch.loaded and
compared recursively with the same file of the other — the same files, dicts with the same keys in
the same order, the same Python types (OrderedDict is not dict, torch.Size is not tuple, DeepSpeed's
classes by module and name, their __dict__ compared as dicts), the same tensor dtypes, shapes and
bits, the same numbers. For tests/unit/formats/test_deepspeed_checkpoint_writer.cpp: the folders
dstrain's writer (formats/deepspeed_checkpoint_writer.h) writes against those that
deepspeed_checkpoint_fixture.py writes, with torch.save, as DeepSpeed's saving code lays them out.

  deepspeed_layout_check.py A B                       two save_dirs
  deepspeed_layout_check.py --state STATE.json DIR    DIR/s<S>_<dtype>_dp<W>/ each against the fixture's
                                                      --from-state folder of the same layout, and
                                                      DIR/u_s<S>_<dtype>_dp<W>/ against the fixture's
                                                      to_universal (ds_to_universal) of that folder

Exit 0 when every pair agrees; else the differences, one a line, naming the file and the path in it.
"""
import argparse
import enum
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed_checkpoint_fixture as fixture  # noqa: E402  (registers DeepSpeed's pickled classes)


def type_name(x):
    t = type(x)
    return '%s.%s' % (t.__module__, t.__qualname__)


def bits(t):
    """A tensor's elements as integers of its width, so that -0.0, NaNs and every bit count."""
    t = t.contiguous()
    if t.dtype.is_floating_point:
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def compare(a, b, where, out):
    if type(a) is not type(b):
        out.append('%s: %s against %s' % (where, type_name(a), type_name(b)))
        return
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append('%s: tensor %s%s against %s%s' % (where, a.dtype, list(a.shape), b.dtype, list(b.shape)))
        elif not torch.equal(bits(a), bits(b)):
            k = int((bits(a) != bits(b)).flatten().nonzero()[0])
            out.append('%s: tensor values differ, first at [%d]: %r against %r' % (where, k, a.flatten()[k].item(), b.flatten()[k].item()))
        return
    if isinstance(a, enum.Enum):
        if a is not b:
            out.append('%s: %r against %r' % (where, a, b))
        return
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            out.append('%s: keys %r against %r' % (where, list(a.keys()), list(b.keys())))
            return
        for k in a:
            compare(a[k], b[k], '%s[%r]' % (where, k), out)
        return
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append('%s: %d items against %d' % (where, len(a), len(b)))
            return
        for k, (x, y) in enumerate(zip(a, b)):
            compare(x, y, '%s[%d]' % (where, k), out)
        return
    if isinstance(a, (set, frozenset)):
        if sorted(a) != sorted(b):
            out.append('%s: %r against %r' % (where, a, b))
        return
    if isinstance(a, float):
        if not (a == b or (a != a and b != b)) or (a == 0 and str(a) != str(b)):
            out.append('%s: %r against %r' % (where, a, b))
        return
    if a is None or isinstance(a, (bool, int, str, bytes, torch.dtype)):
        if a != b:
            out.append('%s: %r against %r' % (where, a, b))
        return
    if hasattr(a, '__dict__'):  # DeepSpeed's loss scalers, fragment_address
        compare(dict(vars(a)), dict(vars(b)), where + '.__dict__', out)
        return
    out.append('%s: a %s, which this check does not know' % (where, type_name(a)))


def files_of(root):
    out = []
    for d, _, fs in os.walk(root):
        for f in fs:
            out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(f for f in out if f != 'expected.json')


def compare_folders(a, b):
    out = []
    fa, fb = files_of(a), files_of(b)
    if fa != fb:
        out.append('%s against %s: files %r against %r' % (a, b, fa, fb))
    for f in sorted(set(fa) & set(fb)):
        pa, pb = os.path.join(a, f), os.path.join(b, f)
        if f.endswith('.pt'):
            compare(torch.load(pa), torch.load(pb), f, out)
        else:
            with open(pa, 'rb') as x, open(pb, 'rb') as y:
                if x.read() != y.read():
                    out.append('%s: contents differ' % f)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('a')
    ap.add_argument('b', nargs='?')
    ap.add_argument('--state', help='STATE.json: compare each layout folder of A with the fixture\'s folder of that state')
    args = ap.parse_args()
    failures = []
    if args.state:
        layouts = sorted(d for d in os.listdir(args.a) if re.fullmatch(r'(u_)?s[0-3]_(fp32|fp16|bf16)_dp\d+', d))
        if not layouts:
            failures.append('%s holds no s<S>_<dtype>_dp<W> folders' % args.a)
        with tempfile.TemporaryDirectory() as tmp:
            for d in layouts:
                universal, stage, dtype, dp = re.fullmatch(r'(u_)?s(\d)_(\w+)_dp(\d+)', d).groups()
                ref = os.path.join(tmp, d)
                if universal:  # ds_to_universal's output of the fixture's folder, alone (latest_universal, no latest)
                    fixture.from_state(args.state, ref + '.src', int(stage), dtype, int(dp))
                    fixture.to_universal(ref + '.src', ref)
                else:
                    fixture.from_state(args.state, ref, int(stage), dtype, int(dp))
                failures += ['%s: %s' % (d, x) for x in compare_folders(os.path.join(args.a, d), ref)]
            print('compared %d layouts' % len(layouts))
    else:
        failures = compare_folders(args.a, args.b)
    for f in failures[:40]:
        print(f if len(f) < 600 else f[:600] + ' ...')
    if len(failures) > 40:
        print('... and %d more' % (len(failures) - 40))
    sys.exit(1 if failures else 0)


if __name__ == '__main__':
    main()
