#!/usr/bin/python3
"""Writes DeepSpeed save_checkpoint folders with torch.save, laid out as DeepSpeed writes them
(deepspeed/runtime/engine.py _save_checkpoint / _save_zero_checkpoint, zero/stage_1_and_2.py and
bf16_optimizer.py state_dict, fp16/fused_optimizer.py state_dict), from known values, and the whole
values expected back (expected.json) — for tests/unit/formats/test_deepspeed_checkpoint.cpp.

  deepspeed_checkpoint_fixture.py OUT --stage S --dtype fp32|fp16|bf16 --dp W [--lie-shape]
  deepspeed_checkpoint_fixture.py OUT --from-dstrain CKDIR --stage S --dtype D --dp W
                                                (the state of dstrain checkpoint CKDIR as a Hugging Face GPT-2 or
                                                 Llama run under DeepSpeed saves it: tests/integration/test_resume_deepspeed_cli.cpp)
  deepspeed_checkpoint_fixture.py OUT --from-dstrain CKDIR ... --universal
                                                (the same converted by ds_to_universal.py: OUT/global_step<N>_universal,
                                                 OUT/latest_universal; the save_checkpoint folder in OUT.src)
  deepspeed_checkpoint_fixture.py OUT --from-state STATE.json --stage S --dtype D --dp W
                                                (the folder DeepSpeed saves for a state given as JSON:
                                                 tests/unit/formats/test_deepspeed_checkpoint_writer.cpp)
  deepspeed_checkpoint_fixture.py OUT --all     (OUT/s<S>_<dtype>_dp<W>/ for S 0-3 x dtypes x W 1,2,4,
                                                 OUT/llama_s<S>_<dtype>_dp<W>/ for LLAMA_CELLS, OUT/u_<cell>/ the
                                                 universal checkpoints of UNIVERSAL_CELLS, OUT/u_vocab/ (a vocabulary
                                                 tensor cut), and OUT/lie/, OUT/lie3/ (stage 2, stage 3): a param_shapes
                                                 entry one row too long; OUT/u_lie/, OUT/u_bad_moment/ (universal: a
                                                 param_shapes entry one row too long, an exp_avg one row short))

DeepSpeed itself is not imported: the classes its checkpoints pickle are stand-ins registered in
sys.modules under DeepSpeed's module paths and qualnames, so the pickles name the same globals
(deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler, deepspeed.runtime.zero.config.ZeroStageEnum,
deepspeed.utils.tensor_fragment.fragment_address).
"""
import argparse
import collections
import dataclasses
import enum
import glob
import json
import math
import os
import re
import shutil
import sys
import types

import torch


def _module(name):
    parts = name.split('.')
    for k in range(1, len(parts) + 1):
        n = '.'.join(parts[:k])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
            if k > 1:
                setattr(sys.modules['.'.join(parts[:k - 1])], parts[k - 1], sys.modules[n])
    return sys.modules[name]


def _register(cls, module):
    cls.__module__ = module
    setattr(_module(module), cls.__name__, cls)
    return cls


class LossScalerBase:
    def __init__(self, cur_scale):
        self.cur_scale = cur_scale
        self.dynamic = False


class LossScaler(LossScalerBase):
    def __init__(self, scale=1):
        super().__init__(scale)


class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale=2**32, scale_factor=2., scale_window=1000, min_scale=1, delayed_shift=1, consecutive_hysteresis=False,
                 raise_error_at_min_scale=True, dtype=torch.half):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


@dataclasses.dataclass
class fragment_address:
    numel: int
    start: int


for _c in (LossScalerBase, LossScaler, DynamicLossScaler):
    _register(_c, 'deepspeed.runtime.fp16.loss_scaler')
_register(ZeroStageEnum, 'deepspeed.runtime.zero.config')
_register(fragment_address, 'deepspeed.utils.tensor_fragment')

DTYPES = {'fp32': torch.float32, 'fp16': torch.float16, 'bf16': torch.bfloat16}
DS_VERSION = '0.19.6'  # the DeepSpeed whose saving code this mirrors (its files' ds_version)
STEP = 10


LLAMA_SHAPES = [
    # A Llama with grouped-query attention (C 8, 2 query heads of 4, 1 key/value head: k_proj and
    # v_proj 4 rows), SwiGLU I 12, V 11, lm_head untied; Hugging Face names as named_parameters()
    # gives them — without "module.", as DeepSpeed's engine.param_names has them.
    [('model.embed_tokens.weight', (11, 8)), ('model.layers.0.self_attn.q_proj.weight', (8, 8)), ('model.layers.0.self_attn.k_proj.weight', (4, 8)),
     ('model.layers.0.self_attn.v_proj.weight', (4, 8)), ('model.layers.0.self_attn.o_proj.weight', (8, 8)),
     ('model.layers.0.mlp.gate_proj.weight', (12, 8)), ('model.layers.0.mlp.up_proj.weight', (12, 8)), ('model.layers.0.mlp.down_proj.weight', (8, 12)),
     ('lm_head.weight', (11, 8))],
    [('model.layers.0.input_layernorm.weight', (8,)), ('model.layers.0.post_attention_layernorm.weight', (8,)), ('model.norm.weight', (8,))],
]


def bare(n):
    return n[len('module.'):] if n.startswith('module.') else n


def model_params(model='gpt2'):
    """Two param groups as Hugging Face's trainer makes them (decay / no decay), GPT-2-like names
    (wrapped: "module.") or a Llama's."""
    g = torch.Generator().manual_seed(1234)
    shapes = [
        [('module.transformer.wte.weight', (7, 4)), ('module.transformer.h.0.attn.c_attn.weight', (4, 3)),
         ('module.transformer.h.0.mlp.c_fc.weight', (3, 3))],
        [('module.transformer.h.0.ln_1.weight', (4,)), ('module.transformer.h.0.ln_1.bias', (1,))],
    ] if model == 'gpt2' else LLAMA_SHAPES
    groups = []
    for grp in shapes:
        out = collections.OrderedDict()
        for name, s in grp:
            # Values on a coarse grid, exactly representable in fp16 and bf16: the module copy then
            # equals the master, and a value in the wrong place cannot hide behind rounding.
            out[name] = (torch.randint(-64, 64, s, generator=g).float() / 16)
        groups.append(out)
    return groups


def moments(groups):
    g = torch.Generator().manual_seed(99)
    m, v = {}, {}
    for grp in groups:
        for n, t in grp.items():
            m[n] = torch.randn(t.shape, generator=g) * 1e-2
            v[n] = torch.rand(t.shape, generator=g) * 1e-4
    return m, v


