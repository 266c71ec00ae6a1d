"""Fused numba kernel of :func:`solver.physics.megatron.solve` for flat (1-D) inputs.

A port, step by step, of :mod:`solver.physics.megatron_steps` and
:mod:`solver.physics.megatron_compose` to one loop over configurations: every
intermediate stays in registers, so a million configurations cost one pass
over the inputs and one over the outputs instead of the numpy path's hundreds
of full-size temporaries. Each ``_step`` function below mirrors the numpy
function named in its comment, line for line and in the same order of floating
point operations, so the two are bitwise equal (``tests/test_fused_megatron.py``
holds them so: change a formula there, port it here).

How the port stays exact:

- ``np.where`` becomes a select; both sides are computed as numpy does (no
  short cuts that change a rounding). ``np.maximum`` keeps numpy's NaN rule.
- Integer arithmetic of the numpy path (``%``, ``//`` on counts below 2**53,
  guaranteed by :mod:`solver.knobs`) is done in float64: the correctly rounded
  quotient of two such integers floors to the exact integer quotient, and the
  products stay exact.
- ``np.interp`` of the GEMM size curve is numpy's formula
  ``slope * (x - xp[j]) + fp[j]`` with numpy's precomputed slopes.
- ``np.log`` is libm's ``log`` on x86-64 without AVX-512, and numba calls the same
  libm ``log``. numpy dispatches its own SIMD float64 log on AVX-512 machines; where
  a one-time probe (:func:`libm_is_numpy_log`) finds the two differ, :func:`run`
  takes the logs with ``np.log`` between two calls of the kernel instead (one that
  writes the GEMMs' ideal durations, one that prices the configurations).
- The memo of steps 3-4 (see :func:`_kernel`) is keyed on the exact knob values its
  steps read, so a hit returns the bits a computation would.
- No fastmath (it would reassociate); ``error_model="numpy"`` (a division by
  zero gives inf/NaN as numpy does, no exception checks in the loop).
- Where numpy computes both sides of an ``np.where``, the kernel computes the side
  it keeps, with the same expression, so the same bits.

The named steps (``_split`` ... ``_memory``, compose in ``_kernel``) are
``inline="always"`` numba functions; the small formula helpers (``_gemm``,
``_two_level``, ...) are plain ``njit`` functions (inlining those too at numba's
level triples the cold compile time, ~20 s -> ~60 s, for no measured gain). The memo's
miss paths (:func:`_ideals`, :func:`_memo_row`, :func:`_memo_miss`) are plain ``njit``
too: they run once per distinct key, and each type of the name arrays compiles a
:func:`_kernel` of its own, which copied them in every time (a further signature's
compile: 17.7 -> 6.3 s; the first call, 57.3 -> 50.9 s; the kernel as fast, 1 thread,
1M layouts, 8 interleaved rounds, median of the rounds' ratios 1.005; all unsaved).
The compiled kernel is cached next to this file, or in numba's user cache
directory (``~/.cache/numba``, ``NUMBA_CACHE_DIR``) when the package directory is
not writable, while :data:`SOURCES_DIGEST` matches the steps and primitives it
compiles in (numba itself checks only this file; see
:func:`solver.fused._numba.cache_is_current`).

Per-workload, per-fleet and per-constant scalars are computed once in Python
(:func:`workload_scalars`, :func:`fleet_scalars`, :func:`constant_scalars`) and
passed as tuples; per-precision facts are 4-tuples indexed by the precision code.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..megatron_memory import keeps_mask
from ..physics import megatron_steps as _steps
from . import buffers, in_ranges
from ._numba import cache_is_current, forced_vector_width, kernel
from .megatron_primitives import _INLINE as _INLINE_STEP
from .megatron_primitives import _PRIM
from .megatron_primitives import COMPILED_CONSTANTS, _ideal, _min
from .megatron_fused_steps import (G_CORE, G_EH, G_FC1, G_FC2, G_HEAD, G_KVDOWN, G_KVUP, G_MOE1,
                                   G_MOE2, G_PROJ, G_QKV, G_QUP, G_ROUTER, G_SH1, G_SH2, N_GEMMS,
                                   _communication, _data_parallel, _dp_tp_terms, _gemm_flops,
                                   _hardware, _head, _heavy, _key_rules, _layer_times, _low_bits,
                                   _memory, _memory_terms, _model_flops, _mtp_flops_per_sequence,
                                   _p2p_gather_call, _p2p_split, _p2p_steady_sends,
                                   _combined_1f1b_paired, _pipeline, _split)

__all__ = ["run", "workload_scalars", "fleet_scalars", "constant_scalars", "FLOAT_OUTPUTS",
           "BOOL_OUTPUTS"]

#: Float outputs in the order the kernel writes the rows of its float block.
FLOAT_OUTPUTS = (
    "dp_size", "microbatch_count", "step_latency_total", "effective_throughput",
    "tokens_per_second_per_accelerator", "model_flops_per_accelerator", "mfu", "hfu",
    "compute_latency", "tp_communication_latency", "cp_communication_latency",
    "ep_communication_latency", "pp_communication_latency", "dp_communication_latency",
    "communication_latency", "pipeline_bubble_latency", "bubble_fraction", "optimizer_latency",
    "memory_footprint", "memory_weights", "memory_gradients", "memory_optimizer_state",
    "memory_activations", "memory_communication_buffers", "launch_latency")
#: Bool outputs in the order of the rows of the kernel's bool block.
BOOL_OUTPUTS = ("valid", "realizable", "feasible")



#: What :func:`_kernel` compiles in besides this file (numba keys its cache on this file
#: only; see solver.fused._numba.cache_is_current), and their digest, which
#: tests/test_fused_megatron.py holds current: update it with every change to them.
COMPILED_FROM = tuple(Path(__file__).with_name(name)
                      for name in ("megatron_fused_steps.py", "megatron_primitives.py"))
SOURCES_DIGEST = "cf28a582cf847647"
_CACHE = cache_is_current(__name__, SOURCES_DIGEST, COMPILED_FROM, COMPILED_CONSTANTS)

#: The step memo: slots of its open-addressing key table (a power of two) and the most
#: distinct keys it keeps (past that, configurations are priced without it). 4,096 keys:
#: a flat draw over many knobs has thousands (bench_fused's Mixtral draw with ep_size
#: drawn, about 5,200); at 2,048 the rest, 40 % of its configurations, were priced one by
#: one, at about half the rate (1M layouts, 2 threads: 109.0 -> 71.9 ms, bench_fused's
#: MoE row at 2026-12-05 01:31 and 02:02).
#: 8,192 gained no more there and cost the dense draw (1,400 keys) 4-6 % in an interleaved
#: A/B; 4,096 costs it 0.998 best over best (11 rounds, grid_compare_megatron_flat.json).
MEMO_SLOTS = 1 << 13
MEMO_KEYS = 1 << 12
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of the two key words
_SLOT_SHIFT = np.uint64(65 - MEMO_SLOTS.bit_length())  # 64 - log2(MEMO_SLOTS)
_NO_SLOT = np.uint64(0xFFFFFFFFFFFFFFFF)  # marks an empty slot; no packed key has all 64 bits set
#: Values the memo keeps per key: steps 3 and 4, the LM head, a multi-token prediction
#: module's projection and norms and its model FLOPs a sequence (see _kernel); then
#: (columns 16-31) the terms of the later steps that read only the key's knobs, most of
#: them divisions, which bind the vector loop (a vector division takes 8-16 cycles, a
#: gather of the memo's value about 5): split's rules (:func:`_key_rules`), a p2p send over
#: TP, twice that, the all-gather on arrival, the data-parallel step's (:func:`_dp_tp_terms`)
#: and the memory step's (:func:`_memory_terms`). The same expressions, the same bits.
#: The dense loops read these; the MoE loops compute them (see _price_steps), and an MoE
#: workload's memo has the first :data:`_N_MEMO_MOE` columns only: a draw of thousands of
#: keys (bench_fused's MoE draw, about 5,200) then keeps its rows in half the cache lines.
_N_MEMO = 32
_N_MEMO_MOE = 16
#: Configurations a block of the kernel's two passes (see _kernel).
BLOCK = 1024


def choice_code(a, i, keys):  # pragma: no cover - the overload below replaces it inside numba
    """The code of configuration ``i``'s name: ``a[i]`` of int64 codes, or the index in
    ``keys`` of row ``i`` of name characters (:func:`name_characters`), -1 if none."""


@overload(choice_code)
def _choice_code_overload(a, i, keys):
    if isinstance(a, types.Array) and a.ndim == 2:  # (n, width) uint32 characters
        def decode(a, i, keys):
            keys, width = keys  # width: a tuple as long as a row, so the loop unrolls
            key = np.uint64(0)
            high = np.uint32(0)
            for j in range(len(width)):
                ch = a[i, np.uint64(j)]
                high |= ch
                key |= np.uint64(ch) << np.uint64(7 * j)
            code = -1
            for t in range(len(keys)):
                code = t if key == keys[t] else code
            return -1 if high >= 128 else code
        return decode
    return lambda a, i, keys: a[i]


def name_characters(array):
    """A 1-D array of names as the kernel matches them, (n, width) uint32 characters; None
    where it cannot (not unicode, or wider than :data:`_PACKED_WIDTH` characters)."""
    if not (isinstance(array, np.ndarray) and array.dtype.kind == "U" and array.ndim == 1
            and 0 < array.dtype.itemsize // 4 <= _PACKED_WIDTH):
        return None
    width = array.dtype.itemsize // 4
    return np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], width)


def choice_keys(choices, names):
    """The packed keys (7 bits a character) of ``choices`` for the characters ``names``
    (no key matches a choice longer than their width, or one not ASCII), and a tuple of
    their width (numba types a tuple by its length: each width compiles a loop of its own,
    unrolled, as :func:`_match_packed`)."""
    width = names.shape[1] if names.ndim == 2 else 0
    return (tuple(np.uint64(sum(ord(ch) << (7 * j) for j, ch in enumerate(choice)))
                  if len(choice) <= width and choice.isascii() else _NO_KEY for choice in choices),
            (0,) * width)


@njit(**_INLINE_STEP)
def _whole(f, has_dp, tp, pp, cp, dp):
    """Whether the job fits in one NVLink domain (megatron_steps.Hardware.within's
    ``world <= domain``): ``n_acc`` as _split has it (the fleet where dp is derived;
    a layout that does not fill it is invalid, and masked)."""
    return (tp * pp * cp * dp <= f[6]) if has_dp else (f[11] <= f[6])


@njit(**_INLINE_STEP)
def _single_ep(f, has_dp, tp, pp, cp, dp, ep, etp):
    """Whether one EP group spans the whole job (``etp * ep == n_acc``, n_acc as
    :func:`_whole` has it): megatron_steps.communication's rule for its near peers."""
    return etp * ep == ((tp * pp * cp * dp) if has_dp else f[11])


