#!/usr/bin/python3
"""DeepSpeed's consolidation of a ZeRO checkpoint into whole fp32 weights, reimplemented from
deepspeed/utils/zero_to_fp32.py (_get_fp32_state_dict_from_zero_checkpoint and what it calls, for
stages 1, 2 and 3) without importing DeepSpeed: the classes its files pickle are the stand-ins of
deepspeed_checkpoint_fixture.py. For tests/unit/formats/test_deepspeed_checkpoint_writer.cpp, which
compares the result for folders dstrain's writer wrote with the masters it wrote.

  zero_to_fp32_reader.py OUT.json SAVE_DIR...   each SAVE_DIR's `latest` tag consolidated;
                                                OUT.json: {SAVE_DIR: {name: [values]} or {"error": message}}

What zero_to_fp32 does, step by step, is kept: model states files (*_model_states.pt, natural order)
give buffers, param_shapes, frozen shapes and fragments, shared_params; optimizer files
(*_optim_states.pt) must carry zero_stage (BF16_Optimizer's files do not: "not a zero checkpoint")
and be partition_count many; stages 1/2 concatenate each group's ranks' partitions and cut the
parameters off in order, then check that what was consumed, aligned to 2 * world_size, is what is
there; stage 3 takes each parameter's ceil(numel / W) slice of every rank at one running offset.
"""
import glob
import json
import math
import os
import re
import sys
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed_checkpoint_fixture  # noqa: E402,F401  (registers DeepSpeed's pickled classes)


def natural_keys(text):
    return [int(c) if c.isdigit() else c for c in re.split(r'(\d+)', text)]


def get_checkpoint_files(checkpoint_dir, pattern):
    files = sorted(glob.glob(os.path.join(checkpoint_dir, pattern)), key=natural_keys)
    if not files:
        raise FileNotFoundError("can't find %s files in directory '%s'" % (pattern, checkpoint_dir))
    return files


def parse_model_states(files):
    states = []
    for f in files:
        sd = torch.load(f, map_location='cpu')
        if 'buffer_names' not in sd:
            raise ValueError('%s is not a model state checkpoint' % f)
        buffers = {k: v.float() for k, v in sd['module'].items() if k in sd['buffer_names']}
        states.append(dict(buffers=buffers, param_shapes=sd['param_shapes'], shared_params=[[k, v] for k, v in sd['shared_params'].items()],
                           frozen_param_shapes=sd.get('frozen_param_shapes'), frozen_param_fragments=sd.get('frozen_param_fragments')))
    return states


def parse_optim_states(files, checkpoint_dir):
    sds = []
    for f in files:
        sd = torch.load(f, map_location='cpu')
        sd['optimizer_state_dict'].pop('optimizer_state_dict', None)
        sds.append(sd)
    if 'zero_stage' not in sds[0]['optimizer_state_dict']:
        raise ValueError('%s is not a zero checkpoint' % files[0])
    zero_stage = sds[0]['optimizer_state_dict']['zero_stage']
    world_size = sds[0]['optimizer_state_dict']['partition_count']
    if type(world_size) is list:
        world_size = max(world_size)
    if world_size != len(files):
        raise ValueError("Expected %d of '*_optim_states.pt' under '%s' but found %d files" % (world_size, checkpoint_dir, len(files)))
    if zero_stage <= 2:
        key = 'single_partition_of_fp32_groups'
    elif zero_stage == 3:
        key = 'fp32_flat_groups'
    else:
        raise ValueError('unknown zero stage %s' % zero_stage)
    return zero_stage, world_size, [sd['optimizer_state_dict'][key] for sd in sds]


def numel(shape):
    return shape.numel() if callable(getattr(shape, 'numel', None)) else math.prod(shape)


def zero2_merge(state_dict, world_size, fp32_flat_groups, model_states):
    frozen = model_states[0]['frozen_param_shapes']
    if frozen:
        for name in frozen:
            state_dict[name] = model_states[0]['frozen_param_fragments'][name]
    param_shapes = model_states[0]['param_shapes']
    merged = [torch.cat([sd[i] for sd in fp32_flat_groups], 0) for i in range(len(fp32_flat_groups[0]))]
    for shapes, full in zip(param_shapes, merged):
        offset = 0
        avail = full.numel()
        for name, shape in shapes.items():
            n = numel(shape)
            state_dict[name] = full.narrow(0, offset, n).view(shape)
            offset += n
        align_to = 2 * world_size

        def zero2_align(x):
            return align_to * math.ceil(x / align_to)

        offset, avail = zero2_align(offset), zero2_align(avail)
        if offset != avail:
            raise ValueError('consumed %d numels out of %d - something is wrong' % (offset, avail))


def zero3_merge(state_dict, world_size, fp32_flat_groups, model_states):
    frozen = model_states[0]['frozen_param_shapes']
    if frozen:
        for name, shape in frozen.items():
            frags = tuple(ms['frozen_param_fragments'][name] for ms in model_states)
            state_dict[name] = torch.cat(frags, 0).narrow(0, 0, numel(shape)).view(shape)
    param_shapes = {k: v for d in model_states[0]['param_shapes'] for k, v in d.items()}
    # GatheredTensor: the groups of a rank back to back, each parameter at one running offset.
    flats = [torch.cat(list(groups), 0) for groups in fp32_flat_groups]
    avail = flats[0].numel() * world_size
    offset = 0
    for name, shape in param_shapes.items():
        n = numel(shape)
        part = math.ceil(n / world_size)
        state_dict[name] = torch.cat([f[offset:offset + part] for f in flats], 0)[:n].view(shape).contiguous()
        offset += part
    if offset * world_size != avail:
        raise ValueError('consumed %d numels out of %d - something is wrong' % (offset * world_size, avail))


def get_fp32_state_dict(save_dir):
    with open(os.path.join(save_dir, 'latest')) as f:
        tag = f.read().strip()
    ckpt = os.path.join(save_dir, tag)
    model_states = parse_model_states(get_checkpoint_files(ckpt, '*_model_states.pt'))
    zero_stage, world_size, flats = parse_optim_states(get_checkpoint_files(ckpt, '*_optim_states.pt'), ckpt)
    state_dict = OrderedDict(model_states[0]['buffers'])
    (zero2_merge if zero_stage <= 2 else zero3_merge)(state_dict, world_size, flats, model_states)
    for a, b in model_states[0]['shared_params']:
        if b in state_dict:
            state_dict[a] = state_dict[b]
    return state_dict


def main():
    out = {}
    for d in sys.argv[2:]:
        try:
            out[d] = {k: v.float().flatten().tolist() for k, v in get_fp32_state_dict(d).items()}
        except Exception as e:  # noqa: BLE001 — the test reads the message
            out[d] = {'error': '%s: %s' % (type(e).__name__, e)}
    with open(sys.argv[1], 'w') as f:
        json.dump(out, f)


if __name__ == '__main__':
    main()