def param_group(params, lr=3e-4, wd=0.01, betas=(0.9, 0.95), eps=1e-8, client_groups=True):
    """FusedAdam's param group (ops/adam/fused_adam.py) as torch's Optimizer.state_dict packs it: the
    group dict's keys in insertion order without 'params' — the client's group ({'params', 'weight_decay'}
    as Hugging Face's Trainer passes them) first, then torch's add_param_group setdefault of FusedAdam's
    defaults (lr, bias_correction, betas, eps, weight_decay), then 'step' 0, which FusedAdam.step adds
    to the group once (the per-parameter state counts) — and 'params' last."""
    d = {'weight_decay': wd} if client_groups else {}
    d.update({'lr': lr, 'bias_correction': True, 'betas': betas, 'eps': eps})
    d.setdefault('weight_decay', wd)
    d['step'] = 0
    d['params'] = params
    return d


def ds_config(stage, dtype, dp):
    c = {'train_batch_size': 4 * dp, 'train_micro_batch_size_per_gpu': 4, 'gradient_accumulation_steps': 1,
         'optimizer': {'type': 'AdamW', 'params': {'lr': 3e-4, 'betas': [0.9, 0.95], 'eps': 1e-8, 'weight_decay': 0.01}},
         'scheduler': {'type': 'WarmupLR', 'params': {'warmup_min_lr': 0, 'warmup_max_lr': 3e-4, 'warmup_num_steps': 100}},
         'zero_optimization': {'stage': stage}}
    if dtype == 'fp16':
        c['fp16'] = {'enabled': True, 'loss_scale': 0, 'initial_scale_power': 16}
    if dtype == 'bf16':
        c['bf16'] = {'enabled': True}
        if stage == 1:
            # engine._do_optimizer_sanity_check picks BF16_Optimizer (the layout written for bf16 at
            # stage 1) only with fp32 gradient accumulation; by default it is DeepSpeedZeroOptimizer.
            c['data_types'] = {'grad_accum_dtype': 'fp32'}
    return c


def zero_partitions(numel, dp):
    """stage_1_and_2.py: the group flattened with align_dense_tensors to 2*dp (nccl_start_alignment_factor
    2 times the world size), cut into dp equal partitions; each rank's padding is the part of its
    partition past the group's numel."""
    alignment = 2 * dp
    aligned = int(math.ceil(numel / alignment)) * alignment
    size = aligned // dp
    pads = []
    for r in range(dp):
        left = r * size
        if numel <= left:
            pads.append(size)
        elif numel < left + size:
            pads.append(left + size - numel)
        else:
            pads.append(0)
    return size, pads


def dynamic_scaler(config, cur_scale, cur_iter, last_overflow_iter, cur_hysteresis):
    """CreateLossScaler's DynamicLossScaler with the config's dynamic_loss_scale_args (precision_config.py
    defaults), then the saving run's counters."""
    fp16 = config.get('fp16', {})
    s = DynamicLossScaler(init_scale=2**fp16.get('initial_scale_power', 16), scale_window=fp16.get('loss_scale_window', 1000),
                          min_scale=fp16.get('min_loss_scale', 1), delayed_shift=fp16.get('hysteresis', 2),
                          consecutive_hysteresis=fp16.get('consecutive_hysteresis', False))
    s.cur_scale, s.cur_iter, s.last_overflow_iter, s.cur_hysteresis = cur_scale, cur_iter, last_overflow_iter, cur_hysteresis
    return s


def model_states(common, **parts):
    """engine._common_checkpoint_state's dict, in its order: module, buffer_names, optimizer, param_shapes,
    frozen_param_shapes, shared_params, frozen_param_fragments, then the schedule, counters and config."""
    d = {'module': parts.pop('module', common['module']), 'buffer_names': common['buffer_names']}
    for k in ('optimizer', 'param_shapes', 'frozen_param_shapes', 'shared_params', 'frozen_param_fragments'):
        d[k] = parts.pop(k)
    assert not parts, parts
    d.update((k, v) for k, v in common.items() if k not in ('module', 'buffer_names'))
    return d


