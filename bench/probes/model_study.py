#!/usr/bin/env python3
"""Replays the cost model's n_comm pick (src/tune/cost_model_eval.hpp) in Python on measured sweeps, so
that other model forms can be scored offline against the same sweeps as the current one.

Input: the WORK lines of `comet-tune --evaluate SWEEP.json --dump-work --measured-work`, each prefixed
with the sweep's name, e.g.

    for f in bench/results/h200_device_sweep_fwd_fb38e9e.json bench/results/h100_unseen_gpu_device_7f7887f.json; do
      build/tools/comet-tune --evaluate $f --table TABLE_WITHOUT_ENTRIES --dump-work --measured-work |
        grep '^WORK' | sed "s|^WORK |$(basename $f .json) |"
    done > work.txt
    python3 bench/probes/model_study.py work.txt

With the current form it reproduces comet-tune's own count (e.g. 83 of 90 picks within 3 % of the
sweep's best on h200_device_sweep_fwd_fb38e9e). The forms tried (docs/design-changes.md, Tuner):
  hbm:  an HBM cap on a layer-0 comm launch's stores (rows x row bytes / bandwidth), in the soft max;
  beta: T_gemm(compute SMs) = T_gemm(all SMs) x (SMs / compute SMs)^beta (beta 1 is the current model).
"""
import json
import math
import sys

# Device-link constants: the H200's fit (bench/results/h200_tune_table.json) and the built-in defaults
# (comet/tune.hpp, CostModel::defaults(Link::device)), which a GPU without a fit gets.
H200_DEVICE = dict(gemm=4.962666666666666, l0_store=70.71067811865474, l0_unit=0.0998518815125134,
                   l1_slice=0.2825075089245508, link=1370.24, pen=0.3, seq_margin=0.05)
DEFAULT_DEVICE = dict(gemm=4.61, l0_store=200.0, l0_unit=0.50, l1_slice=0.40, link=1000.0, pen=0.3,
                      seq_margin=0.05)
SMS = 132


def unit_us(m, w):
    if w['layer'] == 0:
        return m['l0_unit'] + w['rows_per_unit'] * w['hidden'] * 2 / (m['l0_store'] * 1e3)
    return m['l1_slice'] * math.ceil(w['hidden'] / 256) * w['topk'] / 16


def predict_ms(m, w, n_comm, beta=1.0, hbm_gbps=None):
    gemm_sms = SMS if n_comm == 0 else max(SMS - n_comm, 1)
    t_gemm = w['flops'] / (m['gemm'] * 1e12 * SMS) * 1e3 * (SMS / gemm_sms) ** beta
    t_comm = 0.0
    if w['comm_units'] > 0:
        limits = [w['comm_units'] * unit_us(m, w) / (SMS if n_comm == 0 else n_comm) * 1e-3,
                  w['link_bytes'] / (m['link'] * 1e9) * 1e3]
        if hbm_gbps and w['layer'] == 0:
            limits.append(w['comm_units'] * w['rows_per_unit'] * w['hidden'] * 2 / (hbm_gbps * 1e9) * 1e3)
        t_comm = sum(t ** 4 for t in limits) ** 0.25  # the model's soft max
    if n_comm == 0:
        return t_gemm + t_comm
    return max(t_gemm, t_comm) + m['pen'] * min(t_gemm, t_comm)


def best_n_comm(m, w, **form):
    candidates = [n for n in (2, 4, 8, 16, 24, 32) if n <= max(SMS * 2 // 5, 2)]
    best = min(predict_ms(m, w, n, **form) for n in candidates)
    if w['comm_units'] > 0 and predict_ms(m, w, 0, **form) < best * (1 - m['seq_margin']):
        return 0
    return next(n for n in candidates if predict_ms(m, w, n, **form) <= best * 1.01)


def score(cases, m, **form):
    """(picks in the sweep, within 3 % of its best, within 10 %)."""
    n = within3 = within10 = 0
    for w in cases:
        sweep = {int(k): v for k, v in w['sweep'].items()}
        pick = best_n_comm(m, w, **form)
        if pick not in sweep:
            continue
        ratio = sweep[pick] / min(sweep.values())
        n += 1
        within3 += ratio <= 1.03
        within10 += ratio <= 1.10
    return n, within3, within10


def main(path):
    sweeps = {}
    for line in open(path):
        name, record = line.split(' ', 1)
        sweeps.setdefault(name, []).append(json.loads(record))
    forms = [('current', {}), ('hbm 3 TB/s', dict(hbm_gbps=3000)), ('beta 0.5', dict(beta=0.5)),
             ('beta 0.7 + hbm', dict(beta=0.7, hbm_gbps=3000)), ('beta 0.5 + hbm', dict(beta=0.5, hbm_gbps=3000)),
             ('beta 0.3 + hbm', dict(beta=0.3, hbm_gbps=3000))]
    for label, form in forms:
        cells = []
        for name, cases in sweeps.items():
            models = [('h200 fit', H200_DEVICE)] + ([] if name.startswith('h200') else [('defaults', DEFAULT_DEVICE)])
            for model_name, m in models:
                n, w3, w10 = score(cases, m, **form)
                cells.append(f'{name} ({model_name}): {w3}/{n} within 3 %, {w10} within 10 %')
        print(f'{label}:\n  ' + '\n  '.join(cells))


if __name__ == '__main__':
    main(sys.argv[1] if len(sys.argv) > 1 else 'work.txt')