@njit(**_INLINE_STEP)
def _memo_key(s, mbs, tp, cp, ep, etp, sp, rc, flash, prec, tco, whole, single, heavy, masks):
    """Two words that pack the knobs steps 3-4 and the LM head depend on, exactly
    (each field within its width), and whether they fit (else: no memo for this one).
    ``whole``: the job fits in one NVLink domain (:func:`_whole`); ``single``: one EP
    group spans it (:func:`_single_ep`; ``micro_batch_size`` below 2**28 to fit); ``heavy``: the heaviest
    stage holds MoE layers only (megatron_fused_steps._heavy); ``etp`` (below 128 to fit)
    the expert TP degree; ``masks``: :func:`_memo_masks`."""
    fits = (0 <= s < 1 << 32 and 0 <= mbs < 1 << 28 and 0 <= tp < 1 << 16 and 0 <= cp < 1 << 16
            and 0 <= ep < 1 << 16 and 0 <= etp < 1 << 7 and 0 <= rc < 4 and 0 <= prec < 4)
    k1 = (np.uint64(s) | (np.uint64(mbs) << np.uint64(32)) | (np.uint64(single) << np.uint64(60))
          | (np.uint64(masks) << np.uint64(61))) \
        if fits else _NO_SLOT
    flags = np.uint64(sp) | (np.uint64(rc) << np.uint64(1)) | (np.uint64(flash) << np.uint64(3)) \
        | (np.uint64(prec) << np.uint64(4)) | (np.uint64(tco) << np.uint64(6)) \
        | (np.uint64(whole) << np.uint64(7)) | (np.uint64(heavy) << np.uint64(8)) \
        | (np.uint64(etp) << np.uint64(9))
    k2 = (np.uint64(tp) | (np.uint64(cp) << np.uint64(16)) | (np.uint64(ep) << np.uint64(32))
          | (flags << np.uint64(48))) if fits else _NO_SLOT
    return fits, k1, k2


@njit(**_INLINE_STEP)
def _logs(w, f, c, s, tp, cp, ep, etp, mbs, flash, prec, sp):
    """np.log of every GEMM's ideal duration the numpy path takes it of (gemm.gemm_size_efficiency;
    libm's log, as numpy's loop calls it here); 0.0 for GEMMs the workload does not have.

    The kernel's mode 1 writes the same durations line for line (the bitwise tests hold
    both): one helper for the two made the whole loop 5-10 % slower in an interleaved
    A/B (1 thread, 1M layouts), LLVM laying out the hot path differently."""
    moe, shared, mla, q_lora = w[6], w[11], w[25], w[26]
    peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
    (f_qkv, f_proj, f_core, calls_core, f_fc1, f_fc2, f_moe1, f_moe2, calls_moe, f_sh1, f_sh2,
     f_router, f_head, f_qup, f_kvdown, f_kvup, f_eh) = _gemm_flops(w, s, tp, cp, ep, etp, mbs, flash, sp)
    has_moe, has_shared = moe != 0.0, moe != 0.0 and shared != 0.0
    has_mla, has_qup = mla != 0.0, mla != 0.0 and q_lora != 0.0
    return (math.log(_ideal(f_qkv, 1.0, peak_gemm)),
            math.log(_ideal(f_proj, 1.0, peak_gemm)),
            0.0 if flash else math.log(_ideal(f_core, calls_core, peak16)),
            math.log(_ideal(f_fc1, 1.0, peak_gemm)),
            math.log(_ideal(f_fc2, 1.0, peak_gemm)),
            math.log(_ideal(f_moe1, calls_moe, peak_gemm)) if has_moe else 0.0,
            math.log(_ideal(f_moe2, calls_moe, peak_gemm)) if has_moe else 0.0,
            math.log(_ideal(f_sh1, 1.0, peak_gemm)) if has_shared else 0.0,
            math.log(_ideal(f_sh2, 1.0, peak_gemm)) if has_shared else 0.0,
            math.log(_ideal(f_router, 1.0, peak16)) if has_moe else 0.0,
            math.log(_ideal(f_head, 1.0, peak16)),
            math.log(_ideal(f_qup, 1.0, peak_gemm)) if has_qup else 0.0,
            math.log(_ideal(f_kvdown, 1.0, peak_gemm)) if has_mla else 0.0,
            math.log(_ideal(f_kvup, 1.0, peak_gemm)) if has_mla else 0.0,
            math.log(_ideal(f_eh, 1.0, peak_gemm)))