def write(out, stage, dtype, dp, lie_shape=False, run=None, model='gpt2'):
    """`run` (from_dstrain, from_state): the run's own values instead of the fixture's — groups, exp_avg,
    exp_avg_sq, step, global_samples, lr_scheduler, ds_config, module_extra (tied copies and buffers
    a module's state_dict holds besides its parameters), scaler (fp16's DynamicLossScaler fields);
    from_state also optimizer_step, skipped, param_group (lr, betas, eps), group_wd, client_groups,
    module (the 16-bit weights as saved) and scaler_dynamic. A run's padding is DeepSpeed's (zeros);
    the fixture's own folders fill it with a marker (777) that a reader taking padding for
    parameters would return."""
    os.makedirs(out, exist_ok=True)
    run = run or None
    STEP = run['step'] if run else globals()['STEP']
    skipped = run.get('skipped', 0) if run else 1
    opt_step = run.get('optimizer_step', STEP) if run else STEP
    tag = run.get('tag', 'global_step%d' % STEP) if run else 'global_step%d' % STEP
    step_dir = os.path.join(out, tag)
    os.makedirs(step_dir, exist_ok=True)
    if run:
        groups, exp_avg, exp_avg_sq = run['groups'], run['exp_avg'], run['exp_avg_sq']
    else:
        groups = model_params(model)
        exp_avg, exp_avg_sq = moments(groups)
    pgv = dict(run.get('param_group', {})) if run else {}
    group_wd = run.get('group_wd') if run else None
    client_groups = run.get('client_groups', True) if run else True

    def pg(params, gi):
        wd = group_wd[gi] if group_wd is not None else (0.01 if gi == 0 else 0.0)
        return param_group(params, lr=pgv.get('lr', 3e-4), wd=wd, betas=(pgv.get('betas0', 0.9), pgv.get('betas1', 0.95)), eps=pgv.get('eps', 1e-8),
                           client_groups=client_groups)

    marker = 0.0 if run else 777.0
    lp = DTYPES[dtype]
    names = [n for grp in groups for n in grp]
    master = {n: t for grp in groups for n, t in grp.items()}
    module = collections.OrderedDict()
    for n in (run.get('module_order', names) if run else names):
        module[n] = (run['module'][n] if run and run.get('module') else master[n]).to(lp)
    if run:
        buffer_names = []
        for n, (t, is_buffer) in run.get('module_extra', {}).items():
            module[n] = t.to(lp) if not is_buffer else t
            if is_buffer:
                buffer_names.append(n)
        lr_sched = run['lr_scheduler']
    elif model == 'gpt2':
        module['module.transformer.h.0.attn.bias'] = torch.tril(torch.ones(4, 4))  # a buffer, not a parameter
        buffer_names = ['module.transformer.h.0.attn.bias']
    else:
        buffer_names = []  # Llama's rotary inv_freq is not persistent: not in the state_dict
    lr_sched = lr_sched if run else {'last_batch_iteration': STEP - 1, 'warmup_min_lr': 0.0, 'warmup_max_lr': 3e-4, 'warmup_num_steps': 100, 'warmup_type': 'log',
                'inverse_log_warm_up': 0.21714724095162588, 'delta_lr': 3e-4}
    expected = {'tag': tag, 'zero_stage': stage, 'dp_world_size': dp if stage > 0 else dp, 'dtype': dtype, 'names': [bare(n) for n in names],
                'shapes': {bare(n): list(master[n].shape) for n in names}, 'master': {bare(n): master[n].flatten().tolist() for n in names},
                'module': {bare(n): module[n].float().flatten().tolist() for n in names},
                'exp_avg': {bare(n): exp_avg[n].flatten().tolist() for n in names},
                'exp_avg_sq': {bare(n): exp_avg_sq[n].flatten().tolist() for n in names}, 'step': STEP,
                # The param groups (decay, no decay) every layout saves: stage 0's optimizer and the ZeRO optimizers' base.
                'groups': [{'names': [bare(n) for n in grp], 'weight_decay': 0.01 if gi == 0 else 0.0} for gi, grp in enumerate(groups)],
                'param_group': {'lr': 3e-4, 'betas0': 0.9, 'betas1': 0.95, 'eps': 1e-8, 'weight_decay': 0.01}, 'optimizer_type': 'adamw',
                'global_steps': STEP, 'global_samples': STEP * 4 * dp, 'skipped_steps': 1, 'lr_scheduler': lr_sched, 'loss_scaler': None}
    config = run['ds_config'] if run else ds_config(stage, dtype, dp)
    expected['ds_config'] = config
    clip_grad = float(config.get('gradient_clipping', 0.0))  # engine.gradient_clipping(): FP16_Optimizer's and ZeRO's clip_grad
    common = dict(module=module, buffer_names=buffer_names, lr_scheduler=lr_sched, data_sampler=None, random_ltd=None,
                  sparse_tensor_module_names=set(), skipped_steps=skipped, global_steps=STEP,
                  global_samples=run['global_samples'] if run else STEP * 4 * dp, dp_world_size=dp,
                  mp_world_size=1, checkpoint_parallel_dimensions={'pp_degree': 1, 'tp_degree': 1}, ds_config=config,
                  ds_version=DS_VERSION)
    fp16_cfg = config.get('fp16', {})
    # The run's scaler: dynamic unless it says otherwise (from_state's scaler_dynamic), fp16's config loss_scale 0.
    dynamic = run.get('scaler_dynamic', True) if run else True
    if stage == 0:
        if dtype == 'fp32':
            # The basic optimizer itself (no wrapper for fp32 without ZeRO): FusedAdam for the config's
            # Adam / AdamW, one state per parameter shaped as it, its step an int.
            state, pgs, pid = {}, [], 0
            for gi, grp in enumerate(groups):
                ids = []
                for n in grp:
                    state[pid] = {'step': opt_step, 'exp_avg': exp_avg[n].clone(), 'exp_avg_sq': exp_avg_sq[n].clone()}
                    ids.append(pid)
                    pid += 1
                pgs.append(pg(ids, gi))
            optimizer = {'state': state, 'param_groups': pgs}
        else:
            # FP16_Optimizer (fused_optimizer.py): fp32 flat copy per group, no padding.
            flats, state, pgs = [], {}, []
            for gi, grp in enumerate(groups):
                flats.append(torch.cat([master[n].flatten() for n in grp]))
                state[gi] = {'step': opt_step, 'exp_avg': torch.cat([exp_avg[n].flatten() for n in grp]),
                             'exp_avg_sq': torch.cat([exp_avg_sq[n].flatten() for n in grp])}
                pgs.append(pg([gi], gi))
            optimizer = {}
            if dtype == 'fp16':
                # LossScaleConfig: saved only where the scale scales (fp16); the overflow fields only when dynamic.
                sc = run.get('scaler') if run else None
                if dynamic:
                    optimizer.update({'dynamic_loss_scale': True, 'cur_scale': 16384.0, 'cur_iter': STEP, 'last_overflow_iter': 3, 'scale_factor': 2.0,
                                      'scale_window': fp16_cfg.get('loss_scale_window', 1000)})
                    if sc:
                        optimizer.update({k: v for k, v in sc.items() if k != 'cur_hysteresis'})
                else:
                    optimizer.update({'dynamic_loss_scale': False, 'cur_scale': sc['cur_scale'], 'cur_iter': sc['cur_iter']})
                expected['loss_scaler'] = {'cur_scale': 16384.0, 'cur_iter': STEP, 'last_overflow_iter': 3, 'cur_hysteresis': 0, 'dynamic': True}
            optimizer.update({'optimizer_state_dict': {'state': state, 'param_groups': pgs}, 'fp32_groups_flat': flats, 'clip_grad': clip_grad})
        torch.save(model_states(common, optimizer=optimizer, param_shapes=None, frozen_param_shapes=None, shared_params=None, frozen_param_fragments=None),
                   os.path.join(step_dir, 'mp_rank_00_model_states.pt'))
    elif stage == 3:
        write_stage3(step_dir, groups, master, exp_avg, exp_avg_sq, module, common, dtype, dp, expected, lie_shape, STEP, run, pg, opt_step, marker)
    else:
        # engine._do_optimizer_sanity_check: BF16_Optimizer for bf16 at stage 1 with fp32 gradient accumulation.
        bf16_optimizer = dtype == 'bf16' and stage == 1 and config.get('data_types', {}).get('grad_accum_dtype') in ('fp32', 'float32')
        param_shapes = []
        for grp in groups:
            shapes = collections.OrderedDict((n, torch.Size(t.shape)) for n, t in grp.items())
            param_shapes.append(shapes)
        if lie_shape:
            n0 = names[0]
            param_shapes[0][n0] = torch.Size([master[n0].shape[0] + 1] + list(master[n0].shape[1:]))
        partitioned_gradients = stage == 2
        torch.save(model_states(common, optimizer=None, param_shapes=param_shapes,
                                frozen_param_shapes=collections.OrderedDict() if partitioned_gradients else None, shared_params={},
                                frozen_param_fragments=collections.OrderedDict() if partitioned_gradients else None),
                   os.path.join(step_dir, 'mp_rank_00_model_states.pt'))
        flat = [torch.cat([master[n].flatten() for n in grp]) for grp in groups]
        flat_m = [torch.cat([exp_avg[n].flatten() for n in grp]) for grp in groups]
        flat_v = [torch.cat([exp_avg_sq[n].flatten() for n in grp]) for grp in groups]
        layout = [zero_partitions(f.numel(), dp) for f in flat]
        if dtype == 'fp16' and dynamic:
            scaler = DynamicLossScaler(init_scale=2**16, scale_window=1000, min_scale=1, delayed_shift=2)
            scaler.cur_scale = 32768.0
            scaler.cur_iter = STEP
            scaler.last_overflow_iter = 4
            scaler.cur_hysteresis = 1
            if run and run.get('scaler'):
                scaler = dynamic_scaler(config, **run['scaler'])
            expected['loss_scaler'] = {'cur_scale': 32768.0, 'cur_iter': STEP, 'last_overflow_iter': 4, 'cur_hysteresis': 1, 'dynamic': True}
        else:
            scaler = LossScaler(scale=run['scaler']['cur_scale'] if dtype == 'fp16' else 1.0)
            expected['loss_scaler'] = None if bf16_optimizer else {'cur_scale': 1.0, 'cur_iter': 0, 'last_overflow_iter': -1, 'cur_hysteresis': 0,
                                                                    'dynamic': False}
        prefix = 'bf16_' if dtype == 'bf16' else ''  # engine._get_zero_ckpt_prefix: bf16_mode = bfloat16_enabled()
        for r in range(dp):
            fp32_parts, states, pgs, paddings, mappings = [], {}, [], [], []
            for gi in range(len(groups)):
                size, pads = layout[gi]
                if bf16_optimizer:  # BF16_Optimizer: the whole group's padding on the last rank
                    total_pad = size * dp - flat[gi].numel()
                    pads = [0] * (dp - 1) + [total_pad]
                padded = lambda t: torch.cat([t, torch.full((size * dp - t.numel(),), marker)])  # noqa: E731
                part = lambda t: padded(t)[r * size:(r + 1) * size].clone()  # noqa: E731
                pad = pads[r]
                # DeepSpeedZeroOptimizer saves the fp32 partition without its padding; BF16_Optimizer with it.
                fp32_parts.append(part(flat[gi]) if bf16_optimizer else part(flat[gi])[:size - pad].clone())
                states[gi] = {'step': opt_step, 'exp_avg': part(flat_m[gi]), 'exp_avg_sq': part(flat_v[gi])}
                pgs.append(pg([gi], gi))
                paddings.append(pad)
                m = collections.OrderedDict()
                off = 0
                for n, t in groups[gi].items():
                    lo, hi = max(off, r * size), min(off + t.numel(), (r + 1) * size)
                    if lo < hi:
                        m[n] = fragment_address(numel=hi - lo, start=lo - r * size)
                    off += t.numel()
                mappings.append(m)
            osd = {}
            if not bf16_optimizer:
                osd.update({'loss_scaler': scaler, 'dynamic_loss_scale': dtype == 'fp16' and dynamic, 'overflow': False})
            osd['clip_grad'] = clip_grad
            osd['base_optimizer_state'] = {'state': states, 'param_groups': pgs}
            osd['single_partition_of_fp32_groups'] = fp32_parts
            if not bf16_optimizer:
                osd['zero_stage'] = ZeroStageEnum.gradients if stage == 2 else ZeroStageEnum.optimizer_states
            osd['group_paddings'] = paddings
            osd['partition_count'] = [dp] * len(groups)
            osd['ds_version'] = DS_VERSION
            osd['param_slice_mappings'] = mappings
            torch.save(dict(optimizer_state_dict=osd, ds_config=config, ds_version=DS_VERSION),
                       os.path.join(step_dir, '%szero_pp_rank_%d_mp_rank_00_optim_states.pt' % (prefix, r)))
    with open(os.path.join(out, 'latest'), 'w') as f:
        f.write(tag)
    with open(os.path.join(out, 'expected.json'), 'w') as f:
        json.dump(expected, f)


