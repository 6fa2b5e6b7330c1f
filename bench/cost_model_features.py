"""Experiment for issue 16 (reverted by the next commit): does a correction over the chosen
kernel's normalised features (k-iterations, last-wave fill, waves, compute / memory ratio, row
padding) learned on each dev fit's training shapes help the held-out shapes?

    python bench/cost_model_features.py
"""

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simulator.calibrate import load_vidur
from simulator.gemm import TILES, gemm_kernel
from simulator.gemm_fit import A100, dev_split_predictions, gemm_rows, shape_half

rows = gemm_rows(load_vidur())
held = dev_split_predictions(rows)
params = held.attrs["params"]
tiles = {t.label: t for t in TILES[A100.arch]}


def feats(df, p):
    out = []
    for (k, n), g in df.groupby(["K", "N"], sort=False):
        kt = gemm_kernel(g["num_tokens"].to_numpy(float), k, n, A100, p)
        tm = np.array([tiles[lb].tm for lb in kt.tile])
        tk = np.array([tiles[lb].tk for lb in kt.tile])
        c = np.array([tiles[lb].ctas_per_sm for lb in kt.tile])
        per_wave = A100.num_sms * c
        w = kt.tiles / per_wave
        f = pd.DataFrame(
            {
                "pred": kt.time_s,
                "kiter": np.log2(np.ceil(np.ceil(k / kt.split) / tk)),
                "fill": np.where(np.ceil(w) - w == 0, 1.0, w - np.floor(w)),
                "waves": np.ceil(w),
                "cm": np.log2(np.maximum(kt.compute_s, 1e-12) / np.maximum(kt.memory_s, 1e-12)),
                "mpad": g["num_tokens"].to_numpy(float) / (np.ceil(g["num_tokens"].to_numpy(float) / tm) * tm),
                "split": kt.split,
            },
            index=g.index,
        )
        out.append(f)
    return pd.concat(out).loc[df.index]


def ape(p, m):
    return 100 * np.abs(p / m - 1)


res = {}
specs = {
    "kiter x fill": lambda f: (
        pd.cut(f.kiter, [-1, 3, 5, 6, 7, 8, 20]).astype(str)
        + pd.cut(f.fill, [0, 0.25, 0.5, 0.75, 0.999, 1.01]).astype(str)
    ),
    "kiter": lambda f: pd.cut(f.kiter, [-1, 3, 4, 5, 6, 7, 8, 20]).astype(str),
    "fill x waves": lambda f: (
        pd.cut(f.fill, [0, 0.25, 0.5, 0.75, 0.999, 1.01]).astype(str) + pd.cut(f.waves, [0, 1, 2, 4, 1e9]).astype(str)
    ),
    "cm": lambda f: pd.cut(f.cm, [-20, -2, -1, -0.5, 0, 0.5, 1, 2, 20]).astype(str),
    "cm x kiter": lambda f: (
        pd.cut(f.cm, [-20, -1, 0, 1, 20]).astype(str) + pd.cut(f.kiter, [-1, 4, 6, 7, 20]).astype(str)
    ),
    "mpad x cm": lambda f: (
        pd.cut(f.mpad, [0, 0.6, 0.8, 0.95, 1.01]).astype(str) + pd.cut(f.cm, [-20, -1, 0, 1, 20]).astype(str)
    ),
}
base, outs = [], {k: [] for k in specs}
i = 0
for seed in (0, 1):
    half = shape_half(rows, seed)
    for train_mask in (half, ~half):
        p = params[i]
        i += 1
        tr, te = rows[train_mask], rows[~train_mask]
        ftr, fte = feats(tr, p), feats(te, p)
        r = np.log(ftr.pred / tr.time_s)
        base.append(ape(fte.pred.to_numpy(), te.time_s.to_numpy()))
        for name, key in specs.items():
            ktr, kte = key(ftr), key(fte)
            grp = r.groupby(ktr.values)
            shrunk = grp.sum() / (grp.count() + 50)
            corr = kte.map(shrunk).fillna(0).to_numpy()
            outs[name].append(ape(fte.pred.to_numpy() / np.exp(corr), te.time_s.to_numpy()))
b = np.concatenate(base)
print(f"base {np.median(b):.2f} / {np.percentile(b, 90):.2f}")
for name, v in outs.items():
    v = np.concatenate(v)
    print(f"{name:14s} {np.median(v):.2f} / {np.percentile(v, 90):.2f}")