@njit(**_INLINE_STEP)
def _price_steps(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                 mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo,
                 values, rows, bounds, span):
    """Steps 1, 2 and 5-8 of configurations ``b0:b1`` (``span``), steps 3-4 read from
    ``values[rows]`` (the loop of :func:`_price_block` and its ``_even`` variants, inlined
    into each); returns whether any of them has an integer knob outside ``bounds`` or a name
    that is no choice (code -1; see :func:`_kernel`).

    The range checks are here, not in the kernel's scalar pass: this loop reads the same
    arrays, from cache, and checks four configurations a vector. With the names' codes
    decoded in a loop of their own before the scalar pass, the megatron call on 1M layouts
    went 1.089x faster (2 threads, 11 interleaved rounds, best over best, 10a2e63 against
    d01a399: benchmarks/results/grid_compare_megatron_flat.json as committed in 9355ee3).
    ``span`` is one argument, not two: a call of more than 30 arguments compiles (CPython
    3.11) to a call with ``*args``, which numba does not inline.

    A loop without the memo's probing, so LLVM vectorizes it (four configurations a
    vector on AVX2; see :func:`_compile` for why it is told to): both sides of a select are
    computed, each with the expression the scalar code would use, so the same bits.

    ``b0`` and ``b1`` are unsigned (``np.uint64``): numba wraps a negative signed index
    around (``a[i]`` is ``a[i + len(a)]`` where ``i < 0``), a select per lane that left
    LLVM unable to prove four lanes' addresses consecutive, so every input was gathered
    and every output scattered one value at a time. An unsigned index has no wraparound:
    the loads and stores are whole vectors (in an interleaved A/B, 2 threads, 1M layouts,
    14 rounds, unsaved: best 127.7 -> 84.5 ms, median 148.5 -> 105.3 ms).
    """
    layers, h = w[0], w[1]
    n_total, capacity = f[11], f[12]
    step_overhead = c[10]
    up_bw, out_bw = f[7] * c[7], f[8] * c[8]  # as _communication computes them
    nan = np.nan
    outside = False
    b0, b1, staged = span
    for i in range(b0, b1):
        # the integer knobs' range checks and the names' (see _kernel): an or over the block
        outside |= _any_outside(i, bounds, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                                mbs_a, zero_a) | (rc_b[i - b0] < 0) | (prec_b[i - b0] < 0)
        batch, s = float(batch_a[i]), float(s_a[i])
        tp, pp, cp, ep = float(tp_a[i]), float(pp_a[i]), float(cp_a[i]), float(ep_a[i])
        etp = float(etp_a[i])
        v, mbs = float(v_a[i]), float(mbs_a[i])
        rc, zero, prec = rc_b[i - b0], zero_a[i], prec_b[i - b0]  # (the names' codes: by block)
        spk, tco, ogr, opg, flash = spk_a[i], tco_a[i], ogr_a[i], opg_a[i], flash_a[i]
        p2p = p2p_a[i]  # the pipeline's bools and counts in one word (run)
        mtp, first, last = _pipeline_counts(p2p)
        if staged == 0:  # a block with no stage set: constants (see _price_block_even)
            first, last = 0.0, 0.0
        mem = mem_a[i]  # grad_reduce_in_bf16, dropout masks, combined 1F1B, ... (memory_flags)
        a2a = (mem & 8) != 0  # overlap_moe_expert_parallel_comm [35]
        # the memo's row; its columns from 16 on read as values[row, k]: read from the row's
        # view r (r[16] on), the loop was left scalar ("instruction cannot be vectorized").
        # Those columns (the later steps' terms of the key's knobs) are read in the dense
        # loops only (w[6], the MoE flag, is a constant in each loop: see _price_block); the
        # MoE loops compute them here, the same bits (read, they took bench_fused's MoE
        # draw, about 5,200 keys, 1.37x the time: 1 thread, 5 interleaved rounds, unsaved)
        row = rows[i - b0]
        dense = w[6] == 0.0
        key_ok = (values[row, 16] != 0.0) if dense else _key_rules(w, s, tp, cp, ep, etp,
                                                                    spk and tp > 1.0)
        sp, dp, group, valid, n_acc, m_exact, m, realizable = _split(
            w, f, has_dp, batch, s, tp, pp, cp, ep, etp, float(dp_a[i]), v, mbs, spk, tco,
            prec, flash, ogr, opg, zero, first, last, (p2p & 2) != 0, rc, mtp, a2a, key_ok,
            (mem >> 4) & 3, (mem & 128) != 0)
        peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
        grad_bytes = 2.0 if (mem & 1) != 0 else grad_bytes  # grad_reduce_in_bf16 [25]
        r = values[row]
        s_local, act_bytes, layer_f, layer_b, tp_cp_total, tp_layer, tp_layer_f = \
            r[0], r[1], r[2], r[3], r[4], r[5], r[6]
        tp_layer_b = tp_layer - tp_layer_f
        cp_layer, ep_layer, cp_layer_f, cp_layer_b, ep_layer_f, ep_layer_b, t_head = \
            r[7], r[8], r[9], r[10], r[11], r[12], r[13]
        t_mtp_module, mtp_flops_sequence = r[14], r[15]
        heavy = _heavy(w, pp, v, first, last)  # a heaviest stage of MoE layers only (6 and 7)
        # 5. pipeline
        split = _p2p_split(tp, sp, (p2p & 1) != 0)  # scatter_gather_tensors_in_pipeline [26]
        # a send's bytes over its split, and twice that (the memo's act_bytes / tp; over a
        # split of 1.0 the division is exact: the bytes themselves)
        if dense:
            send = values[row, 17] if split != 1.0 else act_bytes
            send2 = values[row, 18] if split != 1.0 else 2.0 * act_bytes
            gather_call = values[row, 19]
            tp_terms = (values[row, 20], values[row, 21], values[row, 22], values[row, 23],
                        values[row, 29], values[row, 30])
            mem_terms = (values[row, 24], values[row, 25], values[row, 26], values[row, 27],
                         values[row, 28], values[row, 31], values[row, 31])
        else:
            send, send2 = act_bytes / split, 2.0 * act_bytes / split
            gather_call = _p2p_gather_call(f, c, tp, act_bytes, n_acc <= f[6])
            tp_terms = _dp_tp_terms(w, f, tp, ep, etp)
            mem_terms = _memory_terms(w, s_local, tp, etp, ep, mbs, sp, rc, flash, prec,
                                      (mem & 2) != 0, (mem & 4) != 0)
        steady = _p2p_steady_sends(v, m, (p2p & 2) != 0)  # overlap_p2p_comm [27]
        paired = _combined_1f1b_paired(pp, v, m, a2a)  # overlap_moe_expert_parallel_comm [35]
        (layers_stage, paced_layers, last_paced, bubble, t_pipe, t_pp, window_f, window_b, q, slack,
         a2a_hidden, a2a_launch) = _pipeline(
            w, f, c, tp, pp, cp, v, dp, m, rc, act_bytes, layer_f, layer_b, (tp_layer_f, tp_layer_b),
            cp_layer_f,
            cp_layer_b, ep_layer_f, ep_layer_b, up_bw, out_bw, t_head, (send, gather_call), steady,
            1.0 * ((not sp) and split > 1.0), n_acc, mtp, t_mtp_module, (first, last), paired)
        # 6. data parallel
        (heavy_params, expert_stage_params, expert_group, params_bytes, t_dp_total, t_dp,
         t_opt) = _data_parallel(w, f, c, tp, pp, v, heavy, ep, etp, group, zero, m, ogr, opg, grad_bytes,
                                 layers_stage, window_f, window_b, t_pipe, up_bw, out_bw, n_acc, q, mtp,
                                 slack, a2a_hidden, tp_terms, (mem & 64) != 0)
        # 7. memory
        weights, grads, optim, activations, buffers, footprint = _memory(
            w, pp, v, m, group, zero, grad_bytes, act_bytes, layers_stage, expert_group, params_bytes,
            heavy_params, expert_stage_params, send2, mtp, first, last, 1.0 if paired > 0.0 else 0.0,
            mem_terms + (tp_terms[1], act_bytes / 2.0 / (tp if sp else 1.0) if (mem & 2) != 0 else 0.0))
        # 8. compose (megatron_compose.compose and _mask)
        total = t_pipe + t_pp + t_dp + t_opt + step_overhead
        model_flops = _model_flops(w, batch, s) + mtp * batch * mtp_flops_sequence
        per_acc = model_flops / (total * n_acc)
        head = 6.0 * batch * s * h * w[13] * (1.0 + mtp)
        per_flop = 1.0 / model_flops
        full = (model_flops - head) * per_flop * (1.0 / 3.0)
        selective = 4.0 * s * w[2] * w[30] * (layers + mtp) * (batch * s) * per_flop
        recompute_extra = full if rc == 2 else (selective if rc == 1 else 0.0)
        mfu = per_acc / peak_gemm
        ms = m * (paced_layers + mtp * last_paced)
        x = 0.0 if valid else nan
        fo[0][i] = dp * 1.0 + x
        fo[1][i] = m_exact + x
        fo[2][i] = total + x
        fo[3][i] = batch / total + x
        fo[4][i] = batch * 1.0 * s / (total * n_acc) + x
        fo[5][i] = per_acc + x
        fo[6][i] = mfu + x
        fo[7][i] = mfu * (1.0 + recompute_extra) + x
        fo[8][i] = ms * (layer_f + layer_b) + m * last_paced * (t_head + mtp * (t_head + t_mtp_module)) + x
        fo[9][i] = ms * tp_layer + x
        fo[10][i] = ms * cp_layer + x
        fo[11][i] = ms * ep_layer - ms * _min(a2a_hidden - a2a_launch, ep_layer) + x
        fo[12][i] = t_pp + x
        fo[13][i] = t_dp + x
        fo[14][i] = ms * (tp_cp_total + ep_layer) + t_pp + t_dp_total + x
        fo[15][i] = bubble + x
        fo[16][i] = bubble / t_pipe + x
        fo[17][i] = t_opt + x
        fo[18][i] = footprint + x
        fo[19][i] = weights + x
        fo[20][i] = grads + x
        fo[21][i] = optim + x
        fo[22][i] = activations + x
        fo[23][i] = buffers + x
        fo[24][i] = ms * ((window_f - (layer_f + tp_layer_f + cp_layer_f + ep_layer_f))
                          + (window_b - (layer_b + tp_layer_b + cp_layer_b + ep_layer_b))) \
            - ms * a2a_launch + x
        bo[0][i] = valid
        bo[1][i] = realizable
        bo[2][i] = valid and footprint <= capacity
    return outside


@kernel(cache=_CACHE)
def _price_block(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                 mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo,
                 values, rows, bounds, span):
    """:func:`_price_steps` of an MoE workload, any stages (:func:`_priced_block` sends a
    workload without experts to the dense loops): its MoE flag ``w[6]`` is 1.0, made a
    constant here, as the dense loops make it 0.0, so that _price_steps' branches on it
    fold."""
    return _price_steps(w[:6] + (1.0,) + w[7:], f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                        mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo,
                        bo, values, rows, bounds, (span[0], span[1], np.uint64(1)))


@kernel(cache=_CACHE)
def _price_block_even(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                      mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a,
                      fo, bo, values, rows, bounds, span):
    """:func:`_price_steps` of an MoE workload without leading dense layers (``w[21]`` a
    constant 0.0) in a block where no configuration sets the first or the last stage's
    layers (``num_layers_in_first/last_pipeline_stage`` constants 0.0).

    The memory of rank 1 and of the ranks where the MoE layers start, which can outweigh
    rank 0's only behind a set first stage or leading dense layers, and the uneven stages'
    selects drop out; where these are 0.0 the same bits as :func:`_price_block`. With
    the stages constants but ``w[21]`` not, 1M layouts of Mixtral 8x7B in bench_fused's
    draw took 1.18x the time of 041b881, which priced the first and the last rank's
    activations on the heaviest stage (interleaved A/B, 1 thread, 5 rounds, 2026-12-05,
    unsaved).
    """
    return _price_steps(w[:6] + (1.0,) + w[7:21] + (0.0,) + w[22:], f, c, has_dp, batch_a, s_a, tp_a,
                        pp_a, cp_a, ep_a,
                        etp_a, dp_a, v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a,
                        mem_a, p2p_a, fo, bo, values, rows, bounds, (span[0], span[1], np.uint64(0)))