def write_stage3(step_dir, groups, master, exp_avg, exp_avg_sq, module, common, dtype, dp, expected, lie_shape, STEP, run, pg, opt_step, marker):
    """ZeRO stage 3 (engine._save_checkpoint / _save_zero_checkpoint, zero/stage3.py _rigid_state_dict):
    every rank writes its own zero_pp_rank_<r>_mp_rank_00_model_states.pt (engine._get_ckpt_name), whose
    module holds the partitioned parameters' placeholders (empty tensors of the 16-bit dtype; buffers
    whole), and [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt (engine._get_zero_ckpt_prefix: bf16_
    when bf16 is enabled). Each parameter is cut into ceil(numel / dp) per rank, the last rank's piece
    padded (partition_parameters._partition_param); a rank's fp32_flat_groups[g] is its pieces of group
    g's parameters back to back, which zero_to_fp32._zero3_merge_trainable_params takes apart."""
    lp = DTYPES[dtype]
    placeholder = collections.OrderedDict((n, torch.empty(0, dtype=lp) if n in master else t) for n, t in module.items())
    param_shapes = [collections.OrderedDict((n, torch.Size(t.shape)) for n, t in grp.items()) for grp in groups]
    if lie_shape:
        n0 = next(iter(groups[0]))
        param_shapes[0][n0] = torch.Size([master[n0].shape[0] + 1] + list(master[n0].shape[1:]))
    dynamic = run.get('scaler_dynamic', True) if run else True
    if dtype == 'fp16' and dynamic:
        scaler = DynamicLossScaler(init_scale=2**16, scale_window=1000, min_scale=1, delayed_shift=2)
        scaler.cur_scale, scaler.cur_iter, scaler.last_overflow_iter, scaler.cur_hysteresis = 65536.0, STEP, 5, 2
        if run and run.get('scaler'):
            scaler = dynamic_scaler(common['ds_config'], **run['scaler'])
        expected['loss_scaler'] = {'cur_scale': 65536.0, 'cur_iter': STEP, 'last_overflow_iter': 5, 'cur_hysteresis': 2, 'dynamic': True}
    else:
        scaler = LossScaler(scale=run['scaler']['cur_scale'] if dtype == 'fp16' else 1.0)
        expected['loss_scaler'] = {'cur_scale': 1.0, 'cur_iter': 0, 'last_overflow_iter': -1, 'cur_hysteresis': 0, 'dynamic': False}

    def piece(t, r):
        size = int(math.ceil(t.numel() / dp))
        padded = torch.cat([t.flatten(), torch.full((size * dp - t.numel(),), marker)])
        return padded[r * size:(r + 1) * size]

    prefix = 'bf16_' if dtype == 'bf16' else ''
    for r in range(dp):
        # zero_optimization_partition_gradients() (stages 2 and 3): the frozen parameters' shapes and fragments, none here.
        torch.save(model_states(common, module=placeholder, optimizer=None, param_shapes=param_shapes, frozen_param_shapes=collections.OrderedDict(),
                                shared_params={}, frozen_param_fragments=collections.OrderedDict()),
                   os.path.join(step_dir, 'zero_pp_rank_%d_mp_rank_00_model_states.pt' % r))
        flats, states, pgs = [], {}, []
        for gi, grp in enumerate(groups):
            flats.append(torch.cat([piece(master[n], r) for n in grp]))
            states[gi] = {'step': opt_step, 'exp_avg': torch.cat([piece(exp_avg[n], r) for n in grp]),
                          'exp_avg_sq': torch.cat([piece(exp_avg_sq[n], r) for n in grp])}
            pgs.append(pg([gi], gi))
        osd = {'zero_stage': ZeroStageEnum.weights, 'loss_scaler': scaler, 'dynamic_loss_scale': dtype == 'fp16' and dynamic, 'overflow': False,
               'partition_count': dp, 'optimizer_state_dict': {'state': states, 'param_groups': pgs}, 'fp32_flat_groups': flats}
        torch.save(dict(optimizer_state_dict=osd, ds_config=common['ds_config'], ds_version=DS_VERSION),
                   os.path.join(step_dir, '%szero_pp_rank_%d_mp_rank_00_optim_states.pt' % (prefix, r)))


