#!/usr/bin/env python3
"""How far an online eviction policy could get on a trace (issue 22).

One flat cache of C blocks, requests in serial order, the semantics of
`strata bench simulate`'s `hit_ratio_blocks` references (bench/cache_reference.h):
a unit is a prefix chain (a hash id after its prefix), a prompt's units hit
while every earlier unit of it hit, and after a request every unit of it is
in the cache (touched tail first, as the engine frees a request's blocks).

Printed per size, as hit ratios and as shares of Belady's MIN:
  lru             least recently used (equals lru_hit_ratio_blocks)
  belady          Belady's MIN with bypass (equals belady_hit_ratio_blocks)
  static_freq     knowing every unit's total uses in advance, keep the C most
                  used (a frequency oracle: no online LFU can know more)
  lru_oracle_ever LRU, but a unit never used again is evicted first (or not
                  admitted): a perfect binary reuse predictor on top of LRU
  lru_oracle_H    the same with "used again within H accesses" (H = 4 C)
  fitted_hazard   the best a reuse predictor over the features a tier sees
                  could do when fitted with hindsight on the trace itself:
                  per class (uses of the unit so far, uses of its chain's
                  first unit so far, distance from the prompt's end, prompt
                  length) the distribution of the distance to the next use;
                  the victim (among 64 sampled) is the unit least likely to
                  be used within the next 4 C accesses given its age
The oracles and the fitted predictor read the future: they bound what an
online policy with that knowledge could reach; they are not policies.

Usage: bench/policy_bounds.py [--trace F] [--sizes 2000,5000,10000,20000]
Pure Python 3, no packages; about a minute per size.
"""

import argparse
import collections
import heapq
import json
import math
import random


def load(trace):
    chain = {}
    keys = []
    with open(trace) as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            ks, prev = [], None
            for h in ids:
                k = chain.setdefault((prev, h), len(chain))
                ks.append(k)
                prev = k
            keys.append(ks)
    return keys


def accesses(keys):
    acc = [u for ks in keys for u in ks]
    never = len(acc) + 10**9
    nxt = [never] * len(acc)
    last = {}
    for i in range(len(acc) - 1, -1, -1):
        if acc[i] in last:
            nxt[i] = last[acc[i]]
        last[acc[i]] = i
    return acc, nxt


def run(keys, n_acc, cap, pol):
    cached, hits, t = set(), 0, 0
    for ks in keys:
        for u in ks:
            if u not in cached:
                break
            hits += 1
        for j in range(len(ks) - 1, -1, -1):
            u, ti = ks[j], t + j
            if u not in cached:
                if len(cached) >= cap:
                    v = pol.evict(ti, u)
                    if v == u:
                        continue  # not admitted
                    cached.discard(v)
                cached.add(u)
            pol.touch(u, ti)
        t += len(ks)
    return hits / n_acc


class Lru:
    def __init__(self):
        self.d = collections.OrderedDict()

    def touch(self, u, t):
        self.d[u] = t
        self.d.move_to_end(u)

    def evict(self, t, u):
        return self.d.popitem(last=False)[0]


class Belady:
    def __init__(self, nxt):
        self.nxt, self.h, self.nu = nxt, [], {}

    def touch(self, u, t):
        self.nu[u] = self.nxt[t]
        heapq.heappush(self.h, (-self.nxt[t], u))

    def evict(self, t, u):
        while True:
            nn, v = self.h[0]
            if self.nu.get(v) != -nn:
                heapq.heappop(self.h)
                continue
            if self.nxt[t] >= -nn:
                return u
            heapq.heappop(self.h)
            del self.nu[v]
            return v


class LruOracle:
    """LRU over the units used again within `horizon`; the others go first."""

    def __init__(self, nxt, horizon):
        self.nxt, self.horizon = nxt, horizon
        self.good, self.bad = collections.OrderedDict(), collections.OrderedDict()

    def touch(self, u, t):
        self.good.pop(u, None)
        self.bad.pop(u, None)
        (self.good if self.nxt[t] - t <= self.horizon else self.bad)[u] = t

    def evict(self, t, u):
        if self.bad:
            return self.bad.popitem(last=False)[0]
        if self.nxt[t] - t > self.horizon:
            return u
        return self.good.popitem(last=False)[0]