@kernel(cache=_CACHE)
def _price_block_dense_even(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a,
                            v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a,
                            p2p_a, fo, bo, values, rows, bounds, span):
    """:func:`_price_block_even` of a workload without experts (``w[6]``, the MoE flag, a
    constant 0.0).

    LLVM drops the expert terms too, whose selects the vector loop otherwise computes on
    both sides. The loop is bound by its divisions (78 vector divisions per iteration, 57
    without the expert terms; 1M layouts of Llama3_70B_MC, 1 thread, on this project's
    AVX-512 VM: 70.7 -> 45.0 ms, unsaved). Where the flag is 0.0 the same bits.
    """
    return _price_steps(w[:6] + (0.0,) + w[7:], f, c, has_dp, batch_a, s_a, tp_a, pp_a,
                        cp_a, ep_a, etp_a, dp_a, v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a,
                        opg_a, flash_a, mem_a, p2p_a, fo, bo, values, rows, bounds,
                        (span[0], span[1], np.uint64(0)))


@kernel(cache=_CACHE)
def _price_block_dense(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                       mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a,
                       fo, bo, values, rows, bounds, span):
    """:func:`_price_block` of a workload without experts (``w[6]`` a constant 0.0): a
    dense model's block where a configuration sets the first or the last stage's layers.

    The expert terms drop out, as in :func:`_price_block_dense_even`, and so does the
    memory of the ranks where the MoE layers start; rank 1's stays (a lighter first stage
    moves the peak there). Where the flag is 0.0 the same bits as :func:`_price_block`.
    """
    return _price_steps(w[:6] + (0.0,) + w[7:], f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a,
                        etp_a, dp_a, v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a,
                        flash_a, mem_a, p2p_a, fo, bo, values, rows, bounds,
                        (span[0], span[1], np.uint64(1)))


@njit(**_INLINE_STEP)
def _priced_block(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a,
                  mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo,
                  values, rows, bounds, span):
    """The block loop for the workload and the block (``span``: first, end, and whether a
    configuration of the block sets a stage's layers). A workload without experts takes
    :func:`_price_block_dense_even` where none does, :func:`_price_block_dense` where one
    does; an MoE workload without leading dense layers :func:`_price_block_even` where none
    does; the rest :func:`_price_block`. Returns whether a knob of the block left ``bounds``
    or a name was no choice."""
    here = (span[0], span[1])
    if span[2] != 0 and w[6] == 0.0:
        return _price_block_dense(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a,
                                  v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a,
                                  flash_a, mem_a, p2p_a, fo, bo, values, rows, bounds, here)
    if span[2] == 0 and w[6] == 0.0:
        return _price_block_dense_even(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a,
                                       dp_a, v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a,
                                       opg_a, flash_a, mem_a, p2p_a, fo, bo, values, rows, bounds, here)
    if span[2] == 0 and w[21] == 0.0:
        return _price_block_even(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a,
                                 v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a,
                                 mem_a, p2p_a, fo, bo, values, rows, bounds, here)
    return _price_block(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a,
                        v_a, mbs_a, spk_a, zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a,
                        p2p_a, fo, bo, values, rows, bounds, here)


@njit(**_PRIM)
def _memo_row(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, prec, tco, whole, single, heavy, masks,
              lgs, r):
    """Steps 3, 4 and the LM head of one memo miss (``lgs``: its GEMMs' logs), and the later
    steps' terms of its knobs (see :data:`_N_MEMO`), into the row ``r``."""
    peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
    moe_share = 1.0 if heavy else w[12]
    (s_local, tokens, kv_t, norm_split, act_bytes, t_core_f, t_core_b, layer_f, layer_b, t_mtp,
     t_tp_gemms_f) = _layer_times(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, peak_gemm, peak16,
                                  plateau, plateau16, lgs, moe_share)
    (_up, _out, tp_total, tp_layer, cp_total, cp_layer, ep_layer, cp_layer_f, cp_layer_b,
     ep_layer_f, ep_layer_b, tp_layer_f) = _communication(
        w, f, c, tp, cp, ep, etp, sp, rc, tco, tokens, kv_t, norm_split, act_bytes, t_core_f, t_core_b,
        _low_bits(prec), whole, single, moe_share, t_tp_gemms_f, w[6] != 0.0 and (masks & 1) != 0)
    t_head = _head(w, f, c, tp, tokens, peak16, plateau16, lgs[G_HEAD])
    # (TP's and CP's traffic kept as their sum, which only communication_latency reads)
    r[0], r[1], r[2], r[3], r[4], r[5], r[6] = \
        s_local, act_bytes, layer_f, layer_b, tp_total + cp_total, tp_layer, tp_layer_f
    r[7], r[8], r[9], r[10], r[11], r[12], r[13] = \
        cp_layer, ep_layer, cp_layer_f, cp_layer_b, ep_layer_f, ep_layer_b, t_head
    r[14], r[15] = t_mtp, _mtp_flops_per_sequence(w, s)
    if w[6] != 0.0:  # the MoE loops compute the rest themselves (see _price_steps)
        return
    r[16] = 1.0 if _key_rules(w, s, tp, cp, ep, etp, sp) else 0.0
    r[17], r[18], r[19] = act_bytes / tp, 2.0 * act_bytes / tp, _p2p_gather_call(f, c, tp, act_bytes, whole)
    r[20], r[21], r[22], r[23], r[29], r[30] = _dp_tp_terms(w, f, tp, ep, etp)
    r[24], r[25], r[26], r[27], r[28], r[31], _work_moe = _memory_terms(w, s_local, tp, etp, ep, mbs, sp, rc, flash, prec,
                                                      (masks & 1) != 0, (masks & 2) != 0)


@njit(**_PRIM)
def _ideals(w, f, c, s, tp, cp, ep, etp, mbs, flash, prec, sp, ext, col):
    """Mode 1's miss: its GEMMs' ideal durations into column ``col`` of ``ext`` (the
    arguments of :func:`_logs`, line for line)."""
    peak_gemm, peak16, plateau, plateau16, grad_bytes = _hardware(f, c, prec)
    (f_qkv, f_proj, f_core, calls_core, f_fc1, f_fc2, f_moe1, f_moe2, calls_moe, f_sh1,
     f_sh2, f_router, f_head, f_qup, f_kvdown, f_kvup, f_eh) = _gemm_flops(w, s, tp, cp, ep, etp,
                                                                           mbs, flash, sp)
    ext[G_QKV, col] = _ideal(f_qkv, 1.0, peak_gemm)
    ext[G_PROJ, col] = _ideal(f_proj, 1.0, peak_gemm)
    ext[G_CORE, col] = _ideal(f_core, calls_core, peak16)
    ext[G_FC1, col] = _ideal(f_fc1, 1.0, peak_gemm)
    ext[G_FC2, col] = _ideal(f_fc2, 1.0, peak_gemm)
    ext[G_MOE1, col] = _ideal(f_moe1, calls_moe, peak_gemm)
    ext[G_MOE2, col] = _ideal(f_moe2, calls_moe, peak_gemm)
    ext[G_SH1, col] = _ideal(f_sh1, 1.0, peak_gemm)
    ext[G_SH2, col] = _ideal(f_sh2, 1.0, peak_gemm)
    ext[G_ROUTER, col] = _ideal(f_router, 1.0, peak16)
    ext[G_HEAD, col] = _ideal(f_head, 1.0, peak16)
    ext[G_QUP, col] = _ideal(f_qup, 1.0, peak_gemm)
    ext[G_KVDOWN, col] = _ideal(f_kvdown, 1.0, peak_gemm)
    ext[G_KVUP, col] = _ideal(f_kvup, 1.0, peak_gemm)
    ext[G_EH, col] = _ideal(f_eh, 1.0, peak_gemm)


@njit(**_PRIM)
def _memo_miss(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, prec, tco, whole, single, heavy, masks,
               r):
    """:func:`_memo_row` of a miss of mode 0, its logs from libm (:func:`_logs`)."""
    _memo_row(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, prec, tco, whole, single, heavy, masks,
              _logs(w, f, c, s, tp, cp, ep, etp, mbs, flash, prec, sp), r)


@njit(**_INLINE_STEP)
def _any_outside(i, bounds, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a, mbs_a, zero_a):
    """Whether configuration ``i``'s integer knobs leave ``bounds`` (see :func:`_kernel`)."""
    return (_outside(batch_a[i], bounds[0], bounds[1]) | _outside(s_a[i], bounds[2], bounds[3])
            | _outside(tp_a[i], bounds[4], bounds[5]) | _outside(pp_a[i], bounds[6], bounds[7])
            | _outside(cp_a[i], bounds[8], bounds[9]) | _outside(ep_a[i], bounds[10], bounds[11])
            | _outside(dp_a[i], bounds[12], bounds[13]) | _outside(v_a[i], bounds[14], bounds[15])
            | _outside(mbs_a[i], bounds[16], bounds[17]) | _outside(zero_a[i], bounds[18], bounds[19])
            | _outside(etp_a[i], bounds[20], bounds[21]))