def _natural_keys(text):
    return [int(c) if c.isdigit() else c for c in re.split(r'(\d+)', text)]


def to_universal(src, out, vocab=None):
    """What deepspeed/checkpoint/ds_to_universal.py (main, with --inject_missing_state) writes for
    the save_checkpoint folder `src` (pipeline and tensor-parallel degree 1), into OUT/<tag>_universal
    with OUT/latest_universal naming it. ZeRO 1/2 (extract_zero_shards, merge_tp_slices): every
    rank's param_slice_mappings fragment of each flat state (fp32 = single_partition_of_fp32_groups,
    the base optimizer's exp_avg / exp_avg_sq, step) cut out, the ranks' fragments concatenated in
    rank order and shaped as param_shapes says, saved as zero/<name>/<state>.pt = {'cat_dim': 0,
    'param': tensor} (with a vocabulary pattern: the rows past original_vocab_size cut off and
    'vocab_tensor': True), step.pt the step itself; zero/optimizer_state.pt the ZeRO optimizer's state
    without its partitioned entries plus the base optimizer's param_groups; mp_rank_*_model_states.pt
    copied. ZeRO-3 (extract_zero_shards_stage3, merge_zero3_slices): each parameter's padding-free
    piece of every rank's fp32_flat_groups / exp_avg / exp_avg_sq at ceil(numel / W) per rank,
    concatenated and saved flat (no dict, no step.pt); optimizer_state.pt rank 0's whole
    optimizer_state_dict plus param_groups; every *model_states.pt copied. `vocab` (pattern,
    original_vocab_size): the universal_checkpoint_info a Megatron model saves, put into the model
    states first."""
    with open(os.path.join(src, 'latest')) as f:
        tag = f.read().strip()
    src_dir = os.path.join(src, tag)
    utag = tag + '_universal'
    dst = os.path.join(out, utag)
    zero = os.path.join(dst, 'zero')
    os.makedirs(zero, exist_ok=True)
    optim_files = sorted(glob.glob(os.path.join(src_dir, '*_optim_states.pt')), key=_natural_keys)
    osd0 = torch.load(optim_files[0])['optimizer_state_dict']
    stage = int(osd0.get('zero_stage', 1))

    def save(name, state, value):
        os.makedirs(os.path.join(zero, name), exist_ok=True)
        torch.save(value, os.path.join(zero, name, state + '.pt'))

    if stage <= 2:
        model_file = os.path.join(src_dir, 'mp_rank_00_model_states.pt')
        model_states = torch.load(model_file)
        if vocab:
            model_states['universal_checkpoint_info'] = {'universal_checkpoint_version': 0.4, 'vocabulary_parameter_patterns': [vocab[0]],
                                                         'original_vocab_size': vocab[1]}
            torch.save(model_states, model_file)
        uc_info = model_states.get('universal_checkpoint_info') or {'universal_checkpoint_version': 0.4}
        shapes = {n: s for grp in model_states['param_shapes'] for n, s in grp.items()}
        frags = collections.defaultdict(lambda: collections.defaultdict(list))  # name -> state -> per rank
        for f in optim_files:
            osd = torch.load(f)['optimizer_state_dict']
            state_groups = osd['base_optimizer_state']['state']
            for gid in range(len(state_groups)):
                flat_state = dict(exp_avg=state_groups[gid]['exp_avg'], exp_avg_sq=state_groups[gid]['exp_avg_sq'],
                                  fp32=osd['single_partition_of_fp32_groups'][gid])
                if 'step' in state_groups[gid]:
                    flat_state['step'] = state_groups[gid]['step']
                for name, fm in osd['param_slice_mappings'][gid].items():
                    for key, t in flat_state.items():
                        frags[name][key].append(t if key == 'step' or not torch.is_tensor(t) else t.narrow(0, fm.start, fm.numel).clone())
        for name, states in frags.items():
            if 'step' in states:
                assert all(v == states['step'][0] for v in states['step'])
                save(name, 'step', states['step'][0])
            for key in ('fp32', 'exp_avg', 'exp_avg_sq'):
                param = torch.cat(states[key], dim=0).reshape(shapes[name])
                d = {'cat_dim': 0}
                if any(re.match(p, name) for p in uc_info.get('vocabulary_parameter_patterns', [])):
                    param = param[:uc_info['original_vocab_size'], :]
                    d['vocab_tensor'] = True
                d['param'] = param
                save(name, key, d)
        sharded = ('base_optimizer_state', 'param_slice_mappings', 'single_partition_of_fp32_groups')
        opt = {k: v for k, v in osd0.items() if k not in sharded}
        opt['param_groups'] = osd0['base_optimizer_state']['param_groups']
        model_files = glob.glob(os.path.join(src_dir, 'mp_rank_*_model_states.pt'))
    else:
        model_files = sorted(glob.glob(os.path.join(src_dir, '*model_states.pt')), key=_natural_keys)
        param_shapes = torch.load(model_files[0])['param_shapes']
        w = len(optim_files)
        pieces = collections.defaultdict(lambda: collections.defaultdict(list))
        for r, f in enumerate(optim_files):
            osd = torch.load(f)['optimizer_state_dict']
            for idx, sub_group in enumerate(param_shapes):
                flat_state = dict(exp_avg=osd['optimizer_state_dict']['state'][idx]['exp_avg'],
                                  exp_avg_sq=osd['optimizer_state_dict']['state'][idx]['exp_avg_sq'], fp32=osd['fp32_flat_groups'][idx])
                offset = 0
                for name, shape in sub_group.items():
                    numel = math.prod(shape)
                    part = int(math.ceil(numel / w))
                    free = max(0, min(part, numel - r * part))
                    for key, t in flat_state.items():
                        pieces[name][key].append(t.narrow(0, offset, free).clone())
                    offset += part
        for name, states in pieces.items():
            for key in ('fp32', 'exp_avg', 'exp_avg_sq'):
                save(name, key, torch.cat(states[key], dim=0))
        opt = osd0
        opt['param_groups'] = osd0['optimizer_state_dict']['param_groups']
    torch.save(opt, os.path.join(zero, 'optimizer_state.pt'))
    for f in model_files:
        shutil.copy2(f, dst)
    with open(os.path.join(out, 'latest_universal'), 'w') as f:
        f.write(utag)
    exp_file = os.path.join(src, 'expected.json')
    if os.path.exists(exp_file):
        with open(exp_file) as f:
            expected = json.load(f)
        expected['tag'] = utag
        expected['module'] = expected['master']  # load_universal casts the masters into the module
        if vocab:
            for n in expected['names']:
                if re.match(vocab[0], n) or re.match(vocab[0], 'module.' + n):
                    rows = vocab[1]
                    cols = expected['shapes'][n][1]
                    expected['shapes'][n][0] = rows
                    for k in ('master', 'exp_avg', 'exp_avg_sq'):
                        expected[k][n] = expected[k][n][:rows * cols]
        with open(os.path.join(out, 'expected.json'), 'w') as f:
            json.dump(expected, f)
    return dst