def static_freq(keys, n_acc, cap):
    total = collections.Counter(u for ks in keys for u in ks)
    keep = {u for u, _ in total.most_common(cap)}
    seen, hits = set(), 0
    for ks in keys:
        for u in ks:
            if u not in keep or u not in seen:
                break
            hits += 1
        seen.update(ks)
    return hits / n_acc


def bucket(x):
    return int(math.log2(max(x, 0) + 1) * 4)


def features(keys, n_acc):
    lb = lambda x: min(int(math.log2(x + 1)), 12)
    feats, cnt, t = [None] * n_acc, collections.Counter(), 0
    for ks in keys:
        n = len(ks)
        for j, u in enumerate(ks):
            cnt[u] += 1
            feats[t + j] = (min(cnt[u], 6), lb(cnt[ks[0]]), min(n - 1 - j, 8), lb(n))
        t += n
    return feats


class FittedHazard:
    def __init__(self, feats, nxt, n_acc, window, seed=1):
        nb = bucket(n_acc) + 2
        hist = collections.defaultdict(lambda: [0] * (nb + 1))
        for i in range(n_acc):
            hist[feats[i]][bucket(nxt[i] - i) if nxt[i] < n_acc else nb] += 1
        self.suf = {}
        for f, h in hist.items():
            s = [0] * (nb + 2)
            for b in range(nb, -1, -1):
                s[b] = s[b + 1] + h[b]
            self.suf[f] = s
        self.feats, self.window = feats, window
        self.lst, self.pos, self.f, self.last = [], {}, {}, {}
        self.rng = random.Random(seed)

    def score(self, u, t):
        s = self.suf[self.f[u]]
        a = max(0, t - self.last[u])
        b0, b1 = bucket(a), bucket(a + self.window)
        return 0 if s[b0] == 0 else (s[b0] - s[b1]) / s[b0]

    def touch(self, u, t):
        if u not in self.pos:
            self.pos[u] = len(self.lst)
            self.lst.append(u)
        self.f[u], self.last[u] = self.feats[t], t

    def evict(self, t, u):
        best, bk = None, None
        for _ in range(64):
            v = self.lst[self.rng.randrange(len(self.lst))]
            k = self.score(v, t)
            if bk is None or k < bk:
                best, bk = v, k
        i = self.pos.pop(best)
        last = self.lst.pop()
        if last != best:
            self.lst[i] = last
            self.pos[last] = i
        return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="../shared/traces/synthetic_trace.jsonl")
    ap.add_argument("--sizes", default="2000,5000,10000,20000")
    args = ap.parse_args()
    keys = load(args.trace)
    acc, nxt = accesses(keys)
    n = len(acc)
    feats = features(keys, n)
    print(f"{args.trace}: {len(keys)} requests, {n} units accessed, {len(set(acc))} distinct")
    print("blocks  lru     belady  static_freq  lru_oracle_ever  lru_oracle_H  fitted_hazard  (share of belady)")
    for cap in (int(s) for s in args.sizes.split(",")):
        r = {
            "lru": run(keys, n, cap, Lru()),
            "belady": run(keys, n, cap, Belady(nxt)),
            "static_freq": static_freq(keys, n, cap),
            "ever": run(keys, n, cap, LruOracle(nxt, 10**8)),
            "h": run(keys, n, cap, LruOracle(nxt, 4 * cap)),
            "fit": run(keys, n, cap, FittedHazard(feats, nxt, n, 4 * cap)),
        }
        b = r["belady"]
        cells = [f"{r[k]:.4f} ({r[k] / b:.2f})" for k in ("static_freq", "ever", "h", "fit")]
        print(f"{cap:6d}  {r['lru']:.4f}  {b:.4f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