@kernel(cache=_CACHE)
def _kernel(w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a, mbs_a, spk_a, rc_a,
            zero_a, prec_a, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo, lo, hi, ext, plan, mode, bounds,
            slots, values, rows, rc_b, prec_b, rc_keys, prec_keys):
    """Steps 1-8 of megatron._solve for configurations ``lo:hi``, outputs into ``fo``/``bo``.

    Steps 3 (layer times) and 4 (communication)
    and the LM head's time, with the logs of the GEMM size curve they need, are a pure
    function of ten knobs (``seq_len``, ``micro_batch_size``, ``tp/cp/ep_size``,
    sequence parallelism, recompute, flash attention, precision, ``tp_comm_overlap``), of
    whether the job fits in one NVLink domain (:func:`_whole`) and whether one EP group
    spans it (:func:`_single_ep`), and of the call's
    workload, fleet and constants. They were about a third of a
    configuration's work (an interleaved A/B, 1 thread, 1M layouts: 253 -> 173 ms with the
    memo), and a flat draw over a design space repeats those ten far more often than
    whole layouts: so they are memoized on the exact knob values (packed into two words,
    compared in full; a hit returns the bits a computation would). Knobs too large to
    pack, and keys past :data:`MEMO_KEYS` distinct ones, are priced into a row of their
    own (``values`` has :data:`MEMO_KEYS` shared rows, then one per configuration of a block).

    Blocks of :data:`BLOCK` configurations take two passes: a scalar one finds (or
    computes) each configuration's row of ``values`` into ``rows`` and the codes of its
    recompute and precision into ``rc_b`` and ``prec_b``, then :func:`_price_block` prices
    the rest, vectorized. ``slots`` (the key table: each slot's two key words and row, 32
    bytes, one cache line a probe), ``values``,
    ``rows``, ``rc_b`` and ``prec_b`` are scratch (:func:`_memo_scratch`), which a thread
    keeps over every range it takes in one call, so the memo's keys carry from one range
    and chunk to the next (the count of keys kept is slot 0's fourth word): arguments, not
    allocations, so LLVM knows they overlap no output.

    ``rc_a`` and ``prec_a`` are int64 codes or the characters of the names
    (:func:`name_characters`); the scalar pass matches names exactly against
    ``rc_keys`` / ``prec_keys`` (:func:`choice_keys`), so a million names cost no pass of
    their own, nor a code array written and read back (the megatron call, 2 threads, 1M
    layouts, unsaved: 41.7 -> 34.6 ms). A name that is no choice gives the code -1 and
    fails the range check.

    ``mode`` 0: the logs from libm. Where numpy's log is not libm's, :func:`run` takes
    them with ``np.log`` between a mode 1 and a mode 2 call on the same range. Mode 1
    makes the first pass: it walks the memo and writes only the misses' GEMM ideal
    durations into ``ext`` (rows G_*, columns 0, 1, ...), and a plan into ``plan``
    (``plan[0, i - lo]``: the configuration's row of ``values``, or ``-1 - column`` of
    a miss; ``plan[1, column]``: the shared row a miss is kept in, -1 for none;
    ``plan[2]`` and ``plan[3]``: the names' codes). Mode 2
    follows the plan: it prices each miss from its logs, then the blocks. Misses are few
    (864 distinct keys in a million of ``bench_fused``'s draws), so the logs cost little,
    and mode 2 neither packs nor looks up a key again.

    The vector pass also makes the range checks of the integer knobs (``bounds``: the
    least and the largest value of each, in the order of the integer knob arrays of the
    signature, ``batch_a`` ... ``zero_a``, then ``etp_a``), so their arrays are not read once
    more before the call. Modes 0 and 2 return 1 if every value lay within them and every
    name was a choice, else 0; mode 1 returns the number of misses.
    """
    if mode == 1:  # the memo's misses, in mode 2's order: their GEMMs' ideal durations
        kept = _memo_kept(slots)
        col = 0
        for i in range(lo, hi):
            tp = float(tp_a[i])
            sp = spk_a[i] and tp > 1.0  # as _split has it
            rc, prec = choice_code(rc_a, i, rc_keys), choice_code(prec_a, i, prec_keys)
            whole = _whole(f, has_dp, tp, float(pp_a[i]), float(cp_a[i]), float(dp_a[i]))
            single = _single_ep(f, has_dp, tp, float(pp_a[i]), float(cp_a[i]), float(dp_a[i]),
                                float(ep_a[i]), float(etp_a[i]))
            _mtp, first, last = _pipeline_counts(p2p_a[i])
            heavy = _heavy(w, float(pp_a[i]), float(v_a[i]), first, last)
            fits, k1, k2 = _memo_key(s_a[i], mbs_a[i], tp_a[i], cp_a[i], ep_a[i], etp_a[i], sp, rc,
                                     flash_a[i], prec, tco_a[i], whole, single, heavy,
                                     _memo_masks(w, mem_a[i]))
            # mode 0's probe, written out again: as a helper function the scalar pass ran
            # about 2x slower (an earlier session's A/B, unsaved); inlined by numba
            # (inline="always"), the whole call 1.03x slower (1 thread, 1M layouts, 8
            # interleaved rounds, 2026-12-05, unsaved)
            row = -1
            slot = ((k1 ^ (k2 * _MIX)) * _MIX) >> _SLOT_SHIFT
            if fits:
                while True:  # a hit on the first probe takes one branch
                    held = slots[slot, 0]
                    if ((held ^ k1) | (slots[slot, 1] ^ k2)) == 0:
                        row = np.int64(slots[slot, 2])
                        break
                    if held == _NO_SLOT:
                        break
                    slot = (slot + np.uint64(1)) & np.uint64(MEMO_SLOTS - 1)
            if row < 0:
                s, cp, ep, mbs = float(s_a[i]), float(cp_a[i]), float(ep_a[i]), float(mbs_a[i])
                etp = float(etp_a[i])
                flash = flash_a[i]
                _ideals(w, f, c, s, tp, cp, ep, etp, mbs, flash, prec, sp, ext, col)
                if fits and kept < MEMO_KEYS:
                    slots[slot, 0], slots[slot, 1], slots[slot, 2] = k1, k2, np.uint64(kept)
                    plan[1, col] = kept
                    kept += 1
                else:
                    plan[1, col] = -1
                    slots[1, 3] |= np.uint64(fits)  # a key turned away: the memo overflowed
                row = -1 - col
                col += 1
            plan[0, i - lo] = row
            plan[2, i - lo] = rc
            plan[3, i - lo] = prec
        slots[0, 3] = np.uint64(kept)
        return col
    if mode == 2:  # mode 1's plan: each configuration's row, and the misses to price
        out_of_bounds = False
        for b0 in range(lo, hi, BLOCK):
            b1 = min(b0 + BLOCK, hi)
            staged = False  # whether a configuration of the block sets a stage's layers
            for i in range(b0, b1):
                staged |= (p2p_a[i] >> 8) != 0
                row = plan[0, i - lo]
                rc, prec = plan[2, i - lo], plan[3, i - lo]
                rc_b[i - b0], prec_b[i - b0] = rc, prec
                if row < 0:  # 3, 4 and the LM head, computed (and kept where mode 1 kept the key)
                    col = -1 - row
                    s, tp, cp, ep = float(s_a[i]), float(tp_a[i]), float(cp_a[i]), float(ep_a[i])
                    etp, mbs = float(etp_a[i]), float(mbs_a[i])
                    tco, flash = tco_a[i], flash_a[i]
                    sp = spk_a[i] and tp > 1.0  # as _split has it
                    whole = _whole(f, has_dp, tp, float(pp_a[i]), cp, float(dp_a[i]))
                    single = _single_ep(f, has_dp, tp, float(pp_a[i]), cp, float(dp_a[i]), ep, etp)
                    _mtp, first, last = _pipeline_counts(p2p_a[i])
                    heavy = _heavy(w, float(pp_a[i]), float(v_a[i]), first, last)
                    masks = _memo_masks(w, mem_a[i])
                    lgs = (ext[0, col], ext[1, col], ext[2, col], ext[3, col], ext[4, col],
                           ext[5, col], ext[6, col], ext[7, col], ext[8, col], ext[9, col],
                           ext[10, col], ext[11, col], ext[12, col], ext[13, col], ext[14, col])
                    row = plan[1, col]
                    row = MEMO_KEYS + (i - b0) if row < 0 else row
                    _memo_row(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, prec, tco, whole, single,
                              heavy, masks, lgs, values[row])
                rows[i - b0] = row
            out_of_bounds |= _priced_block(
                w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a, mbs_a, spk_a,
                zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo, values, rows,
                bounds, (np.uint64(b0), np.uint64(b1), np.uint64(staged)))
        return 0 if out_of_bounds else 1
    # mode 0. The step memo: open addressing (linear probing) on the two key words -> a row
    kept = _memo_kept(slots)
    out_of_bounds = False
    for b0 in range(lo, hi, BLOCK):
        b1 = min(b0 + BLOCK, hi)
        for i in range(b0, b1):  # the names' codes, a loop of their own
            rc_b[i - b0] = choice_code(rc_a, i, rc_keys)
            prec_b[i - b0] = choice_code(prec_a, i, prec_keys)
        staged = False  # whether a configuration of the block sets a stage's layers
        for i in range(b0, b1):
            s, tp, cp, ep = float(s_a[i]), float(tp_a[i]), float(cp_a[i]), float(ep_a[i])
            etp, mbs = float(etp_a[i]), float(mbs_a[i])
            rc, prec = rc_b[i - b0], prec_b[i - b0]
            spk, tco, flash = spk_a[i], tco_a[i], flash_a[i]
            sp = spk and tp > 1.0  # as _split has it
            whole = _whole(f, has_dp, tp, float(pp_a[i]), cp, float(dp_a[i]))
            single = _single_ep(f, has_dp, tp, float(pp_a[i]), cp, float(dp_a[i]), ep, etp)
            _mtp, first, last = _pipeline_counts(p2p_a[i])
            staged |= (first > 0.0) | (last > 0.0)
            heavy = _heavy(w, float(pp_a[i]), float(v_a[i]), first, last)
            masks = _memo_masks(w, mem_a[i])
            fits, k1, k2 = _memo_key(s_a[i], mbs_a[i], tp_a[i], cp_a[i], ep_a[i], etp_a[i], sp, rc, flash, prec,
                                     tco, whole, single, heavy, masks)
            row = -1
            slot = ((k1 ^ (k2 * _MIX)) * _MIX) >> _SLOT_SHIFT
            if fits:
                while True:  # a hit on the first probe takes one branch
                    held = slots[slot, 0]
                    if ((held ^ k1) | (slots[slot, 1] ^ k2)) == 0:
                        row = np.int64(slots[slot, 2])
                        break
                    if held == _NO_SLOT:
                        break
                    slot = (slot + np.uint64(1)) & np.uint64(MEMO_SLOTS - 1)
            if row < 0:  # 3, 4 and the LM head, computed (and kept)
                if fits and kept < MEMO_KEYS:
                    slots[slot, 0], slots[slot, 1], slots[slot, 2] = k1, k2, np.uint64(kept)
                    row = kept
                    kept += 1
                else:
                    row = MEMO_KEYS + (i - b0)
                    slots[1, 3] |= np.uint64(fits)  # a key turned away: the memo overflowed
                _memo_miss(w, f, c, s, tp, cp, ep, etp, mbs, sp, rc, flash, prec, tco, whole, single, heavy,
                           masks, values[row])
            rows[i - b0] = row
        out_of_bounds |= _priced_block(
            w, f, c, has_dp, batch_a, s_a, tp_a, pp_a, cp_a, ep_a, etp_a, dp_a, v_a, mbs_a, spk_a,
            zero_a, rc_b, prec_b, tco_a, ogr_a, opg_a, flash_a, mem_a, p2p_a, fo, bo, values, rows,
            bounds, (np.uint64(b0), np.uint64(b1), np.uint64(staged)))
    slots[0, 3] = np.uint64(kept)
    return 0 if out_of_bounds else 1