def from_state(path, out, stage, dtype, dp):
    """The folder DeepSpeed would save for a state given as JSON (the C++ writer's test dumps it:
    tests/unit/formats/test_deepspeed_checkpoint_writer.cpp): names, shapes, master, exp_avg,
    exp_avg_sq, groups [{names, weight_decay}], optimizer_step, global_steps / samples, skipped_steps,
    param_group, loss_scaler, lr_scheduler, ds_config, tag. The config saved agrees with the layout
    (zero_optimization.stage, fp16 / bf16 enabled) as the run that had it would."""
    with open(path) as f:
        st = json.load(f)
    t = {n: torch.tensor(st['master'][n], dtype=torch.float32).view(st['shapes'][n]) for n in st['names']}
    groups = st.get('groups') or [{'names': st['names'], 'weight_decay': st.get('param_group', {}).get('weight_decay', 0.0)}]
    grouped = [collections.OrderedDict((n, t[n]) for n in g['names']) for g in groups]
    m = {n: torch.tensor(st['exp_avg'][n], dtype=torch.float32).view(st['shapes'][n]) for n in st['names']}
    v = {n: torch.tensor(st['exp_avg_sq'][n], dtype=torch.float32).view(st['shapes'][n]) for n in st['names']}
    config = st.get('ds_config')
    if config is None:
        config = {}
        if st.get('optimizer_type'):
            p = st.get('param_group', {})
            params = {k: p[k] for k in ('lr',) if k in p}
            if 'betas0' in p and 'betas1' in p:
                params['betas'] = [p['betas0'], p['betas1']]
            params.update({k: p[k] for k in ('eps', 'weight_decay') if k in p})
            config['optimizer'] = {'type': 'AdamW' if st['optimizer_type'] == 'adamw' else 'Adam', 'params': params}
    config.setdefault('fp16', {})['enabled'] = dtype == 'fp16'
    config.setdefault('bf16', {})['enabled'] = dtype == 'bf16'
    config.setdefault('zero_optimization', {})['stage'] = stage
    ls = st.get('loss_scaler')
    fp16 = config['fp16']
    dynamic = ls['dynamic'] if ls else fp16.get('loss_scale', 0) == 0
    if ls is None:
        ls = {'cur_scale': float(2**fp16.get('initial_scale_power', 16)) if dynamic else float(fp16.get('loss_scale', 1.0)), 'cur_iter': 0,
              'last_overflow_iter': -1, 'cur_hysteresis': fp16.get('hysteresis', 2)}
    scaler = {k: ls[k] for k in ('cur_scale', 'cur_iter', 'last_overflow_iter', 'cur_hysteresis')}
    scaler['cur_scale'] = float(scaler['cur_scale'])
    step = st['global_steps']
    run = dict(groups=grouped, exp_avg=m, exp_avg_sq=v, step=step, global_samples=st['global_samples'], skipped=st['skipped_steps'],
               optimizer_step=st.get('optimizer_step', step - st['skipped_steps']), tag=st['tag'], lr_scheduler=st.get('lr_scheduler'),
               ds_config=config, param_group={'lr': 1e-3, 'betas0': 0.9, 'betas1': 0.999, 'eps': 1e-8, **st.get('param_group', {})},
               group_wd=[g['weight_decay'] for g in groups], client_groups=bool(st.get('groups')), module_order=st['names'],
               module={n: torch.tensor(st['module'][n], dtype=torch.float32).view(st['shapes'][n]) for n in st['names']} if st.get('module') else None,
               scaler=scaler, scaler_dynamic=dynamic)
    write(out, stage, dtype, dp, run=run)


CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


def read_dstrain_checkpoint(ckdir):
    """A dstrain checkpoint (docs/checkpoints.md "Files"), read by hand: the manifest, and each rank
    file (safetensors: 8-byte little-endian header length, a JSON header, the raw bytes) joined by
    the pieces' names `<buffer>/<param>/<offset>` into whole fp32 tensors of the manifest's shapes."""
    with open(os.path.join(ckdir, 'latest')) as f:
        tag = f.read().strip()
    tag_dir = os.path.join(ckdir, tag)
    with open(os.path.join(tag_dir, 'checkpoint.json')) as f:
        manifest = json.load(f)
    shapes = {p['name']: p['shape'] for p in manifest['model']['params']}
    whole = {b: {n: torch.full((math.prod(s),), float('nan')) for n, s in shapes.items()} for b in ('master', 'exp_avg', 'exp_avg_sq')}
    for r in manifest['ranks']:
        with open(os.path.join(tag_dir, r['index'])) as f:
            index = json.load(f)
        with open(os.path.join(tag_dir, index['file']), 'rb') as f:
            data = f.read()
        hlen = int.from_bytes(data[:8], 'little')
        header = json.loads(data[8:8 + hlen])
        for key, e in header.items():
            if key == '__metadata__':
                continue
            buf, rest = key.split('/', 1)
            param, off = rest.rsplit('/', 1)
            if buf not in whole:
                continue
            assert e['dtype'] == 'F32', key
            lo, hi = e['data_offsets']
            t = torch.frombuffer(bytearray(data[8 + hlen + lo:8 + hlen + hi]), dtype=torch.float32)
            whole[buf][param][int(off):int(off) + t.numel()] = t
    for b, ts in whole.items():
        for n, t in ts.items():
            assert not torch.isnan(t).any(), 'dstrain checkpoint %s: %s/%s not every element saved' % (ckdir, b, n)
            ts[n] = t.view(shapes[n])
    return manifest, whole


