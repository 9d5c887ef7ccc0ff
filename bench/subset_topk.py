"""Save the first N tokens of a top-k run (every checkpoint) as a new run: a small piece of a
large real run to profile where it cannot travel whole.

    python -m bench.subset_topk RUN OUT.npy --tokens N
"""
from __future__ import annotations

import argparse

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("out")
    p.add_argument("--tokens", type=int, required=True)
    args = p.parse_args(argv)
    import forgetkit as fk
    from forgetkit.kinds import kind_of
    from forgetkit.kinds.topk import TopKOutputs

    run = fk.load(args.run)
    n = args.tokens
    records = np.ascontiguousarray(np.asarray(kind_of(run).read_records(run))[:, :n])
    sub = fk.Run(TopKOutputs(records, run.n_classes, run.sequence_ids[:n], run.positions[:n]),
                 run.labels[:n], kind="topk", epochs=run.epochs)
    fk.save(sub, args.out)
    print(fk.load(args.out))


if __name__ == "__main__":
    main()