@njit(**_INLINE_STEP)
def _memo_masks(w, mem):
    """The memo key's ``masks``: bits 1 and 2 of :func:`memory_flags` (whether the hidden and
    the attention dropout keep masks) as 0-3, which the memory terms of a dense workload's
    row read; for an MoE workload, whose row does not keep them (a draw of the dropouts
    then shares its keys), bit 7 (``moe_enable_deepep``) as 0-1, which its EP terms read."""
    return np.uint64((mem >> 1) & 3) if w[6] == 0.0 else np.uint64((mem >> 7) & 1)


@njit(**_INLINE_STEP)
def _memo_kept(slots):
    """The count of keys the memo keeps (slot 0's fourth word), after starting it again
    where it overflowed in the call before (slot 1's fourth word: a key turned away).

    A memo kept over a thread's ranges and chunks (:func:`_memo_scratch`) sees a dense
    draw's keys once (bench_fused's million layouts, 1 thread: 21,173 misses in chunks of
    65,536 each with its own memo, 1,404 with one). A draw of more keys than it keeps
    would price every key it turned away one by one over the whole call (Mixtral 8x7B
    with ep_size drawn, about 5,200 keys: 1 thread 183.6 -> 297.1 ms, bench_fused at 19:14
    and 20:58 on 2026-12-05), and starting again whenever it fills costs more misses than
    that; so a memo that overflowed starts again at the next call (a chunk, or a range
    where numpy's log is libm's), as each call's did before.
    """
    if slots[1, 3] != 0:
        slots[:, 0] = _NO_SLOT
        slots[0, 3] = 0
        slots[1, 3] = 0
    return np.int64(slots[0, 3])


@njit(**_INLINE_STEP)
def _pipeline_counts(p2p):
    """(mtp_num_layers, num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage)
    of a word of :func:`pipeline_flags`, as floats."""
    return float((p2p >> 2) & 63), float((p2p >> 8) & 4095), float(p2p >> 20)


@njit(**_INLINE_STEP)
def _outside(x, low, high):
    """Whether an integer knob's value lies outside [low, high] (no branch)."""
    return (x < low) | (x > high)


# ------------------------------------------------------------ Python side

def workload_scalars(w):
    """The kernel's per-workload tuple from a ``megatron._Shape`` (same expressions as the steps)."""
    moe = bool(w.moe)
    # megatron_memory.layer_activation_bytes: the workload-only factors, as it evaluates them.
    attention0 = w.attn_act
    gated = float(np.asarray(w.gated, dtype=np.float64))
    mlp_dense = (4.0 + 2.0 * gated) * float(w.ffn)
    moe_ffn_hidden = w.moe_ffn + w.shared * w.moe_ffn / max(w.top_k, 1)
    mlp_moe_width = w.top_k * moe_ffn_hidden if w.top_k > 0 else moe_ffn_hidden
    mlp_moe = (4.0 + 2.0 * gated) * float(mlp_moe_width)
    # megatron_compose._stage_params: the workload-only parts.
    dense_scale = (w.dense_layer_params * w.dense_layers / w.layers
                   + w.moe_layer_nonexpert * w.moe_layers / w.layers)
    expert_scale = (w.expert_params * w.experts * w.moe_layers / w.layers) if moe else 0.0
    return tuple(float(x) for x in (
        w.layers, float(w.hidden), w.heads, w.kv_heads, w.head_dim, w.experts, moe, gated,
        w.ffn, w.top_k, w.moe_ffn, w.shared, w.moe_layers / w.layers, w.vocab,
        dense_scale, expert_scale, w.embedding_params, attention0, mlp_dense, mlp_moe,
        1.5 if w.gated else 1.0, w.dense_layers if moe else 0.0, w.single_stage_embedding,
        # megatron_memory.layer_activation_bytes's FP8 term: the second MLP GEMM's input
        # width over h, dense and MoE (the same division it makes)
        float(w.ffn) / float(w.hidden), float(mlp_moe_width) / float(w.hidden),
        # multi-head latent attention (megatron._Shape; zeros and GQA's values otherwise)
        1.0 if w.mla else 0.0, w.q_lora, w.kv_lora, w.rope, w.qk_dim, w.core_dim, w.attn_pair,
        w.latent_act, w.context_ratio, w.attn_params,
        # megatron_compose._stage_params on a stage of MoE layers only (heavy_moe_stage)
        float(w.moe_layer_nonexpert), float(w.expert_params * w.experts),
        # multi-head latent attention's duplicated weights a layer (megatron._Shape.attn_dup)
        float(w.attn_dup),
        # a dense layer's weights (megatron_compose.memory's first stage)
        float(w.dense_layer_params),
        # multi-head latent attention's latents kept under FP8 (megatron._Shape.latent_act_fp8)
        float(w.latent_act_fp8),
        # a multi-token prediction module's weights besides its layer (megatron._Shape)
        float(w.mtp_module_params),
        # weights whole on every TP rank a layer (megatron._Shape.dense_dup, moe_dup), and
        # their mix as megatron_compose._stage_params takes it
        float(w.dense_dup * w.dense_layers / w.layers + w.moe_dup * w.moe_layers / w.layers),
        float(w.dense_dup), float(w.moe_dup),
        # the embedding matrices of an unpipelined model's one stage (megatron._Shape)
        float(w.embedding_copies)))


def fleet_scalars(fleet, total_accelerators=None, constants=None):
    """The kernel's per-fleet tuple: per-precision tables (4-tuples) and rates (megatron_steps.hardware).
    ``constants``: where it sets ``gemm_plateau``, that plateau for every precision
    (megatron_steps._plateau); the catalog's otherwise."""
    node, fabric = fleet.node, fleet.fabric
    acc = node.accelerator
    P = _steps.PRECISIONS
    peak_gemm = tuple(float(_steps._peak(acc, p)) for p in P)
    peak16 = tuple(float(_steps._peak(acc, "fp16" if p == "fp16" else "bf16")) for p in P)
    plateau = tuple(float(_steps._plateau(acc, p, constants)) for p in P)
    plateau16 = tuple(float(_steps._plateau(acc, "fp16" if p == "fp16" else "bf16", constants))
                      for p in P)
    return (peak_gemm, peak16, plateau, plateau16,
            float(acc.memory_bandwidth),
            float(acc.gemm_efficiency.get("flash_attention", _steps.DEFAULT_FLASH_ATTENTION_EFFICIENCY)),
            float(node.scale_up_domain or node.accelerators_per_node),
            float(node.scale_up_bus_bandwidth or node.intra_node_bandwidth),
            float(node.nic_bandwidth or fabric.bandwidth / fabric.oversubscription),
            float(_steps.SCALE_UP_STEP_LATENCY),
            float(fabric.latency if fabric.latency is not None else _steps.SCALE_OUT_STEP_LATENCY),
            float(fleet.total_accelerators), float(acc.memory_capacity),
            tuple(1.0 if _steps.supports(acc, p) else 0.0 for p in P),
            1.0 / float(node.scale_up_domain or node.accelerators_per_node))