def from_dstrain(ckdir, out, stage, dtype, dp):
    """The DeepSpeed folder a Hugging Face GPT-2 run under DeepSpeed would have saved at the state of
    dstrain checkpoint `ckdir` (its latest tag): dstrain's names are HF's without `transformer.`; the
    Conv1D weights are HF's (in, out), dstrain's (out, in) — masters and moments transposed; wte's
    padded vocabulary rows (dstrain pads to a multiple of 128) are not HF's; lm_head is wte, tied
    (named_parameters lists it once; the module's state_dict holds both names)."""
    manifest, whole = read_dstrain_checkpoint(ckdir)
    cfg = manifest['architecture']['config']
    eng = manifest['engine']
    if manifest['architecture']['family'] == 'llama':
        groups, m, v, module_extra = llama_from_dstrain(cfg, whole)
        write_run(out, stage, dtype, dp, manifest, eng, groups, m, v, module_extra)
        return

    def hf(n, t):
        if n.endswith(CONV1D):
            t = t.t().contiguous()
        if n == 'wte.weight':
            t = t[:cfg['vocab_size']].clone()
        return t

    order = ['wte.weight', 'wpe.weight']
    for i in range(cfg['n_layer']):
        for m in ('ln_1.weight', 'ln_1.bias', 'attn.c_attn.weight', 'attn.c_attn.bias', 'attn.c_proj.weight', 'attn.c_proj.bias', 'ln_2.weight',
                  'ln_2.bias', 'mlp.c_fc.weight', 'mlp.c_fc.bias', 'mlp.c_proj.weight', 'mlp.c_proj.bias'):
            order.append('h.%d.%s' % (i, m))
    order += ['ln_f.weight', 'ln_f.bias']
    assert sorted(order) == sorted(whole['master']), 'the model is not the GPT-2 this mapping knows'
    # Hugging Face's Trainer groups: decay (matrices), no decay (biases, LayerNorm).
    groups = [collections.OrderedDict(), collections.OrderedDict()]
    m, v = {}, {}
    for n in order:
        key = 'module.transformer.' + n
        groups[0 if whole['master'][n].dim() == 2 else 1][key] = hf(n, whole['master'][n])
        m[key] = hf(n, whole['exp_avg'][n])
        v[key] = hf(n, whole['exp_avg_sq'][n])
    write_run(out, stage, dtype, dp, manifest, eng, groups, m, v, {'module.lm_head.weight': (groups[0]['module.transformer.wte.weight'], False)})


def llama_from_dstrain(cfg, whole):
    """A Hugging Face LlamaForCausalLM's parameters at dstrain's state: dstrain's names are HF's but
    for q_proj / k_proj / v_proj, the row blocks (in that order) of one qkv_proj; embed_tokens and
    an untied lm_head carry dstrain's padded vocabulary rows, which HF's do not. Names as DeepSpeed's
    engine.param_names has them (no "module."); a tied lm_head is a second name of embed_tokens in the
    module's state_dict."""
    c, h = cfg['hidden_size'], cfg['num_attention_heads']
    d = cfg.get('head_dim') or c // h
    q_rows, kv_rows = h * d, cfg.get('num_key_value_heads', h) * d
    tied = cfg.get('tie_word_embeddings', False)
    hf = {}  # HF name -> (dstrain name, row range or None)
    order = ['model.embed_tokens.weight']
    for i in range(cfg['num_hidden_layers']):
        p = 'model.layers.%d.' % i
        qkv = p + 'self_attn.qkv_proj.weight'
        for k, (lo, hi) in (('q_proj', (0, q_rows)), ('k_proj', (q_rows, q_rows + kv_rows)), ('v_proj', (q_rows + kv_rows, q_rows + 2 * kv_rows))):
            hf[p + 'self_attn.%s.weight' % k] = (qkv, (lo, hi))
        for n in ('self_attn.o_proj.weight', 'mlp.gate_proj.weight', 'mlp.up_proj.weight', 'mlp.down_proj.weight', 'input_layernorm.weight',
                  'post_attention_layernorm.weight'):
            hf[p + n] = (p + n, None)
        order += [p + 'self_attn.%s.weight' % k for k in ('q_proj', 'k_proj', 'v_proj')]
        order += [p + n for n in ('self_attn.o_proj.weight', 'mlp.gate_proj.weight', 'mlp.up_proj.weight', 'mlp.down_proj.weight',
                                  'input_layernorm.weight', 'post_attention_layernorm.weight')]
    order.append('model.norm.weight')
    hf['model.embed_tokens.weight'] = ('model.embed_tokens.weight', (0, cfg['vocab_size']))
    hf['model.norm.weight'] = ('model.norm.weight', None)
    if not tied:
        order.append('lm_head.weight')
        hf['lm_head.weight'] = ('lm_head.weight', (0, cfg['vocab_size']))
    assert sorted({o for o, _ in hf.values()}) == sorted(whole['master']), 'the model is not the Llama this mapping knows'

    def take(buf, n):
        ours, rows = hf[n]
        t = whole[buf][ours]
        return t[rows[0]:rows[1]].clone() if rows else t.clone()

    groups = [collections.OrderedDict(), collections.OrderedDict()]  # decay (matrices), no decay (RMSNorm weights)
    m, v = {}, {}
    for n in order:
        t = take('master', n)
        groups[0 if t.dim() == 2 else 1][n] = t
        m[n], v[n] = take('exp_avg', n), take('exp_avg_sq', n)
    return groups, m, v, ({'lm_head.weight': (groups[0]['model.embed_tokens.weight'], False)} if tied else {})


def write_run(out, stage, dtype, dp, manifest, eng, groups, m, v, module_extra):
    """The DeepSpeed folder of a run at dstrain's state (from_dstrain): its step, counters, schedule,
    config at the DeepSpeed run's layout, fp16 loss scaler."""
    ls = manifest.get('loss_scaler') or {}
    config = json.loads(manifest['ds_config']) if isinstance(manifest['ds_config'], str) else manifest['ds_config']
    config.setdefault('zero_optimization', {})['stage'] = stage  # the DeepSpeed run's layout (the reader takes BF16_Optimizer's stage from it)
    # An fp16 step skipped for overflow counts in global_steps and skipped_steps, not in Adam's step.
    run = dict(groups=groups, exp_avg=m, exp_avg_sq=v, step=eng['global_steps'], global_samples=eng['global_samples'],
               skipped=eng['skipped_steps'], optimizer_step=eng['global_steps'] - eng['skipped_steps'],
               lr_scheduler={'last_batch_iteration': manifest['lr_scheduler']['last_batch_iteration']},
               ds_config=config, module_extra=module_extra,
               scaler={k: ls[k] for k in ('cur_scale', 'cur_iter', 'last_overflow_iter', 'cur_hysteresis')} if str(ls.get('kind', '')).startswith('dynamic') else None)
    write(out, stage, dtype, dp, run=run)


# Every stage x dtype x DP, as the GPT-2's.
LLAMA_CELLS = [(stage, dtype, dp) for stage in (0, 1, 2, 3) for dtype in ('fp32', 'fp16', 'bf16') for dp in (1, 2, 4)]
UNIVERSAL_CELLS = ['s1_bf16_dp2', 's1_fp16_dp4', 's2_fp32_dp2', 's2_bf16_dp1', 's3_bf16_dp4', 's3_fp32_dp2', 's3_fp16_dp1', 'llama_s2_bf16_dp4',
                   'llama_s3_fp16_dp4']


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('out')
    ap.add_argument('--stage', type=int, default=2)
    ap.add_argument('--dtype', default='fp32', choices=sorted(DTYPES))
    ap.add_argument('--dp', type=int, default=2)
    ap.add_argument('--lie-shape', action='store_true')
    ap.add_argument('--all', action='store_true')
    ap.add_argument('--from-dstrain', metavar='CKDIR', help="the DeepSpeed folder of a dstrain checkpoint's state (from_dstrain)")
    ap.add_argument('--universal', action='store_true', help='with --from-dstrain: ds_to_universal.py\'s output of that folder (to_universal)')
    ap.add_argument('--from-state', metavar='JSON', help='the DeepSpeed folder of a state given as JSON (from_state)')
    a = ap.parse_args()
    if a.from_state:
        from_state(a.from_state, a.out, a.stage, a.dtype, a.dp)
    elif a.from_dstrain and a.universal:
        # ds_to_universal's output of that folder, alone in OUT (latest_universal, no latest).
        from_dstrain(a.from_dstrain, a.out + '.src', a.stage, a.dtype, a.dp)
        to_universal(a.out + '.src', a.out)
    elif a.from_dstrain:
        from_dstrain(a.from_dstrain, a.out, a.stage, a.dtype, a.dp)
    elif a.all:
        for stage in (0, 1, 2, 3):
            for dtype in ('fp32', 'fp16', 'bf16'):
                for dp in (1, 2, 4):
                    write(os.path.join(a.out, 's%d_%s_dp%d' % (stage, dtype, dp)), stage, dtype, dp)
        # A few cells per stage for the Llama (GQA, untied lm_head, names without "module.").
        for stage, dtype, dp in LLAMA_CELLS:
            write(os.path.join(a.out, 'llama_s%d_%s_dp%d' % (stage, dtype, dp)), stage, dtype, dp, model='llama')
        # ds_to_universal's output of some of them: OUT/u_<source>/ (ZeRO 1-3, each dtype, BF16_Optimizer).
        for src in UNIVERSAL_CELLS:
            to_universal(os.path.join(a.out, src), os.path.join(a.out, 'u_' + src))
        # A Megatron-style vocabulary parameter: wte's rows past original_vocab_size 5 cut off.
        write(os.path.join(a.out, 'src_vocab'), 2, 'fp32', 2)
        to_universal(os.path.join(a.out, 'src_vocab'), os.path.join(a.out, 'u_vocab'), vocab=(r'module\.transformer\.wte\.weight', 5))
        # Hostile universal folders: param_shapes one row too long for fp32.pt; an exp_avg one row short.
        u = to_universal(os.path.join(a.out, 's2_fp32_dp2'), os.path.join(a.out, 'u_lie'))
        f = os.path.join(u, 'mp_rank_00_model_states.pt')
        sd = torch.load(f)
        n0 = 'module.transformer.h.0.mlp.c_fc.weight'
        sd['param_shapes'][0][n0] = torch.Size([4, 3])
        torch.save(sd, f)
        u = to_universal(os.path.join(a.out, 's2_fp32_dp2'), os.path.join(a.out, 'u_bad_moment'))
        f = os.path.join(u, 'zero', n0, 'exp_avg.pt')
        sd = torch.load(f)
        sd['param'] = sd['param'][:2].clone()
        torch.save(sd, f)
        write(os.path.join(a.out, 'lie'), 2, 'fp32', 2, lie_shape=True)
        write(os.path.join(a.out, 'lie3'), 3, 'bf16', 2, lie_shape=True)
        # param_shapes entries no parameter has: 2^70 elements, a negative size.
        for name, shape in (('huge', [2 ** 40, 2 ** 30]), ('negative', [-3, 8])):
            write(os.path.join(a.out, name), 1, 'fp32', 2)
            f = os.path.join(a.out, name, 'global_step%d' % STEP, 'mp_rank_00_model_states.pt')
            sd = torch.load(f)
            n0 = next(iter(sd['param_shapes'][0]))
            sd['param_shapes'][0][n0] = torch.Size(shape)
            torch.save(sd, f)
        # Stage 0: the embedding saved a second time under lm_head's name with other values — two
        # storages in 'module', one parameter of the optimizer.
        write(os.path.join(a.out, 'tied_twice'), 0, 'fp32', 1)
        f = os.path.join(a.out, 'tied_twice', 'global_step%d' % STEP, 'mp_rank_00_model_states.pt')
        sd = torch.load(f)
        wte = next(k for k in sd['module'] if k.endswith('wte.weight'))
        sd['module'][wte[:-len('transformer.wte.weight')] + 'lm_head.weight'] = sd['module'][wte].clone() + 1
        torch.save(sd, f)

        class Evil:
            def __reduce__(self):
                return (os.system, ('touch ' + os.path.join(a.out, 'pwned'),))
        write(os.path.join(a.out, 'evil'), 2, 'fp16', 2)
        p = os.path.join(a.out, 'evil', 'global_step10', 'zero_pp_rank_1_mp_rank_00_optim_states.pt')
        sd = torch.load(p)
        sd['optimizer_state_dict']['clip_grad'] = Evil()
        torch.save(sd, p)
    else:
        write(a.out, a.stage, a.dtype, a.dp, a.lie_shape)


if __name__ == '__main__':
    main()