#: Constant names in the order of the kernel's constant tuple (``gemm_size_shift`` as its log).
CONSTANT_ORDER = ("gemm_scale", "fp8_gemm_scale", "gemm_size_shift", "gemm_k_overhead",
                  "attention_efficiency", "elementwise_bytes", "layer_overhead",
                  "scale_up_efficiency", "scale_out_efficiency", "overlap_efficiency",
                  "step_overhead", "collective_latency")


def constant_scalars(c, accelerator):
    """The kernel's constant tuple from scalar constants (``np.log`` of the size shift, as gemm takes it).

    ``gemm_scale`` comes with the accelerator's architecture scale folded in
    (megatron_steps.architecture_gemm_scale: ``hopper_gemm_scale`` from Hopper on), the one
    fitted constant that depends on the fleet."""
    out = []
    for name in CONSTANT_ORDER:
        value = np.float64(c[name])
        if name == "gemm_scale":
            value = value * np.float64(_steps.architecture_gemm_scale(accelerator, c))
        out.append(float(np.log(value)) if name == "gemm_size_shift" else float(value))
    return tuple(out)


def pipeline_flags(scatter_gather, overlap_p2p, mtp_num_layers=0, first_stage_layers=0,
                   last_stage_layers=0):
    """The ``p2p`` argument of :func:`run` (before it is spread to ``n`` values): the two
    pipeline bools, ``mtp_num_layers`` (0-63) and the layers of the first and the last
    stage (``num_layers_in_first/last_pipeline_stage``, 0-4095; each checked before),
    scalars or arrays, packed into uint32: bit 0, bit 1, bits 2-7, 8-19 and 20-31
    (:func:`_pipeline_counts` unpacks them)."""
    u = np.uint32
    return (np.asarray(scatter_gather).astype(u)
            | (np.asarray(overlap_p2p).astype(u) << u(1))
            | (np.asarray(mtp_num_layers).astype(u) << u(2))
            | (np.asarray(first_stage_layers).astype(u) << u(8))
            | (np.asarray(last_stage_layers).astype(u) << u(20)))


def memory_flags(grad_reduce_in_bf16, hidden_dropout=0.1, attention_dropout=0.1,
                 overlap_moe_expert_parallel_comm=False, pipeline_split=0, fsdp_own_nic=False,
                 moe_enable_deepep=False):
    """The ``mem`` argument of :func:`run` (before it is spread to ``n`` values):
    ``grad_reduce_in_bf16``, whether each dropout keeps a mask
    (:func:`solver.megatron_memory.keeps_mask`), ``overlap_moe_expert_parallel_comm``
    (the combined 1F1B schedule, which moves memory and time) and ``pipeline_split`` (0-2:
    whether Megatron-Core's rule for ``account_for_embedding/loss_in_pipeline_split``
    applies and holds, ``solver.physics.megatron._account_stages``), ``fsdp_own_nic``
    (ZeRO-3's collectives at one NIC's rate, [38] of the model) and ``moe_enable_deepep``
    (the flex dispatcher, [39]), scalars or arrays, packed into uint8: bits 0, 1
    (hidden), 2 (attention), 3, 4-5, 6 and 7."""
    u = np.uint8
    return (np.asarray(grad_reduce_in_bf16).astype(u) | (keeps_mask(hidden_dropout).astype(u) << u(1))
            | (keeps_mask(attention_dropout).astype(u) << u(2))
            | (np.asarray(overlap_moe_expert_parallel_comm).astype(u) << u(3))
            | (np.asarray(pipeline_split).astype(u) << u(4))
            | (np.asarray(fsdp_own_nic).astype(u) << u(6))
            | (np.asarray(moe_enable_deepep).astype(u) << u(7)))


def run(w, f, c, n, has_dp, batch, s, tp, pp, cp, ep, etp, dp, v, mbs, spk, rc, zero, prec, tco, ogr,
        opg, flash, mem, p2p, bounds, choices):
    """Price ``n`` configurations: the knobs as 1-D arrays of length ``n`` (int64 / bool).

    ``rc`` and ``prec`` are each int64 codes or the characters of their names
    (:func:`name_characters`), matched exactly against ``choices`` (the recompute and the
    precision names, in code order) in the kernel's first pass.

    ``p2p``: uint32, bit 0 ``scatter_gather_tensors_in_pipeline``, bit 1 ``overlap_p2p_comm``,
    bits 2-7 ``mtp_num_layers``, 8-19 and 20-31 the first and last stages' layers (:func:`pipeline_flags`): a separate array for each slowed the vector pass on a
    million layouts in an interleaved A/B of the two revisions (commit c242baa;
    ``benchmarks/bench_grid_compare.py --case megatron_flat``).

    ``mem``: uint8, bit 0 ``grad_reduce_in_bf16``, bits 1 and 2 whether the hidden and
    the attention dropout keep masks, bit 3 the combined 1F1B schedule, bits 4-5 the
    pipeline split's rule, bit 6 ``fsdp_own_nic``, bit 7 ``moe_enable_deepep``
    (:func:`memory_flags`): like ``p2p``,
    one array for what a configuration reads beside its other knobs.

    ``etp``: the expert TP degree of each configuration (``tp`` where the knob is not given).

    ``bounds``: 22 ints, the least and the largest value each of ``batch`` ... ``zero``, then ``etp``, may
    take (see :func:`_kernel`).

    Returns
    -------
    (tuple of len(FLOAT_OUTPUTS) float64 arrays, tuple of 3 bool arrays, bool): the
    outputs, each of length n, and whether every integer knob lay within ``bounds`` and
    every name was one of ``choices`` (where not, the outputs are not to be used)
    """
    keys = (choice_keys(choices[0], rc), choice_keys(choices[1], prec))
    # One array per output, not rows of one block: each is its own argument, which the
    # kernels' noalias flag declares overlaps no other (solver.fused._numba), and a caller
    # who keeps one output keeps only its memory. They come from buffers: arrays of an
    # earlier call that nothing refers to any more, already faulted in.
    fo = tuple(buffers.empty(n, np.float64) for _ in FLOAT_OUTPUTS)
    bo = tuple(buffers.empty(n, np.bool_) for _ in BOOL_OUTPUTS)
    args = (w, f, c, has_dp, batch, s, tp, pp, cp, ep, etp, dp, v, mbs, spk, rc, zero, prec, tco, ogr,
            opg, flash, mem, p2p, fo, bo)
    _compile(args, keys)
    # Each thread keeps its scratch, and with it the step memo, over every range it takes
    # in this call: a range's keys are then mostly hits (bench_fused's million layouts, 1
    # thread: 21,173 misses with a memo a chunk of 65,536, 1,404 with one; 90.5 -> 78.4 ms).
    local = threading.local()

    def scratch():
        kept = getattr(local, "scratch", None)
        if kept is None:
            kept = local.scratch = _memo_scratch(moe=w[6] != 0.0)
        return kept

    if libm_is_numpy_log():
        ok = in_ranges(lambda lo, hi: _kernel(*args, lo, hi, np.empty((1, 1)), _NO_PLAN, 0,
                                              bounds, *scratch(), *keys), n)
        return fo, bo, all(ok)
    # numpy's float64 log is its own SIMD code here (AVX-512): take the logs with it, in
    # chunks, between the kernel's mode 1 and mode 2 calls, so they are the numpy path's;
    # in threads as mode 0 (np.log releases the GIL), each thread with its own scratch.
    rows = [g for g in range(N_GEMMS)
            if not ((G_MOE1 <= g <= G_ROUTER and not w[6]) or (g in (G_SH1, G_SH2) and not w[11])
                    or (G_QUP <= g <= G_KVUP and not w[25]) or (g == G_QUP and not w[26]))]

    def log_scratch():
        kept = getattr(local, "logs", None)
        if kept is None:
            ext = np.empty((N_GEMMS, min(n, _NUMPY_LOG_CHUNK)))
            kept = local.logs = (ext, np.empty((4, ext.shape[1]), dtype=np.int64))
        return kept

    def priced(lo, hi):
        ext, plan = log_scratch()
        memo = scratch()
        ok = True
        for b in range(lo, hi, _NUMPY_LOG_CHUNK):
            e = min(b + _NUMPY_LOG_CHUNK, hi)
            misses = _kernel(*args, b, e, ext, plan, 1, bounds, *memo, *keys)
            for g in rows:
                np.log(ext[g, :misses], out=ext[g, :misses])
            ok = bool(_kernel(*args, b, e, ext, plan, 2, bounds, *memo, *keys)) and ok
        return ok

    return fo, bo, all(in_ranges(priced, n))


_NUMPY_LOG_CHUNK = 1 << 16
_NO_PLAN = np.empty((4, 1), dtype=np.int64)  # mode 0 reads no plan
_ANY_INT64 = (np.iinfo(np.int64).min, np.iinfo(np.int64).max) * 11
_LIBM_IS_NUMPY_LOG = None


def vector_width():
    """Lanes :func:`_price_block`'s loops are compiled with: 8 float64 where numba compiles
    for AVX-512 (LLVM then takes its 512-bit registers), else 4 (AVX2's 256 bits).

    The loops are bound by their divisions, which a 512-bit register does at the same rate
    per lane; the rest of a loop's instructions halve. On this project's AVX-512 VM, 1M
    layouts of ``bench_fused``'s draw (Llama3_70B_MC, 8 interleaved rounds, 2026-12-05,
    unsaved): 1 thread best 94.6 -> 89.1 ms, median 97.0 -> 91.4 ms; 2 threads best 54.4 ->
    47.4 ms, median 57.1 -> 49.8 ms. Mixtral 8x7B's MoE loop and a dense loop with stages
    set: no change (medians 1.017x and 1.021x the time at 4 lanes). 16 lanes: 1.22x the
    time of 8 (registers spill). The same bits at any width: each lane computes what the
    scalar loop would.
    """
    from numba.core import config
    if config.CPU_NAME:  # a named target ($NUMBA_CPU_NAME): the features it is given
        return 8 if "+avx512f" in (config.CPU_FEATURES or "") else 4
    import llvmlite.binding as llvm
    return 8 if llvm.get_host_cpu_features().get("avx512f") else 4


_COMPILED = False


def _memo_scratch(moe=False):
    """A new, empty step memo and the block scratch for calls of :func:`_kernel` (each
    thread its own): the key table (every slot empty; a slot's fourth word is unused: slot
    0's counts the keys kept, slot 1's says whether a key was turned away, :func:`_memo_kept`),
    the values' rows, and the block's rows and codes.
    The memo lives as long as this scratch: calls on the same workload, fleet and
    constants may share it, and no others. ``moe``: an MoE workload's, whose rows keep
    :data:`_N_MEMO_MOE` columns."""
    slots = np.empty((MEMO_SLOTS, 4), dtype=np.uint64)
    slots[:, 0] = _NO_SLOT
    slots[0, 3] = slots[1, 3] = 0
    columns = _N_MEMO_MOE if moe else _N_MEMO
    return (slots, np.empty((MEMO_KEYS + BLOCK, columns)), np.empty(BLOCK, dtype=np.int64),
            np.empty(BLOCK, dtype=np.int64), np.empty(BLOCK, dtype=np.int64))


def _compile(args, keys):
    """Compile :func:`_kernel` (or load it from numba's cache) before its first real call,
    with its block loop vectorized.

    LLVM's cost model refuses to vectorize :func:`_price_block`'s loop; forced to
    :func:`vector_width` lanes (:func:`solver.fused._numba.forced_vector_width`) it is
    bitwise the same and faster (the kernel as a whole, against its one-pass scalar
    version, interleaved in one process, 1 thread, 1M layouts, 16 rounds: best 167.7 ->
    125.6 ms, median 194.8 -> 136.3 ms). Calls over no configurations compile it for these
    argument types inside that block, then :func:`_kernel` outside it (forced, LLVM would
    warn on stderr of every loop there it cannot vectorize), before the threads of
    :func:`solver.fused.in_ranges` call them.
    """
    global _COMPILED
    if not _COMPILED:
        w, f, c, has_dp = args[:4]
        knobs, (fo, bo) = args[4:-2], args[-2:]
        memo = _memo_scratch()
        # the names' codes come by block (memo[3], memo[4]), from the kernel's first pass
        block_knobs = knobs[:11] + knobs[12:13] + (memo[3], memo[4]) + knobs[14:]
        with forced_vector_width(vector_width()):  # this loop only: LLVM warns of each it cannot
            for block in (_price_block, _price_block_even, _price_block_dense_even,
                          _price_block_dense):
                block(w, f, c, has_dp, *block_knobs, fo, bo, memo[1], memo[2],
                      _ANY_INT64, (np.uint64(0), np.uint64(0)))
        _COMPILED = True
    # (each type of the name arrays compiles a _kernel of its own, calling the same blocks)
    _kernel(*args, 0, 0, np.empty((1, 1)), _NO_PLAN, 0, _ANY_INT64, *_memo_scratch(), *keys)


@njit(cache=True, nogil=True, error_model="numpy")
def _libm_log(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = math.log(x[i])
    return out


def libm_is_numpy_log():
    """Whether numpy's float64 ``np.log`` is libm's ``log`` here (what the kernel calls),
    probed once on 100,000 arguments over the GEMM curve's range and beyond."""
    global _LIBM_IS_NUMPY_LOG
    if _LIBM_IS_NUMPY_LOG is None:
        rng = np.random.default_rng(0)
        x = np.concatenate([np.exp(rng.uniform(-70.0, 10.0, 99_000)),
                            np.geomspace(1e-30, 1e3, 1000)])
        _LIBM_IS_NUMPY_LOG = bool(np.array_equal(np.log(x), _libm_log(x)))
    return _LIBM_IS_NUMPY_LOG


# ------------------------------------------------------- input normalization

#: Widths whose characters pack, at 7 bits each, into one 64-bit key (ASCII names).
_PACKED_WIDTH = 9
_NO_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)  # no row of width <= 9 packs to this (keys < 2**63)


@njit(cache=True, nogil=True)
def _match_packed(chars, keys, codes, lo, hi, width):
    """``codes[lo:hi]``: index of the key equal to each row's packed characters, -1 if none.

    A row packs to ``sum(c_j << 7 j)`` when every character is ASCII (c_j < 128), which
    is injective for widths up to :data:`_PACKED_WIDTH`; a row with any other character
    matches nothing (the choices are ASCII). Returns whether every row matched.

    ``keys`` is a tuple and ``width`` a tuple of the row's length (its items unused):
    numba types a tuple by its length, so each width and number of choices compiles (and
    caches) a loop of its own with both inner loops unrolled (a million names of 4
    characters: 5.95 -> 2.84 ms, 2 threads, best of 15, unsaved).
    """
    bad = 0
    for i in range(lo, hi):
        code = choice_code(chars, i, (keys, width))
        codes[i] = code
        bad |= code < 0
    return bad == 0


@njit(cache=True, nogil=True)
def _match_rows(chars, table, codes, lo, hi):
    """``codes[lo:hi]``: index of the row of ``table`` equal to each row of ``chars``, -1 if
    none (any width, any characters; branch-free). Returns whether every row matched."""
    width = chars.shape[1]
    ok = True
    for i in range(lo, hi):
        code = -1
        for t in range(table.shape[0]):
            diff = np.uint32(0)
            for j in range(width):
                diff |= chars[i, j] ^ table[t, j]
            code = t if diff == 0 else code
        codes[i] = code
        ok = ok and code >= 0
    return ok


def factorize_choices(array, choices):
    """Codes into ``choices`` of a 1-D unicode array, in one pass (threaded, see
    :func:`solver.fused.in_ranges`); None if any value is not exactly one of ``choices``
    (the caller's slow path then lowers case or raises)."""
    if array.dtype.kind != "U" or array.ndim != 1:
        return None
    width = array.dtype.itemsize // 4
    chars = np.ascontiguousarray(array).view(np.uint32).reshape(array.shape[0], width)
    codes = buffers.empty(array.shape[0], np.int64)  # faulted in already (see _flat)
    if width <= _PACKED_WIDTH and all(ch.isascii() for ch in choices):
        keys, shape = choice_keys(choices, chars)
        matched = in_ranges(lambda lo, hi: _match_packed(chars, keys, codes, np.uint64(lo),
                                                         np.uint64(hi), shape), codes.size)
    else:
        # A choice longer than the array's strings gets a row no character equals (above U+10FFFF).
        table = np.full((len(choices), width), 0xFFFFFFFF, dtype=np.uint32)
        for t, choice in enumerate(choices):
            if len(choice) <= width:
                table[t] = 0
                table[t, :len(choice)] = np.frombuffer(choice.encode("utf-32-le"), dtype=np.uint32)
        matched = in_ranges(lambda lo, hi: _match_rows(chars, table, codes, lo, hi), codes.size)
    return codes if all(matched) else None


@njit(cache=True, nogil=True)
def _min_max(values):
    lo = values[0]
    hi = values[0]
    for i in range(1, values.shape[0]):
        x = values[i]
        lo = x if x < lo else lo
        hi = x if x > hi else hi
    return lo, hi


def int_in_bounds(array, low, high, limit):
    """A 1-D int64 array whose values lie in [low, high] and below ``limit`` in magnitude
    (one pass, threaded: a million values come from memory); False sends the caller to the
    checking converter, which says what is wrong."""
    if array.dtype != np.int64 or array.ndim != 1 or array.size == 0:
        return False
    parts = in_ranges(lambda lo, hi: _min_max(array[lo:hi]), array.size)
    lo, hi = min(p[0] for p in parts), max(p[1] for p in parts)
    return (-limit < lo and hi < limit and (low is None or lo >= low)
            and (high is None or hi <= high))
